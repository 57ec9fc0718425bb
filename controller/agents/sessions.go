package agents

import (
	"time"

	"google.golang.org/protobuf/proto"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Agent streams: a session per open Connect stream, what it is sent next and what its agent
// acknowledges and reports.

// session is one open Connect stream.
type session struct {
	node     string
	wake     chan struct{} // capacity 1: "the program may have changed"
	replaced chan struct{} // closed when a newer stream of the same node registers
	sent     uint64        // version the agent holds or was sent (guarded by Registry.mu)
	// delta: the agent applies deltas (Hello.accepts_delta); base is the last program the
	// stream carried, nil before the first (guarded by Registry.mu).
	delta bool
	base  *kuportv1.NodeProgram
}

func wake(s *session) {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// connect registers a stream that opened with hello, replacing an older stream of the node.
func (r *Registry) connect(hello *kuportv1.Hello) *session {
	s := &session{node: hello.Node, wake: make(chan struct{}, 1), replaced: make(chan struct{}), delta: hello.AcceptsDelta}
	r.mu.Lock()
	n := r.nodeLocked(hello.Node)
	if n.session != nil {
		close(n.session.replaced)
		n.endStream()
	}
	n.session = s
	n.connectedSince = time.Now()
	n.everHello = true
	n.agentVersion = hello.AgentVersion
	n.state = hello.State
	n.ackErrors = nil
	n.ackedVersion = 0
	r.touchLocked(n)
	if hello.AppliedEpoch == r.epoch && n.program != nil && hello.AppliedVersion <= n.program.Version {
		n.ackedVersion = hello.AppliedVersion
		s.sent = hello.AppliedVersion
	}
	wake(s)
	r.mu.Unlock()
	r.log.Info("agent connected", "node", hello.Node, "agent_version", hello.AgentVersion,
		"applied_epoch", hello.AppliedEpoch, "applied_version", hello.AppliedVersion)
	if hello.AppliedEpoch > r.epoch {
		// Its fencing refuses every program of this term: the Lease was deleted or its
		// transitions count went back. A later term whose epoch passes it is served again.
		r.log.Warn("agent holds a higher epoch than this leader's and refuses its programs",
			"node", hello.Node, "agent_epoch", hello.AppliedEpoch, "epoch", r.epoch)
		r.onEpochBehind(hello.AppliedEpoch)
	}
	r.onAgent(hello.Node, true, hello.AgentVersion)
	r.onChange(StateChanged)
	return s
}

// disconnect marks s's node disconnected unless a newer stream replaced s; the node keeps
// its last state.
func (r *Registry) disconnect(s *session) {
	r.mu.Lock()
	n := r.nodes[s.node]
	current := n != nil && n.session == s
	if current {
		n.session = nil
		n.endStream()
		r.touchLocked(n)
	}
	r.mu.Unlock()
	if current {
		r.log.Info("agent disconnected", "node", s.node)
		r.onAgent(s.node, false, "")
		r.onChange(StateChanged)
	}
}

// endStream records, as the stream of n ends, what its agent acknowledged whole: the kernel
// keeps it (fail static). A stream that acknowledged errors leaves nothing known held.
func (n *node) endStream() {
	if len(n.ackErrors) > 0 {
		n.held = 0
		return
	}
	n.held = max(n.held, n.ackedVersion)
}

// next returns the message s must be sent, or nil when its agent already has the current
// program, none exists yet, or the startup hold is on: the program whole, or for an agent
// that accepts deltas and was sent one on this stream, the delta from that one (a
// reconnecting agent gets its whole program once).
func (r *Registry) next(s *session) *kuportv1.ConnectResponse {
	r.mu.Lock()
	n := r.nodes[s.node]
	if !r.released || n == nil || n.session != s || n.program == nil || n.program.Version == s.sent {
		r.mu.Unlock()
		return nil
	}
	p, base := n.program, s.base
	s.sent, s.base = p.Version, p
	r.mu.Unlock()
	if !s.delta || base == nil {
		return &kuportv1.ConnectResponse{Message: &kuportv1.ConnectResponse_Program{Program: p}}
	}
	return &kuportv1.ConnectResponse{Message: &kuportv1.ConnectResponse_Delta{Delta: kuportv1.Delta(base, p)}}
}

// ack records an agent's acknowledgement of one program version.
func (r *Registry) ack(s *session, a *kuportv1.Ack) {
	r.mu.Lock()
	n := r.nodes[s.node]
	var reason string
	switch {
	case n == nil || n.session != s:
		reason = "stream replaced"
	case a.Epoch != r.epoch:
		reason = "other epoch"
	case n.program == nil || a.Version > n.program.Version:
		reason = "version never sent"
	case a.Version < n.ackedVersion:
		reason = "older than the acknowledged version"
	default:
		r.touchAckLocked(n, a)
		n.ackedVersion = a.Version
		n.ackErrors = a.Errors
	}
	r.mu.Unlock()
	if reason != "" {
		r.log.Warn("ignoring ack", "node", s.node, "epoch", a.Epoch, "version", a.Version, "reason", reason)
		return
	}
	for _, e := range a.Errors {
		r.log.Warn("agent failed to apply entry", "node", s.node, "version", a.Version, "id", e.Id, "error", e.Message)
	}
	r.log.Debug("program acknowledged", "node", s.node, "version", a.Version, "errors", len(a.Errors))
	r.onAck(s.node, a.Version)
	r.onChange(Acked)
}

// report records a Report: its counters as Counters (countLocked), its link statistics and
// state; the message itself is not kept. A different NodeState makes compile run again.
func (r *Registry) report(s *session, rep *kuportv1.Report) {
	r.mu.Lock()
	n := r.nodes[s.node]
	if n == nil || n.session != s {
		r.mu.Unlock()
		return
	}
	n.linkStats = rep.Links
	n.lastReport = r.now()
	changed := rep.State != nil && !proto.Equal(rep.State, n.state)
	if changed {
		n.state = rep.State
	}
	answers := r.countLocked(s.node, n, rep.Counters, n.lastReport)
	r.mu.Unlock()
	for _, a := range answers {
		if a.Verdict.Unanswered {
			r.log.Warn("requests unanswered", "node", a.Node, "mapping", a.Mapping, "interface", a.Interface,
				"requests", a.Verdict.Requests, "since", a.Verdict.Since)
		} else {
			r.log.Info("requests answered again", "node", a.Node, "mapping", a.Mapping, "interface", a.Interface)
		}
		r.onUnanswered(a)
	}
	if changed {
		r.log.Info("node state changed", "node", s.node)
		r.onChange(StateChanged)
	}
}
