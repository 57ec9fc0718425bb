package datapath

import (
	"maps"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"google.golang.org/protobuf/proto"

	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// dnat builds a DNAT entry: iifname "enp1s0" (or the link with its address when daddr is
// set) <proto> dport first-last dnat to addr:to.
func dnat(id string, proto kuportv1.Protocol, first, last uint32, daddr, addr string, to uint32) *kuportv1.DnatRule {
	e := &kuportv1.DnatRule{Id: id, InInterface: "enp1s0", MatchDestination: daddr, Protocol: proto,
		Ports: &kuportv1.PortRange{First: first, Last: last}, ToAddress: addr, ToPort: to}
	if daddr != "" {
		e.InInterface = "kup-dcc4266d"
	}
	return e
}

// steered are the entries with the stand-in compile gives them: their target.
func steered(entries []*kuportv1.DnatRule) []*kuportv1.DnatRule {
	out := make([]*kuportv1.DnatRule, len(entries))
	for i, e := range entries {
		c := proto.Clone(e).(*kuportv1.DnatRule)
		c.StandIn = c.ToAddress
		out[i] = c
	}
	return out
}

// tableOf plans DNAT entries, all valid.
func tableOf(t *testing.T, entries ...*kuportv1.DnatRule) *table {
	t.Helper()
	tbl, errs := planTable(&kuportv1.NodeProgram{DnatRules: entries})
	require.Empty(t, errs)
	return tbl
}

// ctFlow is a conntrack entry: the original tuple src:sport -> dst:dport, and the reply's
// source replySrc:replyPort (the DNAT target, or dst:dport when not translated).
func ctFlow(proto uint8, src string, sport uint16, dst string, dport uint16, replySrc string, replyPort uint16) *netlink.ConntrackFlow {
	return &netlink.ConntrackFlow{FamilyType: netlink.FAMILY_V4,
		Forward: netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP(src).To4(), SrcPort: sport, DstIP: net.ParseIP(dst).To4(), DstPort: dport},
		Reverse: netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP(replySrc).To4(), SrcPort: replyPort, DstIP: net.ParseIP(src).To4(), DstPort: sport},
	}
}

// TestStaleFlows runs each case with the entries as they are and steered (kup-steer writes
// their target over the dialed destination, and a link's DNAT element matches the target):
// conntrack records the dialed destination either way, so the same entries go.
func TestStaleFlows(t *testing.T) {
	t.Run("dialed", func(t *testing.T) { testStaleFlows(t, false) })
	t.Run("steered", func(t *testing.T) { testStaleFlows(t, true) })
}

