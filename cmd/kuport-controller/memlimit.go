package main

import (
	"math"
	"os"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/hashicorp/go-hclog"
)

// memoryLimitRatio is the share of the container's memory limit the Go runtime keeps the
// controller's heap under (its soft limit, GOMEMLIMIT): the rest is for goroutine stacks,
// the runtime's own memory and what it has not yet returned to the system.
const memoryLimitRatio = 0.9

// setMemoryLimit sets the Go runtime's soft memory limit from limit (the cgroup's memory
// limit: memlimit.FromCgroup) times memoryLimitRatio, unless the environment sets GOMEMLIMIT
// (the runtime has read it) or AUTOMEMLIMIT=off; AUTOMEMLIMIT=<ratio in (0,1]> replaces the
// ratio. Without a limit (none in the cgroup, or not in one) the runtime's default stays:
// none, GOGC alone paces the collector. It logs what it set and returns it (math.MaxInt64:
// none); a limit it cannot read is logged and leaves the default.
func setMemoryLimit(log hclog.Logger, limit memlimit.Provider) int64 {
	set, err := memlimit.Set(memlimit.WithRatio(memoryLimitRatio), memlimit.WithProvider(limit))
	switch {
	case err != nil:
		log.Warn("memory limit not read: the Go runtime keeps no soft limit", "error", err)
	case set == math.MaxInt64:
		log.Info("no memory limit: the Go runtime keeps no soft limit")
	default:
		log.Info("Go runtime's soft memory limit", "bytes", set, "mib", set>>20)
	}
	return set
}

// gcPercent is the controller's GOGC. Most of its heap lives as long as the cluster's state
// (compile's programs and index, the informer caches, the agents' latest reports, the
// dashboard's history), and the default GOGC (100) lets the heap grow to twice that between
// collections, which the runtime then keeps from the system. At 10,000 mappings with 1,000
// agents (bench/fanout), 25 took about a third off the resident memory for three times the
// collections, most of them while 10,000 PortMaps arrive (BENCHMARKS.md, "controller memory
// at 10,000 mappings and 1,000 agents").
const gcPercent = 25

// setGCPercent sets the process's GOGC to gcPercent, unless the environment sets GOGC, and
// logs it.
func setGCPercent(log hclog.Logger) {
	if v := os.Getenv("GOGC"); v != "" {
		log.Info("GOGC from the environment", "gogc", v)
		return
	}
	debug.SetGCPercent(gcPercent)
	log.Info("GOGC", "gogc", gcPercent)
}
