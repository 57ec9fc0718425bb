package datapath

import (
	"net"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"google.golang.org/protobuf/proto"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestPlanLinkSourcePorts: a link names no source ports (the kernel's) or a range the kernel
// takes, low below high.
func TestPlanLinkSourcePorts(t *testing.T) {
	base := goldenPrograms(t)["remote-worker-b"].GetLinks()[0]
	for _, c := range []struct {
		low, high uint32
		ok        bool
	}{{0, 0, true}, {49152, 65535, true}, {1, 2, true}, {0, 65535, false}, {49152, 0, false},
		{5000, 5000, false}, {6000, 5000, false}, {49152, 65536, false}} {
		l := proto.CloneOf(base)
		l.SourcePortLow, l.SourcePortHigh = c.low, c.high
		w, err := planLink(l)
		if !c.ok {
			assert.Error(t, err, "%d-%d", c.low, c.high)
			continue
		}
		require.NoError(t, err, "%d-%d", c.low, c.high)
		v := w.vxlan()
		assert.Equal(t, []int{int(c.low), int(c.high)}, []int{v.PortLow, v.PortHigh})
		assert.True(t, v.UDPCSum && v.Learning, "checksums and learning on")
	}
}

// TestFakeLinkSettingsRepaired: a device whose source ports, UDP checksum or learning differ
// from kuport's is replaced by one with them, and the next Apply writes nothing; one with the
// kernel's source ports (an older agent's) is kept, and so is a device with source ports
// under a program without them (an older controller's).
func TestFakeLinkSettingsRepaired(t *testing.T) {
	base := goldenPrograms(t)["remote-worker-b"]
	name := base.GetLinks()[0].GetName()
	for _, c := range []struct {
		name   string
		change func(v *netlink.Vxlan)
	}{
		{"source ports", func(v *netlink.Vxlan) { v.PortLow, v.PortHigh = 32768, 61000 }},
		{"udp checksum", func(v *netlink.Vxlan) { v.UDPCSum = false }},
		{"learning", func(v *netlink.Vxlan) { v.Learning = false }},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := newFakeKernel("100.64.93.150")
			dp := k.datapath(t)
			require.NoError(t, dp.Apply(base))
			want := k.dump(t)
			before, err := k.LinkByName(name)
			require.NoError(t, err)
			c.change(k.links[k.linkByIndex(before.Attrs().Index)].(*netlink.Vxlan))
			require.NotEqual(t, want, k.dump(t))

			require.NoError(t, dp.Apply(base))
			after, err := k.LinkByName(name)
			require.NoError(t, err)
			assert.NotEqual(t, before.Attrs().Index, after.Attrs().Index, "replaced")
			assert.Equal(t, want, k.dump(t))
			require.NoError(t, dp.Apply(base))
			assert.Zero(t, dp.lastChanges, "the repaired device is kept")
		})
	}
}

func TestFakeLinkSourcePortsAdopted(t *testing.T) {
	base := goldenPrograms(t)["remote-worker-b"]
	name := base.GetLinks()[0].GetName()
	older := proto.CloneOf(base)
	older.Links[0].SourcePortLow, older.Links[0].SourcePortHigh = 0, 0
	for _, c := range []struct {
		name        string
		first, next *kuportv1.NodeProgram
	}{{"an older agent's device", older, base}, {"an older controller's program", base, older}} {
		t.Run(c.name, func(t *testing.T) {
			k := newFakeKernel("100.64.93.150")
			dp := k.datapath(t)
			require.NoError(t, dp.Apply(c.first))
			before, err := k.LinkByName(name)
			require.NoError(t, err)
			require.NoError(t, dp.Apply(c.next))
			assert.Zero(t, dp.lastChanges, "nothing written")
			after, err := k.LinkByName(name)
			require.NoError(t, err)
			assert.Equal(t, before, after, "the device kept as it is")
		})
	}
}

