package datapath

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// kernelDump is everything kuport owns in the namespace as text: `nft list table ip
// kuport` (counters normalised), each kup-* device by name with its vxlan parameters,
// MTU, state, addresses and rp_filter, the ip rules at prefs 101/102 and the routes of
// tables from 201 other than 253-255, each read from the kernel with the ip tools or
// netlink.
func (tn *testNS) kernelDump(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(tn.nftList(t))
	links, err := tn.nl.LinkList()
	require.NoError(t, err)
	slices.SortFunc(links, func(x, y netlink.Link) int { return strings.Compare(x.Attrs().Name, y.Attrs().Name) })
	for _, l := range links {
		a := l.Attrs()
		if !strings.HasPrefix(a.Name, "kup-") {
			continue
		}
		fmt.Fprintf(&b, "link %s", a.Name)
		if v, ok := l.(*netlink.Vxlan); ok {
			fmt.Fprintf(&b, " vxlan id %d local %s remote %s dstport %d ttl %d%s", v.VxlanId, v.SrcAddr, v.Group, v.Port, v.TTL, vxlanFlags(v))
		}
		state := "down"
		if a.Flags&net.FlagUp != 0 {
			state = "up"
		}
		fmt.Fprintf(&b, " mtu %d %s", a.MTU, state)
		addrs, err := tn.nl.AddrList(l, netlink.FAMILY_V4)
		require.NoError(t, err)
		for _, ad := range addrs {
			fmt.Fprintf(&b, " %s", ad.IPNet)
		}
		fmt.Fprintf(&b, " rp_filter %s", tn.exec(t, "cat", "/proc/sys/net/ipv4/conf/"+a.Name+"/rp_filter"))
	}
	for _, line := range strings.SplitAfter(tn.exec(t, "ip", "rule", "show"), "\n") {
		if strings.HasPrefix(line, "101:") || strings.HasPrefix(line, "102:") {
			b.WriteString(line)
		}
	}
	tableRE := regexp.MustCompile(` table (\d+)\b`)
	for _, line := range strings.SplitAfter(tn.exec(t, "ip", "-4", "route", "show", "table", "all"), "\n") {
		if m := tableRE.FindStringSubmatch(line); m != nil {
			if n, _ := strconv.Atoi(m[1]); kuportTable(n) {
				b.WriteString(line)
			}
		}
	}
	return b.String()
}

// nftTable is the text `nft list table inet kuport` prints (elements sorted) for these
// element lines, each "<set>\t<element>", in the default return marking: a rule on a set
// without elements is left out.
func nftTable(elements ...[]string) string {
	bySet := map[string][]string{}
	var marks []uint32
	for _, e := range slices.Concat(elements...) {
		set, text, _ := strings.Cut(e, "\t")
		bySet[set] = append(bySet[set], text)
		if _, chain, ok := strings.Cut(text, "jump "+markChainPrefix); ok && set == "return-marks" {
			m, _ := strconv.ParseUint(chain, 16, 32)
			marks = append(marks, uint32(m))
		}
	}
	slices.Sort(marks)
	l := newLayout(stateMarking.GetMarkMask(), slices.Compact(marks), false, false)
	var blocks []block
	for _, s := range l.sets {
		slices.Sort(bySet[s.name])
		// Mappings that share a return mark list its return-marks element once.
		bySet[s.name] = slices.Compact(bySet[s.name])
		blocks = append(blocks, setBlock(s, s.header(), bySet[s.name]))
	}
	for _, c := range l.chains {
		bl := block{head: "chain " + c.name, lines: c.header()}
		for _, r := range l.chainRules(c.name) {
			if r.heldWith(len(bySet[r.set])) {
				bl.lines = append(bl.lines, r.text)
			}
		}
		blocks = append(blocks, bl)
	}
	return render(blocks)
}

// podMapping is worker-b's part of a mapping whose pod it holds, reached from edge-a over
// link (docs/design/datapath.md#kup-pre-the-dnat, the pod's node).
type podMapping struct {
	key   string
	proto kuportv1.Protocol
	port  uint32
	pod   string
	link  *kuportv1.Link
	mark  uint32
}

