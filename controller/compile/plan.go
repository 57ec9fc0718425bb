package compile

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// portRange is an inclusive range of transport ports.
type portRange struct{ first, last uint32 }

// String is the status form: "3000" or "27015-27115".
func (r portRange) String() string {
	if r.first == r.last {
		return strconv.FormatUint(uint64(r.first), 10)
	}
	return fmt.Sprintf("%d-%d", r.first, r.last)
}

func (r portRange) overlaps(o portRange) bool { return r.first <= o.last && o.first <= r.last }

// MaxShiftedRange is the most ports a range translated to other pod ports may span: the
// datapath renders it as a per-port map inside one rule
// (docs/design/datapath.md#port-ranges), and one netlink message holds about a thousand
// elements (a 28000-65535 map failed with "message too long"). A range whose pod ports equal
// its own is one range NAT, with no such limit.
const MaxShiftedRange = 512

// startingAt is the range of the same width from first: where a range is translated to.
func (r portRange) startingAt(first uint32) portRange {
	return portRange{first: first, last: first + r.last - r.first}
}

func (r portRange) wire() *kuportv1.PortRange {
	return &kuportv1.PortRange{First: r.first, Last: r.last}
}

// plan is one PortMap's compilation: the acceptance verdict, then the endpoint, serving node
// and targets, then what was emitted.
type plan struct {
	pm *v1alpha1.PortMap
	// key names its entries (MappingKey).
	key   string
	class *classInfo // nil when the class does not exist
	proto kuportv1.Protocol
	ports portRange
	// acceptReason is ReasonValid when accepted.
	acceptReason, acceptMsg string
	// progReason is "" until programming fails.
	progReason, progMsg string
	ep                  *endpoint
	targets             []*target
	// nodes whose programs carry the mapping's entries, and the addresses it answers on.
	nodes     []string
	published []v1alpha1.PublishedAddress
	// needs are the links ("<class>/<pair>") it needed when allocate ran.
	needs []string
	// crossed: the crossings hold took (the plan may fail later, in allocate or emit, and
	// keep them).
	crossed []crossing
}

// target is one programming node with the interfaces it binds (at least one), and the link
// to the pod's node when it lacks the pod (set by allocate).
type target struct {
	node   string
	ifaces []string
	link   *claim
}

// serving is the serving node (docs/design/api.md#portmap) of a plan with an endpoint, in a
// class with an accepting node: derived, not kept (16 bytes a plan put it in the next size
// class).
func (p *plan) serving() string {
	if p.class.accepts(p.ep.node) {
		return p.ep.node
	}
	return p.class.accepting[0]
}

// name is "<namespace>/<name>", for messages.
func (p *plan) name() string { return p.pm.Namespace + "/" + p.pm.Name }

func (p *plan) accepted() bool { return p.acceptReason == v1alpha1.ReasonValid }

func (p *plan) ok() bool { return p.accepted() && p.progReason == "" }

// fail records the first programming failure.
func (p *plan) fail(reason, msg string) {
	if p.progReason == "" {
		p.progReason, p.progMsg = reason, msg
	}
}

// remoteTargets are the targets of a still-viable plan that lack the pod and so need a link.
func (p *plan) remoteTargets() []*target {
	if !p.ok() {
		return nil
	}
	var out []*target
	for _, t := range p.targets {
		if t.node != p.ep.node {
			out = append(out, t)
		}
	}
	return out
}

// hold is one accepted mapping's claim on a port range of one node's interface.
type hold struct {
	node, iface string
	proto       kuportv1.Protocol
}

// plan decides acceptance in one phase, before any link slot is allocated: the checks of
// accept, then for a mapping that could be programmed its endpoint, serving node and targets
// (the programming nodes that bind an interface) and the link crossings they need
// (PortConflict too). Only then does an accepted mapping hold its ports and crossings, so a
// refused one holds nothing and a newer mapping is judged as if it did not exist; allocate
// and emit only number and write what is accepted here. A target lacking the pod in a class
// that builds no links fails the mapping with ReturnPathUnavailable
// (docs/design/datapath.md#return-path-modes-and-the-refusal-matrix).
func (c *compiler) plan(pm *v1alpha1.PortMap) *plan {
	p := &plan{pm: pm, key: MappingKey(pm)}
	first := uint32(max(pm.Spec.Port, 0))
	last := first
	if pm.Spec.EndPort != nil {
		last = uint32(max(*pm.Spec.EndPort, 0))
	}
	p.ports = portRange{first: first, last: last}
	p.acceptReason, p.acceptMsg = c.accept(p)
	if !p.accepted() {
		return p
	}
	c.route(p)
	if p.ok() {
		if reason, msg := c.wayTaken(p); reason != "" {
			p.acceptReason, p.acceptMsg = reason, msg
			return p
		}
	}
	c.hold(p)
	return p
}

