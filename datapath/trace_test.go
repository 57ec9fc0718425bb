package datapath

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestTraceGolden traces flows through the golden programs (testdata/*.program.json): one per
// rule form, each checked against the rule of docs/design/datapath.md it renders.
func TestTraceGolden(t *testing.T) {
	programs := goldenPrograms(t)
	client := netip.MustParseAddrPort("198.51.100.7:40000")
	client6 := netip.MustParseAddrPort("[2001:db8:100::7]:40000")
	tcp, udp := kuportv1.Protocol_PROTOCOL_TCP, kuportv1.Protocol_PROTOCOL_UDP
	ap, addr := netip.MustParseAddrPort, netip.MustParseAddr
	cases := []struct {
		name, program string
		pkt           Packet
		want          Verdict
	}{{
		name: "same node", program: "local-edge-a",
		pkt: Packet{In: "wt0", Proto: tcp, Src: client, Dst: ap("100.64.93.143:3000"), Out: "cilium_host"},
		want: Verdict{StandIn: addr("10.244.17.7"), DNAT: ap("10.244.17.7:3000"), Out: "cilium_host", SNAT: "cilium_host", Elements: []string{
			"kup-steer steer-ports demo/local/dnat/wt0",
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
		want: Verdict{StandIn: addr("10.244.17.9"), DNAT: ap("10.244.17.9:27100"), Out: "cilium_host", SNAT: "cilium_host", Elements: []string{
			"kup-steer steer-ranges games/server/dnat/enp1s0",
			"kup-pre dnat-ranges games/server/dnat/enp1s0",
			"kup-post snat-request-ranges games/server/snat",
			"kup-count-out count-out-ranges games/server/dnat/enp1s0"}},
	}, {
		name: "shifted range maps port by port", program: "ranges-edge-a",
		pkt: Packet{In: "enp1s0", Proto: tcp, Src: client, Dst: ap("203.0.113.9:40009"), Out: "cilium_host"},
		want: Verdict{StandIn: addr("10.244.17.9"), DNAT: ap("10.244.17.9:7009"), Out: "cilium_host", SNAT: "cilium_host", Elements: []string{
			"kup-steer steer-ports games/shifted/dnat/enp1s0",
			"kup-pre dnat-ports games/shifted/dnat/enp1s0",
			"kup-post snat-request-ranges games/shifted/snat",
			"kup-count-out count-out-ports games/shifted/dnat/enp1s0"}},
	}, {
		name: "cross node, accepting node", program: "remote-edge-a",
		pkt: Packet{In: "enp1s0", Proto: tcp, Src: client, Dst: ap("203.0.113.9:3000")},
		want: Verdict{StandIn: addr("169.254.77.1"), DNAT: ap("169.254.77.1:3000"), Out: "kup-5e30a797", SNAT: "kup-5e30a797", Elements: []string{
			"kup-steer steer-ports demo/remote/dnat/enp1s0",
			"kup-pre dnat-ports demo/remote/dnat/enp1s0",
			"kup-post snat-request demo/remote/snat",
			"kup-count-out count-out-ports demo/remote/dnat/enp1s0"}},
	}, {
		name: "cross node Single, pod's node", program: "remote-worker-b",
		pkt: Packet{In: "kup-dcc4266d", Proto: tcp, Src: client, Dst: ap("169.254.77.1:3000"), Out: "cilium_host"},
		want: Verdict{StandIn: addr("10.244.18.107"), DNAT: ap("10.244.18.107:3000"), Out: "cilium_host", SNAT: "cilium_host",
			CtMark: 0x1, Mark: 0x1,
			Route: &Route{Table: 27505, Link: "kup-dcc4266d", Via: netip.MustParseAddr("169.254.77.0")}, Elements: []string{
				"kup-mangle mark-ct-save demo/remote/ct-save/kup-dcc4266d",
				"kup-steer steer-addr-ports demo/remote/dnat/kup-dcc4266d",
				"kup-pre dnat-addr-ports demo/remote/dnat/kup-dcc4266d",
				"kup-post snat-request demo/remote/snat",
				"kup-mangle mark-ct-restore demo/remote/ct-restore",
				"kup-mangle return-marks",
				"kup-count-out count-out-addr-ports demo/remote/dnat/kup-dcc4266d"}},
	}, {
		name: "cross node, accepting node, IPv6 client", program: "dualstack-edge-a",
		pkt: Packet{In: "enp1s0", Proto: tcp, Src: client6, Dst: ap("[2001:db8:9::9]:3001")},
		want: Verdict{StandIn: addr("fd64:f5ac:e961::1"), DNAT: ap("[fd64:f5ac:e961::1]:3001"), Out: "kup-5e30a797", SNAT: "kup-5e30a797", Elements: []string{
			"kup-steer ip6-steer-ports demo/remote/dnat6/enp1s0",
			"kup-pre ip6-dnat-ports demo/remote/dnat6/enp1s0",
			"kup-post ip6-snat-request demo/remote/snat6",
			"kup-count-out ip6-count-out-ports demo/remote/dnat6/enp1s0"}},
	}, {
		name: "cross node, accepting node, IPv4 client of a dual-stack mapping", program: "dualstack-edge-a",
		pkt: Packet{In: "enp1s0", Proto: tcp, Src: client, Dst: ap("203.0.113.9:3001")},
		want: Verdict{StandIn: addr("169.254.77.1"), DNAT: ap("169.254.77.1:3001"), Out: "kup-5e30a797", SNAT: "kup-5e30a797", Elements: []string{
			"kup-steer steer-ports demo/remote/dnat/enp1s0",
			"kup-pre dnat-ports demo/remote/dnat/enp1s0",
			"kup-post snat-request demo/remote/snat",
			"kup-count-out count-out-ports demo/remote/dnat/enp1s0"}},
	}, {
		name: "cross node Single, pod's node, IPv6 client", program: "dualstack-worker-b",
		pkt: Packet{In: "kup-dcc4266d", Proto: tcp, Src: client6, Dst: ap("[fd64:f5ac:e961::1]:3001"), Out: "cilium_host"},
		want: Verdict{StandIn: addr("fd00:18::107"), DNAT: ap("[fd00:18::107]:3001"), Out: "cilium_host", SNAT: "cilium_host",
			CtMark: 0x1, Mark: 0x1,
			Route: &Route{Table: 27505, Link: "kup-dcc4266d", Via: netip.MustParseAddr("fd64:f5ac:e961::")}, Elements: []string{
				"kup-mangle ip6-mark-ct-save demo/remote/ct-save6/kup-dcc4266d",
				"kup-steer ip6-steer-addr-ports demo/remote/dnat6/kup-dcc4266d",
				"kup-pre ip6-dnat-addr-ports demo/remote/dnat6/kup-dcc4266d",
				"kup-post ip6-snat-request demo/remote/snat6",
				"kup-mangle ip6-mark-ct-restore demo/remote/ct-restore6",
				"kup-mangle return-marks",
				"kup-count-out ip6-count-out-addr-ports demo/remote/dnat6/kup-dcc4266d"}},
	}, {
		name: "cross node Single, pod's node, as older controllers marked it", program: "static-worker-b",
		pkt: Packet{In: "kup-dcc4266d", Proto: tcp, Src: client, Dst: ap("169.254.77.1:3000"), Out: "cilium_host"},
		want: Verdict{StandIn: addr("10.244.18.107"), DNAT: ap("10.244.18.107:3000"), Out: "cilium_host", SNAT: "cilium_host", Mark: 0x6b700001,
			Route: &Route{Table: 201, Link: "kup-dcc4266d", Via: netip.MustParseAddr("169.254.77.0")}, Elements: []string{
				"kup-steer steer-addr-ports demo/remote/dnat/kup-dcc4266d",
				"kup-pre dnat-addr-ports demo/remote/dnat/kup-dcc4266d",
				"kup-post snat-request demo/remote/snat",
				"kup-mangle mark-static demo/remote/mark",
				"kup-count-out count-out-addr-ports demo/remote/dnat/kup-dcc4266d"}},
	}, {
		name: "Multi, through worker-c", program: "multi-worker-b",
		pkt: Packet{In: "kup-d86d73d7", Proto: tcp, Src: client, Dst: ap("169.254.79.2:3000"), Out: "cilium_host"},
		want: Verdict{StandIn: addr("10.244.18.107"), DNAT: ap("10.244.18.107:3000"), Out: "cilium_host", SNAT: "cilium_host", CtMark: 0x2, Mark: 0x2,
			Route: &Route{Table: 27506, Link: "kup-d86d73d7", Via: netip.MustParseAddr("169.254.79.3")}, Elements: []string{
				"kup-mangle mark-ct-save demo/remote/ct-save/kup-d86d73d7",
				"kup-steer steer-addr-ports demo/remote/dnat/kup-d86d73d7",
				"kup-pre dnat-addr-ports demo/remote/dnat/kup-d86d73d7",
				"kup-post snat-request demo/remote/snat",
				"kup-mangle mark-ct-restore demo/remote/ct-restore",
				"kup-mangle return-marks",
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

// TestPrivilegedTraceAgrees is the differential test of Trace: UDP exchanges from a client
// through the kernel holding a program (two mappings dialed on 4000 and 4001 to one pod
// port, a shifted range 5000-5009 to 2995-3004, a range 2990-3010 that keeps its ports, whose
// identity SNAT overlaps the shifted range's and is written port by port, each steered to
// the pod's address), each of whose element counters moved
// compared with the elements Trace says the flow matches; the pod answers on 3000 only,
// so an answer shows the translation Trace gives.
func TestPrivilegedTraceAgrees(t *testing.T) {
	testenv.Privileged(t)
	tn := newTestNS(t, "100.64.93.143")
	tn.addPod(t, "10.244.17.5", 3000)
	client := tn.addPeer(t, "enp1s0", "203.0.113.9", "203.0.113.7")
	udp := kuportv1.Protocol_PROTOCOL_UDP
	mapping := func(key string, first, last, to uint32) (*kuportv1.DnatRule, *kuportv1.SnatRule) {
		return &kuportv1.DnatRule{Id: key + "/dnat/enp1s0", Mapping: key, InInterface: "enp1s0", Protocol: udp,
				Ports: &kuportv1.PortRange{First: first, Last: last}, ToAddress: "10.244.17.5", ToPort: to, StandIn: "10.244.17.5"},
			&kuportv1.SnatRule{Id: key + "/snat", Mapping: key, Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
				Address: "10.244.17.5", Protocol: udp, Ports: &kuportv1.PortRange{First: to, Last: to + last - first}}
	}
	p := &kuportv1.NodeProgram{Node: "edge-a", Version: 1}
	for _, m := range []struct {
		key             string
		first, last, to uint32
	}{{"g/a", 4000, 4000, 3000}, {"g/b", 4001, 4001, 3000}, {"g/shifted", 5000, 5009, 2995}, {"g/range", 2990, 3010, 2990}} {
		d, s := mapping(m.key, m.first, m.last, m.to)
		p.DnatRules, p.SnatRules = append(p.DnatRules, d), append(p.SnatRules, s)
	}
	require.NoError(t, tn.dp.Apply(p))

	// moved is every counter that moved since before, as "<id> <field>".
	counts := func() map[string]uint64 {
		cs, err := tn.dp.Counters()
		require.NoError(t, err)
		out := map[string]uint64{}
		for _, c := range cs {
			out[c.GetId()+" packets"] = c.GetPackets()
			out[c.GetId()+" forwarded_in"] = c.GetForwardedIn().GetPackets()
			out[c.GetId()+" forwarded_out"] = c.GetForwardedOut().GetPackets()
		}
		return out
	}
	field := map[string]string{"kup-pre": "packets", "kup-post": "packets", "kup-mangle": "packets",
		"kup-steer": "forwarded_in", "kup-count-out": "forwarded_out"}
	for _, dport := range []uint16{4000, 4001, 5005, 3000} {
		before := counts()
		text, from := client.exchangeUDP(t, "203.0.113.9", int(dport))
		assert.Equal(t, "203.0.113.7", text, "the pod saw the client")
		var moved []string
		for k, n := range counts() {
			if n != before[k] {
				moved = append(moved, k)
			}
		}
		src, err := netip.ParseAddrPort(from)
		require.NoError(t, err)
		v, err := Trace(p, Packet{In: "enp1s0", Proto: udp, Src: netip.AddrPortFrom(netip.MustParseAddr("203.0.113.7"), 40000),
			Dst: netip.AddrPortFrom(netip.MustParseAddr("203.0.113.9"), dport), Out: "cilium_host"})
		require.NoError(t, err)
		assert.Equal(t, netip.MustParseAddrPort("10.244.17.5:3000"), v.DNAT, "dport %d", dport)
		assert.Equal(t, "cilium_host", v.SNAT, "dport %d", dport)
		assert.Equal(t, netip.AddrPortFrom(netip.MustParseAddr("203.0.113.9"), dport), src, "the answer comes from the dialed port")
		assert.Equal(t, netip.MustParseAddr("10.244.17.5"), v.StandIn, "dport %d", dport)
		var traced []string
		for _, e := range v.Elements {
			f := strings.SplitN(e, " ", 3)
			traced = append(traced, f[2]+" "+field[f[0]])
		}
		slices.Sort(moved)
		slices.Sort(traced)
		assert.Equal(t, traced, moved, "dport %d: the counters that moved are the traced elements'", dport)
	}
}
