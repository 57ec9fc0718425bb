package controller

import (
	"context"
	"maps"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"kuport.wlz.li/kuport/controller/metrics"
	"kuport.wlz.li/kuport/controller/programmed"
	"kuport.wlz.li/kuport/controller/timing"
)

// The compile worker: one work queue, whose keys say what to do again, and the compile that
// stores the programs and queues the statuses whose result changed.

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	var err error
	switch key {
	case keyCompile:
		now := time.Now()
		if d := timing.Decide(timing.Input{At: timing.CompileAsked, Now: now, LastCompile: c.compiled}); !d.Compile {
			// A burst: this compile takes what the window gathers.
			c.queue.AddAfter(keyCompile, d.CompileAfter)
			break
		}
		c.compiled = now
		err = c.compile(ctx)
	case keyStatus:
		c.decideAgain(c.reg.Touched())
		err = c.writePutOffClassStatuses(ctx, time.Now())
	case keyStatusAll:
		c.decideAll()
	case keyClassStatus:
		err = c.writePutOffClassStatuses(ctx, time.Now())
	case keyBurstPutOff:
		keys, over := c.bursts.release(time.Now())
		if d := timing.Decide(timing.Input{At: timing.BurstAsked, BurstOn: !over}); d.BurstAfter > 0 {
			c.queue.AddAfter(keyBurstPutOff, d.BurstAfter)
		}
		if len(keys) > 0 {
			c.log.Debug("writing the statuses put off behind a burst", "portmaps", len(keys), "burst_over", over)
		}
		for _, k := range keys {
			c.statuses.Add(k)
		}
	}
	if err != nil {
		// A conflict only means the cache had not yet seen our own last write: routine.
		log := c.log.Warn
		if isOnlyConflicts(err) {
			log = c.log.Debug
		}
		log("sync failed, retrying", "key", key, "error", err)
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// isOnlyConflicts reports whether err, possibly joined, holds nothing but API conflicts.
func isOnlyConflicts(err error) bool {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if !isOnlyConflicts(e) {
				return false
			}
		}
		return true
	}
	return apierrors.IsConflict(err)
}

// compile runs compile.Incremental on a fresh snapshot, records the class statuses (the link
// slot and table claims), hands the programs to the registry, ends the startup hold when it
// may, and queues the PortMaps whose status may have changed: those whose compiled result
// differs from the last compile's and those the registry touched (every one when the hold
// ends).
func (c *Controller) compile(ctx context.Context) error {
	snap, changed, err := c.nextSnapshot()
	if err != nil {
		return err
	}
	start := time.Now()
	res := c.inc.CompileChanges(snap, changed)
	metrics.ObserveCompile(time.Since(start))
	metrics.SetRefusals(res.PortMaps)
	// Claims are persisted before any kernel may use them, so a restart or a failed write
	// can never renumber a live link: no program leaves until its claims are recorded. When
	// the class statuses carry no claim the classes do not record already, the programs
	// leave first and the statuses follow their acknowledgement (DefaultClassStatusWait: a
	// class status of 1,000 node rows took the API server most of a second to write). While
	// the startup hold keeps programs back, nothing is written either:
	// compile has not heard every node, so its statuses would say "no agent has connected"
	// of nodes whose kernels still hold the previous leader's programs.
	unheard := programmed.Unheard(snap)
	in := timing.Input{At: timing.Compiled, Startup: c.reg.Term(unheard, snap.Now)}
	wasHolding := c.holding
	c.holding = in.Startup.Holding()
	compiled := time.Now()
	if !c.holding {
		// Compared only when it counts: the startup hold writes nothing.
		in.ClaimsRecorded = c.claimsRecorded(res)
	}
	writeFirst := timing.Decide(in).WriteClassStatuses
	if writeFirst {
		if err := c.writeClassStatuses(ctx, res); err != nil {
			// The retry lists and compiles whole: this compile's changes are not lost.
			c.snap = nil
			return err
		}
	}
	stored := time.Now()
	nodes := c.reg.SetPrograms(res.Programs, res.Index)
	if len(nodes) > 0 {
		c.log.Debug("compiled", "whole", c.inc.Changed() == nil, "recompiled", c.inc.Recompiled(), "programs_changed", len(nodes),
			"claims_first", writeFirst, "compile_ms", compiled.Sub(start).Milliseconds(),
			"store_ms", time.Since(stored).Milliseconds(), "from_compile_ms", time.Since(compiled).Milliseconds())
	}
	in.At, in.Now, in.FirstCompile, in.WasHolding = timing.Stored, time.Now(), c.last == nil, wasHolding
	in.ProgramsChanged, in.ClassStatusDue, in.ClassStatusWait = len(nodes) > 0, c.classStatusDue, c.classStatusWait
	d := timing.Decide(in)
	// The push goes first: the acknowledgements (keyStatus) or the due time write the put-off
	// statuses, the latest compile's then.
	c.classStatusDue = d.ClassStatusDue
	if d.ClassStatusAfter > 0 {
		c.queue.AddAfter(keyClassStatus, d.ClassStatusAfter)
	}
	if d.WriteClassStatuses {
		if err := c.writeClassStatuses(ctx, res); err != nil {
			c.snap = nil
			return err
		}
	}
	c.pushes.Observe(c.reg.Nodes(), time.Now())
	c.reg.Release(unheard, snap.Now)
	// After an incremental compile only the PortMaps it names may have changed: the status
	// decisions cost O(the change) too.
	dirty := c.inc.Changed()
	c.mu.Lock()
	prev := c.last
	c.last, c.unheard = res, unheard
	c.mu.Unlock()
	c.queue.AddAfter(keyCompile, d.CompileAfter)
	if d.StatusAllAfter > 0 {
		c.queue.AddAfter(keyStatusAll, d.StatusAllAfter)
	}
	switch d.Statuses {
	case timing.StatusesAll:
		c.decideAll()
	case timing.StatusesChanged:
		if dirty == nil {
			dirty = slices.Collect(maps.Keys(res.PortMaps))
		}
		for _, k := range dirty {
			// Incremental shares the results it did not recompute: identity first.
			if r, old := res.PortMaps[k], prev.PortMaps[k]; r != nil && old != r && (old == nil || !equality.Semantic.DeepEqual(old, r)) {
				c.statuses.Add(k)
			}
		}
		c.decideAgain(c.reg.Touched())
	}
	return nil
}

// decideAgain queues the PortMaps of the mappings named (MappingKeys) for their status.
func (c *Controller) decideAgain(mappings []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		return
	}
	for _, m := range mappings {
		if k, ok := c.last.Keys[m]; ok {
			c.statuses.Add(k)
		}
	}
}

// decideAll queues every PortMap of the last compile for its status.
func (c *Controller) decideAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		return
	}
	for k := range c.last.PortMaps {
		c.statuses.Add(k)
	}
}