// route chooses an accepted mapping's endpoint, serving node and targets, or records the
// programming failure that leaves it without them.
func (c *compiler) route(p *plan) {
	pm := p.pm
	ci := p.class
	ep, why := c.chooseEndpoint(p)
	if ep == nil {
		p.fail(v1alpha1.ReasonNoReadyEndpoint, why)
		return
	}
	p.ep = ep
	if len(ci.accepting) == 0 {
		p.fail(v1alpha1.ReasonNodeNotReady, fmt.Sprintf("class %q has no accepting node with a Node object", ci.name))
		return
	}
	// Under Multi an accepting node the narrowing leaves no interface carries nothing
	// (docs/design/api.md#portmap: interfaces resolve per node).
	candidates := ci.programmingNodes(p.serving())
	for _, n := range candidates {
		if ifs := narrow(ci.ifaces[n], pm.Spec.Interfaces); len(ifs) > 0 {
			p.targets = append(p.targets, &target{node: n, ifaces: ifs})
		}
	}
	if len(p.targets) == 0 {
		p.fail(v1alpha1.ReasonNoInterfaceOnNode, fmt.Sprintf("node %s has none of the interfaces %s",
			strings.Join(candidates, ", "), strings.Join(pm.Spec.Interfaces, ", ")))
		return
	}
	// Founding document, refusal table: a programming node that lacks the pod needs a link.
	var lacking []string
	for _, t := range p.targets {
		if t.node != ep.node {
			lacking = append(lacking, t.node)
		}
	}
	if len(lacking) == 0 || ci.buildsLinks() {
		return
	}
	cause := fmt.Sprintf("has returnPath %s", ci.mode)
	if ci.refusal != "" {
		cause = "builds no links: " + ci.refusal
	}
	holds := "holds"
	if len(lacking) > 1 {
		holds = "hold"
	}
	p.fail(v1alpha1.ReasonReturnPathUnavailable, fmt.Sprintf("the pod is on %s, not on %s which %s the mapping, and class %q %s",
		ep.node, strings.Join(lacking, ", "), holds, ci.name, cause))
}

// narrow is the class's interfaces for a node restricted to the mapping's, when it names any.
func narrow(classIfaces, want []string) []string {
	if len(want) == 0 {
		return classIfaces
	}
	var out []string
	for _, i := range classIfaces {
		if slices.Contains(want, i) {
			out = append(out, i)
		}
	}
	return out
}