func testStaleFlows(t *testing.T, steer bool) {
	const (
		udp    = kuportv1.Protocol_PROTOCOL_UDP
		tcp    = kuportv1.Protocol_PROTOCOL_TCP
		client = "198.51.100.7"
		node   = "203.0.113.9"
		link   = "169.254.77.1"
	)
	unchanged := dnat("a/other/dnat/enp1s0", udp, 3001, 3001, "", "10.244.17.5", 3001)
	old := []*kuportv1.DnatRule{
		dnat("a/moves/dnat/enp1s0", udp, 3000, 3000, "", "10.244.17.5", 3000),
		unchanged,
		dnat("a/gone/dnat/enp1s0", tcp, 4000, 4000, "", "10.244.17.5", 4000),
		dnat("a/range/dnat/enp1s0", udp, 27015, 27115, "", "10.244.17.5", 27015),
		dnat("a/shifted/dnat/enp1s0", tcp, 40000, 40009, "", "10.244.17.5", 7000),
		dnat("a/link/dnat/kup-dcc4266d", tcp, 5000, 5000, link, "10.244.18.107", 5000),
		dnat("a/renamed/dnat/enp1s0", udp, 6000, 6000, "", "10.244.17.5", 6000),
	}
	want := []*kuportv1.DnatRule{
		dnat("a/moves/dnat/enp1s0", udp, 3000, 3000, "", "10.244.17.6", 3000),
		unchanged,
		dnat("a/range/dnat/enp1s0", udp, 27015, 27115, "", "10.244.17.6", 27015),
		dnat("a/shifted/dnat/enp1s0", tcp, 40000, 40009, "", "10.244.17.6", 7000),
		dnat("a/link/dnat/kup-dcc4266d", tcp, 5000, 5000, link, "10.244.18.120", 5000),
		dnat("b/renamed/dnat/enp1s0", udp, 6000, 6000, "", "10.244.17.5", 6000),
		dnat("a/new/dnat/enp1s0", udp, 3002, 3002, "", "10.244.17.5", 3002),
	}
	if steer {
		old, want = steered(old), steered(want)
		unchanged = old[1]
	}
	s := tableStaleFlows(tableOf(t, old...), tableOf(t, want...))
	require.NotNil(t, s)
	// The link's address is not in the local table: this change removed the link (the
	// rule's destination match makes it local all the same).
	route := func(prefix string) netlink.Route {
		_, dst, err := net.ParseCIDR(prefix)
		require.NoError(t, err)
		return netlink.Route{Dst: dst}
	}
	s.setLocal([]netlink.Route{route(node + "/32"), route("127.0.0.0/8")})

	for _, c := range []struct {
		name  string
		flow  *netlink.ConntrackFlow
		stale bool
	}{
		{"to the old target", ctFlow(17, client, 5555, node, 3000, "10.244.17.5", 3000), true},
		{"to the new target", ctFlow(17, client, 5555, node, 3000, "10.244.17.6", 3000), false},
		{"unchanged rule", ctFlow(17, client, 5555, node, 3001, "10.244.17.5", 3001), false},
		{"rule removed", ctFlow(6, client, 5555, node, 4000, "10.244.17.5", 4000), true},
		{"other protocol", ctFlow(6, client, 5555, node, 3000, "10.244.17.5", 3000), false},
		{"range keeps the port", ctFlow(17, client, 5555, node, 27064, "10.244.17.5", 27064), true},
		{"range, port outside", ctFlow(17, client, 5555, node, 27116, "10.244.17.5", 27116), false},
		{"shifted range by its map", ctFlow(6, client, 5555, node, 40003, "10.244.17.5", 7003), true},
		{"shifted range, not what the map gave", ctFlow(6, client, 5555, node, 40003, "10.244.17.5", 7000), false},
		{"link rule, old pod", ctFlow(6, client, 5555, link, 5000, "10.244.18.107", 5000), true},
		{"link rule, other destination", ctFlow(6, client, 5555, node, 5000, "10.244.18.107", 5000), false},
		{"same rule under another id", ctFlow(17, client, 5555, node, 6000, "10.244.17.5", 6000), false},
		{"un-NATed, rule added", ctFlow(17, client, 5555, node, 3002, node, 3002), true},
		{"un-NATed, rule changed", ctFlow(17, client, 5555, node, 3000, node, 3000), true},
		{"un-NATed, rule unchanged", ctFlow(17, client, 5555, node, 3001, node, 3001), false},
		{"un-NATed, no rule", ctFlow(17, client, 5555, node, 3003, node, 3003), false},
		{"from this node", ctFlow(17, node, 5555, node, 3000, "10.244.17.5", 3000), false},
		{"un-NATed from this node", ctFlow(17, node, 5555, node, 3002, node, 3002), false},
		{"forwarded, not to this node", ctFlow(17, client, 5555, "192.0.2.1", 3000, "10.244.17.5", 3000), false},
		{"un-NATed forwarded", ctFlow(17, client, 5555, "192.0.2.1", 3002, "192.0.2.1", 3002), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.stale, s.MatchConntrackFlow(c.flow))
		})
	}

	assert.Nil(t, tableStaleFlows(tableOf(t, old...), tableOf(t, old...)), "the same DNAT entries change nothing")
	assert.Nil(t, tableStaleFlows(nil, tableOf(t)))
	marked, errs := planTable(&kuportv1.NodeProgram{DnatRules: old, MarkRules: []*kuportv1.MarkRule{{Id: "m",
		Kind: kuportv1.MarkKind_MARK_KIND_STATIC, Address: "10.244.17.5", Protocol: tcp, Ports: &kuportv1.PortRange{First: 1, Last: 1}, Mark: 1}}})
	require.Empty(t, errs)
	assert.Nil(t, tableStaleFlows(tableOf(t, old...), marked), "only DNAT elements count")
	assert.NotNil(t, tableStaleFlows(tableOf(t, old...), tableOf(t, old[1:]...)), "an entry removed")
	assert.NotNil(t, tableStaleFlows(tableOf(t, old[1:]...), tableOf(t, old...)), "an entry added")
	tcpAdded := dnat("a/tcp/dnat/enp1s0", tcp, 5001, 5001, "", "10.244.17.5", 5001)
	assert.Nil(t, tableStaleFlows(tableOf(t, old...), tableOf(t, append(slices.Clone(old), tcpAdded)...)), "a TCP entry added sweeps nothing")
}

