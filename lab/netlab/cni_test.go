package netlab

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A pod's IPv6 address repeats the digits of its IPv4 host number inside the node's IPv6
// pod CIDR; an address outside the IPv4 pod CIDR has none.
func TestPodAddr6(t *testing.T) {
	edge := nodes[0]
	for v4, v6 := range map[string]string{
		"10.244.17.1":   "fd00:10:244:17::1",
		"10.244.17.10":  "fd00:10:244:17::10",
		"10.244.17.254": "fd00:10:244:17::254",
	} {
		assert.Equal(t, v6, edge.PodAddr6(netip.MustParseAddr(v4)).String(), v4)
	}
	assert.False(t, edge.PodAddr6(netip.MustParseAddr("10.244.18.10")).IsValid())
	assert.False(t, edge.PodAddr6(netip.MustParseAddr("fd00:10:244:17::10")).IsValid())
	for _, s := range nodes {
		assert.True(t, ClusterCIDR6.Contains(s.PodCIDR6.Addr()), s.Name)
		assert.Equal(t, s.PodGateway6().Addr(), s.PodAddr6(s.PodGateway().Addr()), s.Name)
	}
}

// Every profile writes its masquerade for both families, each with its own ranges.
func TestRulesetBothFamilies(t *testing.T) {
	edge := nodes[0]
	for cni, want := range map[CNI][]string{
		CNIFlannel: {
			"ip saddr 10.244.0.0/16 ip daddr != 224.0.0.0/4 counter masquerade fully-random",
			"ip6 saddr fd00:10:244::/48 ip6 daddr != ff00::/8 counter masquerade fully-random",
		},
		CNICalico: {
			"type ipv6_addr; flags interval;\n\t\telements = { fd00:10:244::/48 }",
			"ip6 saddr @masq-ipam-pools ip6 daddr != @all-ipam-pools counter masquerade",
		},
		CNICilium: {
			"ip saddr 10.244.17.0/24 ip daddr != 10.244.0.0/16 oifname != \"cilium_*\" counter masquerade",
			"ip6 saddr fd00:10:244:17::/64 ip6 daddr != fd00:10:244::/48 oifname != \"cilium_*\" counter masquerade",
			"ip6 saddr ::1 oifname \"cilium_host\" counter snat to fd00:10:244:17::1",
		},
	} {
		rules := cni.ruleset(edge)
		assert.Equal(t, 1, strings.Count(rules, "table ip lab-cni {"), cni)
		assert.Equal(t, 1, strings.Count(rules, "table ip6 lab-cni {"), cni)
		assert.NotContains(t, rules, "{ip}", cni)
		for _, w := range want {
			assert.Contains(t, rules, w, cni)
		}
	}
}
