package netlab

import (
	"context"
	"crypto/sha1" // only to name devices as Calico does
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"
)

// CNI is a CNI profile of the namespace lab: which devices a node's pods sit behind and
// which of the CNI's own NAT and mark rules each node carries (tables `ip lab-cni` and, for
// IPv6, `ip6 lab-cni`).
type CNI string

// The lab's CNI profiles; CNICilium is the default.
const (
	// CNICilium is Cilium with legacy host routing in tunnel mode and iptables masquerade
	// (a default Helm install): pods on lxc* veths behind cilium_host.
	CNICilium CNI = "cilium"
	// CNIFlannel is Flannel with its iptables masquerade (flanneld --ip-masq) and its CNI
	// plugin's bridge: pods on veth* ports of cni0.
	CNIFlannel CNI = "flannel"
	// CNICalico is Calico's iptables dataplane with natOutgoing: pods on cali* veths, no
	// bridge, a /32 route and proxy ARP per pod.
	CNICalico CNI = "calico"
)

// CNIs lists the profiles, the default first.
func CNIs() []CNI { return []CNI{CNICilium, CNIFlannel, CNICalico} }

// ParseCNI returns the profile named s ("" is the default, cilium).
func ParseCNI(s string) (CNI, error) {
	if s == "" {
		return CNICilium, nil
	}
	for _, c := range CNIs() {
		if string(c) == s {
			return c, nil
		}
	}
	return "", fmt.Errorf("netlab: unknown CNI profile %q (want cilium, flannel or calico)", s)
}

// ClusterCIDR is the lab's cluster pod network, holding every node's pod CIDR: Flannel's
// Network, Calico's IP pool and Cilium's native-routing CIDR.
var ClusterCIDR = netip.MustParsePrefix("10.244.0.0/16")

// ClusterCIDR6 is ClusterCIDR's IPv6 twin, holding every node's PodCIDR6: Flannel's
// IPv6Network, Calico's IPv6 pool and Cilium's IPv6 native-routing CIDR.
var ClusterCIDR6 = netip.MustParsePrefix("fd00:10:244::/48")

// calicoGateway is the link-local next hop Calico's CNI plugin gives every pod; the host
// side of the pod's veth answers ARP for it by proxy.
var calicoGateway = netip.MustParseAddr("169.254.1.1")

// calicoGateway6 is the next hop of a Calico pod's IPv6 default route: no proxy, but the
// host side's own link-local address, which the kernel derives from calicoHostMAC.
var calicoGateway6 = netip.MustParseAddr("fe80::ecee:eeff:feee:eeee")

// calicoHostMAC is the MAC Calico gives the host side of every pod veth.
const calicoHostMAC = "ee:ee:ee:ee:ee:ee"

// Bridge is the bridge a node's pods are attached to, or "" for a profile without one
// (calico).
func (c CNI) Bridge() string {
	switch c {
	case CNIFlannel:
		return "cni0"
	case CNICalico:
		return ""
	}
	return "cilium_host"
}

// HostEnd is the node-side name of pod's veth: Cilium's lxc + 8 hex digits, the bridge
// plugin's veth + 8 hex digits (random there, derived from the name here), Calico's
// cali + 11 hex digits of a SHA-1 of the workload.
func (c CNI) HostEnd(pod string) string {
	switch c {
	case CNICalico:
		sum := sha1.Sum([]byte(pod))
		return "cali" + hex.EncodeToString(sum[:])[:11]
	case CNIFlannel:
		sum := sha256.Sum256([]byte(pod))
		return "veth" + hex.EncodeToString(sum[:])[:8]
	}
	sum := sha256.Sum256([]byte(pod))
	return "lxc" + hex.EncodeToString(sum[:])[:8]
}

// PodDevice is the node device a packet to pod leaves by: the bridge, or under calico the
// pod's own veth.
func (c CNI) PodDevice(pod string) string {
	if b := c.Bridge(); b != "" {
		return b
	}
	return c.HostEnd(pod)
}

