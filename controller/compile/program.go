package compile

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// programBuilder accumulates one node's program and its index; links and return paths shared
// by several mappings are added once.
type programBuilder struct {
	p       *kuportv1.NodeProgram
	links   map[string]bool
	returns map[string]bool
	index   NodeIndex
}

func newProgramBuilder(node string) *programBuilder {
	return &programBuilder{p: &kuportv1.NodeProgram{Node: node}, links: map[string]bool{}, returns: map[string]bool{},
		index: NodeIndex{}}
}

// of returns the index of p's entries in the program, created on first use.
func (b *programBuilder) of(p *plan) *MappingIndex {
	mi := b.index[p.key]
	if mi == nil {
		mi = &MappingIndex{Mapping: types.NamespacedName{Namespace: p.pm.Namespace, Name: p.pm.Name}, ServingNode: p.serving()}
		b.index[p.key] = mi
	}
	return mi
}

// entry indexes p's entry e, named and given its id here, and returns the id.
func (b *programBuilder) entry(p *plan, name string, e Entry) string {
	e.ID, e.Name = p.key+"/"+name, name
	mi := b.of(p)
	mi.Entries = append(mi.Entries, e)
	return e.ID
}

// addDnat adds p's DNAT entry name of family f, counted in, on r.InInterface; overLink when
// that is one of p's links (Entry.OverLink).
func (b *programBuilder) addDnat(p *plan, name string, f Family, r *kuportv1.DnatRule, overLink bool) {
	r.Id, r.Mapping = b.entry(p, name, Entry{Kind: KindDNAT, Direction: DirectionIn, Interface: r.InInterface,
		OverLink: overLink, Family: f}), p.key
	b.p.DnatRules = append(b.p.DnatRules, r)
}

// addSnat adds p's SNAT entry name of family f, counted in direction dir.
func (b *programBuilder) addSnat(p *plan, name, dir string, f Family, r *kuportv1.SnatRule) {
	r.Id, r.Mapping = b.entry(p, name, Entry{Kind: KindSNAT, Direction: dir, Family: f}), p.key
	b.p.SnatRules = append(b.p.SnatRules, r)
}

// addMark adds p's mark entry name of family f, counted in direction dir.
func (b *programBuilder) addMark(p *plan, name, dir string, f Family, r *kuportv1.MarkRule) {
	r.Id, r.Mapping = b.entry(p, name, Entry{Kind: KindMark, Direction: dir, Family: f}), p.key
	b.p.MarkRules = append(b.p.MarkRules, r)
}

// uses indexes the link device d and, when withReturn, its return path as p's entries use
// them in the program.
func (b *programBuilder) uses(p *plan, d *linkDevice, withReturn bool) {
	mi := b.of(p)
	mi.Links = withOne(mi.Links, d.links)
	if withReturn {
		mi.ReturnPaths = withOne(mi.ReturnPaths, d.returnPaths)
	}
}

// withOne returns list with one's element added once. An empty list becomes one itself, shared
// by every mapping (BENCHMARKS.md, "Figures moved out of code comments"): its capacity is
// its length, so an append copies it.
func withOne(list, one []string) []string {
	switch {
	case len(list) == 0:
		return one
	case slices.Contains(list, one[0]):
		return list
	}
	return append(list, one[0])
}

func (b *programBuilder) addLink(l *kuportv1.Link) {
	if !b.links[l.Name] {
		b.links[l.Name] = true
		b.p.Links = append(b.p.Links, l)
	}
}

func (b *programBuilder) addReturnPath(r *kuportv1.ReturnPath) {
	if !b.returns[r.Id] {
		b.returns[r.Id] = true
		b.p.ReturnPaths = append(b.p.ReturnPaths, r)
	}
}

// program returns the node's program with every list sorted by id (links by name).
func (b *programBuilder) program() *kuportv1.NodeProgram {
	b.p.DnatRules = sortedBy(b.p.DnatRules, (*kuportv1.DnatRule).GetId)
	b.p.SnatRules = sortedBy(b.p.SnatRules, (*kuportv1.SnatRule).GetId)
	b.p.MarkRules = sortedBy(b.p.MarkRules, (*kuportv1.MarkRule).GetId)
	b.p.Links = sortedBy(b.p.Links, (*kuportv1.Link).GetName)
	b.p.ReturnPaths = sortedBy(b.p.ReturnPaths, (*kuportv1.ReturnPath).GetId)
	return b.p
}