// flowsBySport lists the namespace's IPv4 conntrack entries of protocol proto by original
// source port, as "<original destination>:<port> -> <reply source>:<port>".
func (tn *testNS) flowsBySport(t *testing.T, proto uint8) map[uint16]string {
	t.Helper()
	flows, err := tn.nl.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
	require.NoError(t, err)
	out := map[uint16]string{}
	for _, f := range flows {
		if f.Forward.Protocol == proto {
			out[f.Forward.SrcPort] = net.JoinHostPort(f.Forward.DstIP.String(), itoa(uint32(f.Forward.DstPort))) + " -> " +
				net.JoinHostPort(f.Reverse.SrcIP.String(), itoa(uint32(f.Reverse.SrcPort)))
		}
	}
	return out
}

// waitFlows waits until the namespace's UDP conntrack entries are want, as flowsBySport
// shows them, and asserts they are: a datagram sent reaches the node shortly after, not at
// once (the client resolves the node's address first).
func (tn *testNS) waitFlows(t *testing.T, want map[uint16]string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !maps.Equal(want, tn.flowsBySport(t, 17)) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.Equal(t, want, tn.flowsBySport(t, 17))
}

// udpRule is mapping's UDP DNAT entry on enp1s0: port to pod at the same port.
func udpRule(mapping string, port uint32, pod string) *kuportv1.DnatRule {
	return &kuportv1.DnatRule{Id: mapping + "/dnat/enp1s0", Mapping: mapping, InInterface: "enp1s0",
		Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: &kuportv1.PortRange{First: port, Last: port}, ToAddress: pod, ToPort: port}
}

// edgeProgram is edge-a's program of DNAT entries rules.
func edgeProgram(rules ...*kuportv1.DnatRule) *kuportv1.NodeProgram {
	return &kuportv1.NodeProgram{Node: "edge-a", DnatRules: rules}
}

// TestSweepPutOff: with a SweepDelay, the changes of Applies back to back are swept together,
// in one read of the conntrack table, by a filter that deletes what any of them left going
// the old way and nothing the last program translates the same way; SweepNow and Cleanup
// sweep at once.
func TestSweepPutOff(t *testing.T) {
	k := newFakeKernel("100.64.93.143")
	d := k.over(nil)
	d.sweepDelay = time.Hour
	const pod5, pod6 = "10.244.17.5", "10.244.17.6"
	require.NoError(t, d.Apply(edgeProgram(udpRule("g/a", 3000, pod5), udpRule("g/b", 3001, pod5), udpRule("g/c", 3002, pod5))))
	require.NoError(t, d.Apply(edgeProgram(udpRule("g/b", 3001, pod5), udpRule("g/c", 3002, pod5))))
	require.NoError(t, d.Apply(edgeProgram(udpRule("g/a", 3000, pod6), udpRule("g/c", 3002, pod5))))
	assert.Empty(t, k.sweeps, "put off")
	assert.Equal(t, 3, d.swept.changes)

	d.SweepNow()
	require.Len(t, k.sweeps, 1, "one read of the table for the three changes")
	f := k.sweeps[0].(*staleFlows)
	f.local = []netip.Prefix{netip.MustParsePrefix("203.0.113.9/32")}
	const client = "198.51.100.7"
	for _, c := range []struct {
		flow *netlink.ConntrackFlow
		want bool
		why  string
	}{
		{ctFlow(17, client, 5000, "203.0.113.9", 3000, pod5, 3000), true, "g/a's old target, deleted then moved"},
		{ctFlow(17, client, 5001, "203.0.113.9", 3001, pod5, 3001), true, "g/b, deleted"},
		{ctFlow(17, client, 5002, "203.0.113.9", 3002, "203.0.113.9", 3002), true, "past g/c, added by the first"},
		{ctFlow(17, client, 5003, "203.0.113.9", 3000, pod6, 3000), false, "g/a's target now"},
		{ctFlow(17, client, 5004, "203.0.113.9", 3002, pod5, 3002), false, "g/c, unchanged"},
	} {
		assert.Equal(t, c.want, f.MatchConntrackFlow(c.flow), c.why)
	}
	assert.Equal(t, putOffSweep{}, d.swept, "nothing left put off")

	require.NoError(t, d.Apply(edgeProgram(udpRule("g/c", 3002, pod5))))
	assert.Len(t, k.sweeps, 1)
	require.NoError(t, d.Cleanup())
	assert.Len(t, k.sweeps, 2, "Cleanup sweeps the change put off and its own at once")
	assert.Nil(t, d.swept.timer)
}

