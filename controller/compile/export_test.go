package compile

// Exported for chained_test.go, which is in package compile_test because it imports packages
// that import compile (the registry, the agent).

// Events are TestIncrementalEqualsFull's random event sequences.
type Events = events

// NewEvents starts the dual-stack sequence drawn from seed (newEvents).
func NewEvents(seed uint64) *Events { return newEvents(seed, true) }

// Next returns the next snapshot, the Changes from the one before and what happened (advance).
func (e *Events) Next() (*Snapshot, *Changes, string) { return e.advance() }
