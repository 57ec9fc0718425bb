package datapath

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// The link's IPv6 side (docs/design/datapath.md#ipv6-on-the-link) between two namespaces:
// each holds a Datapath and the one link and return path of a program without table
// entries, so these tests exercise devices, addresses, ip rules and routes only.

// link6Name is the link both ends name; link6Table and link6Mark its return path's.
const (
	link6Name  = "kup-6e6e6e6e"
	link6Table = 27505
	link6Mark  = 1
)

// link6Ends are two namespaces joined by a veth (ul0, 10.99.0.1/30 and 10.99.0.2/30), the
// underlay the link's encapsulation crosses.
func link6Ends(t *testing.T) (a, b *testNS) {
	t.Helper()
	a, b = newTestNS(t, "100.64.93.150"), newTestNS(t, "100.64.93.143")
	run(t, "ip", "link", "add", "ul0", "netns", a.name, "type", "veth", "peer", "name", "ul0", "netns", b.name)
	for i, tn := range []*testNS{a, b} {
		tn.exec(t, "ip", "addr", "add", fmt.Sprintf("10.99.0.%d/30", i+1), "dev", "ul0")
		tn.exec(t, "ip", "link", "set", "ul0", "up")
	}
	// A veth sends nothing until the kernel's link watch, up to a second after both ends
	// are up, has seen its carrier: the first packet a test sends must not be lost to that.
	for _, tn := range []*testNS{a, b} {
		require.Eventually(t, func() bool {
			return strings.Contains(tn.exec(t, "ip", "-o", "link", "show", "dev", "ul0"), " state UP ")
		}, 5*time.Second, 10*time.Millisecond, "ul0 up in %s", tn.name)
	}
	return a, b
}

// link6Program is end i's (1 or 2) program: the link's /31 169.254.77.0/31 and /127
// fd6b::/127 (end 1 holds .1 and ::1), and a return path over it in IPv4 and IPv6.
func link6Program(i int) *kuportv1.NodeProgram {
	local, peer := i, 3-i
	end4 := func(n int) string { return fmt.Sprintf("169.254.77.%d", n%2) }
	end6 := func(n int) string { return []string{"fd6b::", "fd6b::1"}[n%2] }
	return &kuportv1.NodeProgram{
		Node: fmt.Sprintf("end-%d", i),
		Links: []*kuportv1.Link{{
			Name: link6Name, ClassName: "public", PeerNode: fmt.Sprintf("end-%d", peer), Vni: 4242, Port: 4790,
			LocalUnderlay: fmt.Sprintf("10.99.0.%d", local), RemoteUnderlay: fmt.Sprintf("10.99.0.%d", peer),
			LocalAddress: end4(local), PeerAddress: end4(peer), Mtu: 1400,
			// As compile makes it, so a device made again answers the peer's neighbour entry.
			Mac:           fmt.Sprintf("02:6b:a9:fe:4d:%02x", local%2),
			SourcePortLow: 49152, SourcePortHigh: 65535,
			LocalAddress6: end6(local), PeerAddress6: end6(peer),
		}},
		ReturnPaths: []*kuportv1.ReturnPath{{
			Id: link6Name + "/return", Link: link6Name, Mark: link6Mark, Table: link6Table,
			PeerUnderlay: fmt.Sprintf("10.99.0.%d", peer), PeerLinkAddress: end4(peer), PeerLinkAddress6: end6(peer),
		}},
		ReturnMarking: &kuportv1.ReturnMarking{MarkMask: 0x301f, LoopGuardPref: 101, DivertPref: 102,
			FirstTable: link6Table, LastTable: link6Table + 126},
	}
}

// without6 is p without IPv6.
func without6(p *kuportv1.NodeProgram) *kuportv1.NodeProgram {
	p = proto.CloneOf(p)
	p.Links[0].LocalAddress6, p.Links[0].PeerAddress6 = "", ""
	p.ReturnPaths[0].PeerLinkAddress6 = ""
	return p
}

var pingTimeRE = regexp.MustCompile(`time=([0-9.]+) ms`)

