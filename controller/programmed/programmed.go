// Package programmed decides a PortMap's Programmed condition and the controller's startup
// hold: one pure function (Decide) of what compile said, the program versions where the
// mapping's entries last changed on each node and what each node's agent acknowledged, and
// the leadership term (docs/design/api.md#status-and-conditions: Programmed=True means every
// node whose program carries the mapping acknowledged the version containing it).
//
// It holds no state, takes the time as a value and touches neither the API server nor an
// agent: the registry (controller/agents) supplies the values, the status writer
// (controller/status) writes the verdict.
package programmed

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/compile"
)

// Term is the leadership term's startup hold as of Now.
type Term struct {
	Now time.Time
	// HoldUntil is the term's start plus the hold: the hold and every node's settling end
	// then at the latest.
	HoldUntil time.Time
	// Released is true once the hold ended (it never starts again in a term).
	Released bool
	// Unheard are the nodes the hold waits for whose agents' state the last compile lacked
	// (Unheard).
	Unheard []string
}

// Holding reports whether the startup hold keeps programs back, and with them every status
// write: compile has not heard every node a class names (docs/design/software.md#leadership:
// an agent reconnecting first must not be handed a program missing its peer's link), and the
// hold has not timed out.
func (t Term) Holding() bool {
	return !t.Released && len(t.Unheard) > 0 && t.Now.Before(t.HoldUntil)
}

// Node is what the registry knows of one node carrying a mapping.
type Node struct {
	Name string
	// Hello: the node's agent said Hello to this controller at least once.
	Hello bool
	// Connected: its stream is open.
	Connected bool
	// Acked is the program version it acknowledged in this term; 0 when none.
	Acked uint64
	// Version is the program version at which the mapping's entries on the node last
	// changed; 0 when the node's program carries no entry of it.
	Version uint64
	// Failed is the agent's error for an entry of the mapping ("<id>: <message>"), empty if none.
	Failed string
	// ProgramFailed is an error of the acknowledged version that no entry owns (a failed kernel
	// read, a refused transaction, fencing): nothing on the node is known to be in place.
	ProgramFailed string
	// Held is the highest program version the node's agent acknowledged whole (without
	// errors) on an earlier stream of this term; 0 if none. The agent leaves its program in
	// the kernel when its stream ends (fail static), so that is what the node was last known
	// to hold.
	Held uint64
}

// Ready tells whether n's kernel holds the mapping's entries; otherwise why not, naming the
// node (docs/design/api.md#status-and-conditions, NodeNotReady).
func (n Node) Ready() (bool, string) {
	switch {
	case !n.Hello:
		return false, fmt.Sprintf("node %s: agent not connected", n.Name)
	case !n.Connected:
		return false, fmt.Sprintf("node %s: agent disconnected", n.Name)
	case n.Version == 0:
		return false, fmt.Sprintf("node %s: program carries no entry of the mapping yet", n.Name)
	case n.Acked < n.Version:
		return false, fmt.Sprintf("node %s has not acknowledged program version %d", n.Name, n.Version)
	case n.Failed != "":
		return false, fmt.Sprintf("node %s failed to apply %s", n.Name, n.Failed)
	case n.ProgramFailed != "":
		return false, fmt.Sprintf("node %s failed to apply its program: %s", n.Name, n.ProgramFailed)
	}
	return true, ""
}

// awaiting: the mapping is not in n's kernel only because its connected agent has yet to
// acknowledge the version carrying it, the ordinary moment after a change.
func (n Node) awaiting() bool { return n.Connected && (n.Version == 0 || n.Acked < n.Version) }

// resuming: n is not ready only because its agent's stream ended (or a new one has not yet
// acknowledged anything as recent as the mapping) after an earlier stream acknowledged the
// version carrying the mapping whole: an agent restarting, or its stream re-established.
func (n Node) resuming() bool {
	return n.Version != 0 && n.Held >= n.Version && (!n.Connected || n.Acked < n.Version) &&
		n.Failed == "" && n.ProgramFailed == ""
}

// settling: n's agent has acknowledged nothing of this term while the term is younger than
// the hold; after a change of leader what it holds is the previous leader's, not known to be
// missing.
func (n Node) settling(t Term) bool { return n.Acked == 0 && t.Now.Before(t.HoldUntil) }

// Input is what Decide reads for one PortMap.
type Input struct {
	Term Term
	// Compiled is compile's Programmed condition (nil when compile set none).
	Compiled *metav1.Condition
	// Recorded is the Programmed condition the object holds now, and Generation its
	// metadata.generation.
	Recorded   *metav1.Condition
	Generation int64
	// Nodes are the nodes whose programs carry entries of the mapping (compile's
	// PortMapResult.Nodes), in that order.
	Nodes []Node
}

// Verdict is Decide's answer.
type Verdict struct {
	// Hold: the startup hold is on; no status is written.
	Hold bool
	// Programmed is the condition to write (meaningful unless Hold; nil when compile set none).
	Programmed *metav1.Condition
	// Quiet: a Programmed=False here is the ordinary wait for acknowledgements, no Warning.
	Quiet bool
}

