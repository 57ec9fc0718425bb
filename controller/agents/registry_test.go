package agents

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/programmed"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// remoteProgram is edge-a's program for mapping games/remote (pod on worker-b) plus, when
// withLocal, mapping games/local (pod on edge-a).
func remoteProgram(podAddr string, withLocal bool) *kuportv1.NodeProgram {
	p := &kuportv1.NodeProgram{
		DnatRules: []*kuportv1.DnatRule{{
			Id: "games/remote/dnat/enp1s0", Mapping: "games/remote", InInterface: "enp1s0",
			Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: &kuportv1.PortRange{First: 3000, Last: 3000},
			ToAddress: "169.254.77.1", ToPort: 3000,
		}},
		SnatRules: []*kuportv1.SnatRule{{
			Id: "games/remote/snat", Mapping: "games/remote", Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
			Address:  "169.254.77.1",
			Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: &kuportv1.PortRange{First: 3000, Last: 3000},
		}},
		Links: []*kuportv1.Link{{
			Name: "kup-1234abcd", ClassName: "public", PeerNode: "worker-b", Vni: 4242, Port: 4790,
			LocalUnderlay: "100.64.93.143", RemoteUnderlay: "100.64.93.144",
			LocalAddress: "169.254.77.0", PeerAddress: "169.254.77.1", Mtu: 1370,
		}},
	}
	if withLocal {
		p.DnatRules = append(p.DnatRules, &kuportv1.DnatRule{
			Id: "games/local/dnat/enp1s0", Mapping: "games/local", InInterface: "enp1s0",
			Protocol: kuportv1.Protocol_PROTOCOL_TCP, Ports: &kuportv1.PortRange{First: 8080, Last: 8080},
			ToAddress: podAddr, ToPort: 8080,
		})
	}
	return p
}

// remoteIndex is compile's index of remoteProgram: which of its entries and links are whose.
func remoteIndex(withLocal bool) compile.NodeIndex {
	idx := compile.NodeIndex{"games/remote": {
		Mapping: types.NamespacedName{Namespace: "games", Name: "remote"}, ServingNode: "edge-a",
		Entries: []compile.Entry{
			{ID: "games/remote/dnat/enp1s0", Name: "dnat/enp1s0", Kind: compile.KindDNAT, Direction: compile.DirectionIn, Interface: "enp1s0"},
			{ID: "games/remote/snat", Name: "snat", Kind: compile.KindSNAT, Direction: compile.DirectionIn},
		},
		Links: []string{"kup-1234abcd"},
	}}
	if withLocal {
		idx["games/local"] = &compile.MappingIndex{
			Mapping: types.NamespacedName{Namespace: "games", Name: "local"}, ServingNode: "edge-a",
			Entries: []compile.Entry{
				{ID: "games/local/dnat/enp1s0", Name: "dnat/enp1s0", Kind: compile.KindDNAT, Direction: compile.DirectionIn, Interface: "enp1s0"},
			},
		}
	}
	return idx
}

// edgeIndex is the index of edge-a holding remoteProgram.
func edgeIndex(withLocal bool) map[string]compile.NodeIndex {
	return map[string]compile.NodeIndex{"edge-a": remoteIndex(withLocal)}
}

// ready is programmed's verdict on whether node's kernel holds mapping.
func ready(r *Registry, node, mapping string) (bool, string) {
	return r.Acks(mapping, []string{node})[0].Ready()
}

// connected reports whether node's stream is open, as ListNodes says.
func connected(r *Registry, node string) bool {
	for _, n := range r.Nodes() {
		if n.Node == node {
			return n.Connected
		}
	}
	return false
}

func newTestRegistry(changes *[]Change) *Registry {
	return NewRegistry(Config{Epoch: 77, Start: t0, OnChange: func(c Change) {
		if changes != nil {
			*changes = append(*changes, c)
		}
	}})
}