// stateMarking is compile's default return marking (controller/compile/marks.go).
var stateMarking = &kuportv1.ReturnMarking{MarkMask: 0x301f, FirstTable: 0x6b71, LastTable: 0x6b71 + 126,
	LoopGuardPref: 101, DivertPref: 102}

// workerB is worker-b's program for the mappings as compile emits it: their rules (the
// arrival link saved on the flow, the reply's mark restored by its pod port), and each link
// and return path they use once.
func workerB(version uint64, ms ...podMapping) *kuportv1.NodeProgram {
	p := &kuportv1.NodeProgram{Node: "worker-b", Version: version, Epoch: 1, ReturnMarking: stateMarking}
	seen := map[string]bool{}
	for _, m := range ms {
		ports := &kuportv1.PortRange{First: m.port, Last: m.port}
		p.DnatRules = append(p.DnatRules, &kuportv1.DnatRule{Id: m.key + "/dnat/" + m.link.Name, Mapping: m.key,
			InInterface: m.link.Name, MatchDestination: m.link.LocalAddress, Protocol: m.proto, Ports: ports, ToAddress: m.pod, ToPort: m.port,
			StandIn: m.pod})
		p.SnatRules = append(p.SnatRules,
			&kuportv1.SnatRule{Id: m.key + "/snat", Mapping: m.key, Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
				Address: m.pod, Protocol: m.proto, Ports: ports},
			&kuportv1.SnatRule{Id: m.key + "/snat-reply", Mapping: m.key, Kind: kuportv1.SnatKind_SNAT_KIND_REPLY,
				Address: m.pod, Protocol: m.proto, Ports: ports})
		p.MarkRules = append(p.MarkRules,
			&kuportv1.MarkRule{Id: m.key + "/ct-restore", Mapping: m.key, Kind: kuportv1.MarkKind_MARK_KIND_CT_RESTORE,
				Address: m.pod, Protocol: m.proto, Ports: ports},
			&kuportv1.MarkRule{Id: m.key + "/ct-save/" + m.link.Name, Mapping: m.key, Kind: kuportv1.MarkKind_MARK_KIND_CT_SAVE,
				InInterface: m.link.Name, Address: m.link.LocalAddress, Protocol: m.proto, Ports: ports, Mark: m.mark})
		if !seen[m.link.Name] {
			seen[m.link.Name] = true
			p.Links = append(p.Links, m.link)
			p.ReturnPaths = append(p.ReturnPaths, &kuportv1.ReturnPath{Id: m.link.Name + "/return", Link: m.link.Name,
				Mark: m.mark, Table: stateMarking.GetFirstTable() + m.mark - 1, PeerUnderlay: m.link.RemoteUnderlay, PeerLinkAddress: m.link.PeerAddress})
		}
	}
	return p
}

// stateStep is one program of a sequence and what kuport owns in the kernel once it is
// applied, as kernelDump prints it.
type stateStep struct {
	name    string
	program *kuportv1.NodeProgram
	want    string
}

