// Package agents is the controller's side of the agent stream
// (docs/design/software.md#the-stream): a Registry that keeps, per node, the current program
// and its version, the version at which each mapping's entries last changed, the agent's
// connection, its last reported NodeState, acknowledgements and counters; and the gRPC
// services (AgentService, ProgramService, health, reflection) served over it.
//
// It decides nothing about what a program holds (compile does) and never talks to the API
// server; it tells its owner through Config.OnChange when compile or status must run again.
package agents

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/programmed"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// DefaultHold is how long after a controller start programs are held back while nodes that
// classes name have not said Hello yet (see Registry.Release).
const DefaultHold = 15 * time.Second

// Change says what an agent event invalidates.
type Change int

const (
	// StateChanged: an agent connected, disconnected, or reported a different NodeState, so
	// compile must run again.
	StateChanged Change = iota + 1
	// Acked: an agent acknowledged a program version, so only status must be rewritten.
	Acked
)

// Config configures a Registry.
type Config struct {
	// Epoch stamps every program; agents refuse programs of a lower epoch than one they
	// applied. Fixed for the Registry's life: the leadership term's epoch (package
	// controller/leader), or the start's unix seconds without leader election.
	Epoch uint64
	// Start is when the controller started; the startup hold ends at Start+Hold at the latest.
	Start time.Time
	// Hold is the longest the startup hold lasts (DefaultHold when zero).
	Hold time.Duration
	// OnChange is called, outside any lock, after every agent event that needs compile or
	// status to run again. May be nil.
	OnChange func(Change)
	// OnAck is called, outside any lock, after an agent's acknowledgement of a version is
	// taken (before OnChange's Acked). May be nil.
	OnAck func(node string, version uint64)
	// OnAgent is called, outside any lock, when a node's agent connects (connected true, with
	// its version) or its stream ends without a newer one replacing it. May be nil.
	OnAgent func(node string, connected bool, agentVersion string)
	// OnEpochBehind is called, outside any lock, when an agent says Hello holding a higher
	// epoch than Epoch (floor), whose programs it therefore refuses. May be nil.
	OnEpochBehind func(floor uint64)
	// Unanswered is how long requests must go without a reply before a DNAT entry is
	// unanswered (DefaultUnansweredWindow when zero).
	Unanswered Window
	// OnUnanswered is called, outside any lock, when a DNAT entry turns unanswered or
	// answered again (once per transition). May be nil.
	OnUnanswered func(UnansweredChange)
	// Log receives agent events; nil discards them.
	Log hclog.Logger
}

// UnansweredChange is a DNAT entry turning unanswered, or answered again, on a node.
type UnansweredChange struct {
	// Mapping is the mapping's key (compile.MappingKey).
	Mapping   string
	Node      string
	Interface string
	// Verdict is the entry's verdict now.
	Verdict Verdict
	// Was is its verdict before: when the entry is answered again, how long and how many
	// requests it went unanswered.
	Was Verdict
}

// Registry is the per-node state of the controller's agent side. Safe for concurrent use.
type Registry struct {
	log       hclog.Logger
	epoch     uint64
	holdUntil time.Time
	onChange  func(Change)
	onAck     func(node string, version uint64)
	onAgent   func(node string, connected bool, agentVersion string)
	// onEpochBehind is Config.OnEpochBehind, never nil.
	onEpochBehind func(floor uint64)
	window        Window
	onUnanswered  func(UnansweredChange)
	// now is time.Now; tests set it.
	now func() time.Time
	// done is closed by Close: its agent streams end.
	done      chan struct{}
	closeOnce sync.Once

	mu       sync.Mutex
	released bool
	nodes    map[string]*node
	// touched are the mappings whose readiness may have changed since Touched was last called.
	touched map[string]bool
}

