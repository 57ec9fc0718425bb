package datapath

import (
	"regexp"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"kuport.wlz.li/kuport/datapath/datapathtest"
	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestPrivilegedRulesFollowSets: a rule is in the kernel while its set holds an element. A
// mapping matching a destination brings the rules of the destination sets and takes them
// when it goes, and only the chains are written anew: the table (and every element's
// counter) stays. An agent restarted writes nothing; a rule on an empty set added by hand,
// as an agent before this one wrote it, costs one chain's rewrite.
func TestPrivilegedRulesFollowSets(t *testing.T) {
	testenv.Privileged(t)
	tn := newTestNS(t, "100.64.93.150")
	one := datapathtest.Program(1, "enp1s0")
	two := proto.CloneOf(one)
	two.Version++
	ports := &kuportv1.PortRange{First: 20000, Last: 20000}
	two.DnatRules = append(two.DnatRules, &kuportv1.DnatRule{Id: "bench/addr/dnat/enp1s0", Mapping: "bench/addr", InInterface: "enp1s0",
		MatchDestination: "203.0.113.9", Protocol: kuportv1.Protocol_PROTOCOL_TCP, Ports: ports, ToAddress: "10.244.17.3", ToPort: 20000,
		StandIn: "10.244.17.3"})
	two.SnatRules = append(two.SnatRules, &kuportv1.SnatRule{Id: "bench/addr/snat", Mapping: "bench/addr",
		Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST, Address: "10.244.17.3", Protocol: kuportv1.Protocol_PROTOCOL_TCP, Ports: ports})
	back := proto.CloneOf(one)
	back.Version = two.Version + 1

	handleRE := regexp.MustCompile(`table inet kuport \{ # handle (\d+)`)
	tableHandle := func() string {
		m := handleRE.FindStringSubmatch(tn.exec(t, "nft", "-a", "list", "table", "inet", "kuport"))
		require.NotNil(t, m)
		return m[1]
	}
	// sets are the first set each of the chain's rules looks up, in order.
	sets := func(chain string) []string {
		var out []string
		for _, line := range strings.Split(tn.exec(t, "nft", "list", "chain", "inet", "kuport", chain), "\n") {
			if _, after, ok := strings.Cut(line, "@"); ok {
				out = append(out, strings.Fields(after)[0])
			}
		}
		return out
	}

	require.NoError(t, tn.dp.Apply(one))
	table := tableHandle()
	assert.Equal(t, []string{"dnat-ports"}, sets("kup-pre"))
	assert.Equal(t, []string{"snat-request"}, sets("kup-post"), "the request's SNAT rule stays with its set empty")
	assert.Equal(t, []string{"mark-ct-restore"}, sets("kup-mangle"), "the restore rule stays: it tells the mask")
	assert.Equal(t, []string{"steer-ports", "steer-ports"}, sets("kup-steer"))
	assert.Equal(t, []string{"count-out-ports"}, sets("kup-count-out"))

	require.NoError(t, tn.dp.Apply(two))
	assert.Equal(t, []string{"dnat-addr-ports", "dnat-ports"}, sets("kup-pre"))
	assert.Equal(t, []string{"steer-addr-ports", "steer-ports", "steer-addr-ports", "steer-ports"}, sets("kup-steer"))
	assert.Equal(t, []string{"count-out-addr-ports", "count-out-ports"}, sets("kup-count-out"))
	// Four elements (DNAT, steering, reply counting, SNAT) and three chains.
	assert.Equal(t, 7, tn.dp.lastChanges)
	assert.Equal(t, table, tableHandle(), "the table stays")

	restarted := New(Config{NFT: tn.dp.nft.(*nftables.Conn), Netlink: tn.nl, NetNS: tn.ns, Log: hclog.NewNullLogger()})
	require.NoError(t, restarted.Apply(two))
	assert.Zero(t, restarted.lastChanges, "an agent restarted reads the rules as it writes them")

	require.NoError(t, restarted.Apply(back))
	assert.Equal(t, []string{"dnat-ports"}, sets("kup-pre"))
	assert.Equal(t, []string{"steer-ports", "steer-ports"}, sets("kup-steer"))
	assert.Equal(t, []string{"count-out-ports"}, sets("kup-count-out"))
	assert.Equal(t, 7, restarted.lastChanges)
	assert.Equal(t, table, tableHandle())

	tn.exec(t, "nft", "add", "rule", "inet", "kuport", "kup-pre", "meta", "nfproto", "ipv4", "meta", "mark", "set", "meta", "mark", "|", "0x80",
		"dnat", "ip", "to", "iifname", ".", "ip", "daddr", ".", "meta", "l4proto", ".", "th", "dport", "map", "@dnat-addr-ports")
	again := New(Config{NFT: tn.dp.nft.(*nftables.Conn), Netlink: tn.nl, NetNS: tn.ns, Log: hclog.NewNullLogger()})
	require.NoError(t, again.Apply(back))
	assert.Equal(t, []string{"dnat-ports"}, sets("kup-pre"))
	assert.Equal(t, 1, again.lastChanges, "the chain alone is written anew")
	assert.Equal(t, table, tableHandle())
}
