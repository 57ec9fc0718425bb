package datapath

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// NFTSendBuffer is the send buffer, in bytes, that NFTSendBufferOption gives the nftables
// socket. google/nftables sends a whole transaction in one sendmsg, which the kernel refuses
// ("message too long") once it passes the socket's send buffer: with the usual 208 KiB
// default, sixteen 512-port shifted ranges in one program were already too many.
const NFTSendBuffer = 64 << 20

// NFTSendBufferOption is the nftables.ConnOption every connection the datapath is given
// should carry: it raises the socket's send buffer to NFTSendBuffer with SO_SNDBUFFORCE
// (CAP_NET_ADMIN, which the agent holds), or as far as net.core.wmem_max allows with
// SO_SNDBUF when forcing is not permitted. Errors: the socket option cannot be set at all.
func NFTSendBufferOption() nftables.ConnOption {
	return nftables.WithSockOptions(func(c *netlink.Conn) error {
		rc, err := c.SyscallConn()
		if err != nil {
			return fmt.Errorf("nftables send buffer: %w", err)
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, NFTSendBuffer)
			if errors.Is(serr, unix.EPERM) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, NFTSendBuffer)
			}
		}); err != nil {
			return fmt.Errorf("nftables send buffer: %w", err)
		}
		if serr != nil {
			return fmt.Errorf("nftables send buffer: %w", serr)
		}
		return nil
	})
}
