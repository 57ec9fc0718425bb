package agents

import (
	"maps"
	"slices"

	"kuport.wlz.li/kuport/controller/programmed"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Acknowledgements: what each node's agent applied, for programmed.Decide and the pacing of
// class status writes.

// Acks returns what the registry knows of each of nodes for mapping (a MappingKey), in
// nodes' order, for programmed.Decide.
func (r *Registry) Acks(mapping string, nodes []string) []programmed.Node {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]programmed.Node, len(nodes))
	for i, name := range nodes {
		out[i] = r.nodes[name].acks(name, mapping)
	}
	return out
}

// Touched returns the mappings whose programmed.Node on some node may have changed since
// the last call (a version stored, an acknowledgement, an agent connecting or leaving), and
// forgets them.
func (r *Registry) Touched() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Sorted(maps.Keys(r.touched))
	clear(r.touched)
	return out
}

// touchLocked records that every mapping of n's program may have changed readiness.
func (r *Registry) touchLocked(n *node) {
	for m := range n.mappings {
		r.touched[m] = true
	}
}

// acks is Registry.Acks for one node (n nil for a node never named), called with
// Registry.mu held.
func (n *node) acks(nodeName, mapping string) programmed.Node {
	out := programmed.Node{Name: nodeName}
	if n == nil {
		return out
	}
	out.Hello, out.Connected, out.Acked, out.Held = n.everHello, n.session != nil, n.ackedVersion, n.held
	mv := n.mappings[mapping]
	if mv == nil {
		return out
	}
	out.Version = mv.version
	for _, e := range n.ackErrors {
		switch {
		case mv.uses(e.Id):
			out.Failed = e.Id + ": " + e.Message
			return out
		case !n.hasEntry(e.Id):
			out.ProgramFailed = e.Message
			return out
		}
	}
	return out
}

// hasEntry reports whether id names an entry of some mapping in n's current program.
func (n *node) hasEntry(id string) bool {
	for _, mv := range n.mappings {
		if mv.uses(id) {
			return true
		}
	}
	return false
}

// Unacknowledged counts the nodes whose agent's stream is open and has not yet acknowledged
// the node's current program version: the push still under way.
func (r *Registry) Unacknowledged() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	count := 0
	for _, n := range r.nodes {
		if n.session != nil && n.program != nil && n.ackedVersion < n.program.Version {
			count++
		}
	}
	return count
}

// touchAckLocked records the mappings whose readiness a acknowledging n's program may change:
// those whose version it reaches, or every one when errors came or went.
func (r *Registry) touchAckLocked(n *node, a *kuportv1.Ack) {
	if len(a.Errors) > 0 || len(n.ackErrors) > 0 {
		r.touchLocked(n)
		return
	}
	for m, mv := range n.mappings {
		if mv.version > n.ackedVersion && mv.version <= a.Version {
			r.touched[m] = true
		}
	}
}
