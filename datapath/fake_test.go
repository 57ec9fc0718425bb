package datapath

import (
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
)

// datapath is a Datapath over the fake, logging to t.
func (k *fakeKernel) datapath(t *testing.T) *Datapath {
	return k.over(hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Trace, Output: testWriter{t}}))
}

// dump is the fake's dumpText.
func (k *fakeKernel) dump(t *testing.T) string {
	t.Helper()
	s, err := k.dumpText()
	require.NoError(t, err)
	return s
}

// TestFakeStates is TestPrivilegedStates against the fake kernel, without root.
func TestFakeStates(t *testing.T) {
	k := newFakeKernel("100.64.93.150")
	dp := k.datapath(t)
	for _, s := range workerBStates() {
		require.NoError(t, dp.Apply(s.program), s.name)
		assert.Equal(t, s.want, k.dump(t), s.name)
		require.NoError(t, dp.Apply(s.program), s.name)
		assert.Zero(t, dp.lastChanges, "%s: re-applying writes nothing", s.name)
		assert.Equal(t, s.want, k.dump(t), s.name)
	}
}

// TestFakeRepair is TestPrivilegedLifecycle's repair, and the removal of an element or of the
// whole table by someone else, against the fake kernel: one Apply puts back exactly what was
// damaged, and the next writes nothing.
func TestFakeRepair(t *testing.T) {
	base := goldenPrograms(t)["remote-worker-b"]
	k := newFakeKernel("100.64.93.150")
	dp := k.datapath(t)
	require.NoError(t, dp.Apply(base))
	want := k.dump(t)
	require.True(t, strings.HasPrefix(want, Render(base)), "the fake holds the rendered table:\n%s", want)
	kuport := &nftables.Table{Name: tableName, Family: tableFamily}
	link, err := k.LinkByName("kup-dcc4266d")
	require.NoError(t, err)

	damage := []struct {
		name   string
		do     func()
		writes int
	}{{
		name: "loop guard rule deleted, route flushed, rp_filter strict, device down",
		do: func() {
			rules, _ := k.RuleList(netlink.FAMILY_V4)
			i := slices.IndexFunc(rules, func(r netlink.Rule) bool { return r.Priority == markingOf(base).loopGuard })
			require.NoError(t, k.RuleDel(&rules[i]))
			routes, _ := k.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: int(base.GetReturnPaths()[0].GetTable())}, netlink.RT_FILTER_TABLE)
			require.Len(t, routes, 1)
			require.NoError(t, k.RouteDel(&routes[0]))
			require.NoError(t, k.setRPFilter(link.Attrs().Index, 1))
			k.links[k.linkByIndex(link.Attrs().Index)].Attrs().Flags &^= net.FlagUp
		},
		writes: 4,
	}, {
		name: "a DNAT element deleted",
		do: func() {
			elems, err := k.GetSetElements(&nftables.Set{Table: kuport, Name: "dnat-addr-ports"})
			require.NoError(t, err)
			require.NoError(t, k.SetDeleteElements(&nftables.Set{Table: kuport, Name: "dnat-addr-ports"}, elems[:1]))
			require.NoError(t, k.Flush())
		},
		writes: 1,
	}, {
		name: "the table deleted",
		do: func() {
			k.DelTable(kuport)
			require.NoError(t, k.Flush())
		},
		writes: 9, // the table, then its eight elements
	}}
	for _, d := range damage {
		d.do()
		assert.NotEqual(t, want, k.dump(t), d.name)
		require.NoError(t, dp.Apply(base), d.name)
		assert.Equal(t, d.writes, dp.lastChanges, d.name)
		assert.Equal(t, want, k.dump(t), d.name)
		require.NoError(t, dp.Apply(base), d.name)
		assert.Zero(t, dp.lastChanges, "%s: the repaired kernel needs no write", d.name)
	}
}

// TestFakeTransaction checks the fake's own contract: a Flush whose calls all succeed
// commits them and counts a generation; one that fails commits none of them.
func TestFakeTransaction(t *testing.T) {
	k := newFakeKernel("100.64.93.150")
	require.NoError(t, k.datapath(t).Apply(goldenPrograms(t)["local-edge-a"]))
	before, gen := k.dump(t), k.gen
	kuport := &nftables.Table{Name: tableName, Family: tableFamily}
	set := &nftables.Set{Table: kuport, Name: "dnat-ports"}
	elems, err := k.GetSetElements(set)
	require.NoError(t, err)
	require.NoError(t, k.SetDeleteElements(set, elems[:1]))
	require.NoError(t, k.SetDeleteElements(set, elems[:1])) // the second delete finds nothing
	require.ErrorIs(t, k.Flush(), syscall.ENOENT)
	assert.Equal(t, before, k.dump(t), "a failed transaction changes nothing")
	assert.Equal(t, gen, k.gen)
	require.NoError(t, k.SetDeleteElements(set, elems[:1]))
	require.NoError(t, k.Flush())
	assert.NotEqual(t, before, k.dump(t))
	assert.Equal(t, gen+1, k.gen)
}