// accept checks a mapping in the order of docs/design/api.md#status-and-conditions and
// returns the first failing reason with a message, or ReasonValid. It holds nothing: plan
// does, once every check has passed.
func (c *compiler) accept(p *plan) (string, string) {
	pm := p.pm
	ci := c.classes[pm.Spec.ClassName]
	if ci == nil {
		return v1alpha1.ReasonClassNotFound, fmt.Sprintf("PortMapClass %q not found", pm.Spec.ClassName)
	}
	p.class = ci
	if ok, msg := c.namespaceSelected(ci, pm.Namespace); !ok {
		return v1alpha1.ReasonNamespaceNotSelected, msg
	}
	switch pm.Spec.Protocol {
	case v1alpha1.ProtocolTCP:
		p.proto = kuportv1.Protocol_PROTOCOL_TCP
	case v1alpha1.ProtocolUDP:
		p.proto = kuportv1.Protocol_PROTOCOL_UDP
	default:
		return v1alpha1.ReasonInvalidPortRange, fmt.Sprintf("protocol %q is neither TCP nor UDP", pm.Spec.Protocol)
	}
	if pm.Spec.EndPort != nil && *pm.Spec.EndPort < pm.Spec.Port {
		return v1alpha1.ReasonInvalidPortRange, fmt.Sprintf("endPort %d is below port %d", *pm.Spec.EndPort, pm.Spec.Port)
	}
	if int64(pm.Spec.Port) < int64(ci.portMin) || int64(p.ports.last) > int64(ci.portMax) {
		return v1alpha1.ReasonPortOutOfRange, fmt.Sprintf("ports %s are outside class %q's range %d-%d",
			p.ports, ci.name, ci.portMin, ci.portMax)
	}
	reserved := slices.Sorted(slices.Values(ci.obj.Spec.Ports.Reserved))
	for _, r := range reserved {
		if r >= 0 && p.ports.overlaps(portRange{first: uint32(r), last: uint32(r)}) {
			return v1alpha1.ReasonPortReserved, fmt.Sprintf("port %d is reserved by class %q", r, ci.name)
		}
	}
	if h, other, ok := c.held[p.proto].firstOn(p.ports, p.holds()); ok {
		return v1alpha1.ReasonPortConflict, fmt.Sprintf("%s ports %s on %s interface %s are held by %s",
			pm.Spec.Protocol, other.ports, h.node, h.iface, other.by.name())
	}
	for _, want := range pm.Spec.Interfaces {
		if !slices.ContainsFunc(ci.accepting, func(n string) bool { return slices.Contains(ci.ifaces[n], want) }) {
			return v1alpha1.ReasonInterfaceNotInClass, fmt.Sprintf(
				"interface %s is not an interface of any accepting node of class %q", want, ci.name)
		}
	}
	return v1alpha1.ReasonValid, ci.acceptedMsg
}

// holds are the (node, interface, protocol) an accepted mapping holds its ports on: every one
// of its class it may bind. Mappings of a class with the same protocol and interfaces share them.
func (p *plan) holds() *spots {
	ci := p.class
	k := p.proto.String() + "/" + strings.Join(p.pm.Spec.Interfaces, ",")
	if s := ci.spots[k]; s != nil {
		return s
	}
	var list []hold
	for _, n := range ci.accepting {
		for _, i := range narrow(ci.ifaces[n], p.pm.Spec.Interfaces) {
			list = append(list, hold{node: n, iface: i, proto: p.proto})
		}
	}
	s := newSpots(list)
	ci.spots[k] = s
	return s
}

// pair is the node pair of the link a target lacking the pod needs.
func (p *plan) pair(t *target) [2]string { return pairOf(t.node, p.ep.node) }

// crossing is traffic of one protocol over one link: on the pod's node, the link-side DNAT
// matches the link device, its /31 address, the protocol and the dialed port, nothing more.
type crossing struct {
	class, pair string
	proto       kuportv1.Protocol
}

// wayTaken returns the PortConflict reason and message of a viable plan whose links an older
// accepted mapping already takes, "" when none does: its dialed ports may not cross any of
// its links alongside an older mapping's (two interfaces of one node may hold the same port,
// PortConflict in docs/design/api.md#portmap, but one link cannot carry both to different
// pods). Any number of mappings, of any classes, may reach one pod port: each reply returns
// the way its request came, by the flow's conntrack mark (emitPodEnd).
func (c *compiler) wayTaken(p *plan) (string, string) {
	for _, t := range p.remoteTargets() {
		pair := pairKey(p.pair(t))
		if other, ok := c.crossings[crossing{class: p.class.name, pair: pair, proto: p.proto}].first(p.ports); ok {
			return v1alpha1.ReasonPortConflict, fmt.Sprintf("%s ports %s cross link %s of class %q, which already carries them for %s",
				p.pm.Spec.Protocol, other.ports, pair, p.class.name, other.by.name())
		}
	}
	return "", ""
}

// hold records what an accepted mapping holds: its ports on every (node, interface) it may
// bind and, when it can be programmed, its dialed ports on every one of its links, built or
// not (so a link whose forwarder is not ready yet, or that finds no free slot, stays the
// older mapping's).
func (c *compiler) hold(p *plan) {
	holdingsOf(c.held, p.proto).add(p.ports, p, p.holds())
	if !p.ok() {
		return
	}
	for _, t := range p.remoteTargets() {
		k := crossing{class: p.class.name, pair: c.intern(pairKey(p.pair(t))), proto: p.proto}
		holdingsOf(c.crossings, k).add(p.ports, p, nil)
		p.crossed = append(p.crossed, k)
	}
}

