package programmed

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/compile"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

var (
	t0       = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	settling = Term{Now: t0.Add(time.Second), HoldUntil: t0.Add(15 * time.Second), Released: true}
	settled  = Term{Now: t0.Add(20 * time.Second), HoldUntil: t0.Add(15 * time.Second), Released: true}
)

func programmedCond(status metav1.ConditionStatus, reason, msg string, gen int64) *metav1.Condition {
	return &metav1.Condition{Type: v1alpha1.ConditionProgrammed, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen}
}

var compiledTrue = programmedCond(metav1.ConditionTrue, v1alpha1.ReasonAllNodesReady, "rules compiled for nodes edge-a, worker-b", 3)

// ready is a node holding the mapping's version 4 (acknowledged 5).
func ready(name string) Node {
	return Node{Name: name, Hello: true, Connected: true, Acked: 5, Version: 4}
}

func with(n Node, f func(*Node)) Node { f(&n); return n }

func TestNodeReady(t *testing.T) {
	for _, tc := range []struct {
		name string
		node Node
		want string
	}{
		{"acknowledged", ready("edge-a"), ""},
		{"acknowledged exactly", with(ready("edge-a"), func(n *Node) { n.Acked = 4 }), ""},
		{"never said hello", Node{Name: "edge-a", Version: 4}, "node edge-a: agent not connected"},
		{"disconnected", with(ready("edge-a"), func(n *Node) { n.Connected = false }), "node edge-a: agent disconnected"},
		{"no entry yet", with(ready("edge-a"), func(n *Node) { n.Version = 0 }), "node edge-a: program carries no entry of the mapping yet"},
		{"older ack", with(ready("edge-a"), func(n *Node) { n.Acked = 3 }), "node edge-a has not acknowledged program version 4"},
		{"entry failed", with(ready("edge-a"), func(n *Node) { n.Failed = "kup-1: file exists" }), "node edge-a failed to apply kup-1: file exists"},
		{"program failed", with(ready("edge-a"), func(n *Node) { n.ProgramFailed = "transaction refused" }),
			"node edge-a failed to apply its program: transaction refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, why := tc.node.Ready()
			assert.Equal(t, tc.want == "", ok)
			assert.Equal(t, tc.want, why)
		})
	}
}

func TestDecide(t *testing.T) {
	notReady := func(msg string) *metav1.Condition {
		return programmedCond(metav1.ConditionFalse, v1alpha1.ReasonNodeNotReady, msg, 3)
	}
	refused := programmedCond(metav1.ConditionFalse, v1alpha1.ReasonNotAccepted, "the mapping is not accepted: x", 3)
	recordedTrue := programmedCond(metav1.ConditionTrue, v1alpha1.ReasonAllNodesReady, "rules compiled for nodes edge-a", 3)
	holding := Term{Now: t0.Add(time.Second), HoldUntil: t0.Add(15 * time.Second), Unheard: []string{"worker-b"}}
	for _, tc := range []struct {
		name string
		in   Input
		want Verdict
	}{
		{"every node holds it", Input{Term: settled, Compiled: compiledTrue, Nodes: []Node{ready("edge-a"), ready("worker-b")}},
			Verdict{Programmed: compiledTrue}},
		{"startup hold: nothing written", Input{Term: holding, Compiled: compiledTrue, Nodes: []Node{ready("edge-a")}},
			Verdict{Hold: true}},
		{"hold timed out", Input{Term: term(holding, func(t *Term) { t.Now = t0.Add(15 * time.Second) }), Compiled: compiledTrue,
			Nodes: []Node{ready("edge-a")}}, Verdict{Programmed: compiledTrue}},
		{"hold released", Input{Term: term(holding, func(t *Term) { t.Released = true }), Compiled: compiledTrue,
			Nodes: []Node{ready("edge-a")}}, Verdict{Programmed: compiledTrue}},
		{"no condition from compile", Input{Term: settled}, Verdict{}},
		{"refused stays as compile said", Input{Term: settled, Compiled: refused, Nodes: []Node{{Name: "edge-a"}}},
			Verdict{Programmed: refused}},
		{"awaiting one ack is quiet", Input{Term: settled, Compiled: compiledTrue,
			Nodes: []Node{ready("edge-a"), with(ready("worker-b"), func(n *Node) { n.Version = 7 })}},
			Verdict{Programmed: notReady("node worker-b has not acknowledged program version 7"), Quiet: true}},
		{"awaiting and disconnected is a fault", Input{Term: settled, Compiled: compiledTrue,
			Nodes: []Node{with(ready("edge-a"), func(n *Node) { n.Connected = false }), with(ready("worker-b"), func(n *Node) { n.Version = 7 })}},
			Verdict{Programmed: notReady("node edge-a: agent disconnected; node worker-b has not acknowledged program version 7")}},
		{"settling keeps a recorded True of the generation", Input{Term: settling, Compiled: compiledTrue, Recorded: recordedTrue, Generation: 3,
			Nodes: []Node{ready("edge-a"), {Name: "worker-b", Version: 4}}},
			Verdict{Programmed: recordedTrue, Quiet: true}},
		{"settling does not keep an older generation's True", Input{Term: settling, Compiled: compiledTrue, Recorded: recordedTrue, Generation: 4,
			Nodes: []Node{{Name: "worker-b", Version: 4}}},
			Verdict{Programmed: notReady("node worker-b: agent not connected")}},
		{"settling with nothing recorded reports the gap", Input{Term: settling, Compiled: compiledTrue, Generation: 3,
			Nodes: []Node{{Name: "worker-b", Version: 4}}},
			Verdict{Programmed: notReady("node worker-b: agent not connected")}},
		{"one node acknowledged this term is no longer settling", Input{Term: settling, Compiled: compiledTrue, Recorded: recordedTrue, Generation: 3,
			Nodes: []Node{with(ready("edge-a"), func(n *Node) { n.Connected = false }), {Name: "worker-b", Version: 4}}},
			Verdict{Programmed: notReady("node edge-a: agent disconnected; node worker-b: agent not connected")}},
		{"settling ends with the hold", Input{Term: settled, Compiled: compiledTrue, Recorded: recordedTrue, Generation: 3,
			Nodes: []Node{{Name: "worker-b", Version: 4}}},
			Verdict{Programmed: notReady("node worker-b: agent not connected")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Decide(tc.in))
		})
	}
	assert.Equal(t, metav1.ConditionTrue, compiledTrue.Status, "Decide does not mutate its input")
}

