package datapath

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"google.golang.org/protobuf/proto"

	"kuport.wlz.li/kuport/datapath/datapathtest"
	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// testNS is a fresh network namespace with a Datapath pointed at it.
type testNS struct {
	name string
	ns   netns.NsHandle
	nl   *netlink.Handle
	dp   *Datapath
}

// newTestNS creates a namespace holding wt0 (a veth, standing in for the mesh device)
// with the given underlay address, and removes it when the test ends.
func newTestNS(t testing.TB, underlay string) *testNS {
	t.Helper()
	tn := &testNS{}
	tn.name, tn.ns = newNetNS(t, "kuptest-")
	for _, args := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", "wt0", "type", "veth", "peer", "name", "wt0-peer"},
		{"ip", "addr", "add", underlay + "/24", "dev", "wt0"},
		{"ip", "link", "set", "wt0", "up"},
		{"ip", "link", "set", "wt0-peer", "up"},
		{"sysctl", "-qw", "net.ipv4.conf.all.rp_filter=1"},
	} {
		tn.exec(t, args...)
	}
	conn, err := nftables.New(nftables.AsLasting(), nftables.WithNetNSFd(int(tn.ns)), NFTSocketOption())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.CloseLasting() })
	tn.nl, err = netlink.NewHandleAt(tn.ns)
	require.NoError(t, err)
	t.Cleanup(tn.nl.Close)
	tn.dp = New(Config{NFT: conn, Netlink: tn.nl, NetNS: tn.ns,
		Log: hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Trace, Output: testWriter{t}})})
	return tn
}

// newNetNS creates a network namespace named prefix and a random suffix and opens a
// handle to it; both go when the test ends.
func newNetNS(t testing.TB, prefix string) (string, netns.NsHandle) {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ns, err := netns.GetFromName(name)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ns.Close() })
	return name, ns
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	require.NoError(t, err, "%v: %s", args, out)
	return string(out)
}

// exec runs a command inside the namespace.
func (tn *testNS) exec(t testing.TB, args ...string) string {
	t.Helper()
	return run(t, append([]string{"ip", "netns", "exec", tn.name}, args...)...)
}

var counterRE = regexp.MustCompile(`counter packets \d+ bytes \d+`)

// sortElements sorts the elements of every set in nft's listing, which prints a hash set in
// the kernel's hash order, the way Render does.
func sortElements(listing string) string {
	const open, cont = "\t\telements = { ", "\t\t\t     "
	var out, elems []string
	for _, line := range strings.Split(listing, "\n") {
		switch {
		case strings.HasPrefix(line, open):
			elems = []string{strings.TrimPrefix(line, open)}
		case elems != nil && strings.HasPrefix(line, cont):
			elems = append(elems, strings.TrimPrefix(line, cont))
		default:
			out = append(out, line)
			continue
		}
		if last := elems[len(elems)-1]; strings.HasSuffix(last, " }") {
			elems[len(elems)-1] = strings.TrimSuffix(last, " }")
			for i := range elems {
				elems[i] = strings.TrimSuffix(elems[i], ",")
			}
			slices.Sort(elems)
			out = append(out, open+strings.Join(elems, ",\n"+cont)+" }")
			elems = nil
		}
	}
	return strings.Join(out, "\n")
}

// nftList is `nft list table inet kuport` in the namespace with counters normalised and
// elements sorted, or "" when there is no table.
func (tn *testNS) nftList(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", tn.name, "nft", "list", "table", "inet", "kuport").CombinedOutput()
	if err != nil {
		require.Contains(t, string(out), "No such file or directory", "nft list: %s", out)
		return ""
	}
	return sortElements(counterRE.ReplaceAllString(string(out), "counter"))
}

// snapshot is everything that must not change when a program is re-applied: the table
// with handles and counters verbatim, every link's index, the ip rules and the routes.
func (tn *testNS) snapshot(t *testing.T) string {
	t.Helper()
	table, _ := exec.Command("ip", "netns", "exec", tn.name, "nft", "-a", "list", "table", "inet", "kuport").CombinedOutput()
	return string(table) + tn.exec(t, "ip", "-o", "link", "show") + tn.exec(t, "ip", "-o", "addr", "show") +
		tn.exec(t, "ip", "rule", "show") + tn.exec(t, "ip", "route", "show", "table", "all")
}

