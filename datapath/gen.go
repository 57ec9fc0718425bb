package datapath

import (
	"encoding/binary"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The ruleset generation. The kernel counts every committed nftables transaction in a
// namespace, whoever sent it (NFT_MSG_GETGEN; nft uses it to know its cache is current).
// Apply remembers the table it wrote and the generation its own transaction made: while the
// generation has not moved, nobody changed any table, ours included, and a resync needs no
// read of the table. Any other commit, a damaged element or another program's firewall
// update alike, makes the next Apply read the table in full. google/nftables v0.3.0 has no
// call for it, so a netlink socket of the datapath's own asks.

// nftSocket is the datapath's own nftables socket, opened on first use in its namespace and
// kept.
func (d *sockets) nftSocket() (*netlink.Conn, error) {
	if d.nfConn == nil {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: max(int(d.netns), 0)})
		if err != nil {
			return nil, fmt.Errorf("nftables socket: %w", err)
		}
		d.nfConn = c
	}
	return d.nfConn, nil
}

// generation returns the namespace's nftables ruleset generation.
func (d *sockets) generation() (uint32, error) {
	c, err := d.nftSocket()
	if err != nil {
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN) || len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, fmt.Errorf("nftables generation: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				id := ad.Uint32()
				return id, ad.Err()
			}
		}
	}
	return 0, fmt.Errorf("nftables generation: no generation id in the answer")
}