// holdingsOf returns m's holdings of k, created on first use.
func holdingsOf[K comparable](m map[K]*holdings, k K) *holdings {
	h := m[k]
	if h == nil {
		h = &holdings{}
		m[k] = h
	}
	return h
}

// namespaceSelected applies the class's namespaceSelector to the namespace's labels; no
// selector, or an empty one, selects every namespace.
func (c *compiler) namespaceSelected(ci *classInfo, ns string) (bool, string) {
	sel := ci.obj.Spec.NamespaceSelector
	if sel == nil {
		return true, ""
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false, fmt.Sprintf("class %q has an invalid namespaceSelector: %v", ci.name, err)
	}
	var set labels.Set
	if n := c.s.Namespaces[ns]; n != nil {
		set = n.Labels
	}
	if !s.Matches(set) {
		return false, fmt.Sprintf("namespace %q is not selected by class %q", ns, ci.name)
	}
	return true, ""
}

// endpoint is the one pod a mapping forwards to, with its address of each family it has
// (address "" for a pod with an IPv6 address only).
type endpoint struct {
	node, address, address6, pod string
	// named: pod is the endpoint's targetRef name, by which its other family's endpoint is
	// found (else pod is its address).
	named bool
	// port is the pod's first port; a range keeps its width.
	port uint32
}

// chooseEndpoint picks the mapping's endpoint from its Service's EndpointSlices
// (docs/design/api.md#portmap): the current endpoint while it remains a candidate; else
// candidates on an accepting node first, by node name then pod name; else the smallest pod
// name. The candidates are the IPv4 endpoints, so a dual-stack Service's pod is chosen as an
// IPv4-only one's, and it takes the IPv6 address the IPv6 slices give the same pod (by
// targetRef name and node); only when there is no IPv4 candidate are the IPv6 endpoints the
// candidates, and the mapping is served on IPv6 alone. It returns nil and the reason when
// there is no candidate.
func (c *compiler) chooseEndpoint(p *plan) (*endpoint, string) {
	pm := p.pm
	svc := pm.Namespace + "/" + pm.Spec.ServiceRef.Name
	if c.s.Services[nsName(pm.Namespace, pm.Spec.ServiceRef.Name)] == nil {
		return nil, fmt.Sprintf("service %s not found", svc)
	}
	var cands, cands6 []endpoint
	// unusable says why a slice's port for the name could not serve the mapping.
	var unusable []string
	width := p.ports.last - p.ports.first
	for _, sl := range c.s.EndpointSlices[nsName(pm.Namespace, pm.Spec.ServiceRef.Name)] {
		if sl == nil || sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		port, ok := slicePort(sl.Ports, pm.Spec.ServiceRef.Port, pm.Spec.Protocol)
		switch {
		case !ok:
			if other := namedPortProtocol(sl.Ports, pm.Spec.ServiceRef.Port); other != "" {
				unusable = append(unusable, fmt.Sprintf("port %q is %s, the mapping %s", pm.Spec.ServiceRef.Port, other, pm.Spec.Protocol))
			}
			continue
		case uint64(port)+uint64(width) > 65535:
			unusable = append(unusable, fmt.Sprintf("pod ports %d-%d pass 65535", port, uint64(port)+uint64(width)))
			continue
		case port != p.ports.first && width+1 > MaxShiftedRange:
			unusable = append(unusable, fmt.Sprintf(
				"pod port %d shifts the %d-port range, and a shifted range spans at most %d ports", port, width+1, MaxShiftedRange))
			continue
		}
		v6 := sl.AddressType == discoveryv1.AddressTypeIPv6
		for _, e := range sl.Endpoints {
			if !endpointServes(e.Conditions.Ready, e.Conditions.Terminating) || e.NodeName == nil ||
				*e.NodeName == "" || len(e.Addresses) == 0 {
				continue
			}
			ep := endpoint{node: *e.NodeName, pod: e.Addresses[0], port: port}
			if e.TargetRef != nil && e.TargetRef.Name != "" {
				ep.pod, ep.named = e.TargetRef.Name, true
			}
			switch {
			case !v6 && isIPv4(e.Addresses[0]):
				ep.address = e.Addresses[0]
				cands = append(cands, ep)
			case v6:
				if a, ok := ipv6Text(e.Addresses[0]); ok {
					ep.address6 = a
					cands6 = append(cands6, ep)
				}
			}
		}
	}
	only6 := len(cands) == 0
	if only6 {
		cands = cands6
	}
	if len(cands) == 0 {
		msg := fmt.Sprintf("service %s has no ready, non-terminating IPv4 or IPv6 endpoint with a node for %s port %q",
			svc, pm.Spec.Protocol, pm.Spec.ServiceRef.Port)
		if len(unusable) > 0 {
			slices.Sort(unusable)
			msg += ": " + strings.Join(slices.Compact(unusable), "; ")
		}
		return nil, msg
	}
	ci := p.class
	slices.SortFunc(cands, func(a, b endpoint) int {
		aa, ba := ci.accepts(a.node), ci.accepts(b.node)
		switch {
		case aa && !ba:
			return -1
		case ba && !aa:
			return 1
		case aa:
			return cmp.Or(cmp.Compare(a.node, b.node), cmp.Compare(a.pod, b.pod), cmp.Compare(a.address, b.address),
				cmp.Compare(a.address6, b.address6))
		}
		return cmp.Or(cmp.Compare(a.pod, b.pod), cmp.Compare(a.address, b.address), cmp.Compare(a.address6, b.address6),
			cmp.Compare(a.node, b.node))
	})
	ep := &cands[0]
	if cur := pm.Status.Endpoint; cur != nil {
		for i := range cands {
			e := &cands[i]
			if e.node == cur.Node && (e.address == cur.Address && !only6 || only6 && cur.Address == "" && e.address6 == cur.Address6) {
				ep = e
				break
			}
		}
	}
	if !only6 {
		ep.address6 = sixOf(ep, cands6, pm.Status.Endpoint)
	}
	return ep, ""
}

