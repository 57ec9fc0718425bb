package agents

import (
	"time"

	"kuport.wlz.li/kuport/controller/compile"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Counter is one counter of a node's latest Report as the Registry keeps it (Stats): the
// values of a kuportv1.Counter without the message, 72 bytes, in one slice per report, its
// id the string of the node's index: a fraction of what the received messages (each Counter
// and Traffic an object, each id a string of its own) held with a Tracker per DNAT entry
// (BenchmarkReportsRetained; BENCHMARKS.md, "The agents' latest Reports in the controller").
type Counter struct {
	// ID is the counted entry's id: the string of the node's index where the index holds it.
	ID             string
	Packets, Bytes uint64
	// ForwardedIn and ForwardedOut are a DNAT entry's forwarded_in and forwarded_out, each
	// carried by the report when HasIn, HasOut.
	ForwardedIn, ForwardedOut Traffic
	HasIn, HasOut             bool
	// judged: the counter stepped its DNAT entry's Tracker (countLocked).
	judged bool
}

// Traffic is a packet count and the packets' IP lengths in bytes (a kuportv1.Traffic).
type Traffic struct{ Packets, Bytes uint64 }

// proto returns c as the agent reported it.
func (c *Counter) proto() *kuportv1.Counter {
	out := &kuportv1.Counter{Id: c.ID, Packets: c.Packets, Bytes: c.Bytes}
	if c.HasIn {
		out.ForwardedIn = &kuportv1.Traffic{Packets: c.ForwardedIn.Packets, Bytes: c.ForwardedIn.Bytes}
	}
	if c.HasOut {
		out.ForwardedOut = &kuportv1.Traffic{Packets: c.ForwardedOut.Packets, Bytes: c.ForwardedOut.Bytes}
	}
	return out
}

// Stats returns the counters and link statistics of node's latest Report. Each report stores
// new ones: they are never changed once returned, and callers must not change them.
func (r *Registry) Stats(nodeName string) ([]Counter, []*kuportv1.LinkStats) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := r.nodes[nodeName]; n != nil {
		return n.counters, n.linkStats
	}
	return nil, nil
}

// counters returns the counters of n's latest Report whose id is one of mv's, in report
// order, as the agent reported them.
func (mv *mappingVersion) counters(n *node) []*kuportv1.Counter {
	var out []*kuportv1.Counter
	for i := range n.counters {
		if mv.uses(n.counters[i].ID) {
			out = append(out, n.counters[i].proto())
		}
	}
	return out
}

// countLocked stores counters, a Report's, as n's latest (Counters whose ids are the index's
// strings) and steps each DNAT entry's Tracker with them; it returns the entries whose
// verdict changed. Trackers of entries no longer in n's index are dropped.
//
// A Tracker at rest (atRest: counts 0 in and out since a baseline, nothing pending, no
// verdict) is not kept. An entry of the index without one is at rest when its counter stepped
// it in the previous report (Counter.judged) or earlier in this one, else unseen (Tracker's
// zero value: its first sample is a baseline, no alarm). An entry at rest that this report
// does not step keeps restTracker, so that it is not taken for unseen at the next.
func (r *Registry) countLocked(name string, n *node, counters []*kuportv1.Counter, now time.Time) []UnansweredChange {
	for id := range n.answers {
		if _, e := n.index.Entry(id); e == nil || e.Kind != compile.KindDNAT {
			delete(n.answers, id)
		}
	}
	// stepped: the entries the previous report stepped, by id; true once this one did.
	stepped := map[string]bool{}
	for i := range n.counters {
		if n.counters[i].judged {
			stepped[n.counters[i].ID] = false
		}
	}
	out := make([]Counter, len(counters))
	var changes []UnansweredChange
	for i, c := range counters {
		v := &out[i]
		*v = Counter{ID: c.Id, Packets: c.Packets, Bytes: c.Bytes}
		if t := c.ForwardedIn; t != nil {
			v.ForwardedIn, v.HasIn = Traffic{t.Packets, t.Bytes}, true
		}
		if t := c.ForwardedOut; t != nil {
			v.ForwardedOut, v.HasOut = Traffic{t.Packets, t.Bytes}, true
		}
		key, e := n.index.Entry(c.Id)
		if e == nil {
			continue
		}
		v.ID = e.ID
		if e.Kind != compile.KindDNAT || !v.HasIn && !v.HasOut {
			continue
		}
		was, ok := n.answers[v.ID]
		if _, seen := stepped[v.ID]; seen && !ok {
			was = restTracker
		}
		t := was.Step(Sample{At: now, Requests: v.ForwardedIn.Packets, Replies: v.ForwardedOut.Packets}, r.window)
		if t.atRest() {
			delete(n.answers, v.ID)
		} else {
			n.answers[v.ID] = t
		}
		v.judged, stepped[v.ID] = true, true
		if t.Verdict.Unanswered != was.Verdict.Unanswered {
			changes = append(changes, UnansweredChange{Mapping: key, Node: name, Interface: e.Interface, Verdict: t.Verdict, Was: was.Verdict})
		}
	}
	for id, now := range stepped {
		if now {
			continue
		}
		if _, e := n.index.Entry(id); e != nil && e.Kind == compile.KindDNAT {
			if _, ok := n.answers[id]; !ok {
				n.answers[id] = restTracker
			}
		}
	}
	n.counters = out
	return changes
}
