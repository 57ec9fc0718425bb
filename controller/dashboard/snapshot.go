package dashboard

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/metrics"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// snapshot is one read of the agent registry (Agents): what every node's program holds,
// by compile's index, and what its latest report counted. Everything the page says of
// which entry, link or node belongs to a mapping comes from here.
type snapshot struct {
	nodes  []*kuportv1.NodeInfo
	agents map[string]*compile.AgentState
	// index by mapping, then node: what the node's program holds for it (readSnapshot).
	index map[types.NamespacedName]map[string]*compile.MappingIndex
	// nodeIndex and stats by node: the index of its program and its latest report's counters.
	nodeIndex map[string]compile.NodeIndex
	stats     map[string][]agents.Counter
	// counters by mapping, of the mappings count was asked for (readSnapshot).
	counters map[types.NamespacedName][]Counter
	// unanswered by mapping (readSnapshot).
	unanswered map[types.NamespacedName][]Unanswered
	// links sorted by class and nodes, each end with its latest statistics.
	links []Link
}

// readSnapshot reads a for a page: what readCounts reads, each mapping's index by node, and
// the unanswered verdicts when a judges (Judge).
func readSnapshot(a Agents) *snapshot {
	s := readCounts(a)
	s.index = map[types.NamespacedName]map[string]*compile.MappingIndex{}
	s.counters, s.unanswered = map[types.NamespacedName][]Counter{}, map[types.NamespacedName][]Unanswered{}
	judge, _ := a.(Judge)
	for _, n := range s.nodes {
		index := s.nodeIndex[n.Node]
		for _, mi := range index {
			if s.index[mi.Mapping] == nil {
				s.index[mi.Mapping] = map[string]*compile.MappingIndex{}
			}
			s.index[mi.Mapping][n.Node] = mi
		}
		if judge == nil {
			continue
		}
		// The verdicts are by compile's mapping key (cut for long names): the index names the
		// mapping.
		for k, vs := range judge.Unanswered(n.Node) {
			mi := index[k]
			if mi == nil {
				continue
			}
			for _, v := range vs {
				if v.Unanswered {
					s.unanswered[mi.Mapping] = append(s.unanswered[mi.Mapping], Unanswered{Node: n.Node, Interface: v.Interface,
						Since: v.Since.UTC(), Requests: v.Requests})
				}
			}
		}
	}
	return s
}

// readCounts reads what a sample needs of a: for every node, its program's index and
// links and its latest report. Its counters are read by counted.
func readCounts(a Agents) *snapshot {
	s := &snapshot{nodes: a.Nodes(), agents: a.Agents(),
		nodeIndex: map[string]compile.NodeIndex{}, stats: map[string][]agents.Counter{}}
	links := map[string]*Link{}
	for _, n := range s.nodes {
		index := a.Index(n.Node)
		ctrs, stats := a.Stats(n.Node)
		s.nodeIndex[n.Node], s.stats[n.Node] = index, ctrs
		program, _, _ := a.Program(n.Node)
		addLinkEnds(links, n.Node, program.GetLinks(), stats)
	}
	for _, l := range links {
		slices.SortFunc(l.Ends, func(a, b LinkEnd) int { return strings.Compare(a.Node, b.Node) })
		s.links = append(s.links, *l)
	}
	slices.SortFunc(s.links, func(a, b Link) int { return strings.Compare(linkKey(a), linkKey(b)) })
	return s
}

// counted calls f with each counter of the wanted mappings (all for nil) that measures a
// rule of its node's current program (metrics.Counted), and its mapping.
func (s *snapshot) counted(wanted map[types.NamespacedName]bool, f func(types.NamespacedName, Counter)) {
	for _, n := range s.nodes {
		index := s.nodeIndex[n.Node]
		if wanted != nil {
			sub := compile.NodeIndex{}
			for k, mi := range index {
				if wanted[mi.Mapping] {
					sub[k] = mi
				}
			}
			index = sub
		}
		for r, c := range metrics.Counted(index, s.stats[n.Node]) {
			f(r.Mapping, Counter{Node: n.Node, Rule: r.Name, Unit: r.Unit, Direction: r.Direction,
				Packets: c.Packets, Bytes: c.Bytes, interfaceName: r.Interface, forwarded: r.Forwarded, overLink: r.OverLink})
		}
	}
}

// count keeps the counters of the wanted mappings (readSnapshot's snapshots only).
func (s *snapshot) count(wanted map[types.NamespacedName]bool) {
	s.counted(wanted, func(m types.NamespacedName, c Counter) { s.counters[m] = append(s.counters[m], c) })
}

// carriers returns the nodes whose programs carry m, sorted.
func (s *snapshot) carriers(m types.NamespacedName) []string {
	out := make([]string, 0, len(s.index[m]))
	for n := range s.index[m] {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// nodeRows lists the nodes as the page shows them.
func (s *snapshot) nodeRows() []Node {
	out := make([]Node, 0, len(s.nodes))
	for _, n := range s.nodes {
		node := Node{Name: n.Node, Connected: n.Connected, AgentVersion: n.AgentVersion,
			ProgramVersion: n.ProgramVersion, AckedVersion: n.AckedVersion}
		if a := s.agents[n.Node]; a != nil && a.State != nil {
			node.UnderlayInterface = a.State.UnderlayInterface
			for _, i := range a.State.Interfaces {
				if i.Name == a.State.UnderlayInterface {
					node.UnderlayMTU = i.Mtu
				}
			}
		}
		out = append(out, node)
	}
	return out
}

// addLinkEnds adds node's links, with their statistics, to the links by class and node pair.
func addLinkEnds(links map[string]*Link, node string, program []*kuportv1.Link, stats []*kuportv1.LinkStats) {
	byName := make(map[string]*kuportv1.LinkStats, len(stats))
	for _, s := range stats {
		byName[s.Name] = s
	}
	for _, l := range program {
		pair := []string{node, l.PeerNode}
		slices.Sort(pair)
		key := l.ClassName + "/" + strings.Join(pair, "/")
		if links[key] == nil {
			links[key] = &Link{Class: l.ClassName}
		}
		end := LinkEnd{Node: node, Device: l.Name, PeerNode: l.PeerNode, Address: l.LocalAddress, VNI: l.Vni, MTU: l.Mtu}
		if s := byName[l.Name]; s != nil {
			end.Reported = true
			end.TxPackets, end.RxPackets, end.TxErrors, end.RxErrors = s.TxPackets, s.RxPackets, s.TxErrors, s.RxErrors
		}
		links[key].Ends = append(links[key].Ends, end)
	}
}

func linkKey(l Link) string {
	k := l.Class
	for _, e := range l.Ends {
		k += "/" + e.Node
	}
	return k
}
