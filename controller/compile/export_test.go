package compile

// Exported for chained_test.go, which is in package compile_test because it imports packages
// that import compile (the registry, the agent).

// Events are TestIncrementalEqualsFull's random event sequences.
type Events = events

// NewEvents starts the IPv4-only sequence drawn from seed (newEvents): the chain applies its
// programs to the datapath's IPv4 table.
func NewEvents(seed uint64) *Events { return newEvents(seed, false) }

// Next returns the next snapshot, the Changes from the one before and what happened (advance).
func (e *Events) Next() (*Snapshot, *Changes, string) { return e.advance() }