type node struct {
	// program is the current program with version and epoch set; nil until compile names
	// the node. Never mutated once stored (sent to streams concurrently).
	program *kuportv1.NodeProgram
	// index is compile's index of program, by mapping; never mutated once stored.
	index compile.NodeIndex
	// input is the program SetPrograms was last given for the node (compile's, not a copy).
	input    *kuportv1.NodeProgram
	mappings map[string]*mappingVersion

	session        *session  // nil while no stream is open
	connectedSince time.Time // when session said Hello
	lastReport     time.Time // when the latest Report arrived; zero before the first
	everHello      bool
	agentVersion   string
	state          *kuportv1.NodeState
	ackedVersion   uint64 // in the current epoch; 0 if none
	ackErrors      []*kuportv1.EntryError
	// held is the highest version an ended stream of this epoch acknowledged without errors
	// (programmed.Node.Held); 0 if none.
	held uint64
	// counters are the latest Report's, in its order (countLocked).
	counters  []Counter
	linkStats []*kuportv1.LinkStats
	// answers folds each DNAT entry's forwarded counters over the reports (Judge), by id; an
	// entry of the index it lacks is at rest or unseen (countLocked).
	answers map[string]Tracker
}

// mappingVersion is the program version at which one mapping's entries on a node last changed.
type mappingVersion struct {
	version uint64
	digest  [sha256.Size]byte
	// index is compile's index of the mapping the digest was taken of: the entry ids, link
	// names and return path ids the mapping uses (uses), never nil.
	index *compile.MappingIndex
}

// uses reports whether id is one of the mapping's entry ids, link names or return path ids
// on the node (a handful: a scan of the index, which holds them once for every node).
func (mv *mappingVersion) uses(id string) bool {
	mi := mv.index
	return slices.ContainsFunc(mi.Entries, func(e compile.Entry) bool { return e.ID == id }) ||
		slices.Contains(mi.Links, id) || slices.Contains(mi.ReturnPaths, id)
}

// idList returns what uses accepts, sorted and without repeats.
func (mv *mappingVersion) idList() []string {
	mi := mv.index
	out := make([]string, 0, len(mi.Entries)+len(mi.Links)+len(mi.ReturnPaths))
	for _, e := range mi.Entries {
		out = append(out, e.ID)
	}
	out = append(append(out, mi.Links...), mi.ReturnPaths...)
	slices.Sort(out)
	return slices.Compact(out)
}

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

// NewRegistry returns an empty Registry holding programs back until Release lets them go.
func NewRegistry(cfg Config) *Registry {
	hold := cfg.Hold
	if hold == 0 {
		hold = DefaultHold
	}
	log := cfg.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	onChange := cfg.OnChange
	if onChange == nil {
		onChange = func(Change) {}
	}
	onAck := cfg.OnAck
	if onAck == nil {
		onAck = func(string, uint64) {}
	}
	onAgent := cfg.OnAgent
	if onAgent == nil {
		onAgent = func(string, bool, string) {}
	}
	onEpochBehind := cfg.OnEpochBehind
	if onEpochBehind == nil {
		onEpochBehind = func(uint64) {}
	}
	window := cfg.Unanswered
	if window == (Window{}) {
		window = DefaultUnansweredWindow
	}
	onUnanswered := cfg.OnUnanswered
	if onUnanswered == nil {
		onUnanswered = func(UnansweredChange) {}
	}
	return &Registry{
		now:           time.Now,
		window:        window,
		onUnanswered:  onUnanswered,
		log:           log,
		epoch:         cfg.Epoch,
		holdUntil:     cfg.Start.Add(hold),
		onChange:      onChange,
		onAck:         onAck,
		onAgent:       onAgent,
		onEpochBehind: onEpochBehind,
		done:          make(chan struct{}),
		nodes:         map[string]*node{},
		touched:       map[string]bool{},
	}
}

// Epoch returns the epoch stamped on every program.
func (r *Registry) Epoch() uint64 { return r.epoch }

func (r *Registry) nodeLocked(name string) *node {
	n := r.nodes[name]
	if n == nil {
		n = &node{mappings: map[string]*mappingVersion{}, answers: map[string]Tracker{}}
		r.nodes[name] = n
	}
	return n
}