// with6 is p with IPv6 on its first link (fd6b::1 here, fd6b::0 the peer) and return path.
func with6(p *kuportv1.NodeProgram) *kuportv1.NodeProgram {
	p = proto.CloneOf(p)
	p.Links[0].LocalAddress6, p.Links[0].PeerAddress6 = "fd6b::1", "fd6b::"
	p.ReturnPaths[0].PeerLinkAddress6 = "fd6b::"
	return p
}

// TestPlanLink6: a link's IPv6 ends are both empty or the two ends of a /127, IPv6 and not
// IPv4-mapped; anything else refuses the link, as a bad IPv4 address does.
func TestPlanLink6(t *testing.T) {
	base := goldenPrograms(t)["remote-worker-b"].GetLinks()[0]
	for _, c := range []struct {
		local, peer string
		want        string // the /127 planned, "" for none
		err         string
	}{
		{"", "", "", ""},
		{"fd6b::1", "fd6b::", "fd6b::1/127", ""},
		{"fd6b::", "fd6b::1", "fd6b::/127", ""},
		{"2001:db8:0:1::ffff", "2001:db8:0:1::fffe", "2001:db8:0:1::ffff/127", ""},
		{"fd6b::1", "", "", `peer_address6 "" is not an IPv6 address`},
		{"", "fd6b::1", "", `local_address6 "" is not an IPv6 address`},
		{"fd6b::1", "fd6b::1", "", "not the two ends of a /127"},
		{"fd6b::1", "fd6b::2", "", "not the two ends of a /127"},
		{"fd6b::2", "fd6b::1", "", "not the two ends of a /127"},
		{"fd6b::3", "fd6b::", "", "not the two ends of a /127"},
		{"169.254.77.1", "169.254.77.0", "", "is not an IPv6 address"},
		{"::ffff:169.254.77.1", "::ffff:169.254.77.0", "", "is not an IPv6 address"},
		{"fe80::1%eth0", "fe80::%eth0", "", "is not an IPv6 address"},
		{"fd6b::1/127", "fd6b::", "", "is not an IPv6 address"},
	} {
		l := proto.CloneOf(base)
		l.LocalAddress6, l.PeerAddress6 = c.local, c.peer
		w, err := planLink(l)
		if c.err != "" {
			assert.ErrorContains(t, err, c.err, "%q %q", c.local, c.peer)
			continue
		}
		require.NoError(t, err, "%q %q", c.local, c.peer)
		assert.NoError(t, w.no6)
		got := ""
		if w.address6 != nil {
			got = w.address6.String()
		}
		assert.Equal(t, c.want, got, "%q %q", c.local, c.peer)
	}
}

// TestPlanLink6MTU: under IPv6's 1280 the link is kept, IPv4 only, and Apply says why;
// Validate, which refuses a program whole, does not refuse it.
func TestPlanLink6MTU(t *testing.T) {
	for _, c := range []struct {
		mtu uint32
		ok  bool
	}{{1280, true}, {1279, false}, {1200, false}} {
		p := with6(goldenPrograms(t)["remote-worker-b"])
		p.Links[0].Mtu = c.mtu
		require.NoError(t, Validate(p), "mtu %d", c.mtu)
		links, returns, errs := planLinks(p)
		require.Empty(t, errs)
		require.Len(t, links, 1)
		require.Len(t, returns, 1)
		if c.ok {
			assert.NotNil(t, links[0].address6, "mtu %d", c.mtu)
			assert.NotNil(t, returns[0].gw6, "mtu %d", c.mtu)
			continue
		}
		assert.Nil(t, links[0].address6, "mtu %d", c.mtu)
		assert.ErrorContains(t, links[0].no6, "below IPv6's minimum 1280")
		assert.Nil(t, returns[0].gw6, "mtu %d", c.mtu)
		assert.ErrorContains(t, returns[0].no6, "below IPv6's minimum 1280")
	}
}

