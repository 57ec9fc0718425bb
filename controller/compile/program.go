package compile

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// programBuilder accumulates one node's program; links and return paths shared by several
// mappings are added once.
type programBuilder struct {
	p       *kuportv1.NodeProgram
	links   map[string]bool
	returns map[string]bool
}

func newProgramBuilder(node string) *programBuilder {
	return &programBuilder{p: &kuportv1.NodeProgram{Node: node}, links: map[string]bool{}, returns: map[string]bool{}}
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
	slices.SortFunc(b.p.DnatRules, func(x, y *kuportv1.DnatRule) int { return cmp.Compare(x.Id, y.Id) })
	slices.SortFunc(b.p.SnatRules, func(x, y *kuportv1.SnatRule) int { return cmp.Compare(x.Id, y.Id) })
	slices.SortFunc(b.p.MarkRules, func(x, y *kuportv1.MarkRule) int { return cmp.Compare(x.Id, y.Id) })
	slices.SortFunc(b.p.Links, func(x, y *kuportv1.Link) int { return cmp.Compare(x.Name, y.Name) })
	slices.SortFunc(b.p.ReturnPaths, func(x, y *kuportv1.ReturnPath) int { return cmp.Compare(x.Id, y.Id) })
	return b.p
}

// nodeNeeds is what a node must have for a mapping's entries: addresses on the interfaces it
// binds and, when it holds a link, on its underlay.
type nodeNeeds struct {
	ifaces   []string
	underlay bool
}

