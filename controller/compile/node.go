package compile

import (
	"fmt"
	"net/netip"
	"strings"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// nodeView is what compile knows of one node: whether a Node object exists and the state its
// agent last reported (nil when no agent ever reported).
type nodeView struct {
	name   string
	exists bool
	state  *kuportv1.NodeState
	// tunnels are the node's tunnel devices by UDP port (tunnelsOf).
	tunnels map[uint32]string
	// cniRefusal says why the node's CNI cannot carry kuport's reply path, cniWarning why it
	// likely cannot (cniView.verdict); nil when nothing says so.
	cniRefusal, cniWarning []string
}

// maxNamedNetkit is how many netkit devices netkitDevices names (a node has one per pod).
const maxNamedNetkit = 3

// netkitDevices names the netkit devices the agent reports on the node, "" when none.
func (v *nodeView) netkitDevices() string {
	var names []string
	n := 0
	for _, i := range v.state.GetInterfaces() {
		if !i.GetNetkit() {
			continue
		}
		if n++; n <= maxNamedNetkit {
			names = append(names, i.GetName())
		}
	}
	if n > maxNamedNetkit {
		names = append(names, fmt.Sprintf("%d more", n-maxNamedNetkit))
	}
	return strings.Join(names, ", ")
}

// tunnelsOf maps each UDP port a tunnel device of another program (the CNI's) uses on a node
// to those devices, "flannel.1 (vxlan)"; nil when there is none. kuport's own links are left
// out: two classes on one port are told apart by their VNIs (validateClasses).
func tunnelsOf(st *kuportv1.NodeState) map[uint32]string {
	var m map[uint32]string
	for _, i := range st.GetInterfaces() {
		port := i.GetUdpPort()
		if i.GetTunnel() == kuportv1.TunnelKind_TUNNEL_KIND_UNSPECIFIED || port == 0 || strings.HasPrefix(i.GetName(), linkPrefix) {
			continue
		}
		dev := fmt.Sprintf("%s (%s)", i.GetName(), strings.ToLower(strings.TrimPrefix(i.GetTunnel().String(), "TUNNEL_KIND_")))
		if m == nil {
			m = map[uint32]string{}
		}
		if m[port] != "" {
			dev = m[port] + ", " + dev
		}
		m[port] = dev
	}
	return m
}

// iface returns the reported interface of that name, or nil.
func (v *nodeView) iface(name string) *kuportv1.Interface {
	if v.state == nil {
		return nil
	}
	for _, i := range v.state.GetInterfaces() {
		if i.GetName() == name {
			return i
		}
	}
	return nil
}

// address returns the first IPv4 address the agent reports on the interface, or "".
func (v *nodeView) address(iface string) string {
	for _, a := range v.iface(iface).GetAddresses() {
		if ip, err := netip.ParseAddr(a); err == nil && ip.Is4() {
			// The reported text, when it is the canonical form, is shared rather than made
			// again for every mapping publishing it.
			var buf [len("255.255.255.255")]byte
			if string(ip.AppendTo(buf[:0])) == a {
				return a
			}
			return ip.String()
		}
	}
	return ""
}

// address6 returns the first global IPv6 address the agent reports on the interface, or "".
func (v *nodeView) address6(iface string) string {
	for _, a := range v.iface(iface).GetAddresses6() {
		if ip, err := netip.ParseAddr(a); err == nil && ip.Is6() && !ip.Is4In6() && ip.IsGlobalUnicast() {
			if t := ip.String(); t != a {
				return t
			}
			return a
		}
	}
	return ""
}

// serves6 reports whether the node forwards IPv6 (net.ipv6.conf.all.forwarding).
func (v *nodeView) serves6() bool { return v.state.GetIpv6Forward() }

// ifaceProblem6 says why an interface serves no IPv6 on the node, "" when it has a global
// IPv6 address.
func (v *nodeView) ifaceProblem6(name string) string {
	switch {
	case v.iface(name) == nil:
		return fmt.Sprintf("interface %s not present", name)
	case v.address6(name) == "":
		return fmt.Sprintf("interface %s has no global IPv6 address", name)
	}
	return ""
}

// ifaceProblem says why an interface gives no address on the node ("interface X not present"
// or "interface X has no IPv4 address"), "" when it has one (docs/design/api.md#status, the
// node rows).
func (v *nodeView) ifaceProblem(name string) string {
	switch {
	case v.iface(name) == nil:
		return fmt.Sprintf("interface %s not present", name)
	case v.address(name) == "":
		return fmt.Sprintf("interface %s has no IPv4 address", name)
	}
	return ""
}

// underlayName is the interface links' outer headers leave from.
func (v *nodeView) underlayName() string { return v.state.GetUnderlayInterface() }

// underlay returns the underlay's first IPv4 address ("" when unknown) and its MTU in bytes
// (0 when unknown).
func (v *nodeView) underlay() (string, uint32) {
	name := v.underlayName()
	if name == "" {
		return "", 0
	}
	return v.address(name), v.iface(name).GetMtu()
}
