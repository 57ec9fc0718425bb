package leader

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	coordinationv1 "k8s.io/api/coordination/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// sighting is the Lease as this candidate last saw its spec change, and when (this
// process's clock: a follower never compares its clock with the holder's).
type sighting struct {
	// lease is nil when the Lease does not exist.
	lease *coordinationv1.Lease
	at    time.Time
}

// takeableIn is how long identity must still wait before it may take the Lease: zero when
// it is absent, released (no holder) or already identity's, else what is left of the
// holder's leaseDurationSeconds counted from the sighting.
func (s sighting) takeableIn(now time.Time, identity string) time.Duration {
	if s.lease == nil {
		return 0
	}
	rec := resourcelock.LeaseSpecToLeaderElectionRecord(&s.lease.Spec)
	if rec.HolderIdentity == "" || rec.HolderIdentity == identity {
		return 0
	}
	return max(0, s.at.Add(time.Duration(rec.LeaseDurationSeconds)*time.Second).Sub(now))
}

// describe says whose the sighted Lease was, for logs: "absent", "released" or the holder.
func (s sighting) describe() string {
	switch {
	case s.lease == nil:
		return "absent"
	case s.lease.Spec.HolderIdentity == nil || *s.lease.Spec.HolderIdentity == "":
		return "released"
	}
	return *s.lease.Spec.HolderIdentity
}

// sameSpec reports whether two sightings of the Lease agree on its spec, renewTime to the
// microsecond. (client-go's own comparison, of the election record, drops renewTime below
// the second, which hides a renewal within the second of the one before.)
func sameSpec(a, b *coordinationv1.Lease) bool {
	if a == nil || b == nil {
		return a == b
	}
	return apiequality.Semantic.DeepEqual(a.Spec, b.Spec)
}

// leaseWatch keeps the latest sighting of one Lease from a watch on it (a client-go
// informer narrowed to the Lease's name).
type leaseWatch struct {
	mu      sync.Mutex
	last    sighting      // the zero sighting (no Lease) until the watch shows one
	changed chan struct{} // signalled (without blocking) on every new sighting
	report  func(holder string)
}

func (w *leaseWatch) see(lease *coordinationv1.Lease) {
	w.mu.Lock()
	if sameSpec(lease, w.last.lease) {
		w.mu.Unlock()
		return // metadata only, the informer's resync, or still absent: not a renewal
	}
	w.last = sighting{lease: lease, at: time.Now()}
	w.mu.Unlock()
	if lease != nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "" {
		w.report(*lease.Spec.HolderIdentity)
	}
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

func (w *leaseWatch) sighting() sighting {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// awaitLease blocks until this candidate holds the Lease, or ctx ends (returning its
// error). This is the follower half of the election, done here rather than by client-go's
// LeaderElector, whose followers poll every RetryPeriod with a jitter factor of 1.2 and
// restart their LeaseDuration clock at each poll that finds a change: after a leader dies
// they take over up to LeaseDuration + 2×2.2×RetryPeriod after its last renewal. Here a
// watch on the Lease sees every renewal as it happens and the takeover is attempted the
// moment LeaseDuration has passed since the last one seen, so it lands within
// LeaseDuration (plus the watch's and one update's latency) of the last renewal, which is
// at most RetryPeriod before the leader died.
//
// The takeover writes client-go's election record (resourcelock's Lease encoding):
// holderIdentity this candidate, leaseTransitions one higher (unchanged when the record
// already names it), and acquire and renew time now. The update is a compare-and-swap on
// the resourceVersion read just before, so of candidates racing for the same expired
// Lease exactly one wins, and a holder that renewed meanwhile keeps it. An absent Lease is
// created. It returns ctx's error once ctx ends, or an error if the watch cannot be set
// up; failed API calls are logged and retried after RetryPeriod. While the watch is down no
// renewal is seen, so the takeover is attempted, and refused because the Lease read back
// differs from the last sighting.
func awaitLease(ctx context.Context, cfg Config, report func(string), log hclog.Logger) error {
	w := &leaseWatch{changed: make(chan struct{}, 1), report: report}
	factory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0,
		informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.Name).String()
		}))
	informer := factory.Coordination().V1().Leases().Informer()
	lease := func(obj any) *coordinationv1.Lease {
		if l, ok := obj.(*coordinationv1.Lease); ok && l.Name == cfg.Name {
			return l.DeepCopy()
		}
		return nil
	}
	reg, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.see(lease(obj)) },
		UpdateFunc: func(_, obj any) { w.see(lease(obj)) },
		DeleteFunc: func(any) { w.see(nil) },
	})
	if err != nil {
		return fmt.Errorf("watch lease: %w", err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer func() {
		stop()
		factory.Shutdown()
	}()
	factory.Start(wctx.Done())
	// The registration has synced once the handler has seen the Lease (or its absence).
	if !cache.WaitForCacheSync(wctx.Done(), reg.HasSynced) {
		return ctx.Err()
	}
	for {
		s := w.sighting()
		wait := s.takeableIn(time.Now(), cfg.Identity)
		if wait == 0 {
			took, err := take(ctx, cfg, s.lease)
			switch {
			case took:
				log.Info("took the lease", "from", s.describe(), "last_change_seen", s.at.Format(time.RFC3339Nano))
				return nil
			case err != nil:
				log.Warn("taking the lease failed; retrying", "error", err, "retry_in", cfg.RetryPeriod)
				wait = cfg.RetryPeriod
			default:
				// The Lease changed since the sighting: wait for the watch to show how.
				wait = cfg.RetryPeriod
			}
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-w.changed:
			timer.Stop()
		case <-timer.C:
		}
	}
}

// take makes cfg.Identity the Lease's holder provided the Lease is still as sighted (nil:
// absent). It reports whether it did; it returns no error when the Lease had changed or
// another candidate won the race, and the API error otherwise.
func take(ctx context.Context, cfg Config, sighted *coordinationv1.Lease) (bool, error) {
	now := metav1.NewTime(time.Now())
	next := resourcelock.LeaderElectionRecord{
		HolderIdentity:       cfg.Identity,
		LeaseDurationSeconds: int(cfg.LeaseDuration / time.Second),
		AcquireTime:          now,
		RenewTime:            now,
	}
	leases := cfg.Client.CoordinationV1().Leases(cfg.Namespace)
	lease, err := leases.Get(ctx, cfg.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if sighted != nil {
			return false, nil
		}
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
			Spec:       resourcelock.LeaderElectionRecordToLeaseSpec(&next),
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return false, nil
		}
		return err == nil, err
	case err != nil:
		return false, err
	case !sameSpec(lease, sighted):
		return false, nil
	}
	rec := resourcelock.LeaseSpecToLeaderElectionRecord(&lease.Spec)
	if rec.HolderIdentity == cfg.Identity {
		next.AcquireTime, next.LeaderTransitions = rec.AcquireTime, rec.LeaderTransitions
	} else {
		next.LeaderTransitions = rec.LeaderTransitions + 1
	}
	// The update carries the resourceVersion just read: the API server refuses it with a
	// conflict if anyone wrote the Lease since.
	lease.Spec = resourcelock.LeaderElectionRecordToLeaseSpec(&next)
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return false, nil
	}
	return err == nil, err
}
