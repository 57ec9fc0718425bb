package agent

import (
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
)

// FreeOSMemory returns the garbage of a program's apply to the system (cmd/kuport-agent's
// Config.Applied): a new program's whole compile and write leave garbage several times the
// program's compiled size (47 MB at 10,000 mappings), and an agent then allocates little
// until its next report, so the heap would stay at its peak for minutes. A forced collection
// costs about 20 ms of CPU at 10,000 mappings, so it runs only when at least freeAfterBytes
// were allocated since the last one (a change of a few mappings allocates well under 1 MB,
// which the steady pace collects), and a call while one runs is dropped: on two cores the
// collections of changes applied back to back doubled their time to Ack
// (BenchmarkPrivilegedAgentChange).
func FreeOSMemory() {
	if !freeing.CompareAndSwap(false, true) {
		return
	}
	defer freeing.Store(false)
	sample := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(sample)
	if allocs := sample[0].Value.Uint64(); allocs-freedAt.Load() >= freeAfterBytes {
		debug.FreeOSMemory()
		freedAt.Store(allocs)
	}
}

// freeAfterBytes is the allocation since the last FreeOSMemory above which it collects.
const freeAfterBytes = 16 << 20

var (
	// freeing is set while a FreeOSMemory runs.
	freeing atomic.Bool
	// freedAt is the heap's cumulative allocation (runtime/metrics) at the last collection
	// FreeOSMemory forced.
	freedAt atomic.Uint64
)
