package datapath

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// NFTSocketBuffer is the send and the receive buffer, in bytes, that NFTSocketOption gives
// the nftables socket. google/nftables sends a whole transaction in one sendmsg, which the
// kernel refuses ("message too long") once it passes the socket's send buffer: with the
// usual 208 KiB default, sixteen 512-port shifted ranges in one program were already too
// many. The kernel then acknowledges every message of the transaction, and the
// acknowledgements overflow a default receive buffer ("recvmsg: no buffer space
// available"): measured at 400 rules (100 mappings) on one node, before the buffer was
// raised (BenchmarkApply; TestPrivilegedTenThousandMappings applies 40,000 elements). Asking for
// acknowledgements without the echoed message (NETLINK_CAP_ACK) was not enough on its own.
const NFTSocketBuffer = 64 << 20

// NFTSocketOption is the nftables.ConnOption every connection the datapath is given should
// carry. It raises the socket's send and receive buffers to NFTSocketBuffer with
// SO_SNDBUFFORCE and SO_RCVBUFFORCE (CAP_NET_ADMIN, which the agent holds), or as far
// as net.core.wmem_max and rmem_max allow with SO_SNDBUF and SO_RCVBUF when forcing is not
// permitted. Errors: a socket option cannot be set at all.
func NFTSocketOption() nftables.ConnOption {
	return nftables.WithSockOptions(func(c *netlink.Conn) error {
		rc, err := c.SyscallConn()
		if err != nil {
			return fmt.Errorf("nftables socket: %w", err)
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			for _, opt := range [][2]int{{unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}, {unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}} {
				err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt[0], NFTSocketBuffer)
				if errors.Is(err, unix.EPERM) {
					err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt[1], NFTSocketBuffer)
				}
				serr = errors.Join(serr, err)
			}
		}); err != nil {
			return fmt.Errorf("nftables socket: %w", err)
		}
		if serr != nil {
			return fmt.Errorf("nftables socket buffers: %w", serr)
		}
		return nil
	})
}
