package compile

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// Defaults of a PortMapClass (docs/design/api.md#portmapclass), applied here too so an object
// that skipped the CRD's defaulting compiles the same.
const (
	defaultPortMin     = 1
	defaultPortMax     = 65535
	defaultVNI         = 4242
	defaultVxlanPort   = 4790
	defaultSubnet      = "169.254.77.0/24"
	defaultSubnet6     = "fd64:f5ac:e961::/112"
	maxVNI             = 1<<24 - 1
	vxlanOverheadBytes = 50 // outer IPv4 + UDP + VXLAN + inner Ethernet
)

// classInfo is a PortMapClass with its defaults applied and its accepting nodes resolved.
type classInfo struct {
	name string
	// acceptedMsg is the Accepted condition's message of its mappings, made once.
	acceptedMsg string
	obj         *v1alpha1.PortMapClass
	// accepting nodes: spec.nodes names that have a Node object, sorted.
	accepting []string
	// ifaces are the class's interfaces per accepting node, sorted and deduplicated.
	ifaces           map[string][]string
	portMin, portMax int32
	// multi is servingMode Multi: every accepting node programs each mapping.
	multi      bool
	mode       v1alpha1.ReturnPathMode
	vni, port  uint32
	subnetText string
	subnet     netip.Prefix // valid only when the class builds links
	// subnet6 is valid only when the class builds links that carry IPv6; links6Off says why
	// they carry none ("" when they do, or build none).
	subnet6Text string
	subnet6     netip.Prefix
	links6Off   string
	// refusal is the Ready=False reason decided before allocation ("" when none): the class
	// then builds no links.
	refusal, refusalMsg string
	// exhausted lists the pairs that found no free slot in this compilation.
	exhausted []string
	// tunnelPods are the pods' nodes whose tunnel devices kept a link of the class off them
	// in this compilation (checkNodes); accepting nodes are checked whole (tunnelConflicts).
	tunnelPods map[string]bool
	// claims are the class's link slot claims by pair key "<a>/<b>".
	claims map[string]*claim
	// spots are the mappings' holds by protocol and interfaces (plan.holds).
	spots map[string]*spots
	// devices are its link devices by the peer they are named after (device).
	devices map[string]*linkDevice
}

func newClassInfo(name string, obj *v1alpha1.PortMapClass, nodes map[string]*nodeView) *classInfo {
	spec := obj.Spec
	ci := &classInfo{
		name:        name,
		acceptedMsg: fmt.Sprintf("accepted by class %q", name),
		obj:         obj,
		ifaces:      map[string][]string{},
		portMin:     max(cmp.Or(spec.Ports.Min, defaultPortMin), 1),
		portMax:     min(cmp.Or(spec.Ports.Max, defaultPortMax), 65535),
		multi:       spec.ServingMode == v1alpha1.ServingModeMulti,
		mode:        spec.ReturnPath.Mode.OrDefault(),
		vni:         uint32(max(cmp.Or(spec.ReturnPath.Vxlan.VNI, defaultVNI), 0)),
		port:        uint32(max(cmp.Or(spec.ReturnPath.Vxlan.Port, defaultVxlanPort), 0)),
		subnetText:  cmp.Or(spec.ReturnPath.Vxlan.Subnet, defaultSubnet),
		subnet6Text: cmp.Or(spec.ReturnPath.Vxlan.Subnet6, defaultSubnet6),
		claims:      map[string]*claim{},
		spots:       map[string]*spots{},
		devices:     map[string]*linkDevice{},
	}
	for n, cn := range spec.Nodes {
		if v, ok := nodes[n]; !ok || !v.exists {
			continue
		}
		ci.accepting = append(ci.accepting, n)
		ifs := slices.Clone(cn.Interfaces)
		slices.Sort(ifs)
		ci.ifaces[n] = slices.Compact(ifs)
	}
	slices.Sort(ci.accepting)
	return ci
}

func (ci *classInfo) accepts(node string) bool {
	_, ok := ci.ifaces[node]
	return ok
}

// buildsLinks reports whether the class may build links now: returnPath Vxlan and not refused.
func (ci *classInfo) buildsLinks() bool {
	return ci.mode == v1alpha1.ReturnPathVxlan && ci.refusal == ""
}

// programmingNodes are the nodes that may hold a mapping's DNAT rules
// (docs/design/datapath.md#serving-modes and
// docs/design/datapath.md#return-path-modes-and-the-refusal-matrix): the serving node under
// Single, every accepting node (sorted) under Multi. A mapping's interfaces then narrow them
// per node.
func (ci *classInfo) programmingNodes(serving string) []string {
	if ci.multi {
		return ci.accepting
	}
	return []string{serving}
}