// TestPlanReturn6: a return path's IPv6 gateway is its link's peer_address6.
func TestPlanReturn6(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(p *kuportv1.NodeProgram)
		err    string
	}{
		{"valid", func(*kuportv1.NodeProgram) {}, ""},
		{"not IPv6", func(p *kuportv1.NodeProgram) { p.ReturnPaths[0].PeerLinkAddress6 = "169.254.77.0" }, "is not an IPv6 address"},
		{"not the peer's end", func(p *kuportv1.NodeProgram) { p.ReturnPaths[0].PeerLinkAddress6 = "fd6b::1" }, "is not link kup-dcc4266d's peer_address6"},
		{"link without IPv6", func(p *kuportv1.NodeProgram) { p.Links[0].LocalAddress6, p.Links[0].PeerAddress6 = "", "" }, "is not link kup-dcc4266d's peer_address6"},
	} {
		p := with6(goldenPrograms(t)["remote-worker-b"])
		c.change(p)
		err := Validate(p)
		if c.err == "" {
			assert.NoError(t, err, c.name)
			continue
		}
		var ee *EntryError
		require.ErrorAs(t, err, &ee, c.name)
		assert.Equal(t, "return path", ee.Kind, c.name)
		assert.ErrorContains(t, err, c.err, c.name)
	}
}

// fakeState6 is what the fake holds of IPv6 for the link: its global addresses, the IPv6
// ip rules and routes.
func fakeState6(t *testing.T, k *fakeKernel, name string) (addrs []string, rules []string, routes []string) {
	t.Helper()
	l, err := k.LinkByName(name)
	require.NoError(t, err)
	as, err := k.AddrList(l, netlink.FAMILY_V6)
	require.NoError(t, err)
	for _, a := range as {
		addrs = append(addrs, a.IPNet.String())
	}
	slices.Sort(addrs)
	rs, err := k.RuleList(netlink.FAMILY_V6)
	require.NoError(t, err)
	for _, r := range rs {
		rules = append(rules, ruleKey(&r))
	}
	ros, err := k.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Protocol: rtprotKuport}, netlink.RT_FILTER_PROTOCOL)
	require.NoError(t, err)
	for _, r := range ros {
		routes = append(routes, routeKey(&r))
	}
	return addrs, rules, routes
}

// TestFakeLink6: a link's /127 and its return path's IPv6 rule and route are made beside the
// IPv4 ones, re-applying writes nothing, drift is repaired, an existing device gains IPv6
// without being replaced, and a program without IPv6 (and Cleanup) removes it all.
func TestFakeLink6(t *testing.T) {
	base := goldenPrograms(t)["remote-worker-b"]
	p6 := with6(base)
	name := base.GetLinks()[0].GetName()
	k := newFakeKernel("100.64.93.150")
	dp := k.datapath(t)
	require.NoError(t, dp.Apply(base))
	dump4 := k.dump(t)
	before, err := k.LinkByName(name)
	require.NoError(t, err)

	require.NoError(t, dp.Apply(p6))
	after, err := k.LinkByName(name)
	require.NoError(t, err)
	assert.Equal(t, before.Attrs().Index, after.Attrs().Index, "the device gains IPv6 in place")
	assert.Equal(t, 4, dp.lastChanges, "addresses, ip rule and route added")
	assert.Equal(t, dump4, k.dump(t), "IPv4 as it was")
	addrs, rules, routes := fakeState6(t, k, name)
	assert.Equal(t, []string{"fd6b::1/127", "fe80::26b:0:a9fe:4d01/64"}, addrs)
	require.Len(t, rules, 1)
	assert.Contains(t, rules[0], "pref 102 fwmark 0x1/0x301f from <nil> to <nil>")
	assert.Contains(t, rules[0], "lookup 27505 protocol 107")
	require.Len(t, routes, 1)
	assert.Contains(t, routes[0], "::/0 via fd6b:: dev 3 src <nil> metric 1024")
	require.NoError(t, dp.Apply(p6))
	assert.Zero(t, dp.lastChanges, "re-applying writes nothing")

	// Drift: the address, then the rule and the route, gone or changed.
	l, _ := k.LinkByName(name)
	require.NoError(t, k.AddrDel(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("fd6b::1"), Mask: net.CIDRMask(127, 128)}}))
	require.NoError(t, k.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("fd6b::5"), Mask: net.CIDRMask(127, 128)}}))
	require.NoError(t, dp.Apply(p6))
	assert.Equal(t, 2, dp.lastChanges, "the stray address deleted, the /127 added")
	rs, _ := k.RuleList(netlink.FAMILY_V6)
	require.NoError(t, k.RuleDel(&rs[0]))
	ros, _ := k.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Protocol: rtprotKuport}, netlink.RT_FILTER_PROTOCOL)
	require.NoError(t, k.RouteDel(&ros[0]))
	require.NoError(t, dp.Apply(p6))
	assert.Equal(t, 2, dp.lastChanges, "rule and route restored")
	a2, r2, ro2 := fakeState6(t, k, name)
	assert.Equal(t, [][]string{addrs, rules, routes}, [][]string{a2, r2, ro2})
	assert.Equal(t, dump4, k.dump(t), "IPv4 untouched by the repairs")

	// Back to IPv4 only: the IPv6 side goes, the device stays.
	require.NoError(t, dp.Apply(base))
	assert.Equal(t, 4, dp.lastChanges, "addresses, ip rule and route deleted")
	a3, r3, ro3 := fakeState6(t, k, name)
	assert.Empty(t, slices.Concat(a3, r3, ro3))
	again, _ := k.LinkByName(name)
	assert.Equal(t, before.Attrs().Index, again.Attrs().Index)
	assert.Equal(t, dump4, k.dump(t))

	require.NoError(t, dp.Apply(p6))
	require.NoError(t, dp.Cleanup())
	r4, _ := k.RuleList(netlink.FAMILY_ALL)
	ro4, _ := k.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: rtprotKuport}, netlink.RT_FILTER_PROTOCOL)
	assert.Empty(t, r4)
	assert.Empty(t, ro4)
	assert.Empty(t, k.dump(t))
}

