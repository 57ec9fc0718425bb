package controller

import (
	"context"
	"errors"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/programmed"
	"kuport.wlz.li/kuport/controller/timing"
)

// Status writes: PortMaps' by the status workers (programmed.Decide), PortMapClasses' by the
// compile worker (their link claims before the push, or behind it).

// DefaultClassStatusWait is the longest a class status write is put off behind the push of
// the compile it comes from (when its link claims are already recorded, nothing waits for it):
// the write goes out once every connected agent acknowledged, or after this long. A class
// of 1,000 nodes is a large write, which beside the push competes with the acknowledgements
// for the CPU (BENCHMARKS.md, "a class change at 1,000 agents"; the write's own CPU in
// "Figures moved out of code comments").
const DefaultClassStatusWait = time.Second

// Status writes: by default at most DefaultStatusQPS a second (bursts of DefaultStatusBurst),
// by statusWorkers in parallel. client-go's default (5 a second) left 1,000 PortMaps applied
// at once minutes from all reading Programmed=True, and 4 workers at 200 a second still
// seconds after the last create, each write waiting out its round trip to an API server busy
// with the creates (BENCHMARKS.md, "Figures moved out of code comments"). Sized so 1,000 at once leave in about a
// second.
const (
	DefaultStatusQPS   = 500
	DefaultStatusBurst = 1000
	statusWorkers      = 16
)

// processStatus writes the status of one queued PortMap; a failed write (a conflict: the
// cache had not seen a write yet) is retried rate-limited.
func (c *Controller) processStatus(ctx context.Context) bool {
	key, quit := c.statuses.Get()
	if quit {
		return false
	}
	defer c.statuses.Done(key)
	if err := c.writeStatus(ctx, key); err != nil {
		log := c.log.Warn
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) || ctx.Err() != nil {
			log = c.log.Debug
		}
		log("status write failed, retrying", "portmap", key, "error", err)
		c.statuses.AddRateLimited(key)
		return true
	}
	c.statuses.Forget(key)
	return true
}

// writeStatus decides the PortMap's Programmed condition (programmed.Decide over the last
// compile's result and the registry's acks) and writes its status when it changed; a verdict
// that only awaits an acknowledgement waits for it as long as Verdict.MayWait says
// (timing.Decide).
func (c *Controller) writeStatus(ctx context.Context, key types.NamespacedName) error {
	c.mu.Lock()
	last, unheard := c.last, c.unheard
	c.mu.Unlock()
	if last == nil {
		return nil // the first compile queues every PortMap
	}
	res := last.PortMaps[key]
	obj, ok, err := c.pms.GetByKey(key.String())
	if res == nil || err != nil || !ok {
		c.waits.forget(key)
		return nil
	}
	pm := obj.(*v1alpha1.PortMap)
	now := time.Now()
	if c.bursts.putOff(key, now) {
		// keyBurstPutOff queues key again.
		c.queue.AddAfter(keyBurstPutOff, timing.Decide(timing.Input{At: timing.BurstAsked, BurstOn: true}).BurstAfter)
		return nil
	}
	in := programmed.Input{
		Term:       c.reg.Term(unheard, now),
		Compiled:   meta.FindStatusCondition(res.Status.Conditions, v1alpha1.ConditionProgrammed),
		Recorded:   meta.FindStatusCondition(pm.Status.Conditions, v1alpha1.ConditionProgrammed),
		Generation: pm.Generation,
		Nodes:      c.reg.Acks(compile.MappingKey(pm), res.Nodes),
	}
	v := programmed.Decide(in)
	grace := v.MayWait(in)
	d := timing.Decide(timing.Input{At: timing.StatusAsked, Now: now, AckGrace: grace, AckWaitSince: c.waits.start(key, now, grace > 0)})
	if !d.WriteStatus {
		// The acknowledgement queues key again, and its True is written at once.
		c.statuses.AddAfter(key, d.StatusAfter)
		return nil
	}
	written, err := c.writer.PortMap(ctx, pm, res, v, c.reg.UnansweredNodes(key.String()))
	if written && v.Programmed != nil {
		c.log.Debug("status written", "portmap", key, "programmed", v.Programmed.Status, "reason", v.Programmed.Reason)
	}
	return err
}

// claimsRecorded reports whether every class's compiled link claims are those its cached
// object records.
func (c *Controller) claimsRecorded(res *compile.Result) bool {
	for name, st := range res.Classes {
		obj, ok, err := c.classes.GetByKey(name)
		if err != nil || !ok {
			return false
		}
		cls := obj.(*v1alpha1.PortMapClass)
		if c.classSettled.known(name, cls, st, claimsEqual) {
			continue
		}
		if !equality.Semantic.DeepEqual(cls.Status.Links, st.Links) {
			return false
		}
		c.classSettled.set(name, cls, st, claimsEqual)
	}
	return true
}

// writePutOffClassStatuses writes the class statuses of the last compile that were put off
// behind its push when timing.Decide says they are due.
func (c *Controller) writePutOffClassStatuses(ctx context.Context, now time.Time) error {
	in := timing.Input{At: timing.ClassStatusAsked, Now: now, ClassStatusDue: c.classStatusDue}
	if !in.ClassStatusDue.IsZero() {
		in.Unacknowledged = c.reg.Unacknowledged() // counted only when something is put off: it visits every node
	}
	d := timing.Decide(in)
	if d.ClassStatusAfter > 0 {
		// The queue keeps a key's earliest time only: an earlier put-off's may have been it.
		c.queue.AddAfter(keyClassStatus, d.ClassStatusAfter)
	}
	if !d.WriteClassStatuses {
		return nil
	}
	return c.writeClassStatuses(ctx, c.last)
}

// writeClassStatuses writes every PortMapClass status of res that differs from the cached
// object; errors (conflicts included) are joined so the key retries. Nothing stays put off
// after it succeeds.
func (c *Controller) writeClassStatuses(ctx context.Context, res *compile.Result) error {
	c.classSettled.keep(res.Classes)
	var errs []error
	for name, st := range res.Classes {
		obj, ok, err := c.classes.GetByKey(name)
		if err != nil || !ok {
			continue
		}
		cls := obj.(*v1alpha1.PortMapClass)
		if c.classSettled.known(name, cls, st, statusWritten) {
			continue
		}
		written, err := c.writer.Class(ctx, cls, st)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if written {
			c.log.Debug("class status written", "class", name, "put_off", !c.classStatusDue.IsZero())
		}
		c.classSettled.set(name, cls, st, statusWritten)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	c.classStatusDue = time.Time{}
	return nil
}
