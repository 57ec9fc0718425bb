package datapath

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestTraceGolden traces flows through the golden programs (testdata/*.program.json): one
// per rule form, each checked against the founding document's rule it renders.
func TestTraceGolden(t *testing.T) {
	programs := goldenPrograms(t)
	client := netip.MustParseAddrPort("198.51.100.7:40000")
	tcp, udp := kuportv1.Protocol_PROTOCOL_TCP, kuportv1.Protocol_PROTOCOL_UDP
	ap := netip.MustParseAddrPort
	cases := []struct {
		name, program string
		pkt           Packet
		want          Verdict
	}{{
		name: "same node", program: "local-edge-a",
		pkt: Packet{In: "wt0", Proto: tcp, Src: client, Dst: ap("100.64.93.143:3000"), Out: "cilium_host"},
		want: Verdict{DNAT: ap("10.244.17.7:3000"), Out: "cilium_host", SNAT: "cilium_host", Elements: []string{
			"kup-count-in count-in-ports demo/local/dnat/wt0",
			"kup-pre dnat-ports demo/local/dnat/wt0",
			"kup-post snat-request demo/local/snat",
			"kup-count-out count-out-ports demo/local/dnat/wt0"}},
	}, {
		name: "same node, another protocol", program: "local-edge-a",
		pkt:  Packet{In: "wt0", Proto: udp, Src: client, Dst: ap("100.64.93.143:3000"), Out: "cilium_host"},
		want: Verdict{Out: "cilium_host"},
	}, {
		name: "range keeps the port", program: "ranges-edge-a",
		pkt: Packet{In: "enp1s0", Proto: udp, Src: client, Dst: ap("203.0.113.9:27100"), Out: "cilium_host"},
		want: Verdict{DNAT: ap("10.244.17.9:27100"), Out: "cilium_host", SNAT: "cilium_host", Elements: []string{
			"kup-count-in count-in-ports games/server/dnat/enp1s0",
			"kup-pre dnat-ports games/server/dnat/enp1s0",
			"kup-post snat-request games/server/snat",
			"kup-count-out count-out-ports games/server/dnat/enp1s0"}},
	}, {
		name: "shifted range maps port by port", program: "ranges-edge-a",
		pkt: Packet{In: "enp1s0", Proto: tcp, Src: client, Dst: ap("203.0.113.9:40009"), Out: "cilium_host"},
		want: Verdict{DNAT: ap("10.244.17.9:7009"), Out: "cilium_host", SNAT: "cilium_host", Elements: []string{
			"kup-count-in count-in-ports games/shifted/dnat/enp1s0",
			"kup-pre dnat-ports games/shifted/dnat/enp1s0",
			"kup-post snat-request games/shifted/snat",
			"kup-count-out count-out-ports games/shifted/dnat/enp1s0"}},
	}, {
		name: "cross node, accepting node", program: "remote-edge-a",
		pkt: Packet{In: "enp1s0", Proto: tcp, Src: client, Dst: ap("203.0.113.9:3000")},
		want: Verdict{DNAT: ap("169.254.77.1:3000"), Out: "kup-5e30a797", SNAT: "kup-5e30a797", Elements: []string{
			"kup-count-in count-in-ports demo/remote/dnat/enp1s0",
			"kup-pre dnat-ports demo/remote/dnat/enp1s0",
			"kup-post snat-request demo/remote/snat",
			"kup-count-out count-out-ports demo/remote/dnat/enp1s0"}},
	}, {
		name: "cross node Single, pod's node", program: "remote-worker-b",
		pkt: Packet{In: "kup-dcc4266d", Proto: tcp, Src: client, Dst: ap("169.254.77.1:3000"), Out: "cilium_host"},
		want: Verdict{DNAT: ap("10.244.18.107:3000"), Out: "cilium_host", SNAT: "cilium_host", Mark: 0x6b700001,
			Route: &Route{Table: 201, Link: "kup-dcc4266d", Via: netip.MustParseAddr("169.254.77.0")}, Elements: []string{
				"kup-count-in count-in-addr-ports demo/remote/dnat/kup-dcc4266d",
				"kup-pre dnat-addr-ports demo/remote/dnat/kup-dcc4266d",
				"kup-post snat-request demo/remote/snat",
				"kup-mangle mark-static demo/remote/mark",
				"kup-count-out count-out-addr-ports demo/remote/dnat/kup-dcc4266d"}},
	}, {
		name: "Multi, through worker-c", program: "multi-worker-b",
		pkt: Packet{In: "kup-d86d73d7", Proto: tcp, Src: client, Dst: ap("169.254.79.2:3000"), Out: "cilium_host"},
		want: Verdict{DNAT: ap("10.244.18.107:3000"), Out: "cilium_host", SNAT: "cilium_host", CtMark: 0x6b700002, Mark: 0x6b700002,
			Route: &Route{Table: 202, Link: "kup-d86d73d7", Via: netip.MustParseAddr("169.254.79.3")}, Elements: []string{
				"kup-mangle mark-ct-save demo/remote/ct-save/kup-d86d73d7",
				"kup-count-in count-in-addr-ports demo/remote/dnat/kup-d86d73d7",
				"kup-pre dnat-addr-ports demo/remote/dnat/kup-d86d73d7",
				"kup-post snat-request demo/remote/snat",
				"kup-mangle mark-ct-restore demo/remote/ct-restore",
				"kup-count-out count-out-addr-ports demo/remote/dnat/kup-d86d73d7"}},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, ok := programs[c.program]
			require.True(t, ok, c.program)
			got, err := Trace(p, c.pkt)
			require.NoError(t, err)
			assert.Equal(t, &c.want, got)
		})
	}
}
