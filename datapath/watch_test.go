package datapath

import (
	"encoding/binary"
	"testing"

	"github.com/mdlayher/netlink"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// notification is a netlink message of type typ: a header of hdr zero bytes (byte 0, the
// family, set to family) and the attributes.
func notification(t *testing.T, typ netlink.HeaderType, hdr int, family byte, attrs func(*netlink.AttributeEncoder)) netlink.Message {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	attrs(ae)
	b, err := ae.Encode()
	require.NoError(t, err)
	data := make([]byte, hdr, hdr+len(b))
	data[0] = family
	return netlink.Message{Header: netlink.Header{Type: typ}, Data: append(data, b...)}
}

// TestWatchOwns: which notifications Watch takes for kuport's, and that everything beside
// them (another device, table, family, pref, routing table) is not.
func TestWatchOwns(t *testing.T) {
	d := New(Config{})
	d.routeTables.Store(&map[int]bool{201: true, 1000: true})
	d.linkIndexes.Store(&map[int]bool{7: true})
	name := func(typ uint16, s string) func(*netlink.AttributeEncoder) {
		return func(ae *netlink.AttributeEncoder) { ae.String(typ, s) }
	}
	u32 := func(typ uint16, v uint32) func(*netlink.AttributeEncoder) {
		return func(ae *netlink.AttributeEncoder) { ae.Uint32(typ, v) }
	}
	rule := func(pref uint32, proto uint8) func(*netlink.AttributeEncoder) {
		return func(ae *netlink.AttributeEncoder) {
			ae.Uint32(unix.FRA_PRIORITY, pref)
			ae.Uint8(unix.FRA_PROTOCOL, proto)
		}
	}
	route := func(table byte, attrs func(*netlink.AttributeEncoder)) netlink.Message {
		m := notification(t, unix.RTM_DELROUTE, unix.SizeofRtMsg, unix.AF_INET, attrs)
		m.Data[4] = table
		return m
	}
	addr6 := func(index uint32) netlink.Message {
		m := notification(t, unix.RTM_DELADDR, unix.SizeofIfAddrmsg, unix.AF_INET6, func(*netlink.AttributeEncoder) {})
		binary.NativeEndian.PutUint32(m.Data[4:8], index)
		return m
	}
	nft := func(msg int, family byte, table string) netlink.Message {
		return notification(t, netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|msg), 4, family, name(1, table))
	}
	for _, c := range []struct {
		name string
		m    netlink.Message
		want string
	}{
		{"kup device deleted", notification(t, unix.RTM_DELLINK, unix.SizeofIfInfomsg, 0, name(unix.IFLA_IFNAME, "kup-dcc4266d")), "device kup-dcc4266d"},
		{"kup device changed", notification(t, unix.RTM_NEWLINK, unix.SizeofIfInfomsg, 0, name(unix.IFLA_IFNAME, "kup-dcc4266d")), "device kup-dcc4266d"},
		{"another device", notification(t, unix.RTM_DELLINK, unix.SizeofIfInfomsg, 0, name(unix.IFLA_IFNAME, "wt0")), ""},
		{"address of a kup device", notification(t, unix.RTM_DELADDR, unix.SizeofIfAddrmsg, unix.AF_INET, name(unix.IFA_LABEL, "kup-dcc4266d")), "address of kup-dcc4266d"},
		{"address of another device", notification(t, unix.RTM_DELADDR, unix.SizeofIfAddrmsg, unix.AF_INET, name(unix.IFA_LABEL, "wt0")), ""},
		{"IPv6 address of a kup device", addr6(7), "address of ifindex 7"},
		{"IPv6 address of another device", addr6(8), ""},
		{"kuport's IPv6 rule pref 102", notification(t, unix.RTM_DELRULE, unix.SizeofRtMsg, unix.AF_INET6, rule(102, rtprotKuport)), "ip rule pref 102"},
		{"kuport's rule pref 101", notification(t, unix.RTM_DELRULE, unix.SizeofRtMsg, unix.AF_INET, rule(101, rtprotKuport)), "ip rule pref 101"},
		{"kuport's rule pref 202", notification(t, unix.RTM_NEWRULE, unix.SizeofRtMsg, unix.AF_INET, rule(202, rtprotKuport)), "ip rule pref 202"},
		{"another's rule pref 101", notification(t, unix.RTM_DELRULE, unix.SizeofRtMsg, unix.AF_INET, rule(101, unix.RTPROT_BOOT)), ""},
		{"rule without protocol", notification(t, unix.RTM_DELRULE, unix.SizeofRtMsg, unix.AF_INET, u32(unix.FRA_PRIORITY, 102)), ""},
		{"rule pref 0", notification(t, unix.RTM_DELRULE, unix.SizeofRtMsg, unix.AF_INET, func(*netlink.AttributeEncoder) {}), ""},
		{"route in table 201", route(201, u32(unix.RTA_TABLE, 201)), "route in table 201"},
		{"route in table 1000", route(unix.RT_TABLE_COMPAT, u32(unix.RTA_TABLE, 1000)), "route in table 1000"},
		{"route in table 300", route(unix.RT_TABLE_COMPAT, u32(unix.RTA_TABLE, 300)), ""},
		{"route in main", route(unix.RT_TABLE_MAIN, u32(unix.RTA_TABLE, unix.RT_TABLE_MAIN)), ""},
	} {
		assert.Equal(t, c.want, d.ownedRoute(c.m), c.name)
	}
	gen := notification(t, netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN), 4, unix.AF_UNSPEC,
		func(ae *netlink.AttributeEncoder) { ae.ByteOrder = binary.BigEndian; ae.Uint32(unix.NFTA_GEN_ID, 7) })
	for _, c := range []struct {
		name string
		m    netlink.Message
		want string
	}{
		{"table inet kuport deleted", nft(unix.NFT_MSG_DELTABLE, unix.NFPROTO_INET, "kuport"), "table inet kuport"},
		{"its chain deleted", nft(unix.NFT_MSG_DELCHAIN, unix.NFPROTO_INET, "kuport"), "table inet kuport"},
		{"its rule deleted", nft(unix.NFT_MSG_DELRULE, unix.NFPROTO_INET, "kuport"), "table inet kuport"},
		{"its set deleted", nft(unix.NFT_MSG_DELSET, unix.NFPROTO_INET, "kuport"), "table inet kuport"},
		{"its element deleted", nft(unix.NFT_MSG_DELSETELEM, unix.NFPROTO_INET, "kuport"), "table inet kuport"},
		{"table ip kuport", nft(unix.NFT_MSG_DELTABLE, unix.NFPROTO_IPV4, "kuport"), ""},
		{"table ip filter", nft(unix.NFT_MSG_NEWRULE, unix.NFPROTO_IPV4, "filter"), ""},
		{"the generation", gen, ""},
	} {
		assert.Equal(t, c.want, ownedNFT(c.m), c.name)
	}
}