// ping sends one echo request to addr from the namespace and waits a second for the reply:
// an address still held back by duplicate address detection (a second at least) fails it.
// It returns the reply's round trip as ping prints it.
func (tn *testNS) ping(t *testing.T, addr string) string {
	t.Helper()
	out := tn.exec(t, "ping", "-n", "-c", "1", "-W", "1", addr)
	m := pingTimeRE.FindStringSubmatch(out)
	require.NotNil(t, m, "%s", out)
	return m[1] + " ms"
}

// forwardedPing6 sends one echo request to addr on peer's end of the link from a client
// namespace behind tn, which forwards it into the link: the kernel resolves a forwarded
// packet's next hop by a neighbour solicitation from the device's link-local address alone.
// It returns the reply's round trip.
func (tn *testNS) forwardedPing6(t *testing.T, peer *testNS, addr string) string {
	t.Helper()
	name, _ := newNetNS(t, "kuptest-client-")
	client := func(args ...string) { run(t, append([]string{"ip", "netns", "exec", name}, args...)...) }
	client("sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0")
	tn.exec(t, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
	tn.exec(t, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0")
	tn.exec(t, "ip", "link", "add", "c0", "type", "veth", "peer", "name", "eth0", "netns", name)
	tn.exec(t, "ip", "addr", "add", "2001:db8:c::1/64", "dev", "c0", "nodad")
	tn.exec(t, "ip", "link", "set", "c0", "up")
	client("ip", "link", "set", "lo", "up")
	client("ip", "addr", "add", "2001:db8:c::2/64", "dev", "eth0", "nodad")
	client("ip", "link", "set", "eth0", "up")
	client("ip", "-6", "route", "add", "default", "via", "2001:db8:c::1")
	here := strings.Split(strings.Fields(tn.exec(t, "ip", "-6", "-o", "addr", "show", "dev", link6Name, "scope", "global"))[3], "/")[0]
	peer.exec(t, "ip", "-6", "route", "add", "2001:db8:c::/64", "via", here, "dev", link6Name)
	defer peer.exec(t, "ip", "-6", "route", "del", "2001:db8:c::/64")
	out := run(t, "ip", "netns", "exec", name, "ping", "-n", "-c", "1", "-W", "1", addr)
	m := pingTimeRE.FindStringSubmatch(out)
	require.NotNil(t, m, "%s", out)
	return m[1] + " ms"
}

// rules6 are the namespace's IPv6 ip rules at 101 and 102.
func (tn *testNS) rules6(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, line := range strings.SplitAfter(tn.exec(t, "ip", "-6", "rule", "show"), "\n") {
		if strings.HasPrefix(line, "101:") || strings.HasPrefix(line, "102:") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// checkLink6 asserts that the namespace's link carries its /127 and its link-local address
// (linkLocalOf; no other when made with IPv6), both ready (not tentative), and that its return
// path diverts marked IPv6 into the link by its one IPv6 rule and route.
func (tn *testNS) checkLink6(t *testing.T, p *kuportv1.NodeProgram, kernelLinkLocal bool) {
	t.Helper()
	l, rp := p.GetLinks()[0], p.GetReturnPaths()[0]
	addrs := tn.exec(t, "ip", "-6", "-o", "addr", "show", "dev", link6Name)
	assert.Contains(t, addrs, "inet6 "+l.GetLocalAddress6()+"/127 scope global nodad \\", "ready at once, not tentative")
	assert.Contains(t, addrs, "inet6 "+linkLocalOf(net.ParseIP(l.GetLocalAddress())).String()+" scope link nodad \\")
	if !kernelLinkLocal {
		assert.Equal(t, 1, strings.Count(addrs, "fe80:"), "kuport's link-local address alone: %s", addrs)
		assert.Contains(t, tn.exec(t, "ip", "-d", "link", "show", "dev", link6Name), "addrgenmode none")
	}
	assert.Equal(t, fmt.Sprintf("102:\tfrom all fwmark %#x/0x301f lookup %d proto 107\n", rp.GetMark(), rp.GetTable()), tn.rules6(t),
		"the divert alone: no IPv6 loop guard")
	assert.Equal(t, fmt.Sprintf("default via %s dev %s proto 107 metric 1024 pref medium\n", rp.GetPeerLinkAddress6(), link6Name),
		tn.exec(t, "ip", "-6", "route", "show", "table", itoa(rp.GetTable())))
	assert.Contains(t, tn.exec(t, "ip", "-6", "route", "get", "2001:db8::1", "mark", itoa(rp.GetMark())),
		fmt.Sprintf("2001:db8::1 from :: via %s dev %s table %d ", rp.GetPeerLinkAddress6(), link6Name, rp.GetTable()))
	assert.Contains(t, tn.exec(t, "ip", "route", "get", "192.0.2.1", "mark", itoa(rp.GetMark())),
		fmt.Sprintf("192.0.2.1 via %s dev %s table %d ", rp.GetPeerLinkAddress(), link6Name, rp.GetTable()))
}

// assertNo6 asserts that the namespace holds no IPv6 of kuport's: no global address on the
// link (when it exists), no IPv6 rule at 101/102, an empty IPv6 table.
func (tn *testNS) assertNo6(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "exec", tn.name, "ip", "-6", "-o", "addr", "show", "dev", link6Name, "scope", "global").CombinedOutput(); err == nil {
		assert.Empty(t, string(out))
	}
	assert.Empty(t, tn.rules6(t))
	// A table that never held a route does not exist, which ip says as an error.
	out, err := exec.Command("ip", "netns", "exec", tn.name, "ip", "-6", "route", "show", "table", itoa(link6Table)).CombinedOutput()
	if err != nil {
		assert.Contains(t, string(out), "FIB table does not exist")
	} else {
		assert.Empty(t, string(out))
	}
}

// TestPrivilegedLink6 builds the link between two namespaces from programs carrying its /31
// and /127: IPv6 crosses it on the first packet after Apply, both ways, by neighbour
// discovery over the /127 alone; a marked IPv6 packet is routed into it by the IPv6 rule;
// re-applying writes nothing; the address, rule and route someone deletes are restored; a
// device made IPv4 only gains IPv6 in place; a program without IPv6 and Cleanup leave none.
func TestPrivilegedLink6(t *testing.T) {
	testenv.Privileged(t)
	a, b := link6Ends(t)
	pa, pb := link6Program(1), link6Program(2)
	// End 1's device exists first, IPv4 only (an agent before IPv6), and gains IPv6.
	require.NoError(t, a.dp.Apply(without6(pa)))
	before, err := a.nl.LinkByName(link6Name)
	require.NoError(t, err)
	require.NoError(t, a.dp.Apply(pa))
	after, err := a.nl.LinkByName(link6Name)
	require.NoError(t, err)
	assert.Equal(t, before.Attrs().Index, after.Attrs().Index, "an existing device gains IPv6 in place")
	assert.Equal(t, 4, a.dp.lastChanges, "addresses, ip rule and route")

	// End 2's device is made with IPv6: its first packet is answered at once.
	require.NoError(t, b.dp.Apply(pb))
	t.Logf("first forwarded IPv6 echo over a new link: %s", b.forwardedPing6(t, a, "fd6b::1"))
	t.Logf("first IPv6 echo over a new link: %s", b.ping(t, "fd6b::1"))
	t.Logf("first IPv6 echo the other way: %s", a.ping(t, "fd6b::"))
	a.ping(t, "169.254.77.0")
	a.checkLink6(t, pa, true)
	b.checkLink6(t, pb, false)
	a.checkKernel(t, pa)
	b.checkKernel(t, pb)
	for _, tn := range []*testNS{a, b} {
		require.NoError(t, tn.dp.Apply(link6Program(map[*testNS]int{a: 1, b: 2}[tn])))
		assert.Zero(t, tn.dp.lastChanges, "re-applying writes nothing")
	}

	// Drift, repaired by the next Apply (the agent's resync).
	b.exec(t, "ip", "-6", "addr", "del", "fd6b::/127", "dev", link6Name)
	require.NoError(t, b.dp.Apply(pb))
	assert.NotZero(t, b.dp.lastChanges)
	b.checkLink6(t, pb, false)
	b.exec(t, "ip", "-6", "rule", "del", "pref", "102", "fwmark", "0x1/0x301f", "lookup", itoa(link6Table))
	require.NoError(t, b.dp.Apply(pb))
	assert.Equal(t, 1, b.dp.lastChanges, "the IPv6 rule")
	b.exec(t, "ip", "-6", "route", "flush", "table", itoa(link6Table))
	require.NoError(t, b.dp.Apply(pb))
	assert.Equal(t, 1, b.dp.lastChanges, "the IPv6 route")
	b.exec(t, "ip", "-6", "addr", "add", "fd6b::5/127", "dev", link6Name)
	require.NoError(t, b.dp.Apply(pb))
	assert.Equal(t, 1, b.dp.lastChanges, "a stray address deleted")
	b.checkLink6(t, pb, false)
	b.checkKernel(t, pb)
	b.ping(t, "fd6b::1")

	// A program without IPv6 removes its address, rule and route and keeps the device.
	require.NoError(t, a.dp.Apply(without6(pa)))
	a.assertNo6(t)
	a.checkKernel(t, without6(pa))
	kept, err := a.nl.LinkByName(link6Name)
	require.NoError(t, err)
	assert.Equal(t, before.Attrs().Index, kept.Attrs().Index)

	require.NoError(t, b.dp.Cleanup())
	b.assertNo6(t)
	b.assertNothingOwned(t, itoa(link6Table))
}

// TestPrivilegedLink6Refused: a link under IPv6's 1280 bytes, or on a device with IPv6
// disabled, carries IPv4 and Apply names its IPv6 side; when the cause goes, the next Apply
// gives the link its IPv6.
func TestPrivilegedLink6Refused(t *testing.T) {
	testenv.Privileged(t)
	a, b := link6Ends(t)
	pa := link6Program(1)
	require.NoError(t, a.dp.Apply(pa))

	small := link6Program(2)
	small.Links[0].Mtu = 1200
	err := b.dp.Apply(small)
	assert.ErrorContains(t, err, "link "+link6Name+": IPv6: mtu 1200 is below IPv6's minimum 1280")
	assert.ErrorContains(t, err, "return path "+link6Name+"/return: IPv6: link "+link6Name+"'s mtu 1200")
	b.ping(t, "169.254.77.1")
	b.checkKernel(t, small)
	b.assertNo6(t)

	pb := link6Program(2)
	require.NoError(t, b.dp.Apply(pb))
	b.checkLink6(t, pb, true) // the kernel made the device's IPv6 when its MTU rose
	b.ping(t, "fd6b::1")

	// IPv6 disabled on the device: IPv4 stays, the error says why.
	require.NoError(t, b.dp.Cleanup())
	b.exec(t, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
	err = b.dp.Apply(pb)
	assert.ErrorContains(t, err, "link "+link6Name+": IPv6: add address fd6b::/127: permission denied (net.ipv6.conf."+link6Name+".disable_ipv6 is 1")
	b.ping(t, "169.254.77.1")
	b.checkKernel(t, without6(pb))
	b.exec(t, "sysctl", "-qw", "net.ipv6.conf."+link6Name+".disable_ipv6=0")
	require.NoError(t, b.dp.Apply(pb))
	b.checkLink6(t, pb, true)
	b.ping(t, "fd6b::1")
}

// TestPrivilegedLink6Watched: Watch signals when someone deletes the link's /127 (whose
// notification names the device by index alone), its IPv6 rule or its IPv6 route.
func TestPrivilegedLink6Watched(t *testing.T) {
	testenv.Privileged(t)
	_, b := link6Ends(t)
	pb := link6Program(2)
	require.NoError(t, b.dp.Apply(pb))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	drift, err := b.dp.Watch(ctx)
	require.NoError(t, err)
	for _, damage := range [][]string{
		{"ip", "-6", "addr", "del", "fd6b::/127", "dev", link6Name},
		{"ip", "-6", "rule", "del", "pref", "102", "fwmark", "0x1/0x301f", "lookup", itoa(link6Table)},
		{"ip", "-6", "route", "flush", "table", itoa(link6Table)},
	} {
		b.exec(t, damage...)
		select {
		case <-drift:
		case <-time.After(5 * time.Second):
			t.Fatalf("no signal after %v", damage)
		}
		require.NoError(t, b.dp.Apply(pb))
		assert.NotZero(t, b.dp.lastChanges, "%v repaired", damage)
		b.checkLink6(t, pb, false)
		// The repair's own notifications signal once more; the next damage waits for its own.
		time.Sleep(2 * watchDebounce)
		select {
		case <-drift:
		default:
		}
	}
}
