package agents

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/controller/compile"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// restIndex is a node's index of mappings ns/m0.. with a DNAT entry on enp1s0 and an SNAT
// entry each, of the mappings present says are there.
func restIndex(present []bool) compile.NodeIndex {
	out := compile.NodeIndex{}
	for i, ok := range present {
		if !ok {
			continue
		}
		key := fmt.Sprintf("ns/m%d", i)
		out[key] = &compile.MappingIndex{Mapping: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("m%d", i)},
			Entries: []compile.Entry{
				{ID: key + "/dnat/enp1s0", Name: "dnat/enp1s0", Kind: compile.KindDNAT, Direction: compile.DirectionIn, Interface: "enp1s0"},
				{ID: key + "/snat", Name: "snat", Kind: compile.KindSNAT, Direction: compile.DirectionIn},
			}}
	}
	return out
}

// storedAlways is the registry's judging as it was before Trackers at rest were dropped: a
// Tracker for every DNAT entry a report stepped, kept while the entry is in the index.
type storedAlways map[string]Tracker

func (m storedAlways) report(name string, index compile.NodeIndex, counters []*kuportv1.Counter, now time.Time, w Window) []UnansweredChange {
	entries := dnatEntries(index)
	for id := range m {
		if _, ok := entries[id]; !ok {
			delete(m, id)
		}
	}
	var out []UnansweredChange
	for _, c := range counters {
		e, ok := entries[c.Id]
		if !ok || c.ForwardedIn == nil && c.ForwardedOut == nil {
			continue
		}
		was := m[c.Id]
		t := was.Step(Sample{At: now, Requests: c.ForwardedIn.GetPackets(), Replies: c.ForwardedOut.GetPackets()}, w)
		m[c.Id] = t
		if t.Verdict.Unanswered != was.Verdict.Unanswered {
			out = append(out, UnansweredChange{Mapping: e.mapping, Node: name, Interface: e.iface, Verdict: t.Verdict, Was: was.Verdict})
		}
	}
	return out
}

// TestTrackersAtRest: a registry that keeps no Tracker at rest (a missing one read as
// restTracker, or as unseen when no report stepped the entry) judges random report
// sequences as one that keeps every Tracker does: the same verdicts and the same changes
// after every report. The sequences mix counts at 0 (rest), requests with and without
// replies, counters going back (an agent restart), counters missing from a report or
// without forwarded counts, repeated counters, entries leaving and rejoining the index
// (their Trackers dropped), and reconnects.
func TestTrackersAtRest(t *testing.T) {
	const mappings, steps = 4, 300
	w := Window{Reports: 3, Duration: 10 * time.Second}
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 13))
		var changes []UnansweredChange
		r := NewRegistry(Config{Epoch: 1, Start: t0, Unanswered: w, OnUnanswered: func(c UnansweredChange) { changes = append(changes, c) }})
		clock := t0
		r.now = func() time.Time { return clock }
		present := make([]bool, mappings)
		for i := range present {
			present[i] = rng.IntN(4) > 0
		}
		index := restIndex(present)
		r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": {}}, map[string]compile.NodeIndex{"edge-a": index})
		s := r.connect(&kuportv1.Hello{Node: "edge-a"})
		ref := storedAlways{}
		requests, replies := make([]uint64, mappings), make([]uint64, mappings)
		atRest := 0
		for step := range steps {
			switch rng.IntN(20) {
			case 0: // a mapping leaves or rejoins the index
				i := rng.IntN(mappings)
				present[i] = !present[i]
				index = restIndex(present)
				r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": {DnatRules: []*kuportv1.DnatRule{{Id: fmt.Sprint(step)}}}},
					map[string]compile.NodeIndex{"edge-a": index})
			case 1:
				s = r.connect(&kuportv1.Hello{Node: "edge-a"})
			}
			var counters []*kuportv1.Counter
			for i := range mappings {
				switch rng.IntN(10) {
				case 0, 1: // the agent restarted, or the entry was rewritten
					requests[i], replies[i] = 0, 0
				case 2:
					requests[i] += uint64(rng.IntN(3))
				case 3:
					replies[i] += uint64(rng.IntN(2))
				case 4:
					requests[i], replies[i] = requests[i]/2, replies[i]/3
				}
				key := fmt.Sprintf("ns/m%d", i)
				c := &kuportv1.Counter{Id: key + "/dnat/enp1s0", Packets: requests[i]}
				switch rng.IntN(12) {
				case 0: // not in the report
					continue
				case 1: // without forwarded counts
				case 2:
					c.ForwardedIn = &kuportv1.Traffic{Packets: requests[i]}
				case 3:
					c.ForwardedOut = &kuportv1.Traffic{Packets: replies[i]}
				default:
					c.ForwardedIn, c.ForwardedOut = &kuportv1.Traffic{Packets: requests[i]}, &kuportv1.Traffic{Packets: replies[i]}
				}
				counters = append(counters, c, &kuportv1.Counter{Id: key + "/snat"})
				if rng.IntN(30) == 0 {
					counters = append(counters, proto.Clone(c).(*kuportv1.Counter))
				}
			}
			clock = clock.Add(time.Duration(1+rng.IntN(6)) * time.Second)
			changes = nil
			r.report(s, &kuportv1.Report{Counters: counters})
			want := ref.report("edge-a", index, counters, clock, w)
			require.Equal(t, want, changes, "seed %d step %d: changes", seed, step)
			for key, vs := range r.Unanswered("edge-a") {
				require.Len(t, vs, 1)
				require.Equal(t, ref[key+"/dnat/enp1s0"].Verdict, vs[0].Verdict, "seed %d step %d: %s", seed, step, key)
			}
			for id, tr := range ref {
				if tr.atRest() && stepped(r, id) {
					atRest++
					_, kept := r.nodes["edge-a"].answers[id]
					require.False(t, kept, "seed %d step %d: %s at rest keeps a Tracker", seed, step, id)
				}
			}
		}
		require.Positive(t, atRest, "seed %d: no entry at rest", seed)
	}
}

