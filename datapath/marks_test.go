package datapath

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestPrivilegedReturnMarkKeepsOthersBits sends a request through a mapping whose flow
// saves return mark 0x1 under the default mask 0x301f, while another table (a CNI's or
// kube-proxy's, at mangle priority, before kup-mangle) sets bit 0x10000000 in every flow's
// conntrack mark and 0x4000 in every packet's mark. kuport writes only its bits: the flow's
// conntrack mark is 0x10000001, the pod's reply carries 0x4001, and the divert rule
// (fwmark 0x1/0x301f) still sends it to the return path's table, out of the link.
func TestPrivilegedReturnMarkKeepsOthersBits(t *testing.T) {
	testenv.Privileged(t)
	tn := newTestNS(t, "100.64.93.150")
	tn.addPod(t, "10.244.17.5", 3000)
	client := tn.addPeer(t, "enp1s0", "203.0.113.9", "203.0.113.7")
	udp := kuportv1.Protocol_PROTOCOL_UDP
	port := &kuportv1.PortRange{First: 4000, Last: 4000}
	pod := &kuportv1.PortRange{First: 3000, Last: 3000}
	p := &kuportv1.NodeProgram{Node: "worker-b", Version: 1,
		ReturnMarking: &kuportv1.ReturnMarking{MarkMask: 0x301f, LoopGuardPref: 101, DivertPref: 102, FirstTable: 27505, LastTable: 27631},
		Links: []*kuportv1.Link{{Name: "kup-marks", ClassName: "c", PeerNode: "edge-a", Vni: 4242, Port: 4790,
			LocalUnderlay: "100.64.93.150", RemoteUnderlay: "100.64.93.143", LocalAddress: "169.254.77.1", PeerAddress: "169.254.77.0", Mtu: 1370}},
		ReturnPaths: []*kuportv1.ReturnPath{{Id: "kup-marks/return", Link: "kup-marks", Mark: 0x1, Table: 27505,
			PeerUnderlay: "100.64.93.143", PeerLinkAddress: "169.254.77.0"}},
		DnatRules: []*kuportv1.DnatRule{{Id: "m/dnat", Mapping: "m", InInterface: "enp1s0", Protocol: udp, Ports: port,
			ToAddress: "10.244.17.5", ToPort: 3000, StandIn: "10.244.17.5"}},
		MarkRules: []*kuportv1.MarkRule{
			{Id: "m/ct-save", Mapping: "m", Kind: kuportv1.MarkKind_MARK_KIND_CT_SAVE, InInterface: "enp1s0",
				Address: "203.0.113.9", Protocol: udp, Ports: port, Mark: 0x1},
			{Id: "m/ct-restore", Mapping: "m", Kind: kuportv1.MarkKind_MARK_KIND_CT_RESTORE, Address: "10.244.17.5", Protocol: udp, Ports: pod},
		},
	}
	require.NoError(t, tn.dp.Apply(p))
	for _, args := range [][]string{
		{"nft", "add", "table", "ip", "other"},
		{"nft", "add", "chain", "ip", "other", "mangle", "{ type filter hook prerouting priority mangle; }"},
		{"nft", "add", "rule", "ip", "other", "mangle", "ct", "mark", "set", "ct", "mark", "or", "0x10000000"},
		{"nft", "add", "rule", "ip", "other", "mangle", "meta", "mark", "set", "meta", "mark", "or", "0x4000"},
		{"nft", "add", "chain", "ip", "other", "forward", "{ type filter hook forward priority filter; }"},
		{"nft", "add", "rule", "ip", "other", "forward", "oifname", "kup-marks", "meta", "mark", "0x4001", "counter"},
	} {
		tn.exec(t, args...)
	}
	client.sendUDP(t, 40000, "203.0.113.9", 4000)

	diverted := regexp.MustCompile(`meta mark 0x00004001 counter packets (\d+)`)
	packets := func() int {
		m := diverted.FindStringSubmatch(tn.exec(t, "nft", "list", "chain", "ip", "other", "forward"))
		require.NotNil(t, m)
		n, _ := strconv.Atoi(m[1])
		return n
	}
	deadline := time.Now().Add(5 * time.Second)
	for packets() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.Equal(t, 1, packets(), "the reply left by the link with the other's bit and the return mark")

	flows, err := tn.nl.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
	require.NoError(t, err)
	var marks []uint32
	for _, f := range flows {
		if f.Forward.DstPort == 4000 {
			marks = append(marks, f.Mark)
		}
	}
	assert.Equal(t, []uint32{0x10000001}, marks, "the flow's conntrack mark keeps the other's bit")
}
