package agent

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// An agent process's memory is paced here, in three parts that cmd/kuport-agent takes
// together: SetSteadyPace at start, PacedApply around its Datapath, and FreeOSMemory as its
// Config.Applied. A GOGC in the environment wins over the first two.

// steadyGCPercent is the agent's GOGC between applies. The agent's heap is mostly what lives
// as long as its program (the program and its compiled table, with the gRPC buffers) and its
// garbage comes from periodic reads (every element's counter per report), so the default
// GOGC (100) lets the heap grow to twice the program between collections. 25 leaves a
// quarter: the lowest resident memory measured, for about one collection more per report
// (BENCHMARKS.md, "Four elements a mapping and fewer comments"; the heap's parts and the
// collection's CPU in "Figures moved out of code comments").
const steadyGCPercent = 25

// SetSteadyPace sets the process's GOGC to steadyGCPercent, unless the environment sets GOGC.
func SetSteadyPace() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(steadyGCPercent)
	}
}

// PacedApply is d with each Apply collected at the default pace (GOGC 100): an Apply
// allocates several times the program's compiled size (more when it reads the kernel's table
// back; BENCHMARKS.md, "Four elements a mapping and fewer comments"), which at steadyGCPercent would be collected a dozen
// times over, each pass marking the whole heap, while the program is not yet in the kernel.
// After the call the steady pace is back, and FreeOSMemory returns the garbage of a large
// one to the system. Nothing changes when the environment sets GOGC.
func PacedApply(d Datapath) Datapath { return pacedApply{d} }

type pacedApply struct{ Datapath }

func (d pacedApply) Apply(p *kuportv1.NodeProgram) error {
	if os.Getenv("GOGC") == "" {
		defer debug.SetGCPercent(debug.SetGCPercent(100))
	}
	return d.Datapath.Apply(p)
}

// FreeOSMemory returns the garbage of a program's apply to the system (an agent process's
// Config.Applied): a new program's whole compile and write leave garbage several times the
// program's compiled size, and an agent then allocates little until its next report, so the
// heap would stay at its peak for minutes. A forced collection costs CPU (BENCHMARKS.md,
// "The agent's path for one change at 10,000"), so it runs only when at least freeAfterBytes
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