// pokedMarkRules are the mark rules that match a reply by its source: a packet sent from
// their address and port over loopback reaches them (kup-mangle sees loopback packets at
// prerouting). A CT_SAVE rule matches a request arriving on a link, which a lone
// namespace cannot receive.
func pokedMarkRules(p *kuportv1.NodeProgram) []*kuportv1.MarkRule {
	var out []*kuportv1.MarkRule
	for _, m := range p.GetMarkRules() {
		if m.GetKind() != kuportv1.MarkKind_MARK_KIND_CT_SAVE {
			out = append(out, m)
		}
	}
	return out
}

// pokeMarkRule sends a TCP SYN from each poked mark rule's address and port over
// loopback, so its counter is not zero.
func (tn *testNS) pokeMarkRule(t *testing.T, p *kuportv1.NodeProgram) {
	t.Helper()
	for _, m := range pokedMarkRules(p) {
		prefix, to := "/32", "127.0.0.1:9"
		if familyOf(m.GetAddress()).v6() {
			prefix, to = "/128", "[::1]:9"
		}
		tn.exec(t, "ip", "addr", "add", m.GetAddress()+prefix, "dev", "lo", "nodad")
		inNS(t, tn.ns, func() error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(m.GetAddress()), Port: int(m.GetPorts().GetFirst())}}
			c, err := d.Dial("tcp", to)
			if err == nil {
				_ = c.Close()
			}
			return nil
		})
	}
}

func underlayOf(p *kuportv1.NodeProgram) string {
	for _, l := range p.GetLinks() {
		return l.GetLocalUnderlay()
	}
	return "100.64.93.143"
}

// TestPrivilegedGolden applies every golden program in its own namespace, compares the
// kernel's listing with the golden file, and checks that re-applying writes nothing.
func TestPrivilegedGolden(t *testing.T) {
	testenv.Privileged(t)
	for name, p := range goldenPrograms(t) {
		t.Run(name, func(t *testing.T) {
			tn := newTestNS(t, underlayOf(p))
			require.NoError(t, tn.dp.Apply(p))
			want, err := os.ReadFile(goldenPath(name))
			require.NoError(t, err)
			assert.Equal(t, string(want), tn.nftList(t), "nft list")
			dump, err := tn.dp.Dump()
			require.NoError(t, err)
			assert.Equal(t, string(want), dump, "Dump")
			tn.checkKernel(t, p)

			tn.pokeMarkRule(t, p)
			before := tn.snapshot(t)
			counters, err := tn.dp.Counters()
			require.NoError(t, err)
			require.NoError(t, tn.dp.Apply(p))
			assert.Zero(t, tn.dp.lastChanges, "re-applying the same program writes nothing")
			assert.Equal(t, before, tn.snapshot(t))
			again, err := tn.dp.Counters()
			require.NoError(t, err)
			assert.Equal(t, counters, again)
			for _, m := range pokedMarkRules(p) {
				c := counterOf(counters, m.GetId())
				require.NotNil(t, c, "counter of %s", m.GetId())
				assert.NotZero(t, c.GetPackets(), "mark rule %s saw the probe", m.GetId())
			}
		})
	}
}

func counterOf(cs []*kuportv1.Counter, id string) *kuportv1.Counter {
	for _, c := range cs {
		if c.GetId() == id {
			return c
		}
	}
	return nil
}