func term(t Term, f func(*Term)) Term { f(&t); return t }

func TestMayWait(t *testing.T) {
	recordedTrue := programmedCond(metav1.ConditionTrue, v1alpha1.ReasonAllNodesReady, "rules compiled for nodes edge-a", 3)
	recordedFalse := programmedCond(metav1.ConditionFalse, v1alpha1.ReasonNodeNotReady, "node edge-a: agent disconnected", 3)
	awaiting := []Node{with(ready("edge-a"), func(n *Node) { n.Version = 7 })}
	holding := Term{Now: t0.Add(time.Second), HoldUntil: t0.Add(15 * time.Second), Unheard: []string{"worker-b"}}
	// An agent that acknowledged version 5 (which carries the mapping's version 4) on its
	// last stream: gone, or back and yet to acknowledge (a restart into an empty kernel).
	gone := with(ready("edge-a"), func(n *Node) { n.Connected, n.Held = false, 5 })
	back := with(ready("edge-a"), func(n *Node) { n.Acked, n.Held = 0, 5 })
	for _, tc := range []struct {
		name string
		in   Input
		want time.Duration
	}{
		{"new object awaiting its ack", Input{Term: settled, Compiled: compiledTrue, Generation: 3, Nodes: awaiting}, AckGrace},
		{"an older generation's True awaiting the new one's ack", Input{Term: settled, Compiled: compiledTrue, Recorded: recordedTrue,
			Generation: 4, Nodes: awaiting}, AckGrace},
		{"a recorded False awaiting", Input{Term: settled, Compiled: compiledTrue, Recorded: recordedFalse, Generation: 3, Nodes: awaiting}, AckGrace},
		{"the generation's True awaiting a changed mapping's ack waits", Input{Term: settled, Compiled: compiledTrue, Recorded: recordedTrue,
			Generation: 3, Nodes: awaiting}, AckGrace},
		{"a disconnected agent is written at once", Input{Term: settled, Compiled: compiledTrue, Generation: 3,
			Nodes: []Node{with(ready("edge-a"), func(n *Node) { n.Connected = false })}}, 0},
		{"a disconnected agent that never held it takes back the True at once", Input{Term: settled, Compiled: compiledTrue,
			Recorded: recordedTrue, Generation: 3, Nodes: []Node{with(ready("edge-a"), func(n *Node) { n.Connected = false })}}, 0},
		{"the True of a node whose stream ended holding it waits", Input{Term: settled, Compiled: compiledTrue, Recorded: recordedTrue,
			Generation: 3, Nodes: []Node{ready("worker-b"), gone}}, ResumeGrace},
		{"and waits while its new stream has not acknowledged", Input{Term: settled, Compiled: compiledTrue, Recorded: recordedTrue,
			Generation: 3, Nodes: []Node{ready("worker-b"), back}}, ResumeGrace},
		{"a node that held an older version of the mapping: it changed, its ack awaited", Input{Term: settled, Compiled: compiledTrue,
			Recorded: recordedTrue, Generation: 3, Nodes: []Node{with(back, func(n *Node) { n.Version = 6 })}}, AckGrace},
		{"a changed mapping on a disconnected node: at once", Input{Term: settled, Compiled: compiledTrue, Recorded: recordedTrue,
			Generation: 3, Nodes: []Node{with(gone, func(n *Node) { n.Version = 6 })}}, 0},
		{"a resuming node that failed the mapping: at once", Input{Term: settled, Compiled: compiledTrue, Recorded: recordedTrue,
			Generation: 3, Nodes: []Node{with(back, func(n *Node) { n.Acked, n.Failed = 5, "x: file exists" })}}, 0},
		{"one node resuming and one awaiting a change: at once", Input{Term: settled, Compiled: compiledTrue, Recorded: recordedTrue,
			Generation: 3, Nodes: []Node{gone, with(ready("worker-b"), func(n *Node) { n.Version = 7 })}}, 0},
		{"a resuming node and no True recorded: written at once", Input{Term: settled, Compiled: compiledTrue, Generation: 3,
			Nodes: []Node{gone}}, 0},
		{"True is written at once", Input{Term: settled, Compiled: compiledTrue, Generation: 3, Nodes: []Node{ready("edge-a")}}, 0},
		{"settling keeps the True: nothing to wait for", Input{Term: settling, Compiled: compiledTrue, Recorded: recordedTrue, Generation: 3,
			Nodes: []Node{{Name: "edge-a", Version: 4}}}, 0},
		{"the hold writes nothing anyway", Input{Term: holding, Compiled: compiledTrue, Generation: 3, Nodes: awaiting}, 0},
		{"no condition from compile", Input{Term: settled, Generation: 3}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Decide(tc.in).MayWait(tc.in))
		})
	}
}