// stepped reports whether the latest report of edge-a stepped id's Tracker.
func stepped(r *Registry, id string) bool {
	for _, c := range r.nodes["edge-a"].counters {
		if c.ID == id && c.judged {
			return true
		}
	}
	return false
}

// TestFirstReportIsBaseline: a node's first report after it connects is a baseline, as
// ever, whatever its counts: requests that went unanswered before the controller started
// raise nothing until new ones go unanswered for the window; the same requests after a
// report at 0 do.
func TestFirstReportIsBaseline(t *testing.T) {
	w := Window{Reports: 3, Duration: 10 * time.Second}
	for _, tc := range []struct {
		name    string
		first   uint64
		alarmed bool
	}{{"first report with requests", 5, false}, {"first report at 0", 0, true}} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry(Config{Epoch: 1, Start: t0, Unanswered: w})
			clock := t0
			r.now = func() time.Time { return clock }
			r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": {}}, map[string]compile.NodeIndex{"edge-a": restIndex([]bool{true})})
			s := r.connect(&kuportv1.Hello{Node: "edge-a"})
			report := func(in uint64) {
				clock = clock.Add(5 * time.Second)
				r.report(s, &kuportv1.Report{Counters: []*kuportv1.Counter{{Id: "ns/m0/dnat/enp1s0",
					ForwardedIn: &kuportv1.Traffic{Packets: in}, ForwardedOut: &kuportv1.Traffic{}}}})
			}
			report(tc.first)
			if tc.first == 0 {
				assert.Empty(t, r.nodes["edge-a"].answers, "an entry at rest keeps no Tracker")
			}
			for range 5 {
				report(5)
			}
			assert.Equal(t, tc.alarmed, r.Unanswered("edge-a")["ns/m0"][0].Unanswered)
		})
	}
}

// TestReportKeepsIndexStrings: the counters a report leaves are the index's ids, not the
// report's copies; a counter of an id the index lacks keeps its own. Mapping gives them
// back as the agent reported them, forwarded counts present or absent as they were.
func TestReportKeepsIndexStrings(t *testing.T) {
	r := newTestRegistry(nil)
	index := restIndex([]bool{true})
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": {}}, map[string]compile.NodeIndex{"edge-a": index})
	s := r.connect(&kuportv1.Hello{Node: "edge-a"})
	sent := []*kuportv1.Counter{
		{Id: string([]byte("ns/m0/dnat/enp1s0")), Packets: 3, Bytes: 180, ForwardedIn: &kuportv1.Traffic{Packets: 4, Bytes: 240}},
		{Id: "ns/m0/snat", Packets: 2, Bytes: 120, ForwardedOut: &kuportv1.Traffic{}},
		{Id: "gone/x/snat", Packets: 1},
	}
	r.report(s, &kuportv1.Report{Counters: sent})
	counters, _ := r.Stats("edge-a")
	require.Len(t, counters, 3)
	assert.Equal(t, unsafe.StringData(index["ns/m0"].Entries[0].ID), unsafe.StringData(counters[0].ID))
	assert.Equal(t, unsafe.StringData(index["ns/m0"].Entries[1].ID), unsafe.StringData(counters[1].ID))
	assert.Equal(t, Counter{ID: "ns/m0/dnat/enp1s0", Packets: 3, Bytes: 180, ForwardedIn: Traffic{4, 240}, HasIn: true, judged: true}, counters[0])
	assert.Equal(t, Counter{ID: "ns/m0/snat", Packets: 2, Bytes: 120, HasOut: true}, counters[1])
	assert.Equal(t, Counter{ID: "gone/x/snat", Packets: 1}, counters[2])

	m := r.Mapping("ns/m0")
	require.Len(t, m, 1)
	require.Len(t, m[0].Counters, 2)
	for i, c := range m[0].Counters {
		assert.True(t, proto.Equal(sent[i], c), "%v", c)
	}
}
