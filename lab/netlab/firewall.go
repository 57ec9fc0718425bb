package netlab

import (
	"context"
	"fmt"
	"strings"
)

// Host firewalls as real nodes run them (docs/design/datapath.md#kup-steer-host-firewalls): a
// block-mode ingress firewall like Talos's, and a mesh's mark-and-drop pair like netbird's.
// Neither is part of the lab until a test adds it to a node; both live in tables of their
// own, which kuport never touches.

// Names of the firewall tables and their named counters, for NftCounter.
const (
	FirewallTable   = "lab-firewall" // family inet
	FirewallDrops   = "fw_drops"     // new connections to the node's own addresses it dropped
	MeshMarkTable   = "lab-meshmark" // family ip
	MeshMarked      = "marked"       // packets to a local address the mesh marked at mangle
	MeshUnmarkedDrp = "unmarked_drops"
	// linkPort is the UDP port of kuport's links (the class default), which the firewall
	// opens to the nodes' underlays as an operator opens the CNI's vxlan port.
	linkPort = 4790
	// meshMark is netbird's mark on packets to the node's own addresses.
	meshMark = "0x1bd00"
)

// firewallRuleset is a block-mode ingress firewall like Talos's: a filter chain at
// prerouting priority dstnat - 10 (-110) that passes established and related flows, traffic
// not addressed to this node, loopback, ICMP and ICMPv6 (neighbour discovery among it),
// opens the mesh's WireGuard port on its endpoint interface (as every WireGuard node must)
// and kuport's link port to the nodes' underlays, IPv4 and IPv6, on the underlay interface,
// and drops every other new connection to the node's own addresses. No nat chain can run
// ahead of it: the kernel runs every nat chain from its one hook at dstnat (-100).
func firewallRuleset() string {
	peers := make([]string, 0, len(nodes))
	peers6 := make([]string, 0, len(nodes))
	for _, s := range nodes {
		peers = append(peers, s.UnderlayAddr.Addr().String())
		peers6 = append(peers6, s.UnderlayAddr6.Addr().String())
	}
	return fmt.Sprintf(`table inet %s {
	counter %s {
	}
	chain ingress {
		type filter hook prerouting priority dstnat - 10; policy accept;
		iifname "lo" accept
		ct state established,related accept
		ct state invalid drop
		fib daddr type != local accept
		meta l4proto { icmp, ipv6-icmp } accept
		iifname %[3]q udp dport %[4]d accept
		iifname %[5]q ip saddr { %[6]s } udp dport %[7]d accept
		iifname %[5]q ip6 saddr { %[8]s } udp dport %[7]d accept
		counter name %[2]q drop
	}
}
`, FirewallTable, FirewallDrops, endpointIface, WireGuardPort, nodes[0].UnderlayIface, strings.Join(peers, ", "), linkPort, strings.Join(peers6, ", "))
}

// meshMarkRuleset is a mesh's pair like netbird's: at mangle (-150) a packet addressed to
// one of the node's own addresses is marked, and one delivered locally without the mark is
// dropped later, at input. A rewrite of the destination ahead of mangle would leave the
// first rule unmatched.
func meshMarkRuleset() string {
	return fmt.Sprintf(`table ip %s {
	counter %s {
	}
	counter %s {
	}
	chain prerouting {
		type filter hook prerouting priority mangle; policy accept;
		fib daddr type local counter name %q meta mark set %s
	}
	chain input {
		type filter hook input priority filter; policy accept;
		meta mark != %s counter name %q drop
	}
}
`, MeshMarkTable, MeshMarked, MeshUnmarkedDrp, MeshMarked, meshMark, meshMark, MeshUnmarkedDrp)
}

// AddHostFirewall loads firewallRuleset and meshMarkRuleset into node's namespace.
func (n *Net) AddHostFirewall(ctx context.Context, node string) error {
	if _, ok := n.Node(node); !ok {
		return fmt.Errorf("netlab: host firewall: unknown node %q", node)
	}
	return n.NftApply(ctx, node, firewallRuleset()+meshMarkRuleset())
}