// PodDevicePrefix is the interface-name prefix every device of the profile's pod network
// starts with (nft's "prefix*" form): the datapath's CNI device match.
func (c CNI) PodDevicePrefix() string {
	switch c {
	case CNIFlannel:
		return "cni0"
	case CNICalico:
		return "cali"
	}
	return "cilium_"
}

// PodGateway is the next hop of a pod's default route on node s: the bridge's address
// (s.PodGateway) for the bridge profiles, Calico's 169.254.1.1 otherwise.
func (c CNI) PodGateway(s NodeSpec) netip.Addr {
	if c == CNICalico {
		return calicoGateway
	}
	return s.PodGateway().Addr()
}

// PodGateway6 is the next hop of a pod's IPv6 default route on node s: the bridge's
// address (s.PodGateway6) for the bridge profiles, the link-local fe80::ecee:eeff:feee:eeee
// of the pod's host end under calico.
func (c CNI) PodGateway6(s NodeSpec) netip.Addr {
	if c == CNICalico {
		return calicoGateway6
	}
	return s.PodGateway6().Addr()
}

// podPrefix is the length of a pod's own address: the node's pod CIDR under the bridge
// profiles, a /32 under calico (its IPAM hands out single addresses).
func (c CNI) podPrefix(s NodeSpec) int {
	if c == CNICalico {
		return 32
	}
	return s.PodCIDR.Bits()
}

// podPrefix6 is podPrefix for a pod's IPv6 address: PodCIDR6's length, or a /128 under
// calico.
func (c CNI) podPrefix6(s NodeSpec) int {
	if c == CNICalico {
		return 128
	}
	return s.PodCIDR6.Bits()
}

// ruleset is the profile's own NAT (and, for calico, mark) rules on node s, as nftables
// in tables `ip lab-cni` and `ip6 lab-cni`: each CNI writes the same rules for both
// families, with ip6tables and its IPv6 ranges (the source files named in
// familyRules).
func (c CNI) ruleset(s NodeSpec) string {
	return c.familyRules(strings.NewReplacer(
		"{ip}", "ip", "{node}", s.PodCIDR.Masked().String(), "{cluster}", ClusterCIDR.String(),
		"{gateway}", s.PodGateway().Addr().String(), "{multicast}", "224.0.0.0/4",
		"{loopback}", "127.0.0.1", "{addr}", "ipv4_addr")) +
		c.familyRules(strings.NewReplacer(
			"{ip}", "ip6", "{node}", s.PodCIDR6.Masked().String(), "{cluster}", ClusterCIDR6.String(),
			"{gateway}", s.PodGateway6().Addr().String(), "{multicast}", "ff00::/8",
			"{loopback}", "::1", "{addr}", "ipv6_addr"))
}