// SetPrograms stores compile's programs (content only: their version and epoch are
// ignored) and their index (compile.Result.Index), which says which entries, links and
// return paths of each program are a mapping's. A program given again by identity (the same
// pointer as last time) is taken as unchanged with its index: compile's results are never
// mutated. A node whose content differs from what it holds gets version previous+1 and, when
// its agent is connected and the startup hold is over, the new program is pushed. A node that
// had a program and is absent from programs gets an empty one (its agent clears its rules).
// It returns the names of the nodes whose program changed, sorted.
func (r *Registry) SetPrograms(programs map[string]*kuportv1.NodeProgram, index map[string]compile.NodeIndex) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var changed []string
	for name, n := range r.nodes {
		if _, ok := programs[name]; ok {
			continue
		}
		switch {
		case n.program != nil && !isEmpty(n.program):
			n.input = nil
			if r.storeLocked(name, n, &kuportv1.NodeProgram{}, nil) {
				changed = append(changed, name)
			}
		case n.session == nil:
			// A node compile no longer names (its Node object is gone), with nothing to
			// clear and no agent connected, is forgotten: ListNodes stops showing it.
			delete(r.nodes, name)
		}
	}
	for name, p := range programs {
		n := r.nodeLocked(name)
		if p != nil && p == n.input {
			// The very program stored last time (compile.Incremental shares what it did not
			// recompile): unchanged, with its index, and not worth a clone and a comparison.
			continue
		}
		n.input = p
		if p == nil {
			p = &kuportv1.NodeProgram{}
		}
		if r.storeLocked(name, n, p, index[name]) {
			changed = append(changed, name)
		}
	}
	slices.Sort(changed)
	if len(changed) > 0 {
		r.log.Debug("programs changed", "nodes", changed, "epoch", r.epoch)
	}
	return changed
}

// storeLocked stores p's content as n's program if it differs, with its index, and wakes n's
// stream. The stored program shares p's lists (compile never mutates a result, and nothing
// here does), and a mapping whose *compile.MappingIndex is the one stored before keeps its
// digest without one (compile.Incremental shares it only while the mapping's entries are the
// same): a change of one mapping among 10,000 on a node then costs no clone, no comparison
// and no digest of the others.
func (r *Registry) storeLocked(name string, n *node, p *kuportv1.NodeProgram, index compile.NodeIndex) bool {
	next := &kuportv1.NodeProgram{Node: name, Epoch: r.epoch, DnatRules: p.DnatRules, SnatRules: p.SnatRules,
		MarkRules: p.MarkRules, Links: p.Links, ReturnPaths: p.ReturnPaths, ReturnMarking: p.ReturnMarking}
	prev := n.program
	n.index = index
	if prev != nil {
		next.Version = prev.Version
		if sameProgram(next, prev) {
			// Unchanged: the new, equal lists take the place of the old (a new object, never
			// a stored one mutated) in the program, the stream's base and the mappings'
			// index, so a full compile's equal programs are held once, not beside the old.
			n.program = next
			if n.session != nil && n.session.base == prev {
				n.session.base = next
			}
			for m, mi := range index {
				if old := n.mappings[m]; old != nil {
					old.index = mi
				}
			}
			return false
		}
	}
	next.Version++
	n.program = next
	// A mapping's digest covers the links and return paths it uses: kept only while both
	// lists are the very same.
	sharedPaths := prev != nil && sameList(next.Links, prev.Links) && sameList(next.ReturnPaths, prev.ReturnPaths)
	for m := range n.mappings {
		if _, ok := index[m]; !ok {
			delete(n.mappings, m)
			r.touched[m] = true
		}
	}
	for m, mi := range index {
		old := n.mappings[m]
		if sharedPaths && old != nil && old.index == mi {
			continue
		}
		d := digestMapping(next, mi)
		if old != nil && old.digest == d.digest {
			old.index = mi
			continue
		}
		d.version = next.Version
		n.mappings[m] = d
		r.touched[m] = true
	}
	if r.released && n.session != nil {
		wake(n.session)
	}
	return true
}

// sameProgram reports whether two programs have the same content, comparing shared entries
// by identity first.
func sameProgram(a, b *kuportv1.NodeProgram) bool {
	return a.Node == b.Node && a.Version == b.Version && a.Epoch == b.Epoch &&
		equalList(a.DnatRules, b.DnatRules) && equalList(a.SnatRules, b.SnatRules) && equalList(a.MarkRules, b.MarkRules) &&
		equalList(a.Links, b.Links) && equalList(a.ReturnPaths, b.ReturnPaths) && proto.Equal(a.ReturnMarking, b.ReturnMarking)
}

