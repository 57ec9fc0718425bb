package main

import (
	"math"

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
