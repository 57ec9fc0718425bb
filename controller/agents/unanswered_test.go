package agents

import (
	"slices"
	"strings"
	"testing"
	"time"

	"kuport.wlz.li/kuport/controller/compile"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

func TestJudge(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// s builds a history of reports 5 s apart from pairs (requests, replies).
	s := func(pairs ...uint64) []Sample {
		var out []Sample
		for i := 0; i+1 < len(pairs); i += 2 {
			out = append(out, Sample{At: t0.Add(time.Duration(i/2) * 5 * time.Second), Requests: pairs[i], Replies: pairs[i+1]})
		}
		return out
	}
	w := Window{Reports: 3, Duration: 10 * time.Second}
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * 5 * time.Second) }
	for _, tc := range []struct {
		name    string
		history []Sample
		want    Verdict
	}{
		{"empty", nil, Verdict{}},
		{"one report of requests", s(10, 0), Verdict{}},
		{"requests with replies", s(0, 0, 5, 5, 9, 9, 20, 18, 30, 25), Verdict{}},
		{"no requests: idle", s(0, 0, 0, 0, 0, 0, 0, 0, 0, 0), Verdict{}},
		{"idle after answered requests", s(0, 0, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4), Verdict{}},
		{"requests without replies for the window", s(0, 0, 3, 0, 5, 0, 7, 0), Verdict{Unanswered: true, Since: at(1), Requests: 7}},
		{"one request then silence, no reply", s(0, 0, 1, 0, 1, 0, 1, 0, 1, 0), Verdict{Unanswered: true, Since: at(1), Requests: 1}},
		{"not yet the window: two reports", s(0, 0, 3, 0, 5, 0), Verdict{}},
		{"answered earlier, unanswered since", s(0, 0, 4, 4, 6, 4, 8, 4, 9, 4), Verdict{Unanswered: true, Since: at(2), Requests: 5}},
		{"replies resume: clears", s(0, 0, 3, 0, 5, 0, 7, 0, 9, 1), Verdict{}},
		{"replies resume, then idle", s(0, 0, 3, 0, 5, 0, 7, 0, 9, 1, 9, 1, 9, 1, 9, 1), Verdict{}},
		{"counter reset (agent restart) is no alarm", s(0, 0, 100, 100, 200, 200, 3, 0, 6, 2, 9, 4), Verdict{}},
		{"reset mid-window starts over", s(0, 0, 3, 0, 5, 0, 2, 0, 4, 0), Verdict{}},
		{"reset of replies only starts over", s(10, 10, 20, 20, 21, 0, 22, 0), Verdict{}},
		{"unanswered stands across a reset until a reply", s(0, 0, 3, 0, 5, 0, 7, 0, 1, 0, 2, 0), Verdict{Unanswered: true, Since: at(1), Requests: 1}},
		{"unanswered across a reset clears on a reply", s(0, 0, 3, 0, 5, 0, 7, 0, 1, 0, 2, 1), Verdict{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Judge(tc.history, w); got != tc.want {
				t.Errorf("Judge = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestJudgeDuration: reports closer together than the window's duration (a state change
// sends one early) do not make requests unanswered sooner.
func TestJudgeDuration(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := Window{Reports: 3, Duration: 10 * time.Second}
	var h []Sample
	for i := range 5 {
		h = append(h, Sample{At: t0.Add(time.Duration(i) * 2 * time.Second), Requests: uint64(i)})
	}
	if v := Judge(h, w); v.Unanswered {
		t.Fatalf("unanswered after 8 s: %+v", v)
	}
	h = append(h, Sample{At: t0.Add(12 * time.Second), Requests: 6})
	if v := Judge(h, w); !v.Unanswered || v.Since != t0.Add(2*time.Second) || v.Requests != 6 {
		t.Fatalf("after 12 s: %+v, want unanswered since 2 s with 6 requests", v)
	}
}

// TestRegistryUnanswered: the registry judges each DNAT entry over the node's reports, tells
// each transition once, and shows the verdict in Unanswered and Mapping.
func TestRegistryUnanswered(t *testing.T) {
	var changes []UnansweredChange
	r := NewRegistry(Config{Epoch: 77, Start: t0, Unanswered: Window{Reports: 3, Duration: 10 * time.Second},
		OnUnanswered: func(c UnansweredChange) { changes = append(changes, c) }})
	clock := t0
	r.now = func() time.Time { return clock }
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", true)}, edgeIndex(true))
	s := r.connect(&kuportv1.Hello{Node: "edge-a"})
	report := func(in, out uint64) {
		clock = clock.Add(5 * time.Second)
		r.report(s, &kuportv1.Report{Counters: []*kuportv1.Counter{
			{Id: "games/remote/dnat/enp1s0", ForwardedIn: &kuportv1.Traffic{Packets: in}, ForwardedOut: &kuportv1.Traffic{Packets: out}},
			{Id: "games/local/dnat/enp1s0", ForwardedIn: &kuportv1.Traffic{Packets: in}, ForwardedOut: &kuportv1.Traffic{Packets: in}},
		}})
	}
	report(0, 0)
	report(2, 0) // first unanswered request: since this report
	since := clock
	report(4, 0)
	if len(changes) != 0 {
		t.Fatalf("changes after two reports: %+v", changes)
	}
	report(6, 0)
	if len(changes) != 1 {
		t.Fatalf("changes = %+v, want one", changes)
	}
	want := UnansweredChange{Mapping: "games/remote", Node: "edge-a", Interface: "enp1s0",
		Verdict: Verdict{Unanswered: true, Since: since, Requests: 6}}
	if changes[0] != want {
		t.Errorf("change = %+v, want %+v", changes[0], want)
	}
	report(8, 0) // still unanswered: no second event
	if len(changes) != 1 {
		t.Fatalf("a second change while unanswered: %+v", changes)
	}
	got := r.Unanswered("edge-a")
	if v := got["games/remote"]; len(v) != 1 || !v[0].Unanswered || v[0].Requests != 8 || v[0].Interface != "enp1s0" {
		t.Errorf("Unanswered[games/remote] = %+v", v)
	}
	if v := got["games/local"]; len(v) != 1 || v[0].Unanswered {
		t.Errorf("Unanswered[games/local] = %+v, want answered", v)
	}
	m := r.Mapping("games/remote")
	if len(m) != 1 || !m[0].Unanswered || !m[0].UnansweredSince.AsTime().Equal(since) || len(m[0].UnansweredInterfaces) != 1 {
		t.Errorf("Mapping = %v", m)
	}
	if m := r.Mapping("games/local"); len(m) != 1 || m[0].Unanswered || m[0].UnansweredSince != nil {
		t.Errorf("Mapping(local) = %v", m)
	}
	report(9, 1) // a reply: answered again, once
	if len(changes) != 2 || changes[1].Verdict.Unanswered || !changes[1].Was.Unanswered || changes[1].Was.Requests != 8 {
		t.Fatalf("changes = %+v, want the answered transition", changes)
	}
	report(9, 1)
	if len(changes) != 2 {
		t.Fatalf("changes = %+v", changes)
	}
	// The mapping leaves the program: its tracker goes with it.
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": {}}, nil)
	report(0, 0)
	if got := r.Unanswered("edge-a"); len(got) != 0 {
		t.Errorf("Unanswered after removal = %+v", got)
	}
}

// TestDefaultWindowTiming: with the agents' default reports (5 s apart, arriving a few
// milliseconds early or late) the default window makes requests that get no reply unanswered
// at the second report that shows them, 10 s after they began at the latest; a reply still in
// flight when one report is taken, which the next one shows, is no alarm.
func TestDefaultWindowTiming(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := DefaultUnansweredWindow
	for _, jitter := range []time.Duration{-20 * time.Millisecond, 0, 20 * time.Millisecond} {
		// Requests begin just after the report at t0; the report at 5 s shows them.
		history := []Sample{
			{At: t0, Requests: 0, Replies: 0},
			{At: t0.Add(5 * time.Second), Requests: 4, Replies: 0},
			{At: t0.Add(10*time.Second + jitter), Requests: 9, Replies: 0},
		}
		v := Judge(history, w)
		if !v.Unanswered || !v.Since.Equal(t0.Add(5*time.Second)) {
			t.Errorf("jitter %s: verdict %+v, want unanswered since the report at 5 s, judged at 10 s", jitter, v)
		}
		history[2].Replies = 1
		if v := Judge(history, w); v.Unanswered {
			t.Errorf("jitter %s: a reply shown by the next report is unanswered: %+v", jitter, v)
		}
	}
}

// TestUnansweredInterfaceOnce: an interface whose IPv4 and IPv6 DNAT entries both go
// unanswered is named once (status's unanswered interfaces are a set).
func TestUnansweredInterfaceOnce(t *testing.T) {
	r := NewRegistry(Config{Epoch: 77, Start: t0, Unanswered: Window{Reports: 1, Duration: time.Second}})
	clock := t0
	r.now = func() time.Time { return clock }
	p := remoteProgram("10.244.17.5", false)
	p.DnatRules = append(p.DnatRules, &kuportv1.DnatRule{Id: "games/remote/dnat6/enp1s0", Mapping: "games/remote",
		InInterface: "enp1s0", Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: &kuportv1.PortRange{First: 3000, Last: 3000},
		ToAddress: "fd64:f5ac:e961::1", ToPort: 3000})
	idx := remoteIndex(false)
	mi := idx["games/remote"]
	mi.Entries = append(mi.Entries, compile.Entry{ID: "games/remote/dnat6/enp1s0", Name: "dnat6/enp1s0", Kind: compile.KindDNAT,
		Direction: compile.DirectionIn, Interface: "enp1s0", Family: compile.FamilyIPv6})
	slices.SortFunc(mi.Entries, func(a, b compile.Entry) int { return strings.Compare(a.ID, b.ID) })
	r.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": p}, map[string]compile.NodeIndex{"edge-a": idx})
	s := r.connect(&kuportv1.Hello{Node: "edge-a"})
	for _, in := range []uint64{0, 2, 4} {
		clock = clock.Add(5 * time.Second)
		r.report(s, &kuportv1.Report{Counters: []*kuportv1.Counter{
			{Id: "games/remote/dnat/enp1s0", ForwardedIn: &kuportv1.Traffic{Packets: in}, ForwardedOut: &kuportv1.Traffic{}},
			{Id: "games/remote/dnat6/enp1s0", ForwardedIn: &kuportv1.Traffic{Packets: in}, ForwardedOut: &kuportv1.Traffic{}},
		}})
	}
	got := r.UnansweredNodes("games/remote")
	if len(got) != 1 || !slices.Equal(got[0].Interfaces, []string{"enp1s0"}) {
		t.Errorf("UnansweredNodes = %+v, want edge-a with enp1s0 once", got)
	}
}
