// Package dashboard serves the controller's read-only web page (DESIGN.md, "watch counters
// on the controller's dashboard"): "/" is a page that polls "/api/state" every second and
// redraws classes, nodes, links and mappings with their live counters and rates; Run samples
// the counters for the rates while the state is being read.
//
// It reads the agent registry and the controller's informer caches through Source and
// writes nothing anywhere: no API call, no kernel, no decision. Which entry a counter
// measures comes from metrics.Counted, shared with the Prometheus metrics, and a mapping's
// serving node from compile's index, both through the registry.
package dashboard

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/metrics"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

//go:embed index.html
var indexHTML []byte

// Agents is the agent side the page reads; *agents.Registry satisfies it.
type Agents interface {
	metrics.Source
	// Agents returns what each node's agent last told (its interfaces and underlay).
	Agents() map[string]*compile.AgentState
}

// Judge is an Agents that also judges whether each mapping's requests go unanswered on a
// node (*agents.Registry does); the page shows no unanswered row for an Agents without it.
type Judge interface {
	Unanswered(node string) map[string][]agents.InterfaceVerdict
}

// Source is what the page shows while this replica leads.
type Source struct {
	Agents Agents
	// PortMaps lists the cached PortMaps.
	PortMaps func() []*v1alpha1.PortMap
	// Classes lists the cached PortMapClasses.
	Classes func() []*v1alpha1.PortMapClass
}

// sampleInterval is how often Run reads the counters: a counter moves when its agent
// reports (every 10 s by default, 2 s in the lab), and Run times each move to within one
// interval, whenever and however often the page is read.
const sampleInterval = time.Second

// idleAfter is how long after the last read of the state Run keeps sampling: an unwatched
// dashboard reads nothing.
const idleAfter = time.Minute

// Server serves the page and its state. Safe for concurrent use.
type Server struct {
	mu       sync.Mutex
	src      *Source
	lastRead time.Time       // of the state
	rates    map[string]Rate // of Run's latest sample, by counterKey

	series rates
}

// New returns a Server with no Source: it says the replica does not lead until SetSource.
func New() *Server { return &Server{} }

// SetSource sets what the page shows: the current leadership term's registry and caches,
// or nil while this replica does not lead.
func (s *Server) SetSource(src *Source) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.src = src
}

// Run samples the counters every sampleInterval until ctx ends, while the state has been
// read within idleAfter; the rates State reports come from these samples.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(sampleInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.sample(now)
		}
	}
}

// sample feeds one reading of every counter to the rates; with no source, or nobody
// reading, it reads nothing and the rates start over.
func (s *Server) sample(now time.Time) {
	s.mu.Lock()
	src, watched := s.src, now.Sub(s.lastRead) < idleAfter
	s.mu.Unlock()
	readings := map[string]reading{}
	if src != nil && watched {
		counters, _ := readCounters(src.Agents)
		for m, cs := range counters {
			for _, c := range cs {
				readings[counterKey(m, c)] = reading{packets: c.Packets, bytes: c.Bytes}
			}
		}
	}
	rates := s.series.observe(readings, now)
	s.mu.Lock()
	s.rates = rates
	s.mu.Unlock()
}

// ServeHTTP serves "/" (the page) and "/api/state" (State as JSON), GET and HEAD only.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	switch r.URL.Path {
	case "/":
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(indexHTML)
	case "/api/state":
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", " ")
		_ = enc.Encode(s.State(time.Now()))
	default:
		http.NotFound(w, r)
	}
}

// State is everything the page shows.
type State struct {
	// Leader is false on a replica that does not lead: it has nothing else to show.
	Leader   bool      `json:"leader"`
	Time     time.Time `json:"time"`
	Classes  []Class   `json:"classes"`
	Nodes    []Node    `json:"nodes"`
	Links    []Link    `json:"links"`
	Mappings []Mapping `json:"mappings"`
}