// TestFakeLink6MTU: a link under 1280 with IPv6 ends is made IPv4 only, and Apply reports its
// IPv6 side and its return path's, nothing else.
func TestFakeLink6MTU(t *testing.T) {
	base := goldenPrograms(t)["remote-worker-b"]
	base.Links[0].Mtu = 1200
	k := newFakeKernel("100.64.93.150")
	dp := k.datapath(t)
	require.NoError(t, dp.Apply(base))
	want := k.dump(t)

	k6 := newFakeKernel("100.64.93.150")
	dp6 := k6.datapath(t)
	err := dp6.Apply(with6(base))
	errs := EntryErrors(err)
	require.Len(t, errs, 2, "%v", err)
	assert.Equal(t, "kup-dcc4266d", errs[0].GetId())
	assert.Contains(t, errs[0].GetMessage(), "link kup-dcc4266d: IPv6: mtu 1200 is below IPv6's minimum 1280: the link carries IPv4 only")
	assert.Equal(t, "kup-dcc4266d/return", errs[1].GetId())
	assert.Contains(t, errs[1].GetMessage(), "IPv6: link kup-dcc4266d's mtu 1200 is below IPv6's minimum 1280")
	assert.Equal(t, want, k6.dump(t), "IPv4 as without IPv6")
	a, r, ro := fakeState6(t, k6, "kup-dcc4266d")
	assert.Empty(t, slices.Concat(a, r, ro))
}

// TestSameProgram6: a program that differs in a link's or a return path's IPv6 side is not
// the same program, so the agent applies it and Apply reads its links again.
func TestSameProgram6(t *testing.T) {
	base := with6(goldenPrograms(t)["remote-worker-b"])
	for _, edit := range []func(p *kuportv1.NodeProgram){
		func(p *kuportv1.NodeProgram) { p.Links[0].LocalAddress6 = "fd6b::3" },
		func(p *kuportv1.NodeProgram) { p.Links[0].PeerAddress6 = "fd6b::2" },
		func(p *kuportv1.NodeProgram) { p.ReturnPaths[0].PeerLinkAddress6 = "" },
	} {
		other := proto.CloneOf(base)
		edit(other)
		assert.False(t, SameProgram(base, other))
		assert.False(t, sameNet(base.GetLinks(), base.GetReturnPaths(), base.GetReturnMarking(), other))
	}
	assert.True(t, SameProgram(base, proto.CloneOf(base)))
}