// workerBStates is a sequence of worker-b's programs (tailscale's TestRouterStates): a
// mapping added, a second sharing its link, a third over another class's link, an endpoint
// moved, mappings removed one by one, then none.
func workerBStates() []stateStep {
	public := &kuportv1.Link{Name: "kup-dcc4266d", ClassName: "public", PeerNode: "edge-a", Vni: 4242, Port: 4790,
		LocalUnderlay: "100.64.93.150", RemoteUnderlay: "100.64.93.143", LocalAddress: "169.254.77.1", PeerAddress: "169.254.77.0", Mtu: 1370,
		SourcePortLow: 49152, SourcePortHigh: 65535}
	// intranet's program names no source ports, as an older controller's: the kernel's default.
	intranet := &kuportv1.Link{Name: "kup-2b1e7a90", ClassName: "intranet", PeerNode: "edge-c", Vni: 4300, Port: 4790,
		LocalUnderlay: "100.64.93.150", RemoteUnderlay: "100.64.93.160", LocalAddress: "169.254.79.0", PeerAddress: "169.254.79.1", Mtu: 1370}
	a := podMapping{"games/a", kuportv1.Protocol_PROTOCOL_UDP, 27015, "10.244.18.107", public, 1}
	aMoved := a
	aMoved.pod = "10.244.18.120"
	b := podMapping{"games/b", kuportv1.Protocol_PROTOCOL_TCP, 8080, "10.244.18.108", public, 1}
	c := podMapping{"web/c", kuportv1.Protocol_PROTOCOL_TCP, 443, "10.244.18.109", intranet, 2}

	const (
		linkPublic   = "link kup-dcc4266d vxlan id 4242 local 100.64.93.150 remote 100.64.93.143 dstport 4790 ttl 64 srcport 49152 65535 udpcsum learning mtu 1370 up 169.254.77.1/31 rp_filter 2\n"
		linkIntranet = "link kup-2b1e7a90 vxlan id 4300 local 100.64.93.150 remote 100.64.93.160 dstport 4790 ttl 64 srcport 0 0 udpcsum learning mtu 1370 up 169.254.79.0/31 rp_filter 2\n"
		rulesPublic  = "101:\tfrom all to 100.64.93.143 fwmark 0x1/0x301f lookup main proto 107\n" +
			"102:\tfrom all fwmark 0x1/0x301f lookup 27505 proto 107\n"
		rulesBoth = "101:\tfrom all to 100.64.93.143 fwmark 0x1/0x301f lookup main proto 107\n" +
			"101:\tfrom all to 100.64.93.160 fwmark 0x2/0x301f lookup main proto 107\n" +
			"102:\tfrom all fwmark 0x1/0x301f lookup 27505 proto 107\n" +
			"102:\tfrom all fwmark 0x2/0x301f lookup 27506 proto 107\n"
		routePublic   = "default via 169.254.77.0 dev kup-dcc4266d table 27505 proto 107 \n"
		routeIntranet = "default via 169.254.79.1 dev kup-2b1e7a90 table 27506 proto 107 \n"
	)
	// elems are a mapping's elements on worker-b: its translation (of the stand-in, its pod),
	// the steering that also counts its requests over the link, the counting of its replies,
	// the request's identity SNAT, the reply exemption, the arrival link saved on the flow,
	// the reply's mark restored and the return mark.
	elems := func(m podMapping) []string {
		p := strings.ToLower(strings.TrimPrefix(m.proto.String(), "PROTOCOL_"))
		dialed := fmt.Sprintf(`%q . %s . %s . %d counter`, m.link.Name, m.link.LocalAddress, p, m.port)
		pod := fmt.Sprintf("%s . %s . %d counter", m.pod, p, m.port)
		return []string{
			fmt.Sprintf(`dnat-addr-ports	%q . %s . %s . %d counter comment "%s/dnat/%s" : %s . %d`, m.link.Name, m.pod, p, m.port, m.key, m.link.Name, m.pod, m.port),
			fmt.Sprintf("steer-addr-ports\t%s : %s", dialed, m.pod),
			"count-out-addr-ports\t" + dialed,
			"snat-request\t" + fmt.Sprintf(`%s comment "%s/snat"`, pod, m.key),
			"snat-reply\t" + fmt.Sprintf(`%s comment "%s/snat-reply"`, pod, m.key),
			"mark-ct-save\t" + fmt.Sprintf(`%s comment "%s/ct-save/%s" : jump %s`, dialed, m.key, m.link.Name, ctMarkChain(m.mark)),
			"mark-ct-restore\t" + fmt.Sprintf(`%s comment "%s/ct-restore"`, pod, m.key),
			"return-marks\t" + fmt.Sprintf(`0x%08x counter : jump %s`, m.mark, markChain(m.mark)),
		}
	}
	return []stateStep{{
		name:    "add a mapping",
		program: workerB(1, a),
		want: nftTable(elems(a)) + linkPublic +
			rulesPublic + routePublic,
	}, {
		name:    "a second mapping shares the link",
		program: workerB(2, a, b),
		want: nftTable(elems(a), elems(b)) + linkPublic +
			rulesPublic + routePublic,
	}, {
		name:    "a mapping over another class's link",
		program: workerB(3, a, b, c),
		want: nftTable(elems(a), elems(b), elems(c)) +
			linkIntranet + linkPublic + rulesBoth + routePublic + routeIntranet,
	}, {
		name:    "the endpoint of the first changes",
		program: workerB(4, aMoved, b, c),
		want: nftTable(elems(aMoved), elems(b), elems(c)) +
			linkIntranet + linkPublic + rulesBoth + routePublic + routeIntranet,
	}, {
		name:    "the first is removed",
		program: workerB(5, b, c),
		want: nftTable(elems(b), elems(c)) +
			linkIntranet + linkPublic + rulesBoth + routePublic + routeIntranet,
	}, {
		name:    "the other class's mapping is removed",
		program: workerB(6, b),
		want: nftTable(elems(b)) + linkPublic +
			rulesPublic + routePublic,
	}, {
		name:    "all removed",
		program: workerB(7),
		want:    "",
	}}
}