// Condition is a status condition; Status is "Unknown" when the object has none yet.
type Condition struct {
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Class is one PortMapClass.
type Class struct {
	Name        string    `json:"name"`
	ServingMode string    `json:"servingMode"`
	ReturnPath  string    `json:"returnPath"`
	Ready       Condition `json:"ready"`
	// Nodes are the accepting nodes, sorted.
	Nodes []string `json:"nodes"`
}

// Node is one node as the agent registry knows it.
type Node struct {
	Name              string `json:"name"`
	Connected         bool   `json:"connected"`
	AgentVersion      string `json:"agentVersion"`
	UnderlayInterface string `json:"underlayInterface"`
	// UnderlayMTU in bytes; 0 while the agent has not reported its underlay.
	UnderlayMTU    uint32 `json:"underlayMTU"`
	ProgramVersion uint64 `json:"programVersion"`
	AckedVersion   uint64 `json:"ackedVersion"`
}

// Link is one vxlan link of a class between two nodes.
type Link struct {
	Class string `json:"class"`
	// Ends are the nodes whose programs hold the link, sorted by node: two once both are
	// programmed.
	Ends []LinkEnd `json:"ends"`
}

// LinkEnd is one node's device of a link and its latest reported statistics.
type LinkEnd struct {
	Node    string `json:"node"`
	Device  string `json:"device"`
	Address string `json:"address"`
	// MTU in bytes.
	MTU uint32 `json:"mtu"`
	// Reported is false while the node's latest report has no statistics for the device.
	Reported  bool   `json:"reported"`
	TxPackets uint64 `json:"txPackets"`
	RxPackets uint64 `json:"rxPackets"`
	TxErrors  uint64 `json:"txErrors"`
	RxErrors  uint64 `json:"rxErrors"`
}

// Mapping is one PortMap with its counters.
type Mapping struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Class     string `json:"class"`
	Protocol  string `json:"protocol"`
	// Ports is "27015" or "27015-27115".
	Ports    string                   `json:"ports"`
	Endpoint *v1alpha1.EndpointStatus `json:"endpoint,omitempty"`
	// ServingNode is the node status is about (API.md), as compile's index has it; empty
	// while no program carries the mapping.
	ServingNode string `json:"servingNode,omitempty"`
	// Published are the addresses clients dial, one per interface, as status has them.
	Published []v1alpha1.PublishedAddress `json:"published"`
	Accepted  Condition                   `json:"accepted"`
	// Programmed is the condition as written (True once every carrying node acknowledged).
	Programmed Condition `json:"programmed"`
	// Unanswered lists the nodes and interfaces where the mapping's requests arrive and no
	// reply leaves (agents.Judge), sorted; empty while every one is answered or idle.
	Unanswered []Unanswered `json:"unanswered"`
	Counters   []Counter    `json:"counters"`
}

// Unanswered is one DNAT entry of a mapping whose requests go unanswered on its node.
type Unanswered struct {
	Node      string `json:"node"`
	Interface string `json:"interface"`
	// Since is when the report that showed the first unanswered request arrived.
	Since time.Time `json:"since"`
	// Requests arrived since the last reply (replies since: 0).
	Requests uint64 `json:"requests"`
}

// Counter is one rule of a mapping on one node: its cumulative values from the node's
// latest report and their rates (see metrics.Rules for what each rule counts).
type Counter struct {
	Node      string       `json:"node"`
	Rule      string       `json:"rule"`
	Unit      metrics.Unit `json:"unit"`
	Direction string       `json:"direction"`
	Packets   uint64       `json:"packets"`
	Bytes     uint64       `json:"bytes"`
	Rate
}

// State reads the Source at now, with the rates of Run's latest sample; it also keeps Run
// sampling for idleAfter.
func (s *Server) State(now time.Time) *State {
	st := &State{Time: now.UTC(), Classes: []Class{}, Nodes: []Node{}, Links: []Link{}, Mappings: []Mapping{}}
	s.mu.Lock()
	src, rates := s.src, s.rates
	s.lastRead = now
	s.mu.Unlock()
	if src == nil {
		return st
	}
	st.Leader = true

	agentStates := src.Agents.Agents()
	links := map[string]*Link{}
	for _, n := range src.Agents.Nodes() {
		node := Node{Name: n.Node, Connected: n.Connected, AgentVersion: n.AgentVersion,
			ProgramVersion: n.ProgramVersion, AckedVersion: n.AckedVersion}
		if a := agentStates[n.Node]; a != nil && a.State != nil {
			node.UnderlayInterface = a.State.UnderlayInterface
			for _, i := range a.State.Interfaces {
				if i.Name == a.State.UnderlayInterface {
					node.UnderlayMTU = i.Mtu
				}
			}
		}
		st.Nodes = append(st.Nodes, node)

		program, _, _ := src.Agents.Program(n.Node)
		_, stats := src.Agents.Stats(n.Node)
		addLinkEnds(links, n.Node, program.GetLinks(), stats)
	}

	counters, serving := readCounters(src.Agents)
	unanswered := map[string][]Unanswered{}
	if j, ok := src.Agents.(Judge); ok {
		for _, n := range src.Agents.Nodes() {
			for m, vs := range j.Unanswered(n.Node) {
				for _, v := range vs {
					if v.Unanswered {
						unanswered[m] = append(unanswered[m], Unanswered{Node: n.Node, Interface: v.Interface,
							Since: v.Since.UTC(), Requests: v.Requests})
					}
				}
			}
		}
	}
	for m, cs := range counters {
		for i := range cs {
			cs[i].Rate = rates[counterKey(m, cs[i])]
		}
		slices.SortFunc(cs, func(a, b Counter) int {
			return strings.Compare(a.Node+"\x00"+a.Rule+"\x00"+a.Direction, b.Node+"\x00"+b.Rule+"\x00"+b.Direction)
		})
	}
	for _, l := range links {
		slices.SortFunc(l.Ends, func(a, b LinkEnd) int { return strings.Compare(a.Node, b.Node) })
		st.Links = append(st.Links, *l)
	}
	slices.SortFunc(st.Links, func(a, b Link) int { return strings.Compare(linkKey(a), linkKey(b)) })

	for _, c := range src.Classes() {
		st.Classes = append(st.Classes, class(c))
	}
	slices.SortFunc(st.Classes, func(a, b Class) int { return strings.Compare(a.Name, b.Name) })
	for _, pm := range src.PortMaps() {
		m := mapping(pm)
		key := types.NamespacedName{Namespace: pm.Namespace, Name: pm.Name}
		m.ServingNode = serving[key]
		m.Counters = counters[key]
		m.Unanswered = unanswered[key.String()]
		slices.SortFunc(m.Unanswered, func(a, b Unanswered) int {
			return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.Interface, b.Interface))
		})
		if m.Unanswered == nil {
			m.Unanswered = []Unanswered{}
		}
		if m.Counters == nil {
			m.Counters = []Counter{}
		}
		st.Mappings = append(st.Mappings, m)
	}
	slices.SortFunc(st.Mappings, func(a, b Mapping) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return st
}