// familyRules is the profile's table for one family, the placeholders replaced by f: {ip}
// the family (ip, ip6, also its match keyword), {node} this node's pod CIDR, {cluster} the
// cluster's, {gateway} the bridge's address, {multicast}, {loopback} and {addr} (the nft
// address type). Each rule is the CNI's iptables rule rewritten as nft, the source file
// named next to it.
func (c CNI) familyRules(f *strings.Replacer) string {
	var b strings.Builder
	b.WriteString("table {ip} lab-cni {\n")
	switch c {
	case CNIFlannel:
		b.WriteString(`	chain postrtg {
		type nat hook postrouting priority srcnat; policy accept;
		# flannel-io/flannel pkg/trafficmngr/iptables/iptables.go masqRules and, for IPv6,
		# masqIP6Rules (the same rules, multicast ff00::/8), chain FLANNEL-POSTRTG:
		# kube-proxy's masquerade mark (trafficmngr.KubeProxyMark 0x4000/0x4000) is left to kube-proxy
		meta mark & 0x00004000 == 0x00004000 counter return
		# pod network to pod network is not NATed, either way
		{ip} saddr {node} {ip} daddr {cluster} counter return
		{ip} saddr {cluster} {ip} daddr {node} counter return
		# external traffic to this node's pods keeps its source
		{ip} saddr != {cluster} {ip} daddr {node} counter return
		# pods to anywhere but multicast: masquerade --random-fully
		{ip} saddr {cluster} {ip} daddr != {multicast} counter masquerade fully-random
		# the outside to a remote node's pods: masquerade --random-fully
		{ip} saddr != {cluster} {ip} daddr {cluster} counter masquerade fully-random
	}
`)
	case CNICalico:
		b.WriteString(`	set all-ipam-pools {
		type {addr}; flags interval;
		elements = { {cluster} }
	}
	set masq-ipam-pools {
		type {addr}; flags interval;
		elements = { {cluster} }
	}
	chain raw-prerouting {
		type filter hook prerouting priority raw; policy accept;
		# projectcalico/calico felix/rules/static.go StaticRawPreroutingChain: clear every Calico mark
		# bit (allCalicoMarkBits: accept 0x10000, pass 0x20000, scratch0 0x80000, scratch1 0x100000,
		# as felix/dataplane/driver.go allocates them from IptablesMarkMask 0xffff0000)
		counter meta mark set meta mark & 0xffe4ffff
		# ... then set scratch0, "from workload", on what a workload interface (cali*) sends
		iifname "cali*" counter meta mark set meta mark | 0x00080000
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		# felix/rules/static.go StaticNATPostroutingChains jumps to cali-nat-outgoing, whose rule
		# felix/rules/nat.go makeNATOutgoingRuleIPTables writes for each IP version's pools: natOutgoing
		# pool source to a destination outside every pool, MASQUERADE
		{ip} saddr @masq-ipam-pools {ip} daddr != @all-ipam-pools counter masquerade
	}
`)
	default:
		b.WriteString(`	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		# cilium/cilium pkg/datapath/iptables/iptables.go installMasqueradeRules, chain CILIUM_POST_nat,
		# called for iptables and ip6tables alike (enable-ipv6-masquerade, on by default):
		# "cilium masquerade non-cluster": this node's pods to outside the native-routing CIDR,
		# unless leaving by a cilium_ device
		{ip} saddr {node} {ip} daddr != {cluster} oifname != "cilium_*" counter masquerade
		# "exclude proxy return traffic from masquerade": MagicMarkIsProxy 0x0a00 under MagicMarkProxyMask 0x0e00
		meta mark & 0x00000e00 == 0x00000a00 counter accept
		# tunnel mode, "cilium host->cluster masquerade": anything not from this node's pods
		# entering cilium_host for a pod not on this node takes cilium_host's address
		{ip} saddr != {node} {ip} daddr != {node} oifname "cilium_host" counter snat to {gateway}
		# "cilium host->cluster from 127.0.0.1 masquerade" (from ::1 for IPv6)
		{ip} saddr {loopback} oifname "cilium_host" counter snat to {gateway}
	}
`)
	}
	b.WriteString("}\n")
	return f.Replace(b.String())
}

// RemoveCNIEmulation deletes the profile's emulated rules (tables `ip lab-cni` and `ip6
// lab-cni`) and its
// bridge on every node, for a caller that then runs the CNI itself once SelfCheck has
// proved the mesh emulation (the kubelet-backed lab runs real Flannel): the pod network is
// the real CNI's from then on, and AddPod must not be called again.
func (n *Net) RemoveCNIEmulation(ctx context.Context) error {
	for _, s := range nodes {
		for _, family := range []string{"ip", "ip6"} {
			if _, err := n.Exec(ctx, s.Name, "nft", "delete", "table", family, "lab-cni"); err != nil {
				return err
			}
		}
		if br := n.cni.Bridge(); br != "" {
			if err := n.ip(ctx, s.Name, "link", "delete", br); err != nil {
				return err
			}
		}
	}
	return nil
}