// checkNodes reports what the nodes carrying a plan lack (NodeNotReady). blocking is true
// when an entry cannot be built at all: a node with no Node object, no reported state, or a
// link end with no underlay address. Otherwise the entries are emitted and only the status
// says what is missing.
func (c *compiler) checkNodes(p *plan) (problems []string, blocking bool) {
	needs := map[string]*nodeNeeds{}
	get := func(n string) *nodeNeeds {
		if needs[n] == nil {
			needs[n] = &nodeNeeds{}
		}
		return needs[n]
	}
	for _, t := range p.targets {
		get(t.node).ifaces = t.ifaces
		if t.link != nil {
			get(t.node).underlay = true
			get(p.ep.node).underlay = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(needs)) {
		v, need := c.node(name), needs[name]
		var miss []string
		switch {
		case !v.exists:
			miss, blocking = append(miss, "no Node object"), true
		case v.state == nil:
			miss, blocking = append(miss, "no agent has connected"), true
		default:
			for _, i := range need.ifaces {
				if v.address(i) == "" {
					miss = append(miss, fmt.Sprintf("interface %s has no IPv4 address", i))
				}
			}
			if addr, _ := v.underlay(); need.underlay && addr == "" {
				miss, blocking = append(miss, fmt.Sprintf("underlay interface %q has no IPv4 address", v.underlayName())), true
			}
			if !v.state.GetIpForward() {
				miss = append(miss, "net.ipv4.ip_forward is 0")
			}
		}
		if len(miss) > 0 {
			problems = append(problems, fmt.Sprintf("node %s: %s", name, strings.Join(miss, ", ")))
		}
	}
	return problems, blocking
}

// emit writes a viable plan's entries into the programs of its nodes (founding document, the
// two nft blocks and the return path; DESIGN.md for the identity SNAT on the pod's node).
func (c *compiler) emit(p *plan) {
	if !p.ok() {
		return
	}
	if c.crossesTaken(p) {
		return
	}
	problems, blocking := c.checkNodes(p)
	if len(problems) > 0 {
		p.fail(v1alpha1.ReasonNodeNotReady, strings.Join(problems, "; "))
	}
	if blocking {
		return
	}
	ep := p.ep
	podPorts := p.ports.startingAt(ep.port)
	carriers := map[string]bool{}
	for _, t := range p.targets {
		b := c.programs[t.node]
		carriers[t.node] = true
		// A local pod is translated to at once. Over a link the dialed port is kept, so the
		// pod's node tells mappings that share a pod port apart by it, and translates there.
		to, toPorts, egress := ep.address, podPorts, cniHostDevice
		if t.link != nil {
			to, toPorts, egress = t.link.address(ep.node).String(), p.ports, linkName(p.class.name, ep.node)
			c.cross(p, t.link)
		}
		for _, i := range t.ifaces {
			b.p.DnatRules = append(b.p.DnatRules, &kuportv1.DnatRule{
				Id: p.key + "/dnat/" + i, Mapping: p.key, InInterface: i,
				Protocol: p.proto, Ports: p.ports.wire(), ToAddress: to, ToPort: toPorts.first,
			})
			p.published = append(p.published, v1alpha1.PublishedAddress{
				Node: t.node, Interface: i, Address: c.node(t.node).address(i),
			})
		}
		b.p.SnatRules = append(b.p.SnatRules, &kuportv1.SnatRule{
			Id: p.key + "/snat", Mapping: p.key, Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
			OutInterface: egress, Address: to, Protocol: p.proto, Ports: toPorts.wire(),
		})
		if t.link != nil {
			carriers[ep.node] = true
			c.emitLink(t.link, t.node, ep.node)
			c.emitPodEnd(p, t, podPorts)
		}
	}
	p.nodes = slices.Sorted(maps.Keys(carriers))
}

// crossing is traffic of one protocol over one link: on the pod's node, the link-side DNAT
// matches the link device, its /31 address, the protocol and the dialed port, nothing more.
type crossing struct {
	class, pair string
	proto       kuportv1.Protocol
}

// crossesTaken refuses a plan whose dialed ports would cross one of its links alongside an
// older mapping's (two interfaces of one node may hold the same port, API.md PortConflict,
// but one link cannot carry both to different pods): the newer is not accepted.
func (c *compiler) crossesTaken(p *plan) bool {
	for _, t := range p.remoteTargets() {
		k := crossing{class: p.class.name, pair: t.link.key(), proto: p.proto}
		for _, other := range c.crossings[k] {
			if other.ports.overlaps(p.ports) {
				p.acceptReason = v1alpha1.ReasonPortConflict
				p.acceptMsg = fmt.Sprintf("%s ports %s cross link %s of class %q, which already carries them for %s",
					p.pm.Spec.Protocol, other.ports, t.link.key(), p.class.name, other.by)
				return true
			}
		}
	}
	return false
}

// cross records that p's dialed ports cross link cl.
func (c *compiler) cross(p *plan, cl *claim) {
	k := crossing{class: p.class.name, pair: cl.key(), proto: p.proto}
	c.crossings[k] = append(c.crossings[k], holding{ports: p.ports, by: p.key})
}

// emitLink puts a link's device on both of its nodes, each named after the other.
func (c *compiler) emitLink(cl *claim, a, b string) {
	ua, ma := c.node(a).underlay()
	ub, mb := c.node(b).underlay()
	for _, end := range [2][4]string{{a, b, ua, ub}, {b, a, ub, ua}} {
		self, peer := end[0], end[1]
		c.programs[self].addLink(&kuportv1.Link{
			Name: linkName(cl.class.name, peer), ClassName: cl.class.name, PeerNode: peer,
			Vni: cl.vni(), Port: cl.class.port, LocalUnderlay: end[2], RemoteUnderlay: end[3],
			LocalAddress: cl.address(self).String(), PeerAddress: cl.address(peer).String(),
			Mtu: linkMTU(ma, mb),
		})
	}
}

// emitPodEnd writes the pod node's side of a link target: the DNAT of what arrives on the
// link, the identity SNATs of the request and the reply, the reply's mark and its return path.
func (c *compiler) emitPodEnd(p *plan, t *target, podPorts portRange) {
	// The link carries the dialed ports (see emit); translate them to the pod's here.
	ep, cl := p.ep, t.link
	b := c.programs[ep.node]
	dev := linkName(p.class.name, t.node)
	table := cl.ends[ep.node]
	peerUnderlay, _ := c.node(t.node).underlay()
	b.p.DnatRules = append(b.p.DnatRules, &kuportv1.DnatRule{
		Id: p.key + "/dnat/" + dev, Mapping: p.key, InInterface: dev,
		MatchDestination: cl.address(ep.node).String(), Protocol: p.proto, Ports: p.ports.wire(),
		ToAddress: ep.address, ToPort: ep.port,
	})
	b.p.SnatRules = append(b.p.SnatRules,
		&kuportv1.SnatRule{
			Id: p.key + "/snat", Mapping: p.key, Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
			OutInterface: cniHostDevice, Address: ep.address, Protocol: p.proto, Ports: podPorts.wire(),
		},
		&kuportv1.SnatRule{
			Id: p.key + "/snat-reply", Mapping: p.key, Kind: kuportv1.SnatKind_SNAT_KIND_REPLY,
			OutInterface: cniDevicePrefix, Address: ep.address, Protocol: p.proto, Ports: podPorts.wire(),
		})
	b.p.MarkRules = append(b.p.MarkRules, &kuportv1.MarkRule{
		Id: p.key + "/mark", Mapping: p.key, Kind: kuportv1.MarkKind_MARK_KIND_STATIC, Address: ep.address,
		Protocol: p.proto, Ports: podPorts.wire(), Mark: markOf(table),
	})
	b.addReturnPath(&kuportv1.ReturnPath{
		Id: dev + "/return", Link: dev, Mark: markOf(table), Table: uint32(table),
		PeerUnderlay: peerUnderlay, PeerLinkAddress: cl.address(t.node).String(),
	})
}