// validateClasses decides, oldest class first, which Vxlan classes are refused before any
// allocation: an invalid subnet or subnet6, or a subnet or base VNI (on the same port) that
// collides with an older, valid Vxlan class sharing an accepting node
// (docs/design/api.md#links-and-slots). A CNI's tunnel on the class's port refuses the class
// on that node only (tunnelConflict). A subnet6 that overlaps an older class's refuses
// nothing: the class's links carry no IPv6 (links6Off), as every class gets the same default
// subnet6 and refusing would take IPv4 from classes that served it before.
func (c *compiler) validateClasses() {
	for i, ci := range c.classOrder {
		if ci.mode != v1alpha1.ReturnPathVxlan {
			continue
		}
		p, err := netip.ParsePrefix(ci.subnetText)
		if err != nil || !p.Addr().Is4() || p.Bits() > 31 {
			ci.refusal = v1alpha1.ReasonInvalidSubnet
			ci.refusalMsg = fmt.Sprintf("subnet %q is not an IPv4 CIDR with a prefix of at most 31 bits", ci.subnetText)
			continue
		}
		ci.subnet = p.Masked()
		p6, err := netip.ParsePrefix(ci.subnet6Text)
		if err != nil || !p6.Addr().Is6() || p6.Addr().Is4In6() || p6.Addr().Zone() != "" || p6.Bits() > 127 {
			ci.refusal = v1alpha1.ReasonInvalidSubnet
			ci.refusalMsg = fmt.Sprintf("subnet6 %q is not an IPv6 CIDR with a prefix of at most 127 bits", ci.subnet6Text)
			continue
		}
		ci.subnet6 = p6.Masked()
		for _, older := range c.classOrder[:i] {
			if !older.buildsLinks() {
				continue
			}
			shared := sharedAcceptingNode(ci, older)
			if shared == "" {
				continue
			}
			if ci.subnet.Overlaps(older.subnet) {
				ci.refusal = v1alpha1.ReasonSubnetOverlap
				ci.refusalMsg = fmt.Sprintf("subnet %s overlaps subnet %s of class %q, which shares node %s",
					ci.subnet, older.subnet, older.name, shared)
				break
			}
			if ci.port == older.port && ci.vni == older.vni {
				ci.refusal = v1alpha1.ReasonVxlanPortConflict
				ci.refusalMsg = fmt.Sprintf("vxlan port %d with base VNI %d is used by class %q, which shares node %s",
					ci.port, ci.vni, older.name, shared)
				break
			}
		}
		c.overlap6(ci, c.classOrder[:i])
	}
}

// overlap6 takes IPv6 off a class's links when its subnet6 overlaps that of an older class
// whose links carry IPv6. Unlike subnet, whose overlap counts on a shared accepting node only,
// any two classes may: both have the default until an admin sets one, and two classes'
// links to the same pod node would then give it one /127 on two devices.
func (c *compiler) overlap6(ci *classInfo, older []*classInfo) {
	if ci.refusal != "" {
		return
	}
	for _, o := range older {
		if o.buildsLinks() && o.subnet6.IsValid() && ci.subnet6.Overlaps(o.subnet6) {
			ci.links6Off = fmt.Sprintf("links carry no IPv6: subnet6 %s overlaps subnet6 %s of class %q",
				ci.subnet6, o.subnet6, o.name)
			ci.subnet6 = netip.Prefix{}
			return
		}
	}
}

// tunnelConflict names the devices of another program that use a class's vxlan port on a
// node ("" when none, or when the class builds no links). A link there would share the port's
// packets with the CNI's device (a collect-metadata one, as Cilium's, takes every VNI, and a
// geneve one keeps vxlan off the port), so no link of the class is built to or from the node.
func (c *compiler) tunnelConflict(ci *classInfo, node string) string {
	if !ci.buildsLinks() {
		return ""
	}
	return c.node(node).tunnels[ci.port]
}

// tunnelConflicts are the class's nodes whose tunnel devices use its port, "<devices> on
// <node>" sorted by node: its accepting nodes and the pods' nodes its links would have gone to.
func (c *compiler) tunnelConflicts(ci *classInfo) []string {
	nodes := slices.Collect(maps.Keys(ci.tunnelPods))
	for _, n := range ci.accepting {
		if c.tunnelConflict(ci, n) != "" && !ci.tunnelPods[n] {
			nodes = append(nodes, n)
		}
	}
	slices.Sort(nodes)
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = fmt.Sprintf("%s on %s", c.tunnelConflict(ci, n), n)
	}
	return out
}

// sharedAcceptingNode returns the first accepting node two classes share, or "".
func sharedAcceptingNode(a, b *classInfo) string {
	for _, n := range a.accepting {
		if b.accepts(n) {
			return n
		}
	}
	return ""
}