// sortedBy returns list sorted by key, without the spare room appending left: a result lives
// until the next compile (BENCHMARKS.md, "What compile keeps live"; the index entries' share
// in "Figures moved out of code comments").
func sortedBy[T any](list []T, key func(T) string) []T {
	if cap(list) > len(list) {
		list = slices.Clone(list)
	}
	slices.SortFunc(list, func(x, y T) int { return cmp.Compare(key(x), key(y)) })
	return list
}

// nodeIndex returns the program's index with every list sorted.
func (b *programBuilder) nodeIndex() NodeIndex {
	for _, mi := range b.index {
		mi.Entries = sortedBy(mi.Entries, func(e Entry) string { return e.ID })
		slices.Sort(mi.Links)
		slices.Sort(mi.ReturnPaths)
	}
	return b.index
}

// lacks reports what a node carrying entries on ifaces is missing: addresses on those
// interfaces, net.ipv4.ip_forward and, when it is a link end, an underlay address; the one
// readiness check of a node, for a mapping's NodeNotReady (checkNodes) and a class's node
// rows (nodeRow). With only6 (a pod with an IPv6 address only) the interfaces' global IPv6
// addresses and net.ipv6.conf.all.forwarding stand for the IPv4 ones; the underlay is IPv4
// still, the links' outer packets being IPv4. blocking is true when its entries cannot be built at all: no Node object,
// no reported state, or a link end with no underlay address. Otherwise the entries are built
// and only the status says what is missing (docs/design/api.md#status-and-conditions,
// NodeNotReady).
func (c *compiler) lacks(name string, ifaces []string, linkEnd, only6 bool) (miss []string, blocking bool) {
	v := c.node(name)
	switch {
	case !v.exists:
		return []string{"no Node object"}, true
	case v.state == nil:
		return []string{"no agent has connected"}, true
	}
	problem := v.ifaceProblem
	if only6 {
		problem = v.ifaceProblem6
	}
	for _, i := range ifaces {
		if p := problem(i); p != "" {
			miss = append(miss, p)
		}
	}
	if addr, _ := v.underlay(); linkEnd && addr == "" {
		miss, blocking = append(miss, fmt.Sprintf("underlay interface %q has no IPv4 address", v.underlayName())), true
	}
	switch {
	case only6 && !v.serves6():
		miss = append(miss, "net.ipv6.conf.all.forwarding is 0")
	case !only6 && !v.state.GetIpForward():
		miss = append(miss, "net.ipv4.ip_forward is 0")
	}
	return miss, blocking
}

// minLinkMTU is the smallest MTU an IPv4 device may have (RFC 791); the datapath refuses a
// link below it, and with it the node's whole program.
const minLinkMTU = 68

// linkUnusable says why the link between a forwarder and the pod's node cannot be built
// for its MTU ("" when it can): neither end reports an underlay MTU, or the smaller one
// leaves less than minLinkMTU after the encapsulation.
func (c *compiler) linkUnusable(forwarder, podNode string) string {
	_, ma := c.node(forwarder).underlay()
	_, mb := c.node(podNode).underlay()
	if m := linkMTU(ma, mb); m < minLinkMTU {
		return fmt.Sprintf("link to %s would have MTU %d (underlay MTUs %d and %d), below IPv4's %d", podNode, m, ma, mb, minLinkMTU)
	}
	return ""
}