func TestSetProgramsVersionsOnlyOnChange(t *testing.T) {
	r := newTestRegistry(nil)

	assert.Equal(t, []string{"edge-a", "worker-b"}, r.SetPrograms(map[string]*kuportv1.NodeProgram{
		"edge-a": remoteProgram("10.244.17.5", false), "worker-b": {},
	}, edgeIndex(false)))
	p, _, ok := r.Program("edge-a")
	require.True(t, ok)
	assert.Equal(t, uint64(1), p.Version)
	assert.Equal(t, uint64(77), p.Epoch)
	assert.Equal(t, "edge-a", p.Node)
	assert.Equal(t, remoteIndex(false), r.Index("edge-a"))

	// The same content (whatever version/epoch compile left on it) is no change.
	same := remoteProgram("10.244.17.5", false)
	same.Version, same.Epoch = 99, 3
	assert.Empty(t, r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": same, "worker-b": {}}, edgeIndex(false)))
	kept := p
	p, _, _ = r.Program("edge-a")
	assert.Equal(t, uint64(1), p.Version)
	assert.Same(t, same.DnatRules[0], p.DnatRules[0], "the equal new lists are held, not beside the old")
	assert.Equal(t, uint64(1), kept.Version, "the program stored before is not mutated")

	assert.Equal(t, []string{"edge-a"}, r.SetPrograms(map[string]*kuportv1.NodeProgram{
		"edge-a": remoteProgram("10.244.17.5", true), "worker-b": {},
	}, edgeIndex(true)))
	p, _, _ = r.Program("edge-a")
	assert.Equal(t, uint64(2), p.Version)
	assert.Len(t, p.DnatRules, 2)

	// A node compile no longer names is emptied once, then, with no agent connected,
	// forgotten.
	assert.Equal(t, []string{"edge-a"}, r.SetPrograms(map[string]*kuportv1.NodeProgram{"worker-b": {}}, nil))
	p, _, _ = r.Program("edge-a")
	assert.Equal(t, uint64(3), p.Version)
	assert.Empty(t, p.DnatRules)
	assert.Nil(t, r.Index("edge-a"))
	assert.Empty(t, r.SetPrograms(map[string]*kuportv1.NodeProgram{"worker-b": {}}, nil))
	_, _, ok = r.Program("edge-a")
	assert.False(t, ok)
	require.Len(t, r.Nodes(), 1)
	assert.Equal(t, "worker-b", r.Nodes()[0].Node)
}

// TestSetProgramsCarriesEveryField: every field of a compiled program but node, version and
// epoch (which the registry sets) is stored and served as compile left it, and a change of
// any one alone is a new version (a field the registry dropped would never reach an agent).
func TestSetProgramsCarriesEveryField(t *testing.T) {
	fields := (&kuportv1.NodeProgram{}).ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if f.Name() == "node" || f.Name() == "version" || f.Name() == "epoch" {
			continue
		}
		r := newTestRegistry(nil)
		base := remoteProgram("10.244.17.5", false)
		require.Equal(t, []string{"edge-a"}, r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": base}, edgeIndex(false)))
		changed := proto.Clone(base).(*kuportv1.NodeProgram)
		m := changed.ProtoReflect()
		switch {
		case f.IsList():
			l := m.Mutable(f).List()
			l.Append(l.NewElement())
		case f.Kind() == protoreflect.MessageKind:
			m.Mutable(f)
		default:
			t.Fatalf("%s: a field the test cannot change: %v", f.Name(), f.Kind())
		}
		assert.Equal(t, []string{"edge-a"}, r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": changed}, edgeIndex(false)), "%s", f.Name())
		p, _, _ := r.Program("edge-a")
		assert.Equal(t, uint64(2), p.GetVersion(), "%s", f.Name())
		got := proto.Clone(p).(*kuportv1.NodeProgram)
		got.Node, got.Version, got.Epoch = changed.Node, changed.Version, changed.Epoch
		assert.True(t, proto.Equal(changed, got), "%s is not stored as compiled", f.Name())
	}
}

// TestSetProgramsSharedByIncremental: programs as compile.Incremental leaves them (the lists
// of the entries it kept shared, a kept mapping's index entry the same pointer) store without
// a copy, and only the mapping whose entries changed gets a new version; the program given
// again by identity is no change.
func TestSetProgramsSharedByIncremental(t *testing.T) {
	r := newTestRegistry(nil)
	p1, idx1 := remoteProgram("10.244.17.5", true), remoteIndex(true)
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": p1}, map[string]compile.NodeIndex{"edge-a": idx1})
	stored, _, _ := r.Program("edge-a")
	assert.Same(t, p1.DnatRules[0], stored.DnatRules[0], "stored without a copy")

	// games/local moves to another pod: a new rule and index entry, the rest shared.
	local := proto.Clone(p1.DnatRules[1]).(*kuportv1.DnatRule)
	local.ToAddress = "10.244.17.6"
	p2 := &kuportv1.NodeProgram{DnatRules: []*kuportv1.DnatRule{p1.DnatRules[0], local}, SnatRules: p1.SnatRules, Links: p1.Links}
	idx2 := compile.NodeIndex{"games/remote": idx1["games/remote"], "games/local": remoteIndex(true)["games/local"]}
	assert.Equal(t, []string{"edge-a"}, r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": p2}, map[string]compile.NodeIndex{"edge-a": idx2}))
	versions := map[string]uint64{}
	for _, m := range []string{"games/remote", "games/local"} {
		versions[m] = r.Mapping(m)[0].Version
	}
	assert.Equal(t, map[string]uint64{"games/remote": 1, "games/local": 2}, versions)
	assert.Empty(t, r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": p2}, map[string]compile.NodeIndex{"edge-a": idx2}))

	// Shared lists but another index entry of the same content: digested, and unchanged.
	idx3 := compile.NodeIndex{"games/remote": remoteIndex(true)["games/remote"], "games/local": idx2["games/local"]}
	p3 := &kuportv1.NodeProgram{DnatRules: p2.DnatRules, SnatRules: p2.SnatRules, Links: p2.Links, MarkRules: []*kuportv1.MarkRule{}}
	assert.Empty(t, r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": p3}, map[string]compile.NodeIndex{"edge-a": idx3}))
	assert.Equal(t, uint64(1), r.Mapping("games/remote")[0].Version)
}

func TestMappingVersionsAndAckGating(t *testing.T) {
	var changes []Change
	r := newTestRegistry(&changes)
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", false)}, edgeIndex(false)) // v1

	ok, why := ready(r, "edge-a", "games/remote")
	assert.False(t, ok)
	assert.Equal(t, "node edge-a: agent not connected", why)

	s := r.connect(&kuportv1.Hello{Node: "edge-a", AgentVersion: "test"})
	assert.Equal(t, []Change{StateChanged}, changes)
	assert.Nil(t, r.next(s), "held: nothing is sent before Release")
	released := r.Release(nil, t0.Add(time.Second))
	require.True(t, released)
	require.NotNil(t, r.next(s))

	ok, why = ready(r, "edge-a", "games/remote")
	assert.False(t, ok)
	assert.Equal(t, "node edge-a has not acknowledged program version 1", why)

	r.ack(s, &kuportv1.Ack{Epoch: 77, Version: 1})
	assert.Equal(t, []Change{StateChanged, Acked}, changes)
	ok, _ = ready(r, "edge-a", "games/remote")
	assert.True(t, ok)

	// v2 adds games/local only: games/remote stays programmed at ack 1, games/local waits.
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", true)}, edgeIndex(true))
	ok, _ = ready(r, "edge-a", "games/remote")
	assert.True(t, ok)
	ok, why = ready(r, "edge-a", "games/local")
	assert.False(t, ok)
	assert.Equal(t, "node edge-a has not acknowledged program version 2", why)

	// v3 changes the link games/remote uses (its MTU): games/remote needs ack 3 now.
	p := remoteProgram("10.244.17.5", true)
	p.Links[0].Mtu = 1350
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": p}, edgeIndex(true))
	r.ack(s, &kuportv1.Ack{Epoch: 77, Version: 2})
	ok, _ = ready(r, "edge-a", "games/local")
	assert.True(t, ok)
	ok, why = ready(r, "edge-a", "games/remote")
	assert.False(t, ok)
	assert.Equal(t, "node edge-a has not acknowledged program version 3", why)

	// Acks of another epoch, of a version never sent, or older than the last are ignored.
	r.ack(s, &kuportv1.Ack{Epoch: 76, Version: 3})
	r.ack(s, &kuportv1.Ack{Epoch: 77, Version: 4})
	r.ack(s, &kuportv1.Ack{Epoch: 77, Version: 1})
	_, acked, _ := r.Program("edge-a")
	assert.Equal(t, uint64(2), acked)

	// An ack with an error on one of the mapping's entries (here its link) is not programmed.
	r.ack(s, &kuportv1.Ack{Epoch: 77, Version: 3, Errors: []*kuportv1.EntryError{{Id: "kup-1234abcd", Message: "file exists"}}})
	ok, why = ready(r, "edge-a", "games/remote")
	assert.False(t, ok)
	assert.Equal(t, "node edge-a failed to apply kup-1234abcd: file exists", why)
	ok, _ = ready(r, "edge-a", "games/local")
	assert.True(t, ok)

	// An error no entry owns (a refused transaction, fencing) fails every mapping on the node.
	for _, id := range []string{"", "ip rule 101 stale"} {
		r.ack(s, &kuportv1.Ack{Epoch: 77, Version: 3, Errors: []*kuportv1.EntryError{{Id: id, Message: "transaction refused"}}})
		for _, m := range []string{"games/local", "games/remote"} {
			ok, why = ready(r, "edge-a", m)
			assert.False(t, ok, "%s with error id %q", m, id)
			assert.Equal(t, "node edge-a failed to apply its program: transaction refused", why)
		}
	}

	r.disconnect(s)
	ok, why = ready(r, "edge-a", "games/local")
	assert.False(t, ok)
	assert.Equal(t, "node edge-a: agent disconnected", why)
	assert.False(t, connected(r, "edge-a"))
}

// TestHeldAcrossStreams: what an ended stream acknowledged whole stays known as held
// (programmed.Node.Held) while the node is away and after it comes back, until an error.
func TestHeldAcrossStreams(t *testing.T) {
	r := newTestRegistry(nil)
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", false)}, edgeIndex(false)) // v1
	released := r.Release(nil, t0.Add(time.Second))
	require.True(t, released)
	held := func() uint64 { return r.Acks("games/remote", []string{"edge-a"})[0].Held }

	s := r.connect(&kuportv1.Hello{Node: "edge-a"})
	r.ack(s, &kuportv1.Ack{Epoch: 77, Version: 1})
	assert.Equal(t, uint64(0), held(), "nothing held by an ended stream yet")
	r.disconnect(s)
	assert.Equal(t, uint64(1), held(), "the ended stream acknowledged version 1")

	// Back, as a restarted agent (no applied version): still held until it acknowledges.
	s = r.connect(&kuportv1.Hello{Node: "edge-a"})
	n := r.Acks("games/remote", []string{"edge-a"})[0]
	assert.Equal(t, programmed.Node{Name: "edge-a", Hello: true, Connected: true, Version: 1, Held: 1}, n)
	// A stream replaced before it acknowledged anything keeps what the one before held.
	s = r.connect(&kuportv1.Hello{Node: "edge-a"})
	assert.Equal(t, uint64(1), held())

	// A stream that ends with errors acknowledged leaves nothing known held.
	r.ack(s, &kuportv1.Ack{Epoch: 77, Version: 1, Errors: []*kuportv1.EntryError{{Message: "transaction refused"}}})
	r.disconnect(s)
	assert.Equal(t, uint64(0), held())
}

func TestReleaseWaitsForExpectedNodesOrTimeout(t *testing.T) {
	r := newTestRegistry(nil)
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", false), "worker-b": {}}, edgeIndex(false))
	s := r.connect(&kuportv1.Hello{Node: "edge-a"})

	released := r.Release([]string{"worker-b"}, t0.Add(5*time.Second))
	assert.False(t, released)
	assert.Nil(t, r.next(s), "edge-a must not get a program before worker-b said hello")

	// worker-b says hello, but the programs stored were compiled without its state: still
	// held, or edge-a would get a program missing the link to worker-b.
	r.connect(&kuportv1.Hello{Node: "worker-b"})
	released = r.Release([]string{"worker-b"}, t0.Add(6*time.Second))
	assert.False(t, released)
	assert.Nil(t, r.next(s))

	// A compile that heard worker-b releases.
	released = r.Release(nil, t0.Add(7*time.Second))
	assert.True(t, released)
	assert.Equal(t, uint64(1), r.next(s).GetProgram().GetVersion())

	// Without the peer, the hold ends at Start+Hold.
	r2 := newTestRegistry(nil)
	released = r2.Release([]string{"worker-b"}, t0.Add(DefaultHold))
	assert.True(t, released)
}

// TestAcksTermAndTouched: Acks and Term carry what programmed.Decide reads (settling is
// decided there from them), and Touched names the mappings a store, a connect, an ack or a
// disconnect may have changed, once.
func TestAcksTermAndTouched(t *testing.T) {
	r := newTestRegistry(nil)
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", false)}, edgeIndex(false)) // v1
	assert.Equal(t, []string{"games/remote"}, r.Touched())
	assert.Empty(t, r.Touched(), "forgotten once told")
	assert.Equal(t, []programmed.Node{{Name: "edge-a", Version: 1}, {Name: "worker-b"}},
		r.Acks("games/remote", []string{"edge-a", "worker-b"}), "worker-b: a node no program names")
	term := r.Term([]string{"worker-b"}, t0.Add(time.Second))
	assert.Equal(t, programmed.Term{Now: t0.Add(time.Second), HoldUntil: t0.Add(DefaultHold), Unheard: []string{"worker-b"}}, term)
	assert.True(t, term.Holding())

	s := r.connect(&kuportv1.Hello{Node: "edge-a", AppliedEpoch: 76, AppliedVersion: 9})
	assert.Equal(t, []string{"games/remote"}, r.Touched())
	assert.Equal(t, []programmed.Node{{Name: "edge-a", Hello: true, Connected: true, Version: 1}}, r.Acks("games/remote", []string{"edge-a"}),
		"what it holds is the previous term's: acknowledged nothing of this one")
	r.Release(nil, t0.Add(time.Second))
	assert.True(t, r.Term(nil, t0.Add(time.Second)).Released)
	require.NotNil(t, r.next(s))

	// v2 adds games/local: only it is touched; acking v2 touches it again, not games/remote.
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", true)}, edgeIndex(true))
	assert.Equal(t, []string{"games/local"}, r.Touched())
	r.ack(s, &kuportv1.Ack{Epoch: 77, Version: 1})
	assert.Equal(t, []string{"games/remote"}, r.Touched())
	r.ack(s, &kuportv1.Ack{Epoch: 77, Version: 2})
	assert.Equal(t, []string{"games/local"}, r.Touched())
	assert.Equal(t, []programmed.Node{{Name: "edge-a", Hello: true, Connected: true, Acked: 2, Version: 2}}, r.Acks("games/local", []string{"edge-a"}))

	// An error touches every mapping of the node, and so does its clearing.
	r.ack(s, &kuportv1.Ack{Epoch: 77, Version: 2, Errors: []*kuportv1.EntryError{{Id: "games/local/dnat/enp1s0", Message: "boom"}}})
	assert.Equal(t, []string{"games/local", "games/remote"}, r.Touched())
	assert.Equal(t, "games/local/dnat/enp1s0: boom", r.Acks("games/local", []string{"edge-a"})[0].Failed)
	r.ack(s, &kuportv1.Ack{Epoch: 77, Version: 2})
	assert.Equal(t, []string{"games/local", "games/remote"}, r.Touched())

	r.disconnect(s)
	assert.Equal(t, []string{"games/local", "games/remote"}, r.Touched())
}

func TestHelloWithCurrentProgramIsNotResent(t *testing.T) {
	r := newTestRegistry(nil)
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", false)}, edgeIndex(false))
	r.Release(nil, t0)
	s := r.connect(&kuportv1.Hello{Node: "edge-a", AppliedEpoch: 77, AppliedVersion: 1})
	assert.Nil(t, r.next(s))
	ok, _ := ready(r, "edge-a", "games/remote")
	assert.True(t, ok, "the agent said it holds version 1 of this epoch")

	// A newer stream of the same node replaces the old one; the old one's end changes nothing.
	s2 := r.connect(&kuportv1.Hello{Node: "edge-a", AppliedEpoch: 12, AppliedVersion: 1})
	select {
	case <-s.replaced:
	default:
		t.Fatal("old stream not told it was replaced")
	}
	r.disconnect(s)
	assert.True(t, connected(r, "edge-a"))
	assert.Equal(t, uint64(1), r.next(s2).GetProgram().GetVersion(), "a program of another epoch is replaced")
}

func TestReportStateAndCounters(t *testing.T) {
	var changes []Change
	r := newTestRegistry(&changes)
	state := &kuportv1.NodeState{UnderlayInterface: "wt0", Interfaces: []*kuportv1.Interface{{Name: "wt0", Addresses: []string{"100.64.93.143"}, Mtu: 1420}}}
	s := r.connect(&kuportv1.Hello{Node: "edge-a", State: state})
	r.report(s, &kuportv1.Report{State: state, Counters: []*kuportv1.Counter{{Id: "x", Packets: 3, Bytes: 120}}})
	assert.Equal(t, []Change{StateChanged}, changes, "the same state is no change")
	counters, _ := r.Stats("edge-a")
	assert.Equal(t, uint64(3), counters[0].Packets)

	r.report(s, &kuportv1.Report{State: &kuportv1.NodeState{UnderlayInterface: "wt0", IpForward: true}})
	assert.Equal(t, []Change{StateChanged, StateChanged}, changes)
	assert.True(t, r.Agents()["edge-a"].State.IpForward)
}

// TestMappingCounters: Mapping carries, per node, the counters of the mapping's entries in
// the node's current program, in report order, and no others.
func TestMappingCounters(t *testing.T) {
	r := newTestRegistry(nil)
	worker := &kuportv1.NodeProgram{DnatRules: []*kuportv1.DnatRule{{
		Id: "games/remote/dnat/kup-5e30a797", Mapping: "games/remote", InInterface: "kup-5e30a797",
		Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: &kuportv1.PortRange{First: 3000, Last: 3000},
		ToAddress: "10.244.18.107", ToPort: 3000,
	}}}
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", true), "worker-b": worker},
		map[string]compile.NodeIndex{"edge-a": remoteIndex(true), "worker-b": {"games/remote": {
			Mapping: types.NamespacedName{Namespace: "games", Name: "remote"}, ServingNode: "edge-a",
			Entries: []compile.Entry{{ID: "games/remote/dnat/kup-5e30a797", Name: "dnat/kup-5e30a797",
				Kind: compile.KindDNAT, Direction: compile.DirectionIn, Interface: "kup-5e30a797"}},
		}}})
	edge := r.connect(&kuportv1.Hello{Node: "edge-a"})
	r.report(edge, &kuportv1.Report{Counters: []*kuportv1.Counter{
		{Id: "games/remote/dnat/enp1s0", Packets: 7, Bytes: 700},
		{Id: "games/local/dnat/enp1s0", Packets: 2, Bytes: 120},
		{Id: "games/remote/snat", Packets: 7, Bytes: 700},
		{Id: "gone/old/dnat/enp1s0", Packets: 1, Bytes: 60}, // an entry the current program lacks
	}})
	wb := r.connect(&kuportv1.Hello{Node: "worker-b"})
	r.report(wb, &kuportv1.Report{Counters: []*kuportv1.Counter{{Id: "games/remote/dnat/kup-5e30a797", Packets: 6, Bytes: 600}}})

	// mappingCounters is Mapping's counters by node, leaving out nodes with none.
	mappingCounters := func(mapping string) map[string][]*kuportv1.Counter {
		out := map[string][]*kuportv1.Counter{}
		for _, mn := range r.Mapping(mapping) {
			if len(mn.Counters) > 0 {
				out[mn.Node] = mn.Counters
			}
		}
		return out
	}
	got := mappingCounters("games/remote")
	requireCounters := func(node string, want ...*kuportv1.Counter) {
		t.Helper()
		require.Len(t, got[node], len(want), node)
		for i := range want {
			assert.True(t, proto.Equal(want[i], got[node][i]), "%s: %v", node, got[node][i])
		}
	}
	assert.Len(t, got, 2)
	requireCounters("edge-a", &kuportv1.Counter{Id: "games/remote/dnat/enp1s0", Packets: 7, Bytes: 700},
		&kuportv1.Counter{Id: "games/remote/snat", Packets: 7, Bytes: 700})
	requireCounters("worker-b", &kuportv1.Counter{Id: "games/remote/dnat/kup-5e30a797", Packets: 6, Bytes: 600})

	got = mappingCounters("games/local")
	assert.Len(t, got, 1)
	requireCounters("edge-a", &kuportv1.Counter{Id: "games/local/dnat/enp1s0", Packets: 2, Bytes: 120})
	assert.Empty(t, mappingCounters("gone/old"), "only entries of the current program count")
}

// TestMappingAndNodeInspection: Mapping shows one mapping's entries, acknowledgement, counters
// and links per node; Nodes carries the epoch and the stream's and report's times.
func TestMappingAndNodeInspection(t *testing.T) {
	r := newTestRegistry(nil)
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", true), "worker-b": {}}, edgeIndex(true))
	r.Release(nil, t0)
	before := time.Now()
	s := r.connect(&kuportv1.Hello{Node: "edge-a"})
	require.NotNil(t, r.next(s))

	m := r.Mapping("games/remote")
	require.Len(t, m, 1)
	assert.Equal(t, "edge-a", m[0].Node)
	assert.Equal(t, []string{"games/remote/dnat/enp1s0", "games/remote/snat", "kup-1234abcd"}, m[0].EntryIds)
	assert.Equal(t, uint64(1), m[0].Version)
	assert.False(t, m[0].Acked)
	assert.False(t, m[0].Ready)
	assert.Contains(t, m[0].Message, "has not acknowledged program version 1")

	r.ack(s, &kuportv1.Ack{Epoch: 77, Version: 1})
	r.report(s, &kuportv1.Report{
		Counters: []*kuportv1.Counter{{Id: "games/local/dnat/enp1s0", Packets: 1}, {Id: "games/remote/dnat/enp1s0", Packets: 2}, {Id: "games/remote/snat", Packets: 3}},
		Links:    []*kuportv1.LinkStats{{Name: "kup-1234abcd", TxPackets: 4}, {Name: "kup-ffffffff", TxPackets: 5}},
	})
	m = r.Mapping("games/remote")
	require.Len(t, m, 1)
	assert.True(t, m[0].Acked)
	assert.True(t, m[0].Ready, m[0].Message)
	assert.Empty(t, m[0].Message)
	assert.True(t, proto.Equal(&kuportv1.MappingNode{
		Node: "edge-a", EntryIds: m[0].EntryIds, Version: 1, Acked: true, Ready: true,
		Counters: []*kuportv1.Counter{{Id: "games/remote/dnat/enp1s0", Packets: 2}, {Id: "games/remote/snat", Packets: 3}},
		Links:    []*kuportv1.LinkStats{{Name: "kup-1234abcd", TxPackets: 4}},
	}, m[0]), "%v", m[0])
	assert.Empty(t, r.Mapping("games/nowhere"))

	nodes := r.Nodes()
	require.Len(t, nodes, 2)
	a, b := nodes[0], nodes[1]
	assert.Equal(t, uint64(77), a.Epoch)
	assert.False(t, a.ConnectedSince.AsTime().Before(before))
	assert.False(t, a.LastReportTime.AsTime().Before(a.ConnectedSince.AsTime()))
	assert.Equal(t, uint64(77), b.Epoch)
	assert.Nil(t, b.ConnectedSince, "worker-b never connected")
	assert.Nil(t, b.LastReportTime)
}

// TestOnAgent: OnAgent hears a connect with the agent's version, and a disconnect only when
// no newer stream of the node replaced the ending one.
func TestOnAgent(t *testing.T) {
	var events []string
	r := NewRegistry(Config{Epoch: 77, Start: t0, OnAgent: func(node string, connected bool, agentVersion string) {
		events = append(events, fmt.Sprintf("%s %t %s", node, connected, agentVersion))
	}})
	old := r.connect(&kuportv1.Hello{Node: "edge-a", AgentVersion: "v1"})
	cur := r.connect(&kuportv1.Hello{Node: "edge-a", AgentVersion: "v2"})
	r.disconnect(old)
	assert.Equal(t, []string{"edge-a true v1", "edge-a true v2"}, events, "a replaced stream's end is no disconnect")
	r.disconnect(cur)
	assert.Equal(t, []string{"edge-a true v1", "edge-a true v2", "edge-a false "}, events)
}

// TestNextSendsDeltasToAgentsThatTakeThem: an agent whose Hello accepts deltas gets its first
// program whole on a stream, then deltas that rebuild each next one; another agent gets
// programs whole.
func TestNextSendsDeltasToAgentsThatTakeThem(t *testing.T) {
	r := newTestRegistry(nil)
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", false), "worker-b": {}}, edgeIndex(false))
	r.Release(nil, t0)
	s := r.connect(&kuportv1.Hello{Node: "edge-a", AcceptsDelta: true})
	old := r.connect(&kuportv1.Hello{Node: "worker-b"})
	first := r.next(s).GetProgram()
	require.NotNil(t, first, "the first program of a stream is whole")
	require.NotNil(t, r.next(old).GetProgram())

	next := remoteProgram("10.244.17.5", true)
	slices.SortFunc(next.DnatRules, func(a, b *kuportv1.DnatRule) int { return strings.Compare(a.Id, b.Id) }) // as compile sorts
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": next,
		"worker-b": {SnatRules: []*kuportv1.SnatRule{{Id: "x/snat"}}}}, edgeIndex(true))
	d := r.next(s).GetDelta()
	require.NotNil(t, d)
	assert.Len(t, d.Changed.DnatRules, 1, "only the rule added")
	got, err := d.Apply(first)
	require.NoError(t, err)
	want, _, _ := r.Program("edge-a")
	assert.True(t, proto.Equal(want, got))
	assert.NotNil(t, r.next(old).GetProgram(), "an agent that takes no deltas gets programs whole")
}

// TestUnacknowledged: a node counts while its agent's stream is open and its acknowledged
// version is below its program's; an agent without a stream, or without a program, never.
func TestUnacknowledged(t *testing.T) {
	r := newTestRegistry(nil)
	assert.Zero(t, r.Unacknowledged(), "no node")
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", false), "worker-b": {}}, edgeIndex(false)) // v1 each
	assert.Zero(t, r.Unacknowledged(), "no agent connected: nobody to wait for")

	a := r.connect(&kuportv1.Hello{Node: "edge-a"})
	b := r.connect(&kuportv1.Hello{Node: "worker-b"})
	assert.Equal(t, 2, r.Unacknowledged())
	r.ack(a, &kuportv1.Ack{Epoch: 77, Version: 1})
	assert.Equal(t, 1, r.Unacknowledged())
	r.ack(b, &kuportv1.Ack{Epoch: 76, Version: 1})
	assert.Equal(t, 1, r.Unacknowledged(), "another epoch's ack is not this program's")

	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", true), "worker-b": {}}, edgeIndex(true)) // edge-a v2
	assert.Equal(t, 2, r.Unacknowledged())
	r.disconnect(b)
	assert.Equal(t, 1, r.Unacknowledged(), "a closed stream is not waited for")
	r.ack(a, &kuportv1.Ack{Epoch: 77, Version: 2})
	assert.Zero(t, r.Unacknowledged())

	r.connect(&kuportv1.Hello{Node: "db-c"})
	assert.Zero(t, r.Unacknowledged(), "an agent compile names no program for")
}