// classStatus is the status to write for a class: its Ready condition, one row per accepting
// node and its surviving link claims.
func (c *compiler) classStatus(ci *classInfo) *v1alpha1.PortMapClassStatus {
	reason, msg := v1alpha1.ReasonValid, "the class is valid"
	tunnels := c.tunnelConflicts(ci)
	switch {
	case ci.refusal != "":
		reason, msg = ci.refusal, ci.refusalMsg
	case len(tunnels) > 0:
		reason = v1alpha1.ReasonVxlanPortConflict
		msg = fmt.Sprintf("vxlan port %d is used by %s: no link of the class is built to or from those nodes",
			ci.port, strings.Join(tunnels, ", by "))
	case len(ci.exhausted) > 0:
		reason = v1alpha1.ReasonSubnetExhausted
		msg = fmt.Sprintf("subnet %s has no free /31 for %s", ci.subnet, strings.Join(ci.exhausted, ", "))
		if ci.subnet6.IsValid() && slotCount(ci.subnet6, 128) < slotCount(ci.subnet, 32) {
			msg = fmt.Sprintf("subnet6 %s has no free /127 for %s", ci.subnet6, strings.Join(ci.exhausted, ", "))
		}
	}
	st := &v1alpha1.PortMapClassStatus{
		ObservedGeneration: ci.obj.Generation,
		Conditions: []metav1.Condition{c.condition(ci.obj.Status.Conditions, v1alpha1.ClassConditionReady,
			reason == v1alpha1.ReasonValid, reason, msg, ci.obj.Generation), c.nodePortsCondition(ci)},
	}
	for _, n := range ci.accepting {
		st.Nodes = append(st.Nodes, c.nodeRow(ci, n))
	}
	for _, cl := range sortedValues(ci.claims, func(a, b *claim) int { return cmp.Compare(a.key(), b.key()) }) {
		st.Links = append(st.Links, cl.status())
	}
	return st
}

// nodeRow reports whether every interface the class gives a node resolves to an IPv4 address
// there, no tunnel of another program uses the class's port and the node's CNI can carry the
// reply path, with the underlay and link MTU (docs/design/api.md#status, the class status);
// its message also carries the warnings of a CNI that likely cannot (cniView.verdict).
func (c *compiler) nodeRow(ci *classInfo, name string) v1alpha1.ClassNodeStatus {
	v := c.node(name)
	row := v1alpha1.ClassNodeStatus{Name: name}
	problems, blocking := c.lacks(name, ci.ifaces[name], false, false)
	if blocking {
		row.Message = strings.Join(problems, ", ")
		return row
	}
	for _, ifn := range ci.ifaces[name] {
		if a := v.address(ifn); a != "" {
			if row.Addresses == nil {
				row.Addresses = map[string]string{}
			}
			row.Addresses[ifn] = a
		}
		if a := v.address6(ifn); a != "" {
			if row.Addresses6 == nil {
				row.Addresses6 = map[string]string{}
			}
			row.Addresses6[ifn] = a
		}
	}
	row.IPv6Unavailable = c.lacks6(ci, name)
	if dev := c.tunnelConflict(ci, name); dev != "" {
		problems = append(problems, fmt.Sprintf("%s: UDP port %d is used by %s on this node",
			v1alpha1.ReasonVxlanPortConflict, ci.port, dev))
	}
	// A pod on a node whose CNI cannot carry the reply path is refused (checkNodes); the row
	// says so for the node's own pods, and warns where the CNI likely cannot.
	problems = append(problems, v.cniRefusal...)
	if _, mtu := v.underlay(); mtu > 0 {
		row.UnderlayMTU = int32(min(mtu, 1<<31-1))
		row.LinkMTU = int32(linkMTU(mtu, mtu))
	}
	row.Ready = len(problems) == 0
	for _, w := range v.cniWarning {
		problems = append(problems, "warning: "+w)
	}
	row.Message = strings.Join(problems, ", ")
	return row
}

// lacks6 says why an accepting node serves no IPv6 on some of the class's interfaces, ""
// when it serves it on all: the node row's ipv6Unavailable, which never makes it not ready.
func (c *compiler) lacks6(ci *classInfo, name string) string {
	v := c.node(name)
	var miss []string
	for _, ifn := range ci.ifaces[name] {
		if v.iface(ifn) != nil && v.address6(ifn) == "" {
			miss = append(miss, v.ifaceProblem6(ifn))
		}
	}
	if !v.serves6() {
		miss = append(miss, "net.ipv6.conf.all.forwarding is 0")
	}
	if ci.links6Off != "" {
		miss = append(miss, ci.links6Off)
	}
	return strings.Join(miss, ", ")
}

// linkMTU is the MTU of a link between ends with these underlay MTUs: the smaller less the
// vxlan encapsulation (docs/design/datapath.md#mtu), 0 when unknown (a link is then not
// built, linkUnusable).
func linkMTU(a, b uint32) uint32 {
	// An end that reports no MTU yet does not drag the link down: the known end's figure
	// holds until the other's arrives (docs/design/datapath.md#mtu).
	m := max(a, b)
	if a != 0 && b != 0 {
		m = min(a, b)
	}
	if m <= vxlanOverheadBytes {
		return 0
	}
	return m - vxlanOverheadBytes
}
