package agents

import (
	"cmp"
	"slices"

	"google.golang.org/protobuf/types/known/timestamppb"

	"kuport.wlz.li/kuport/controller/compile"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Read-only views of the registry for compile's snapshot, the gRPC ProgramService and the
// dashboard.

// Agents returns what each node's agent last told, for compile's snapshot.
func (r *Registry) Agents() map[string]*compile.AgentState {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]*compile.AgentState{}
	for name, n := range r.nodes {
		if n.everHello {
			out[name] = &compile.AgentState{State: n.state}
		}
	}
	return out
}

// Program returns node's current program (nil if compile has not named it) and the version
// its agent acknowledged in this epoch; ok is false for a node neither compile nor an agent
// has named.
func (r *Registry) Program(nodeName string) (program *kuportv1.NodeProgram, acked uint64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.nodes[nodeName]
	if n == nil {
		return nil, 0, false
	}
	return n.program, n.ackedVersion, true
}

// Index returns compile's index of node's current program (nil when it has none).
func (r *Registry) Index(nodeName string) compile.NodeIndex {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := r.nodes[nodeName]; n != nil {
		return n.index
	}
	return nil
}

// Nodes lists every node compile or an agent named, sorted by name.
func (r *Registry) Nodes() []*kuportv1.NodeInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*kuportv1.NodeInfo, 0, len(r.nodes))
	for name, n := range r.nodes {
		info := &kuportv1.NodeInfo{
			Node:         name,
			Connected:    n.session != nil,
			AgentVersion: n.agentVersion,
			AckedVersion: n.ackedVersion,
			Epoch:        r.epoch,
		}
		if n.program != nil {
			info.ProgramVersion = n.program.Version
		}
		if n.session != nil {
			info.ConnectedSince = timestamppb.New(n.connectedSince)
		}
		if !n.lastReport.IsZero() {
			info.LastReportTime = timestamppb.New(n.lastReport)
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b *kuportv1.NodeInfo) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// Mapping returns mapping's ("<namespace>/<name>") state on every node whose current program
// carries entries of it, sorted by node: the entry ids, the version where they last changed,
// whether the agent acknowledged it, its programmed.Node's Ready verdict, and the entries' counters and
// link statistics from the node's latest Report. Empty when no program carries the mapping.
func (r *Registry) Mapping(mapping string) []*kuportv1.MappingNode {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*kuportv1.MappingNode
	for name, n := range r.nodes {
		mv := n.mappings[mapping]
		if mv == nil {
			continue
		}
		mn := &kuportv1.MappingNode{
			Node:     name,
			EntryIds: mv.idList(),
			Version:  mv.version,
			Acked:    n.ackedVersion >= mv.version,
			Counters: mv.counters(n),
		}
		mn.Ready, mn.Message = n.acks(name, mapping).Ready()
		if ifaces, since := n.unanswered(mapping); len(ifaces) > 0 {
			mn.Unanswered, mn.UnansweredInterfaces, mn.UnansweredSince = true, ifaces, timestamppb.New(since)
		}
		for _, l := range n.linkStats {
			if mv.uses(l.Name) {
				mn.Links = append(mn.Links, l)
			}
		}
		out = append(out, mn)
	}
	slices.SortFunc(out, func(a, b *kuportv1.MappingNode) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// dnatEntry is a DNAT entry of a node's index.
type dnatEntry struct{ mapping, iface string }

// dnatEntries lists index's DNAT entries by id.
func dnatEntries(index compile.NodeIndex) map[string]dnatEntry {
	out := map[string]dnatEntry{}
	for key, mi := range index {
		for _, e := range mi.Entries {
			if e.Kind == compile.KindDNAT {
				out[e.ID] = dnatEntry{key, e.Interface}
			}
		}
	}
	return out
}

// InterfaceVerdict is the verdict of one DNAT entry of a mapping on a node.
type InterfaceVerdict struct {
	Interface string
	Verdict
}

// Unanswered returns, for each mapping ("<namespace>/<name>") with a DNAT entry in node's
// current program, its entries' verdicts sorted by interface (Judge over the node's reports).
func (r *Registry) Unanswered(nodeName string) map[string][]InterfaceVerdict {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.nodes[nodeName]
	if n == nil {
		return nil
	}
	out := map[string][]InterfaceVerdict{}
	for id, e := range dnatEntries(n.index) {
		out[e.mapping] = append(out[e.mapping], InterfaceVerdict{Interface: e.iface, Verdict: n.answers[id].Verdict})
	}
	for _, vs := range out {
		slices.SortFunc(vs, func(a, b InterfaceVerdict) int { return cmp.Compare(a.Interface, b.Interface) })
	}
	return out
}