// TestPrivilegedConntrackSweepPutOff: with the agent's SweepDelay, the flows of mappings
// deleted by Applies back to back are deleted within the delay after the first of them
// returned (and the sweep's own read of the table; the test allows a second for it on a
// loaded machine), and the others' flows stay.
func TestPrivilegedConntrackSweepPutOff(t *testing.T) {
	testenv.Privileged(t)
	tn := newTestNS(t, "100.64.93.143")
	tn.addPodNetwork(t)
	client := tn.addPeer(t, "enp1s0", "203.0.113.9", "203.0.113.7")
	tn.dp.sweepDelay = 250 * time.Millisecond
	const pod = "10.244.17.5"
	const a, b, c, foreign = 5000, 5001, 5002, 5003
	require.NoError(t, tn.dp.Apply(edgeProgram(udpRule("g/a", 3000, pod), udpRule("g/b", 3001, pod), udpRule("g/c", 3002, pod))))
	tn.dp.SweepNow()
	for sport, dport := range map[int]int{a: 3000, b: 3001, c: 3002, foreign: 4000} {
		client.sendUDP(t, sport, "203.0.113.9", dport)
	}
	tn.waitFlows(t, map[uint16]string{
		a:       "203.0.113.9:3000 -> 10.244.17.5:3000",
		b:       "203.0.113.9:3001 -> 10.244.17.5:3001",
		c:       "203.0.113.9:3002 -> 10.244.17.5:3002",
		foreign: "203.0.113.9:4000 -> 203.0.113.9:4000",
	})

	require.NoError(t, tn.dp.Apply(edgeProgram(udpRule("g/b", 3001, pod), udpRule("g/c", 3002, pod))))
	returned := time.Now()
	require.NoError(t, tn.dp.Apply(edgeProgram(udpRule("g/c", 3002, pod))))
	want := map[uint16]string{
		c:       "203.0.113.9:3002 -> 10.244.17.5:3002",
		foreign: "203.0.113.9:4000 -> 203.0.113.9:4000",
	}
	bound := tn.dp.sweepDelay + time.Second
	for !maps.Equal(want, tn.flowsBySport(t, 17)) && time.Since(returned) < bound {
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(returned)
	assert.Equal(t, want, tn.flowsBySport(t, 17))
	assert.Less(t, took, bound)
	t.Logf("the deleted mappings' flows were gone %s after the first delete's Apply returned", took)
}

// TestPrivilegedConntrack sends UDP flows through DNAT rules, changes the program, and
// checks which conntrack entries Apply deleted: the flow whose target moved, the flow that
// arrived before its rule existed, the flow of a removed mapping; never the others.
func TestPrivilegedConntrack(t *testing.T) {
	testenv.Privileged(t)
	tn := newTestNS(t, "100.64.93.143")
	tn.addPodNetwork(t)
	client := tn.addPeer(t, "enp1s0", "203.0.113.9", "203.0.113.7")
	udp, program := udpRule, edgeProgram
	// Source ports name the flows.
	const moves, stays, early, foreign = 5000, 5001, 5002, 5003
	send := func() {
		for sport, dport := range map[int]int{moves: 3000, stays: 3001, early: 3002, foreign: 4000} {
			client.sendUDP(t, sport, "203.0.113.9", dport)
		}
	}

	require.NoError(t, tn.dp.Apply(program(udp("g/moves", 3000, "10.244.17.5"), udp("g/stays", 3001, "10.244.17.5"))))
	send()
	tn.waitFlows(t, map[uint16]string{
		moves:   "203.0.113.9:3000 -> 10.244.17.5:3000",
		stays:   "203.0.113.9:3001 -> 10.244.17.5:3001",
		early:   "203.0.113.9:3002 -> 203.0.113.9:3002",
		foreign: "203.0.113.9:4000 -> 203.0.113.9:4000",
	})

	// The endpoint of g/moves changes, g/early's rule arrives after its client.
	p2 := program(udp("g/moves", 3000, "10.244.17.6"), udp("g/stays", 3001, "10.244.17.5"), udp("g/early", 3002, "10.244.17.5"))
	require.NoError(t, tn.dp.Apply(p2))
	assert.Equal(t, map[uint16]string{
		stays:   "203.0.113.9:3001 -> 10.244.17.5:3001",
		foreign: "203.0.113.9:4000 -> 203.0.113.9:4000",
	}, tn.flowsBySport(t, 17))
	send() // the clients' next packets take the rules now in the kernel
	tn.waitFlows(t, map[uint16]string{
		moves:   "203.0.113.9:3000 -> 10.244.17.6:3000",
		stays:   "203.0.113.9:3001 -> 10.244.17.5:3001",
		early:   "203.0.113.9:3002 -> 10.244.17.5:3002",
		foreign: "203.0.113.9:4000 -> 203.0.113.9:4000",
	})

	// Re-applying deletes nothing; removing g/stays deletes its flow only.
	require.NoError(t, tn.dp.Apply(p2))
	assert.Len(t, tn.flowsBySport(t, 17), 4)
	require.NoError(t, tn.dp.Apply(program(udp("g/moves", 3000, "10.244.17.6"), udp("g/early", 3002, "10.244.17.5"))))
	assert.Equal(t, map[uint16]string{
		moves:   "203.0.113.9:3000 -> 10.244.17.6:3000",
		early:   "203.0.113.9:3002 -> 10.244.17.5:3002",
		foreign: "203.0.113.9:4000 -> 203.0.113.9:4000",
	}, tn.flowsBySport(t, 17))

	// An element deleted by hand lets a new client past it; the resync that puts the element
	// back deletes that client's un-NATed entry, and only that.
	const bypass = 5004
	tn.exec(t, "nft", "delete", "element", "inet", "kuport", "dnat-ports", `{ "enp1s0" . udp . 3002 }`)
	client.sendUDP(t, bypass, "203.0.113.9", 3002)
	tn.waitFlows(t, map[uint16]string{
		moves:   "203.0.113.9:3000 -> 10.244.17.6:3000",
		early:   "203.0.113.9:3002 -> 10.244.17.5:3002",
		bypass:  "203.0.113.9:3002 -> 203.0.113.9:3002",
		foreign: "203.0.113.9:4000 -> 203.0.113.9:4000",
	})
	require.NoError(t, tn.dp.Apply(program(udp("g/moves", 3000, "10.244.17.6"), udp("g/early", 3002, "10.244.17.5"))))
	assert.Equal(t, map[uint16]string{
		moves:   "203.0.113.9:3000 -> 10.244.17.6:3000",
		early:   "203.0.113.9:3002 -> 10.244.17.5:3002",
		foreign: "203.0.113.9:4000 -> 203.0.113.9:4000",
	}, tn.flowsBySport(t, 17))

	// Cleanup takes kuport's flows with its rules.
	require.NoError(t, tn.dp.Cleanup())
	assert.Equal(t, map[uint16]string{foreign: "203.0.113.9:4000 -> 203.0.113.9:4000"}, tn.flowsBySport(t, 17))
}