// TestPrivilegedStates applies workerBStates to a namespace and compares everything kuport
// owns in the kernel with the expected text after each, then checks that re-applying the
// step writes nothing.
func TestPrivilegedStates(t *testing.T) {
	testenv.Privileged(t)
	tn := newTestNS(t, "100.64.93.150")
	for _, s := range workerBStates() {
		require.NoError(t, tn.dp.Apply(s.program), s.name)
		assert.Equal(t, s.want, tn.kernelDump(t), s.name)
		require.NoError(t, tn.dp.Apply(s.program), s.name)
		assert.Zero(t, tn.dp.lastChanges, "%s: re-applying writes nothing", s.name)
		assert.Equal(t, s.want, tn.kernelDump(t), s.name)
	}
}

// foreignState is what kuport does not own in the namespace: `nft list ruleset` without
// table inet kuport, `ip rule` without prefs 101/102, `ip -4 route show table all` without
// routes through kup-* devices (which includes every route of kuport's tables). IPv4 only:
// kuport writes no IPv6, and the kernel adds IPv6 link-local routes whenever a device's
// carrier comes up, which may be after the test's first look.
func (tn *testNS) foreignState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	inKuport := false
	for _, line := range strings.SplitAfter(tn.exec(t, "nft", "list", "ruleset"), "\n") {
		switch {
		case line == "table inet kuport {\n":
			inKuport = true
		case inKuport:
			inKuport = line != "}\n"
		default:
			b.WriteString(line)
		}
	}
	for _, line := range strings.SplitAfter(tn.exec(t, "ip", "rule", "show"), "\n") {
		if !strings.HasPrefix(line, "101:") && !strings.HasPrefix(line, "102:") {
			b.WriteString(line)
		}
	}
	for _, line := range strings.SplitAfter(tn.exec(t, "ip", "-4", "route", "show", "table", "all"), "\n") {
		if !strings.Contains(line, " dev kup-") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// TestTunnelOf: vxlan and geneve devices report their kind and UDP destination port, any
// other device neither.
func TestTunnelOf(t *testing.T) {
	for _, c := range []struct {
		link netlink.Link
		kind kuportv1.TunnelKind
		port uint32
	}{
		{&netlink.Vxlan{VxlanId: 1, Port: 4789}, kuportv1.TunnelKind_TUNNEL_KIND_VXLAN, 4789},
		{&netlink.Geneve{ID: 1, Dport: 6081}, kuportv1.TunnelKind_TUNNEL_KIND_GENEVE, 6081},
		{&netlink.Veth{}, kuportv1.TunnelKind_TUNNEL_KIND_UNSPECIFIED, 0},
	} {
		kind, port := tunnelOf(c.link)
		assert.Equal(t, c.kind, kind, "%T", c.link)
		assert.Equal(t, c.port, port, "%T", c.link)
	}
}
