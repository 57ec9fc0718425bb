package datapath

import (
	"encoding/binary"
	"testing"

	"github.com/mdlayher/netlink"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func nlAttrs(t *testing.T, as ...netlink.Attribute) []byte {
	t.Helper()
	b, err := netlink.MarshalAttributes(as)
	require.NoError(t, err)
	return b
}

// nlmsg is one netlink message of type typ and sequence seq around data.
func nlmsg(typ uint16, seq uint32, data []byte) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(data)+3)
	binary.NativeEndian.PutUint32(b, uint32(unix.NLMSG_HDRLEN+len(data)))
	binary.NativeEndian.PutUint16(b[4:], typ)
	binary.NativeEndian.PutUint32(b[8:], seq)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// TestDumpMessages reads an element dump as the kernel sends it: elements with a counter
// as their one expression (NFTA_SET_ELEM_EXPR) or in a list (NFTA_SET_ELEM_EXPRESSIONS), with
// a comment or without, one without a counter, one without a key, a message of another
// sequence, the end; and an error.
func TestDumpMessages(t *testing.T) {
	counter := func(packets, bytes uint64) []byte {
		return nlAttrs(t, netlink.Attribute{Type: unix.NFTA_EXPR_NAME, Data: []byte("counter\x00")},
			netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA, Data: nlAttrs(t,
				netlink.Attribute{Type: unix.NFTA_COUNTER_BYTES, Data: binary.BigEndian.AppendUint64(nil, bytes)},
				netlink.Attribute{Type: unix.NFTA_COUNTER_PACKETS, Data: binary.BigEndian.AppendUint64(nil, packets)})})
	}
	comment := func(id string) netlink.Attribute {
		return netlink.Attribute{Type: unix.NFTA_SET_ELEM_USERDATA, Data: append([]byte{0, byte(len(id) + 1)}, id+"\x00"...)}
	}
	key := func(k string) netlink.Attribute {
		return netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_KEY, Data: nlAttrs(t, netlink.Attribute{Type: unix.NFTA_DATA_VALUE, Data: []byte(k)})}
	}
	elem := func(as ...netlink.Attribute) netlink.Attribute {
		return netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: nlAttrs(t, as...)}
	}
	list := nlAttrs(t, netlink.Attribute{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte("kuport\x00")},
		netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_LIST_ELEMENTS, Data: nlAttrs(t,
			elem(key("ka"), comment("a"), netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_EXPR, Data: counter(3, 300)}),
			elem(key("kb"), netlink.Attribute{Type: unix.NLA_F_NESTED | nftaSetElemExpressions, Data: nlAttrs(t,
				netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: nlAttrs(t, netlink.Attribute{Type: unix.NFTA_EXPR_NAME, Data: []byte("limit\x00")})},
				netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: counter(5, 500)})}),
			elem(netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_EXPR, Data: counter(7, 700)}),
			elem(key("kd"), comment("d")))})
	const newElem = unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSETELEM
	var b []byte
	b = append(b, nlmsg(newElem, 9, append([]byte{unix.AF_INET, 0, 0, 0}, list...))...)
	b = append(b, nlmsg(newElem, 8, append([]byte{unix.AF_INET, 0, 0, 0}, list...))...)
	got := map[string][2]uint64{}
	done, err := dumpMessages(b, 9, func(c []byte, p, by uint64) { got[string(c)] = [2]uint64{p, by} })
	require.NoError(t, err)
	assert.False(t, done)
	assert.Equal(t, map[string][2]uint64{"ka": {3, 300}, "kb": {5, 500}}, got)

	done, err = dumpMessages(nlmsg(unix.NLMSG_DONE, 9, []byte{0, 0, 0, 0}), 9, nil)
	assert.True(t, done)
	assert.NoError(t, err)
	errno := make([]byte, 4)
	code := -int32(unix.ENOENT)
	binary.NativeEndian.PutUint32(errno, uint32(code))
	done, err = dumpMessages(nlmsg(unix.NLMSG_ERROR, 9, errno), 9, nil)
	assert.True(t, done)
	assert.ErrorIs(t, err, unix.ENOENT)
	_, err = dumpMessages([]byte{200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 9, nil)
	assert.Error(t, err, "a message longer than the read")
}