// checkKernel asserts that the program's links, ip rules and routes are in the kernel.
func (tn *testNS) checkKernel(t *testing.T, p *kuportv1.NodeProgram) {
	t.Helper()
	for _, l := range p.GetLinks() {
		link, err := tn.nl.LinkByName(l.GetName())
		require.NoError(t, err)
		v, ok := link.(*netlink.Vxlan)
		require.True(t, ok, "%s is a vxlan device", l.GetName())
		assert.Equal(t, int(l.GetVni()), v.VxlanId)
		assert.Equal(t, int(l.GetPort()), v.Port)
		assert.Equal(t, 64, v.TTL)
		assert.Equal(t, int(l.GetMtu()), v.MTU)
		assert.Equal(t, l.GetLocalUnderlay(), v.SrcAddr.String())
		assert.Equal(t, l.GetRemoteUnderlay(), v.Group.String())
		assert.NotZero(t, v.Flags&net.FlagUp, "up")
		// The encapsulation's settings as the ip tool reads them, apart from the library.
		details := tn.exec(t, "ip", "-d", "link", "show", "dev", l.GetName())
		if l.GetSourcePortHigh() != 0 { // a program without them keeps the device's
			assert.Contains(t, details, fmt.Sprintf(" srcport %d %d ", l.GetSourcePortLow(), l.GetSourcePortHigh()))
		}
		assert.Contains(t, details, " udpcsum ")
		assert.NotContains(t, details, "nolearning")
		assert.Contains(t, tn.exec(t, "ip", "-4", "-o", "addr", "show", "dev", l.GetName()), l.GetLocalAddress()+"/31")
		assert.Equal(t, "2\n", tn.exec(t, "cat", "/proc/sys/net/ipv4/conf/"+l.GetName()+"/rp_filter"))
	}
	rules := tn.exec(t, "ip", "rule", "show")
	m := markingOf(p)
	for _, rp := range p.GetReturnPaths() {
		// ip rule prints no mask that is the whole mark.
		mark := fmt.Sprintf("%#x", rp.GetMark())
		if m.mask != 0xffffffff {
			mark += fmt.Sprintf("/%#x", m.mask)
		}
		assert.Contains(t, rules, fmt.Sprintf("%d:\tfrom all to %s fwmark %s lookup main proto 107\n", m.loopGuard, rp.GetPeerUnderlay(), mark))
		assert.Contains(t, rules, fmt.Sprintf("%d:\tfrom all fwmark %s lookup %d proto 107\n", m.divert, mark, rp.GetTable()))
		assert.Equal(t, "default via "+rp.GetPeerLinkAddress()+" dev "+rp.GetLink()+" proto 107 \n",
			tn.exec(t, "ip", "route", "show", "table", itoa(rp.GetTable())))
	}
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

// TestPrivilegedLifecycle feeds a sequence of programs to one namespace and checks the
// kernel after each: a change keeps what did not change, damage is repaired, an empty
// program and Cleanup remove everything kuport made and nothing else.
func TestPrivilegedLifecycle(t *testing.T) {
	testenv.Privileged(t)
	base := goldenPrograms(t)["remote-worker-b"]
	tn := newTestNS(t, "100.64.93.150")
	// Foreign state that must survive everything below byte for byte: a filter table with
	// a rule, another NAT table on kup-pre's hook, ip rules on both sides of kuport's band
	// and one far off, routes in main and in a table above 201 that no kuport rule names.
	for _, args := range [][]string{
		{"nft", "add", "table", "inet", "filter"},
		{"nft", "add", "chain", "inet", "filter", "input", "{ type filter hook input priority 0; }"},
		{"nft", "add", "rule", "inet", "filter", "input", "tcp", "dport", "22", "counter", "accept"},
		{"nft", "add", "table", "ip", "othernat"},
		{"nft", "add", "chain", "ip", "othernat", "prerouting", "{ type nat hook prerouting priority dstnat; }"},
		{"nft", "add", "rule", "ip", "othernat", "prerouting", "iifname", "wt0", "tcp", "dport", "3000", "counter", "dnat", "to", "10.9.0.1:80"},
		{"ip", "rule", "add", "pref", "100", "fwmark", "0x2", "lookup", "300"},
		{"ip", "rule", "add", "pref", "110", "from", "10.9.0.0/16", "lookup", "300"},
		{"ip", "rule", "add", "pref", "500", "fwmark", "0x1", "lookup", "300"},
		{"ip", "route", "add", "10.9.0.0/16", "via", "100.64.93.1", "dev", "wt0"},
		{"ip", "route", "add", "default", "via", "100.64.93.1", "dev", "wt0", "table", "300"},
		{"ip", "link", "add", "kup-stale", "type", "vxlan", "id", "99", "dstport", "4791", "local", "100.64.93.150", "remote", "100.64.93.9"},
	} {
		tn.exec(t, args...)
	}
	foreign := func() string { return tn.foreignState(t) }
	foreignBefore := foreign()
	// A table inet kuport left in a wrong shape (a chain at another priority, a stray
	// chain) is rebuilt, and an earlier agent's table ip kuport goes.
	tn.exec(t, "nft", "add", "table", "inet", "kuport")
	tn.exec(t, "nft", "add", "chain", "inet", "kuport", "kup-pre", "{ type nat hook prerouting priority 0; policy accept; }")
	tn.exec(t, "nft", "add", "chain", "inet", "kuport", "stray")
	tn.exec(t, "nft", "add", "table", "ip", "kuport")
	tn.exec(t, "nft", "add", "chain", "ip", "kuport", "kup-pre", "{ type nat hook prerouting priority -110; policy accept; }")

	require.NoError(t, tn.dp.Apply(base))
	assert.Equal(t, Render(base), tn.nftList(t))
	tn.checkKernel(t, base)
	assert.Equal(t, foreignBefore, foreign())
	assert.NotContains(t, tn.exec(t, "ip", "-o", "link", "show"), "kup-stale", "a kup-* device the program does not name is removed")
	link, err := tn.nl.LinkByName("kup-dcc4266d")
	require.NoError(t, err)
	// A rebuilt table has a new handle (the kernel numbers tables per namespace), its rules
	// would not: the table's handle tells.
	handles := func() string {
		table, _, _ := strings.Cut(tn.exec(t, "nft", "-a", "list", "table", "inet", "kuport"), "\n")
		return table + "\n" + tn.exec(t, "nft", "-a", "list", "chain", "inet", "kuport", "kup-pre")
	}
	before := handles()

	// Damage: loop guard rule deleted, route gone, rp_filter strict, device down. Apply
	// (what the agent's resync runs) repairs exactly that.
	rp, m := base.GetReturnPaths()[0], markingOf(base)
	table := itoa(rp.GetTable())
	tn.exec(t, "ip", "rule", "del", "pref", strconv.Itoa(m.loopGuard), "fwmark", fmt.Sprintf("%#x/%#x", rp.GetMark(), m.mask),
		"to", rp.GetPeerUnderlay(), "lookup", "main")
	tn.exec(t, "ip", "route", "flush", "table", table)
	tn.exec(t, "sysctl", "-qw", "net.ipv4.conf.kup-dcc4266d.rp_filter=1")
	tn.exec(t, "ip", "link", "set", "kup-dcc4266d", "down")
	require.NoError(t, tn.dp.Apply(base))
	assert.Equal(t, 4, tn.dp.lastChanges, "ip rule, route, rp_filter and up state restored")
	tn.checkKernel(t, base)

	// A changed program: a mapping added before an existing one, a changed mark, the reply
	// exemption on another port, a smaller MTU, another table. Only elements and the return
	// marks' chains change: the table is not rebuilt, its rules keep their handles.
	changed := proto.Clone(base).(*kuportv1.NodeProgram)
	extra := proto.Clone(changed.DnatRules[0]).(*kuportv1.DnatRule)
	extra.Id, extra.Ports = "demo/other/dnat/kup-dcc4266d", &kuportv1.PortRange{First: 4000, Last: 4000}
	extra.ToPort = 4000
	changed.DnatRules = append([]*kuportv1.DnatRule{extra}, changed.DnatRules...)
	for _, m := range changed.MarkRules {
		if m.GetKind() != kuportv1.MarkKind_MARK_KIND_CT_RESTORE { // a restore takes the flow's mark
			m.Mark = rp.GetMark() + 1
		}
	}
	changed.SnatRules[1].Ports = &kuportv1.PortRange{First: 3001, Last: 3001}
	changed.Links[0].Mtu = 1360
	changed.ReturnPaths[0].Table = rp.GetTable() + 1
	changed.ReturnPaths[0].Mark = rp.GetMark() + 1
	require.NoError(t, tn.dp.Apply(changed))
	assert.Equal(t, Render(changed), tn.nftList(t))
	tn.checkKernel(t, changed)
	assert.Equal(t, foreignBefore, foreign())
	assert.Equal(t, before, handles(), "the table and its rules keep their handles")
	relinked, err := tn.nl.LinkByName("kup-dcc4266d")
	require.NoError(t, err)
	assert.Equal(t, link.Attrs().Index, relinked.Attrs().Index, "an MTU change keeps the device")
	assert.Empty(t, tn.exec(t, "ip", "route", "show", "table", table))
	assert.NotContains(t, tn.exec(t, "ip", "rule", "show"), "lookup "+table+" ")

	// The empty program leaves nothing of kuport's.
	require.NoError(t, tn.dp.Apply(&kuportv1.NodeProgram{Node: "worker-b", Version: 3}))
	tn.assertNothingOwned(t, table, itoa(rp.GetTable()+1))
	assert.Equal(t, foreignBefore, foreign())

	// Cleanup after a full program, likewise.
	require.NoError(t, tn.dp.Apply(base))
	require.NoError(t, tn.dp.Cleanup())
	tn.assertNothingOwned(t, table)
	assert.Equal(t, foreignBefore, foreign())
}

func (tn *testNS) assertNothingOwned(t *testing.T, tables ...string) {
	t.Helper()
	assert.Empty(t, tn.nftList(t), "table inet kuport is gone")
	dump, err := tn.dp.Dump()
	require.NoError(t, err)
	assert.Empty(t, dump)
	assert.NotContains(t, tn.exec(t, "ip", "-o", "link", "show"), "kup-")
	rules := tn.exec(t, "ip", "rule", "show")
	assert.NotContains(t, rules, "101:")
	assert.NotContains(t, rules, "102:")
	for _, table := range tables {
		assert.Empty(t, tn.exec(t, "ip", "route", "show", "table", table))
	}
	stats, err := tn.dp.LinkStats()
	require.NoError(t, err)
	assert.Empty(t, stats)
}

// TestPrivilegedReadState checks NodeState and LinkStats against the namespace.
func TestPrivilegedReadState(t *testing.T) {
	testenv.Privileged(t)
	p := goldenPrograms(t)["remote-worker-b"]
	tn := newTestNS(t, "100.64.93.150")
	tn.exec(t, "ip", "route", "add", "default", "via", "100.64.93.1", "dev", "wt0")
	require.NoError(t, tn.dp.Apply(p))

	st, err := tn.dp.NodeState("")
	require.NoError(t, err)
	assert.Equal(t, "wt0", st.GetUnderlayInterface(), "the default route's device")
	assert.False(t, st.GetIpForward(), "a fresh namespace does not forward")
	byName := map[string]*kuportv1.Interface{}
	for _, i := range st.GetInterfaces() {
		byName[i.GetName()] = i
	}
	require.Contains(t, byName, "wt0")
	assert.Equal(t, []string{"100.64.93.150"}, byName["wt0"].GetAddresses())
	assert.Equal(t, uint32(1500), byName["wt0"].GetMtu())
	assert.Equal(t, []string{"169.254.77.1"}, byName["kup-dcc4266d"].GetAddresses())
	assert.Equal(t, uint32(1370), byName["kup-dcc4266d"].GetMtu())

	tn.exec(t, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	st, err = tn.dp.NodeState("enp1s0")
	require.NoError(t, err)
	assert.True(t, st.GetIpForward())
	assert.Equal(t, "enp1s0", st.GetUnderlayInterface(), "a named underlay is reported as named")

	stats, err := tn.dp.LinkStats()
	require.NoError(t, err)
	require.Len(t, stats, 1)
	assert.Equal(t, "kup-dcc4266d", stats[0].GetName())
}

// TestPrivilegedReadStateNetkit: a netkit pair (Cilium's pod device in its netkit modes) is
// reported as netkit, a veth is not. iproute2 6.1 cannot make one: netlink does.
func TestPrivilegedReadStateNetkit(t *testing.T) {
	testenv.Privileged(t)
	tn := newTestNS(t, "100.64.93.150")
	nk := &netlink.Netkit{LinkAttrs: netlink.LinkAttrs{Name: "nk0"}, Mode: netlink.NETKIT_MODE_L3,
		Policy: netlink.NETKIT_POLICY_FORWARD, PeerPolicy: netlink.NETKIT_POLICY_FORWARD}
	nk.SetPeerAttrs(&netlink.LinkAttrs{Name: "nk1"})
	if err := tn.nl.LinkAdd(nk); err != nil {
		t.Skipf("no netkit devices on this kernel (6.7+ with CONFIG_NETKIT): %v", err)
	}
	st, err := tn.dp.NodeState("")
	require.NoError(t, err)
	netkit := map[string]bool{}
	for _, i := range st.GetInterfaces() {
		netkit[i.GetName()] = i.GetNetkit()
	}
	assert.Equal(t, map[string]bool{"nk0": true, "nk1": true, "wt0": false, "wt0-peer": false, "lo": false}, netkit)
}

// TestPrivilegedEntryErrors applies a program with one bad entry of each kind: the good
// entries land, each bad one is reported by id.
func TestPrivilegedEntryErrors(t *testing.T) {
	testenv.Privileged(t)
	p := proto.Clone(goldenPrograms(t)["remote-worker-b"]).(*kuportv1.NodeProgram)
	p.DnatRules = append(p.DnatRules, &kuportv1.DnatRule{Id: "bad/dnat", InInterface: "enp1s0", Protocol: kuportv1.Protocol_PROTOCOL_TCP,
		Ports: &kuportv1.PortRange{First: 1, Last: 1}, ToAddress: "not-an-ip", ToPort: 1})
	p.Links = append(p.Links, &kuportv1.Link{Name: "kup-bad", Vni: 4242, Port: 4790, LocalUnderlay: "100.64.93.150",
		RemoteUnderlay: "100.64.93.9", LocalAddress: "169.254.77.3", Mtu: 1370}) // same VNI and port: the kernel refuses
	p.ReturnPaths = append(p.ReturnPaths, &kuportv1.ReturnPath{Id: "bad/return", Link: "kup-dcc4266d", Mark: 7, Table: 254,
		PeerUnderlay: "100.64.93.143", PeerLinkAddress: "169.254.77.0"})
	tn := newTestNS(t, "100.64.93.150")
	err := tn.dp.Apply(p)
	require.Error(t, err)
	ids := map[string]string{}
	for _, e := range EntryErrors(err) {
		ids[e.GetId()] = e.GetMessage()
	}
	assert.Len(t, ids, 3, "%v", ids)
	assert.Contains(t, ids["bad/dnat"], "dnat bad/dnat: to_address")
	assert.Contains(t, ids["kup-bad"], "link kup-bad: add vxlan device")
	assert.Contains(t, ids["bad/return"], "not a kuport table")
	assert.Equal(t, Render(goldenPrograms(t)["remote-worker-b"]), tn.nftList(t), "the valid rules are all in")
	tn.checkKernel(t, goldenPrograms(t)["remote-worker-b"])
}

// TestPrivilegedLinkChanges changes one attribute of a link at a time and checks whether
// the device was kept (same ifindex) or replaced, and that the kernel then holds the
// changed program. The split is README.md's (Reconciling, links).
func TestPrivilegedLinkChanges(t *testing.T) {
	testenv.Privileged(t)
	cases := []struct {
		name   string
		change func(p *kuportv1.NodeProgram)
		kept   bool
	}{
		{"mtu", func(p *kuportv1.NodeProgram) { p.Links[0].Mtu = 1300 }, true},
		{"link addresses", func(p *kuportv1.NodeProgram) {
			p.Links[0].LocalAddress, p.Links[0].PeerAddress = "169.254.77.3", "169.254.77.2"
			p.DnatRules[0].MatchDestination = "169.254.77.3"
			p.ReturnPaths[0].PeerLinkAddress = "169.254.77.2"
		}, true},
		{"vni", func(p *kuportv1.NodeProgram) { p.Links[0].Vni = 4243 }, false},
		{"port", func(p *kuportv1.NodeProgram) { p.Links[0].Port = 4791 }, false},
		{"remote underlay", func(p *kuportv1.NodeProgram) {
			p.Links[0].RemoteUnderlay = "100.64.93.160"
			p.ReturnPaths[0].PeerUnderlay = "100.64.93.160"
		}, false},
		{"local underlay", func(p *kuportv1.NodeProgram) { p.Links[0].LocalUnderlay = "100.64.93.151" }, false},
		{"source ports", func(p *kuportv1.NodeProgram) { p.Links[0].SourcePortLow, p.Links[0].SourcePortHigh = 32768, 61000 }, false},
		{"no source ports", func(p *kuportv1.NodeProgram) { p.Links[0].SourcePortLow, p.Links[0].SourcePortHigh = 0, 0 }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := goldenPrograms(t)["remote-worker-b"]
			tn := newTestNS(t, "100.64.93.150")
			require.NoError(t, tn.dp.Apply(base))
			name := base.Links[0].GetName()
			before, err := tn.nl.LinkByName(name)
			require.NoError(t, err)

			changed := proto.Clone(base).(*kuportv1.NodeProgram)
			c.change(changed)
			require.NoError(t, tn.dp.Apply(changed))
			after, err := tn.nl.LinkByName(name)
			require.NoError(t, err)
			if c.kept {
				assert.Equal(t, before.Attrs().Index, after.Attrs().Index, "changed in place")
			} else {
				assert.NotEqual(t, before.Attrs().Index, after.Attrs().Index, "replaced")
			}
			assert.Equal(t, Render(changed), tn.nftList(t))
			tn.checkKernel(t, changed)
			require.NoError(t, tn.dp.Apply(changed))
			assert.Zero(t, tn.dp.lastChanges, "the changed program is all in the kernel")
		})
	}
}

// TestPrivilegedLinkSettingsRepaired: a link device someone made again with the program's
// encapsulation but other settings (no UDP checksum, no learning, the kernel's source ports)
// is replaced by one with kuport's, and the next Apply writes nothing.
func TestPrivilegedLinkSettingsRepaired(t *testing.T) {
	testenv.Privileged(t)
	p := goldenPrograms(t)["remote-worker-b"]
	l := p.GetLinks()[0]
	tn := newTestNS(t, "100.64.93.150")
	tn.exec(t, "ip", "link", "add", l.GetName(), "type", "vxlan", "id", itoa(l.GetVni()), "dstport", itoa(l.GetPort()),
		"local", l.GetLocalUnderlay(), "remote", l.GetRemoteUnderlay(), "ttl", "64", "noudpcsum", "nolearning")
	require.NoError(t, tn.dp.Apply(p))
	assert.Equal(t, Render(p), tn.nftList(t))
	tn.checkKernel(t, p)
	require.NoError(t, tn.dp.Apply(p))
	assert.Zero(t, tn.dp.lastChanges, "the repaired device is kept")
}

// TestPrivilegedRecreatedLinkKeepsItsAddress deletes a link device as a reboot or another
// program would and applies again: the new device has the program's link-layer address, the
// one the peer's neighbor entry holds, so the peer's cached entry stays right. A device that
// exists with another address keeps it (changing it would stale the peer's entry).
func TestPrivilegedRecreatedLinkKeepsItsAddress(t *testing.T) {
	testenv.Privileged(t)
	p := goldenPrograms(t)["remote-worker-b"]
	want := p.Links[0].GetMac()
	require.NotEmpty(t, want, "the golden program names the link's address")
	tn := newTestNS(t, "100.64.93.150")
	require.NoError(t, tn.dp.Apply(p))
	name := p.Links[0].GetName()
	l, err := tn.nl.LinkByName(name)
	require.NoError(t, err)
	assert.Equal(t, want, l.Attrs().HardwareAddr.String(), "created")

	require.NoError(t, tn.nl.LinkDel(l))
	require.NoError(t, tn.dp.Apply(p))
	again, err := tn.nl.LinkByName(name)
	require.NoError(t, err)
	assert.NotEqual(t, l.Attrs().Index, again.Attrs().Index, "a new device")
	assert.Equal(t, want, again.Attrs().HardwareAddr.String(), "recreated")

	other, err := net.ParseMAC("02:00:00:00:00:01")
	require.NoError(t, err)
	require.NoError(t, tn.nl.LinkSetHardwareAddr(again, other))
	require.NoError(t, tn.dp.Apply(p))
	kept, err := tn.nl.LinkByName(name)
	require.NoError(t, err)
	assert.Equal(t, other.String(), kept.Attrs().HardwareAddr.String(), "an existing device keeps its address")
}

// Sixteen of the widest shifted ranges compile allows (compile.MaxShiftedRange, 512 ports,
// each a per-port map) go in one transaction and re-apply with no write: the whole
// transaction rides one sendmsg, which the default 208 KiB send buffer refused ("message too
// long") until NFTSocketOption raised it.
func TestPrivilegedWideShiftedRanges(t *testing.T) {
	testenv.Privileged(t)
	const width, ranges = 512, 16
	p := &kuportv1.NodeProgram{Node: "worker-b"}
	for i := range ranges {
		first := uint32(1000 + i*600)
		p.DnatRules = append(p.DnatRules, &kuportv1.DnatRule{
			Id: fmt.Sprintf("demo/wide-%d/dnat/eth0", i), Mapping: fmt.Sprintf("demo/wide-%d", i), InInterface: "eth0",
			Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: &kuportv1.PortRange{First: first, Last: first + width - 1},
			ToAddress: "10.244.18.107", ToPort: 40000,
		})
	}
	tn := newTestNS(t, underlayOf(p))
	require.NoError(t, tn.dp.Apply(p))
	assert.Equal(t, ranges, strings.Count(tn.nftList(t), fmt.Sprintf(": 10.244.18.107 . %d", 40000+width-1)))
	require.NoError(t, tn.dp.Apply(p))
	assert.Zero(t, tn.dp.lastChanges, "re-applying the same program writes nothing")
}

// Ten thousand mappings on one node (40,000 set elements) go in one transaction, every
// element arrives with its counter, those of an entry's own translation with its id
// (google/nftables v0.3.0 silently truncates an element list over 64 KiB, so the datapath
// chunks them), every entry's counters are read back, and a re-apply writes nothing. The kernel acknowledges
// every message of the transaction, which overflowed the socket's default receive buffer
// ("recvmsg: no buffer space available") until NFTSocketOption raised it.
func TestPrivilegedTenThousandMappings(t *testing.T) {
	testenv.Privileged(t)
	const n = 10000
	p := datapathtest.Program(n, "enp1s0")
	tn := newTestNS(t, "100.64.93.143")
	tn.dp.log = hclog.NewNullLogger()
	require.NoError(t, tn.dp.Apply(p))
	listed := tn.nftList(t)
	for set, commented := range map[string]bool{"dnat-ports": true, "steer-ports": false, "count-out-ports": false, "snat-request": true} {
		block := listed[strings.Index(listed, " "+set+" {"):]
		block = block[:strings.Index(block, "\t}\n")]
		// An element's counter follows its key after a space, the set's own on a line of its own.
		assert.Equal(t, n, strings.Count(block, " counter"), set)
		if commented {
			assert.Equal(t, n, strings.Count(block, `comment "bench/m`), set)
		}
	}
	assert.Equal(t, 2*n, strings.Count(listed, `comment "bench/m`))
	counters, err := tn.dp.Counters()
	require.NoError(t, err)
	assert.Len(t, counters, 2*n, "a Counter per DNAT and SNAT entry")
	for _, c := range counters {
		if strings.HasSuffix(c.GetId(), "/dnat/enp1s0") && (c.GetForwardedIn() == nil || c.GetForwardedOut() == nil) {
			t.Fatalf("%s: forwarded_in %v, forwarded_out %v: a DNAT entry's requests and replies are counted", c.GetId(), c.GetForwardedIn(), c.GetForwardedOut())
		}
	}
	require.NoError(t, tn.dp.Apply(p))
	assert.Zero(t, tn.dp.lastChanges, "re-applying the same program writes nothing")
}

// TestPrivilegedNetReadSkipped: under a watch, an Apply that changes table entries but not
// the links and return paths reads none of them again, and one after someone deleted the
// link (notified) reads them and puts it back; a resync of the same program always reads.
func TestPrivilegedNetReadSkipped(t *testing.T) {
	testenv.Privileged(t)
	base := goldenPrograms(t)["remote-worker-b"]
	tn := newTestNS(t, "100.64.93.150")
	_, err := tn.dp.Watch(t.Context())
	require.NoError(t, err)
	require.NoError(t, tn.dp.Apply(base))
	// The Apply's own writes are notified: wait until they all are, then resync.
	settled := func() {
		t.Helper()
		for n := tn.dp.netNotes.Load(); ; {
			time.Sleep(300 * time.Millisecond)
			m := tn.dp.netNotes.Load()
			if m == n {
				return
			}
			n = m
		}
	}
	settled()
	require.NoError(t, tn.dp.Apply(base))
	known := tn.dp.netKnown
	require.NotNil(t, known, "a whole read under a watch is recorded")
	require.NoError(t, tn.dp.Apply(base))
	assert.NotSame(t, known, tn.dp.netKnown, "a resync reads the links and return paths")
	known = tn.dp.netKnown

	moved := proto.Clone(base).(*kuportv1.NodeProgram)
	moved.Version++
	moved.DnatRules[0].ToAddress = "10.244.18.108"
	require.NoError(t, tn.dp.Apply(moved))
	assert.Same(t, known, tn.dp.netKnown, "an entry change under an unchanged watch reads no link")
	assert.Equal(t, Render(moved), tn.nftList(t))

	name := base.Links[0].GetName()
	tn.exec(t, "ip", "link", "del", name)
	require.Eventually(t, func() bool { return tn.dp.netNotes.Load() != known.notes }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, tn.dp.Apply(base))
	_, err = tn.nl.LinkByName(name)
	require.NoError(t, err, "the deleted link is put back by the next change")
	tn.checkKernel(t, base)
	// The watch logs its last signal (to this test's log) a debounce after the last write.
	settled()
	time.Sleep(2 * watchDebounce)
}