// checkNodes returns what the nodes a plan needs lack, one "node <name>: <what>" per node
// sorted by name (NodeNotReady), the link ends where a tunnel of another program uses the
// class's port, likewise (tunnelConflict), and the targets whose entries can be built, in
// target order. A forwarder that cannot be built, or whose link cannot, is left out and the
// other nodes still serve (under Multi); when the pod's node cannot be built, nothing is.
func (c *compiler) checkNodes(p *plan) (problems, tunnels []string, built []*target) {
	missing := map[string][]string{}
	only6 := p.ep.address == ""
	// forwarders: the targets lacking the pod, each a link end, and whether it is left out.
	forwarders := map[string]bool{}
	var podIfaces []string
	tunnelAt := func(node string) bool {
		dev := c.tunnelConflict(p.class, node)
		if dev != "" {
			tunnels = append(tunnels, fmt.Sprintf("node %s: vxlan port %d of class %q is used by %s", node, p.class.port, p.class.name, dev))
		}
		return dev != ""
	}
	for _, t := range p.targets {
		if t.node == p.ep.node {
			podIfaces = t.ifaces
			continue
		}
		var blocking bool
		missing[t.node], blocking = c.lacks(t.node, t.ifaces, true, only6)
		if why := c.linkUnusable(t.node, p.ep.node); why != "" && !blocking {
			missing[t.node], blocking = append(missing[t.node], why), true
		}
		forwarders[t.node] = tunnelAt(t.node) || blocking
	}
	// A tunnel on the pod's node keeps every link off it; a local target still serves.
	podTunnel := len(forwarders) > 0 && tunnelAt(p.ep.node)
	if podTunnel {
		if p.class.tunnelPods == nil {
			p.class.tunnelPods = map[string]bool{}
		}
		p.class.tunnelPods[p.ep.node] = true
		for n := range forwarders {
			forwarders[n] = true
		}
	}
	miss, blocking := c.lacks(p.ep.node, podIfaces, len(forwarders) > 0 && !podTunnel, only6)
	// The pod's reply leaves by its node's CNI: where that skips netfilter, nothing is built.
	if r := c.node(p.ep.node).cniRefusal; len(r) > 0 {
		miss, blocking = append(miss, r...), true
	}
	missing[p.ep.node] = miss
	if !blocking {
		for _, t := range p.targets {
			if !forwarders[t.node] {
				built = append(built, t)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(missing)) {
		if m := missing[name]; len(m) > 0 {
			problems = append(problems, fmt.Sprintf("node %s: %s", name, strings.Join(m, ", ")))
		}
	}
	slices.Sort(tunnels)
	return problems, tunnels, built
}

// emit writes a viable plan's entries into the programs of its nodes
// (docs/design/datapath.md: kup-pre, kup-post, kup-mangle and the return path, with the
// identity SNAT on the pod's node too): on each programming node a DNAT per interface,
// translating to the local pod or to the far end of its link, with the request's identity
// SNAT; on the pod's node that SNAT once, and the far ends of the links (emitPodEnd). Each
// family the pod has gets these entries on the interfaces that serve it (served6): an
// interface without IPv6 keeps its IPv4 entries, and its node row says what IPv6 lacks.
func (c *compiler) emit(p *plan) {
	if !p.ok() {
		return
	}
	problems, tunnels, built := c.checkNodes(p)
	// A tunnel on the class's port is no node waiting to be ready: the link it keeps off the
	// node is missing until the class's port or the node's tunnels change, as a class that
	// builds no links refuses it (route).
	switch {
	case len(tunnels) > 0:
		p.fail(v1alpha1.ReasonReturnPathUnavailable, strings.Join(append(tunnels, problems...), "; "))
	case len(problems) > 0:
		p.fail(v1alpha1.ReasonNodeNotReady, strings.Join(problems, "; "))
	}
	if len(built) == 0 {
		return
	}
	ep := p.ep
	v4 := ep.address != ""
	podPorts := p.ports.startingAt(ep.port)
	w := wirePorts{dialed: c.wire(p.ports), pod: c.wire(podPorts)}
	carriers := map[string]bool{}
	var links []*target
	// links6 are the targets of links that carry the mapping's IPv6 side.
	links6 := map[*target]bool{}
	any6 := false
	for _, t := range built {
		b := c.programs[t.node]
		ifaces6 := c.served6(p, t)
		if !v4 && len(ifaces6) == 0 {
			continue
		}
		carriers[t.node] = true
		any6 = any6 || len(ifaces6) > 0
		// A local pod is translated to at once. Over a link the dialed port is kept, so the
		// pod's node tells mappings that share a pod port apart by it, and translates there.
		to, to6, toPorts, toWire := ep.address, ep.address6, podPorts, w.pod
		if t.link != nil {
			to, to6, toPorts, toWire = t.link.addressText(ep.node), t.link.addressText6(ep.node), p.ports, w.dialed
			links = append(links, t)
			d := p.class.device(ep.node)
			if v4 {
				b.addSnat(p, "snat", DirectionIn, FamilyIPv4, requestSnat(p, to, toWire))
			}
			if len(ifaces6) > 0 {
				links6[t] = true
				b.addSnat(p, "snat6", DirectionIn, FamilyIPv6, requestSnat(p, to6, toWire))
			}
			b.uses(p, d, false)
		}
		for _, i := range t.ifaces {
			pub := v1alpha1.PublishedAddress{Node: t.node, Interface: i}
			if v4 {
				b.addDnat(p, c.intern("dnat/"+i), FamilyIPv4, &kuportv1.DnatRule{
					InInterface: i, Protocol: p.proto, Ports: w.dialed, ToAddress: to, ToPort: toPorts.first,
					StandIn: to,
				}, false)
				pub.Address = c.node(t.node).address(i)
			}
			if slices.Contains(ifaces6, i) {
				b.addDnat(p, c.intern("dnat6/"+i), FamilyIPv6, &kuportv1.DnatRule{
					InInterface: i, Protocol: p.proto, Ports: w.dialed, ToAddress: to6, ToPort: toPorts.first,
					StandIn: to6,
				}, false)
				pub.Address6 = c.node(t.node).address6(i)
			} else if !v4 {
				continue
			}
			p.published = append(p.published, pub)
		}
	}
	if !v4 && !any6 {
		p.fail(v1alpha1.ReasonNodeNotReady, fmt.Sprintf(
			"the pod has an IPv6 address only, and no interface of the mapping serves IPv6 to it on node %s",
			strings.Join(targetNodes(p), ", ")))
		return
	}
	// The pod's node delivers every request, local or off a link, to the pod: the identity
	// SNAT claims it whatever device the CNI gives the pod.
	pod := c.programs[ep.node]
	carriers[ep.node] = true
	if v4 {
		pod.addSnat(p, "snat", DirectionIn, FamilyIPv4, requestSnat(p, ep.address, w.pod))
	}
	if any6 {
		pod.addSnat(p, "snat6", DirectionIn, FamilyIPv6, requestSnat(p, ep.address6, w.pod))
	}
	if len(links) > 0 {
		c.emitPodEnd(p, links, links6, w)
	}
	p.nodes = slices.Sorted(maps.Keys(carriers))
}

// link6 reports whether a link carries IPv6: its class has a usable subnet6 and both its
// nodes forward IPv6. A link between nodes that do not keeps the IPv4-only form, so a node
// without IPv6 is given no IPv6 address to set.
func (c *compiler) link6(cl *claim) bool {
	return cl.has6() && c.node(cl.peers[0]).serves6() && c.node(cl.peers[1]).serves6()
}

// served6 are the interfaces of a target that serve the plan's IPv6 side: the pod has an IPv6
// address, the target's node forwards IPv6 and the interface has a global IPv6 address, and
// over a link the link carries IPv6 and the pod's node forwards it too. Nil when none do.
func (c *compiler) served6(p *plan, t *target) []string {
	v := c.node(t.node)
	if p.ep.address6 == "" || !v.serves6() ||
		t.link != nil && !c.link6(t.link) {
		return nil
	}
	var out []string
	for _, i := range t.ifaces {
		if v.address6(i) != "" {
			out = append(out, i)
		}
	}
	return out
}

// requestSnat is the identity SNAT claiming a mapping's forwarded request, translated towards
// address:ports, before the CNI's masquerade
// (docs/design/datapath.md#kup-post-the-identity-snat).
func requestSnat(p *plan, address string, ports *kuportv1.PortRange) *kuportv1.SnatRule {
	return &kuportv1.SnatRule{
		Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST, Address: address, Protocol: p.proto, Ports: ports,
	}
}

// wirePorts are a plan's dialed and pod port ranges as its rules carry them.
type wirePorts struct{ dialed, pod *kuportv1.PortRange }

// emitLink puts a link's device on both of its nodes, each named after the other, with the
// ends of its /127 when it carries IPv6 (link6).
func (c *compiler) emitLink(cl *claim, a, b string) {
	ua, ma := c.node(a).underlay()
	ub, mb := c.node(b).underlay()
	six := c.link6(cl)
	for _, end := range [2][4]string{{a, b, ua, ub}, {b, a, ub, ua}} {
		self, peer := end[0], end[1]
		l := &kuportv1.Link{
			Name: cl.class.device(peer).name, ClassName: cl.class.name, PeerNode: peer,
			Vni: cl.vni(), Port: cl.class.port, LocalUnderlay: end[2], RemoteUnderlay: end[3],
			LocalAddress: cl.addressText(self), PeerAddress: cl.addressText(peer),
			Mtu: linkMTU(ma, mb), Mac: linkMAC(cl.address(self)),
			SourcePortLow: linkSourcePortLow, SourcePortHigh: linkSourcePortHigh,
		}
		if six {
			l.LocalAddress6, l.PeerAddress6 = cl.addressText6(self), cl.addressText6(peer)
		}
		c.programs[self].addLink(l)
	}
}

// emitPodEnd writes the pod node's side of a plan's links (docs/design/datapath.md: the link,
// kup-mangle, the return path and serving modes): per link the device on both ends, the DNAT
// of what arrives on it and its return path; the reply's identity SNAT once; and the return
// marking, the Multi form under Single too
// (docs/design/datapath.md#kup-mangle-return-marking): the arrival link is recorded in the
// flow's conntrack mark (a CT_SAVE rule per link) and restored onto the reply (one CT_RESTORE
// rule, shared by every mapping to the pod port). So any number of mappings, of any classes
// and modes, reach one pod port at once and each reply returns the way its request came: over
// its link, or by main for a flow that came in by none (a local accepting node's). A static
// mark (MARK_KIND_STATIC) would send every reply from the pod port into one link. A packet
// the pod sends first, with no conntrack entry (or one that idled out), takes mark 0 and
// leaves by the node's own uplink; under the static mark it went over the link, where the
// accepting node's conntrack had no entry to translate it back either, so it was lost the
// same (docs/design/datapath.md#kup-mangle-return-marking).
func (c *compiler) emitPodEnd(p *plan, links []*target, links6 map[*target]bool, w wirePorts) {
	ep := p.ep
	v4 := ep.address != ""
	b := c.programs[ep.node]
	for _, t := range links {
		cl := t.link
		c.emitLink(cl, t.node, ep.node)
		d := p.class.device(t.node)
		dev := d.name
		mark := c.marking.Mark(cl.ends[ep.node])
		peerUnderlay, _ := c.node(t.node).underlay()
		// The link carries the dialed ports (see emit); translate them to the pod's here.
		// arrive is a family's DNAT of what arrives at here, this node's end of the link, to
		// the pod at to, and the save of the link's mark on its flow.
		arrive := func(f Family, dnat, ctSave, here, to string) {
			b.addDnat(p, dnat, f, &kuportv1.DnatRule{
				InInterface: dev, MatchDestination: here, Protocol: p.proto, Ports: w.dialed,
				ToAddress: to, ToPort: ep.port, StandIn: to,
			}, true)
			b.addMark(p, ctSave, DirectionIn, f, &kuportv1.MarkRule{
				Kind:        kuportv1.MarkKind_MARK_KIND_CT_SAVE,
				InInterface: dev, Address: here, Protocol: p.proto, Ports: w.dialed, Mark: mark,
			})
		}
		if v4 {
			arrive(FamilyIPv4, d.dnat, d.ctSave, cl.addressText(ep.node), ep.address)
		}
		if links6[t] {
			arrive(FamilyIPv6, d.dnat6, d.ctSave6, cl.addressText6(ep.node), ep.address6)
		}
		// The return path is the link's, whichever mappings use it: its IPv6 gateway is set
		// whenever the link carries IPv6.
		rp := &kuportv1.ReturnPath{
			Id: d.returnPath, Link: dev, Mark: mark, Table: uint32(cl.ends[ep.node]),
			PeerUnderlay: peerUnderlay, PeerLinkAddress: cl.addressText(t.node),
		}
		if c.link6(cl) {
			rp.PeerLinkAddress6 = cl.addressText6(t.node)
		}
		b.addReturnPath(rp)
		b.uses(p, d, true)
	}
	// reply is a family's identity SNAT of the pod's replies into a link and the restore of
	// their flow's mark.
	reply := func(f Family, snat, ctRestore, pod string) {
		b.addSnat(p, snat, DirectionOut, f, &kuportv1.SnatRule{
			Kind:    kuportv1.SnatKind_SNAT_KIND_REPLY,
			Address: pod, Protocol: p.proto, Ports: w.pod,
		})
		b.addMark(p, ctRestore, DirectionOut, f, &kuportv1.MarkRule{
			Kind:    kuportv1.MarkKind_MARK_KIND_CT_RESTORE,
			Address: pod, Protocol: p.proto, Ports: w.pod,
		})
	}
	if v4 {
		reply(FamilyIPv4, "snat-reply", "ct-restore", ep.address)
	}
	if len(links6) > 0 {
		reply(FamilyIPv6, "snat6-reply", "ct-restore6", ep.address6)
	}
}
