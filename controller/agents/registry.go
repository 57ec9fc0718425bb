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
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"kuport.wlz.li/kuport/controller/compile"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

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

// Close ends the Registry's service: the agent streams it holds end (Done), so the agents
// reconnect to whatever registry the server leads with next. Idempotent.
func (r *Registry) Close() { r.closeOnce.Do(func() { close(r.done) }) }

// Done is closed once Close was called.
func (r *Registry) Done() <-chan struct{} { return r.done }