// readCounters reads, by mapping, the counters of every node's latest report that measure
// a rule of the node's current program (metrics.Counted), and the serving node of every
// mapping some program carries, from compile's index.
func readCounters(a Agents) (map[types.NamespacedName][]Counter, map[types.NamespacedName]string) {
	out, serving := map[types.NamespacedName][]Counter{}, map[types.NamespacedName]string{}
	for _, n := range a.Nodes() {
		index := a.Index(n.Node)
		for _, mi := range index {
			serving[mi.Mapping] = mi.ServingNode
		}
		ctrs, _ := a.Stats(n.Node)
		for r, c := range metrics.Counted(index, ctrs) {
			out[r.Mapping] = append(out[r.Mapping], Counter{Node: n.Node, Rule: r.Name,
				Unit: r.Unit, Direction: r.Direction, Packets: c.Packets, Bytes: c.Bytes})
		}
	}
	return out, serving
}

// counterKey names mapping's counter c across samples: a rule's forwarded rows differ by
// direction only.
func counterKey(mapping types.NamespacedName, c Counter) string {
	return c.Node + " " + mapping.String() + "/" + c.Rule + " " + c.Direction
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
		end := LinkEnd{Node: node, Device: l.Name, Address: l.LocalAddress, MTU: l.Mtu}
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

func condition(c *metav1.Condition) Condition {
	if c == nil {
		return Condition{Status: "Unknown"}
	}
	return Condition{Status: string(c.Status), Reason: c.Reason, Message: c.Message}
}

func class(c *v1alpha1.PortMapClass) Class {
	// The API's defaults stand in for a class read before the API server applied them.
	return Class{Name: c.Name,
		ServingMode: string(cmp.Or(c.Spec.ServingMode, v1alpha1.ServingModeSingle)),
		ReturnPath:  string(cmp.Or(c.Spec.ReturnPath.Mode, v1alpha1.ReturnPathVxlan)),
		Ready:       condition(meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ClassConditionReady)),
		Nodes:       slices.Sorted(maps.Keys(c.Spec.Nodes)),
	}
}

func mapping(pm *v1alpha1.PortMap) Mapping {
	m := Mapping{Namespace: pm.Namespace, Name: pm.Name, Class: pm.Spec.ClassName, Protocol: string(pm.Spec.Protocol),
		Ports: pm.Status.Ports, Endpoint: pm.Status.Endpoint, Published: pm.Status.Published,
		Accepted:   condition(meta.FindStatusCondition(pm.Status.Conditions, v1alpha1.ConditionAccepted)),
		Programmed: condition(meta.FindStatusCondition(pm.Status.Conditions, v1alpha1.ConditionProgrammed)),
	}
	if m.Ports == "" {
		m.Ports = fmt.Sprint(pm.Spec.Port)
		if pm.Spec.EndPort != nil {
			m.Ports += fmt.Sprintf("-%d", *pm.Spec.EndPort)
		}
	}
	if m.Published == nil {
		m.Published = []v1alpha1.PublishedAddress{}
	}
	return m
}