// sixOf is the IPv6 address of ep's pod among the IPv6 candidates: the one of the same
// targetRef name, node and port; the current endpoint's when the pod has several, else the
// smallest. "" when the pod has none, or ep has no targetRef to find it by.
func sixOf(ep *endpoint, cands6 []endpoint, cur *v1alpha1.EndpointStatus) string {
	if !ep.named {
		return ""
	}
	var out string
	for _, e := range cands6 {
		if !e.named || e.pod != ep.pod || e.node != ep.node || e.port != ep.port {
			continue
		}
		if cur != nil && cur.Node == ep.node && cur.Address == ep.address && e.address6 == cur.Address6 {
			return e.address6
		}
		if out == "" || e.address6 < out {
			out = e.address6
		}
	}
	return out
}

func nsName(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}

// slicePort is the port an EndpointSlice gives for a Service port name and protocol (an
// unset protocol is TCP, as in the discovery API): a UDP mapping never binds a TCP port.
func slicePort(ports []discoveryv1.EndpointPort, name string, proto v1alpha1.Protocol) (uint32, bool) {
	for _, p := range ports {
		pp := corev1.ProtocolTCP
		if p.Protocol != nil {
			pp = *p.Protocol
		}
		if p.Name != nil && *p.Name == name && string(pp) == string(proto) && p.Port != nil && *p.Port > 0 && *p.Port <= 65535 {
			return uint32(*p.Port), true
		}
	}
	return 0, false
}

// namedPortProtocol is the protocol of the slice's port of that name when it exists ("" when
// none does), so a protocol mismatch can be told from a missing name.
func namedPortProtocol(ports []discoveryv1.EndpointPort, name string) corev1.Protocol {
	for _, p := range ports {
		if p.Name != nil && *p.Name == name {
			if p.Protocol == nil {
				return corev1.ProtocolTCP
			}
			return *p.Protocol
		}
	}
	return ""
}

// endpointServes applies EndpointSlice condition semantics: a nil ready counts as ready, and
// a terminating endpoint does not serve.
func endpointServes(ready, terminating *bool) bool {
	return (ready == nil || *ready) && (terminating == nil || !*terminating)
}

func isIPv4(s string) bool {
	ip, err := netip.ParseAddr(s)
	return err == nil && ip.Is4()
}

// ipv6Text is s in the canonical form rules carry when it is an IPv6 address (no zone, not
// IPv4-mapped).
func ipv6Text(s string) (string, bool) {
	ip, err := netip.ParseAddr(s)
	if err != nil || !ip.Is6() || ip.Is4In6() || ip.Zone() != "" {
		return "", false
	}
	if t := ip.String(); t != s {
		return t, true
	}
	return s, true
}
