package agents

import (
	"cmp"
	"slices"
	"time"

	"kuport.wlz.li/kuport/controller/compile"
)

// Unanswered mappings (docs/design/api.md#unanswered-mappings): a DNAT entry whose node keeps
// forwarding requests (Counter.forwarded_in rising) and sees no reply (forwarded_out not
// rising) is unanswered there. Another table's forward chain dropping the requests, a CNI
// bypassing netfilter on the reply path, a pod that does not answer all look like this, while
// the kernel holds every rule and Programmed stays True.

// DefaultUnansweredWindow is the window of Window's defaults: requests without a reply for
// two reports at least 4 s apart. With the agents' default 5 s reports a mapping is
// unanswered 5-10 s after its requests go unanswered (well within 15 s), and a reply
// in flight while one report is taken shows in the next. 4 s, not 5: two reports a period
// apart arrive a little more or less than 5 s apart, and one short of 5 s would wait a third.
var DefaultUnansweredWindow = Window{Reports: 2, Duration: 4 * time.Second}

// Window is how long requests must go without a reply before their entry is unanswered:
// Reports consecutive reports, the first being the one that showed the first unanswered
// request, spanning at least Duration. Both guard: a report sent early (a state change)
// does not shorten the window, a late one does not lengthen it past the next report.
type Window struct {
	Reports  int
	Duration time.Duration
}

// Sample is one report's forwarded counts of a DNAT entry: the packets of forwarded_in
// (requests) and forwarded_out (replies), cumulative.
type Sample struct {
	At       time.Time
	Requests uint64
	Replies  uint64
}

// Verdict is what the counter history says of one DNAT entry.
type Verdict struct {
	// Unanswered: requests went without a reply for the whole window.
	Unanswered bool
	// Since is when the report that showed the first unanswered request arrived; zero
	// when answered.
	Since time.Time
	// Requests is how many requests arrived since the last reply, so far; replies since
	// are 0 by definition. Zero when answered.
	Requests uint64
}

// Tracker is the fold state of Judge over one entry's samples; its zero value has seen
// nothing. Step it with Judge's step.
type Tracker struct {
	last    Sample
	have    bool
	pending bool      // requests arrived since the last reply
	first   time.Time // report that showed the first of them
	base    uint64    // Requests before the first of them
	reports int       // reports since the first of them, that one included
	Verdict Verdict
}

// restTracker is the state of an entry seen at rest: counts of 0 in and 0 out since a
// baseline, nothing pending, no verdict. Every Tracker that atRest accepts steps as
// restTracker does, to the same verdicts (Step reads neither last.At nor, while nothing is pending, first,
// base and reports), so the Registry keeps none of them (countLocked). It is not the zero
// Tracker, which has seen nothing: there a first sample is a baseline, here a first request
// after the rest starts the window.
var restTracker = Tracker{have: true}

// atRest reports whether t is restTracker's state.
func (t Tracker) atRest() bool {
	return t.have && !t.pending && t.Verdict == (Verdict{}) && t.last.Requests == 0 && t.last.Replies == 0
}

// Judge folds an entry's counter history, oldest first, into its verdict: the one pure
// decision of "unanswered". Requests with replies are answered; requests with no reply over
// w are unanswered (until a reply arrives); no requests is answered (idle). A counter that
// goes back (the agent restarted, the entry was rewritten) starts the history over from that
// sample without judging what came before: no false alarm, and the verdict stands until the
// new history decides otherwise.
func Judge(history []Sample, w Window) Verdict {
	var t Tracker
	for _, s := range history {
		t = t.Step(s, w)
	}
	return t.Verdict
}

// Step is Judge's fold step: t after one more sample s.
func (t Tracker) Step(s Sample, w Window) Tracker {
	switch {
	case !t.have, s.Requests < t.last.Requests, s.Replies < t.last.Replies:
		// A baseline: nothing to compare with.
		t.have, t.pending = true, false
	case s.Replies > t.last.Replies:
		t.pending = false
		t.Verdict = Verdict{}
	case t.pending:
		t.reports++
	case s.Requests > t.last.Requests:
		t.pending, t.first, t.base, t.reports = true, s.At, t.last.Requests, 1
	}
	if t.pending {
		if !t.Verdict.Unanswered && t.reports >= w.Reports && s.At.Sub(t.first) >= w.Duration {
			t.Verdict = Verdict{Unanswered: true, Since: t.first}
		}
		if t.Verdict.Unanswered {
			t.Verdict.Requests = s.Requests - t.base
		}
	}
	t.last = s
	return t
}

// UnansweredMappings returns, by mapping key, whether any of the mapping's DNAT entries in
// node's current program is unanswered (metrics.UnansweredSource).
func (r *Registry) UnansweredMappings(nodeName string) map[string]bool {
	out := map[string]bool{}
	for m, vs := range r.Unanswered(nodeName) {
		for _, v := range vs {
			out[m] = out[m] || v.Unanswered
		}
	}
	return out
}

// UnansweredNode is a node on which a mapping's requests go unanswered: the interfaces whose
// DNAT entries are unanswered, sorted, and the earliest of their Since.
type UnansweredNode struct {
	Node       string
	Interfaces []string
	Since      time.Time
}

// UnansweredNodes returns the nodes on which mapping ("<namespace>/<name>") is unanswered,
// sorted by name; nil when it is answered (or idle) everywhere.
func (r *Registry) UnansweredNodes(mapping string) []UnansweredNode {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []UnansweredNode
	for name, n := range r.nodes {
		if ifaces, since := n.unanswered(mapping); len(ifaces) > 0 {
			out = append(out, UnansweredNode{Node: name, Interfaces: ifaces, Since: since})
		}
	}
	slices.SortFunc(out, func(a, b UnansweredNode) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// unanswered returns the interfaces of n whose DNAT entries of mapping are unanswered, sorted
// and each once (an interface's IPv4 and IPv6 entries are judged apart), and the earliest
// Since among them.
func (n *node) unanswered(mapping string) ([]string, time.Time) {
	mi := n.index[mapping]
	if mi == nil {
		return nil, time.Time{}
	}
	var ifaces []string
	var since time.Time
	for _, e := range mi.Entries {
		v := n.answers[e.ID].Verdict
		if e.Kind != compile.KindDNAT || !v.Unanswered {
			continue
		}
		if len(ifaces) == 0 || v.Since.Before(since) {
			since = v.Since
		}
		ifaces = append(ifaces, e.Interface)
	}
	slices.Sort(ifaces)
	return slices.Compact(ifaces), since
}
