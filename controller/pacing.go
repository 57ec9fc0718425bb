package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// When the controller compiles and writes under a burst of events (issue 13: a thousand
// PortMaps applied at once reached the agent as about 370 program versions, each compiled,
// pushed, applied and acknowledged, and every PortMap's status was written twice: a
// Programmed=False awaiting the acknowledgement, then the True a few milliseconds later).
const (
	// compileWindow: compiles start at least this far apart. A change after a quiet spell
	// compiles at once; the events of a burst wait at most this long and leave together, as
	// one program version.
	compileWindow = 50 * time.Millisecond
)

// compileDelay is how long a compile due at now waits for its window, given when the last
// compile started (zero: none yet).
func compileDelay(last, now time.Time, window time.Duration) time.Duration {
	if last.IsZero() {
		return 0
	}
	return max(last.Add(window).Sub(now), 0)
}

// ackWaits remembers since when each PortMap's verdict may wait (programmed.Verdict.MayWait),
// so its write is put off for that long at most; the acknowledgement's True, written at
// once, normally comes first.
type ackWaits struct {
	mu    sync.Mutex
	since map[types.NamespacedName]time.Time
}

// delay is how long key's write of a verdict that may wait grace is put off at now; 0: write
// it. A verdict that may not wait (grace 0) forgets key's wait.
func (w *ackWaits) delay(key types.NamespacedName, now time.Time, grace time.Duration) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if grace <= 0 {
		delete(w.since, key)
		return 0
	}
	if w.since == nil {
		w.since = map[types.NamespacedName]time.Time{}
	}
	since, ok := w.since[key]
	if !ok {
		since, w.since[key] = now, now
	}
	return max(since.Add(grace).Sub(now), 0)
}

// forget drops key's wait (its PortMap is gone).
func (w *ackWaits) forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.since, key)
}