func TestTermHolding(t *testing.T) {
	for _, tc := range []struct {
		name string
		term Term
		want bool
	}{
		{"a node unheard within the hold", Term{Now: t0, HoldUntil: t0.Add(time.Second), Unheard: []string{"b"}}, true},
		{"every node heard", Term{Now: t0, HoldUntil: t0.Add(time.Second)}, false},
		{"timed out", Term{Now: t0.Add(time.Second), HoldUntil: t0.Add(time.Second), Unheard: []string{"b"}}, false},
		{"released", Term{Now: t0, HoldUntil: t0.Add(time.Second), Released: true, Unheard: []string{"b"}}, false},
	} {
		assert.Equal(t, tc.want, tc.term.Holding(), tc.name)
	}
}

func TestUnheard(t *testing.T) {
	s := &compile.Snapshot{
		Nodes: map[string]*corev1.Node{"edge-a": {}, "worker-b": {}, "worker-c": {}, "worker-d": {}},
		Classes: map[string]*v1alpha1.PortMapClass{
			"public": {
				Spec:   v1alpha1.PortMapClassSpec{Nodes: map[string]v1alpha1.ClassNode{"edge-a": {}, "gone": {}}},
				Status: v1alpha1.PortMapClassStatus{Links: []v1alpha1.LinkStatus{{Peers: []string{"edge-a", "worker-b"}}, {Peers: []string{"edge-a", "worker-d"}}}},
			},
			"mesh": {Spec: v1alpha1.PortMapClassSpec{Nodes: map[string]v1alpha1.ClassNode{"edge-a": {}}}},
		},
		Agents: map[string]*compile.AgentState{"worker-d": {State: &kuportv1.NodeState{}}, "edge-a": {}},
	}
	// worker-c carries nothing a class names; "gone" has no Node object; worker-d was heard;
	// edge-a's agent connected but its state is unknown.
	assert.Equal(t, []string{"edge-a", "worker-b"}, Unheard(s))
}