func equalList[T proto.Message](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if any(a[i]) != any(b[i]) && !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// sameList reports whether two lists are the very same (one backing array, one length).
func sameList[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

func isEmpty(p *kuportv1.NodeProgram) bool {
	return len(p.DnatRules)+len(p.SnatRules)+len(p.MarkRules)+len(p.Links)+len(p.ReturnPaths) == 0
}

// digestMapping digests one mapping of a program's index: its entries, links and return
// paths as compile indexed them, so a change to any of them gives the mapping a new version.
func digestMapping(p *kuportv1.NodeProgram, mi *compile.MappingIndex) *mappingVersion {
	mv := &mappingVersion{index: mi}
	h := sha256.New()
	add := func(id string, m proto.Message) {
		// Deterministic marshalling of one message cannot fail for a valid message; a
		// failure still changes the digest, so it is never mistaken for "unchanged".
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			b = []byte(err.Error())
		}
		h.Write(binary.AppendUvarint(nil, uint64(len(b))))
		h.Write(b)
	}
	for _, e := range mi.Entries {
		switch e.Kind {
		case compile.KindDNAT:
			add(e.ID, find(p.DnatRules, e.ID, (*kuportv1.DnatRule).GetId))
		case compile.KindSNAT:
			add(e.ID, find(p.SnatRules, e.ID, (*kuportv1.SnatRule).GetId))
		case compile.KindMark:
			add(e.ID, find(p.MarkRules, e.ID, (*kuportv1.MarkRule).GetId))
		default:
			add(e.ID, nil)
		}
	}
	for _, name := range mi.Links {
		add(name, find(p.Links, name, (*kuportv1.Link).GetName))
	}
	for _, id := range mi.ReturnPaths {
		add(id, find(p.ReturnPaths, id, (*kuportv1.ReturnPath).GetId))
	}
	h.Sum(mv.digest[:0])
	return mv
}

// find returns the element of list whose key is id (nil if none): by binary search, as
// compile sorts every list by it, else by a scan.
func find[T proto.Message](list []T, id string, key func(T) string) proto.Message {
	if i, ok := slices.BinarySearchFunc(list, id, func(x T, id string) int { return strings.Compare(key(x), id) }); ok {
		return list[i]
	}
	for _, x := range list {
		if key(x) == id {
			return x
		}
	}
	return nil
}

// Release ends the startup hold (docs/design/software.md#leadership: after a restart an agent
// that reconnects first must not be handed a program missing its peer's link, which would
// make it tear a live link down). unheard are the nodes the caller expects whose agents'
// state the programs it just stored were compiled without (programmed.Unheard): the hold
// lasts while Term(unheard, now).Holding(). It returns true when released, else how long
// until the hold times out.
func (r *Registry) Release(unheard []string, now time.Time) (bool, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return true, 0
	}
	if r.termLocked(unheard, now).Holding() {
		r.log.Info("holding programs until every node said hello", "missing", unheard, "until", r.holdUntil)
		return false, r.holdUntil.Sub(now)
	}
	r.released = true
	r.log.Info("releasing programs", "missing", unheard)
	for _, n := range r.nodes {
		if n.session != nil {
			wake(n.session)
		}
	}
	return true, 0
}

// Close ends the Registry's service: the agent streams it holds end (Done), so the agents
// reconnect to whatever registry the server leads with next. Idempotent.
func (r *Registry) Close() { r.closeOnce.Do(func() { close(r.done) }) }

// Done is closed once Close was called.
func (r *Registry) Done() <-chan struct{} { return r.done }

// Term returns this term's startup hold as of now, with unheard as the nodes the last
// compile had no state from (programmed.Unheard).
func (r *Registry) Term(unheard []string, now time.Time) programmed.Term {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.termLocked(unheard, now)
}

func (r *Registry) termLocked(unheard []string, now time.Time) programmed.Term {
	return programmed.Term{Now: now, HoldUntil: r.holdUntil, Released: r.released, Unheard: unheard}
}

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

// Agents returns what each node's agent last told, for compile's snapshot.
func (r *Registry) Agents() map[string]*compile.AgentState {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]*compile.AgentState{}
	for name, n := range r.nodes {
		if n.everHello {
			out[name] = &compile.AgentState{Connected: n.session != nil, State: n.state}
		}
	}
	return out
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