// Decide decides the Programmed condition to write: compile's, downgraded to False with reason
// NodeNotReady (the message lists each node missing, "; "-separated) when compile found it
// True but a node carrying the mapping does not hold it yet. While every node missing is only
// settling, a recorded Programmed=True of the object's generation stays: a new leader does not
// report the kernels it has not heard from yet as missing what the previous leader programmed.
func Decide(in Input) Verdict {
	if in.Term.Holding() {
		return Verdict{Hold: true}
	}
	if in.Compiled == nil {
		return Verdict{}
	}
	prog := *in.Compiled
	if prog.Status != metav1.ConditionTrue {
		return Verdict{Programmed: &prog}
	}
	var missing []string
	awaiting, settling := true, true
	for _, n := range in.Nodes {
		if ok, why := n.Ready(); !ok {
			missing = append(missing, why)
			awaiting = awaiting && n.awaiting()
			settling = settling && n.settling(in.Term)
		}
	}
	if len(missing) == 0 {
		return Verdict{Programmed: &prog}
	}
	if r := in.Recorded; settling && r != nil && r.Status == metav1.ConditionTrue && r.ObservedGeneration == in.Generation {
		kept := *r
		return Verdict{Programmed: &kept, Quiet: true}
	}
	prog.Status = metav1.ConditionFalse
	prog.Reason = v1alpha1.ReasonNodeNotReady
	prog.Message = strings.Join(missing, "; ")
	return Verdict{Programmed: &prog, Quiet: awaiting}
}

// How long a Programmed=False may wait before it is written (MayWait): an acknowledgement it
// awaits normally comes first, and the True it brings is then the only write.
const (
	// AckGrace: a Programmed=False that only awaits connected agents' acknowledgement of the
	// version carrying the mapping. A thousand PortMaps created at once are then written once
	// each, not False and then True a few milliseconds later, and a change to mappings from
	// outside their objects writes no False between two Trues.
	AckGrace = time.Second
	// ResumeGrace: a recorded Programmed=True taken back only because the stream of a node
	// that acknowledged the mapping ended, or its new stream has not acknowledged yet (Held).
	// An agent restarting (an upgrade of the DaemonSet, or into an empty kernel: it applies
	// its whole program, 1.1-1.7 s at 10,000 mappings in the lab) then has none of the
	// PortMaps it carries written, where each one the status writer reached meanwhile was
	// written False and then True again; a node that stays away has them written
	// NodeNotReady once it has passed.
	ResumeGrace = 5 * time.Second
)

// MayWait is how long writing v (Decide's verdict on in) may wait for the acknowledgements
// it awaits, counted from when its PortMap first had such a verdict; 0: write it now. Only a
// Programmed=False of reason NodeNotReady waits:
//   - ResumeGrace when it takes back a True of the object's generation and every node
//     missing is resuming (Node.Held): the mapping is as its nodes last acknowledged it;
//   - else AckGrace when it only awaits connected agents' acknowledgement (Quiet): of a new
//     object or generation, or of a mapping changed from outside its object (its class, its
//     endpoints), whose True of the generation then stays while the agents apply the change.
//     Otherwise a change to many mappings whose acknowledgements come slower than the status
//     writer reaches them writes each PortMap twice (False, then True again a moment later),
//     beside the push;
//   - else not at all: a node disconnected, failed the mapping or is not ready.
func (v Verdict) MayWait(in Input) time.Duration {
	p, r := v.Programmed, in.Recorded
	if v.Hold || p == nil || p.Status != metav1.ConditionFalse || p.Reason != v1alpha1.ReasonNodeNotReady {
		return 0
	}
	if r != nil && r.Status == metav1.ConditionTrue && r.ObservedGeneration == in.Generation && allResuming(in.Nodes) {
		return ResumeGrace
	}
	if v.Quiet {
		return AckGrace
	}
	return 0
}

// allResuming reports whether every node of nodes that is not ready is resuming.
func allResuming(nodes []Node) bool {
	for _, n := range nodes {
		if ok, _ := n.Ready(); !ok && !n.resuming() {
			return false
		}
	}
	return true
}

// Unheard are the nodes the startup hold waits for that s has no agent state from: every
// existing node a class names as accepting or as a peer of a recorded link. The programs
// compiled from s lack what those nodes' state brings (the links to them).
func Unheard(s *compile.Snapshot) []string {
	var out []string
	for _, cls := range s.Classes {
		if cls == nil {
			continue
		}
		for name := range cls.Spec.Nodes {
			out = append(out, name)
		}
		for _, l := range cls.Status.Links {
			out = append(out, l.Peers...)
		}
	}
	out = slices.DeleteFunc(out, func(n string) bool {
		a := s.Agents[n]
		return s.Nodes[n] == nil || a != nil && a.State != nil
	})
	slices.Sort(out)
	return slices.Compact(out)
}
