// Package leader runs the controller's leading work under leader election on a
// coordination.k8s.io Lease (client-go's resourcelock.LeaseLock and its election record)
// and derives the fencing epoch that stamps every program of a leadership term.
//
// # Taking the Lease
//
// A follower watches the Lease and takes it over LeaseDuration after the last renewal it
// saw (see awaitLease); only then does it start client-go's LeaderElector, which finds the
// Lease already its own and from there renews it every RetryPeriod, gives up after
// RenewDeadline and releases it on a graceful stop. client-go's own followers poll with
// jitter and can take up to LeaseDuration + 4.4×RetryPeriod after a leader dies; kuport's
// take at most LeaseDuration + RetryPeriod (the renewal interval) plus a watch event's and
// one update's latency.
//
// # Epoch
//
// A candidate increments the Lease's spec.leaseTransitions every time it takes the Lease
// over from another holder (or from none), never when a holder renews, as client-go does.
// Right after acquiring, the new leader reads the Lease back and, provided it still names
// this candidate, uses leaseTransitions+1 as its epoch (+1 keeps it above zero, which agents
// read as "nothing applied"). Two terms therefore never share an epoch and a later term's
// epoch is higher, as long as every process campaigns under an identity of its own (a
// restarted process that reused its predecessor's identity would renew its predecessor's
// term instead of starting one) and the Lease object is not deleted. Deleting it (or
// restoring an old copy) restarts the count below the epoch agents applied, so they refuse
// the new leader's programs; the leading work then returns *EpochBehind and Run raises
// leaseTransitions past the agents' epoch and leads again (a term may so span several
// epochs, each higher than the last).
//
// # Losing the lease
//
// The leading work stops, and Run returns an error wrapping ErrLost, as soon as either
// client-go gives up renewing (after RenewDeadline) or no renewal has succeeded for
// RenewDeadline. The second check is this package's own: client-go releases the Lease
// before it cancels the leading context, so it alone would let a release that hangs on an
// unreachable API server outlast the Lease. The caller exits non-zero; a supervisor restarts
// it as a follower: the standard client-go pattern of exiting when leadership ends.
package leader

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// Defaults for the flags of kuport-controller.
const (
	DefaultNamespace     = "kuport-system"
	DefaultName          = "kuport-controller"
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// ErrLost is returned by Run when the leadership term ended while the context was still
// live: the lease was lost (or its renewal could not be confirmed in time).
var ErrLost = errors.New("leadership lost")

// EpochBehind is what the leading work returns (or ends its context with, as the cause)
// when agents refuse its programs because they applied a higher epoch, Floor: the Lease was
// deleted or restored from an old backup, so leaseTransitions counts from below what the
// agents saw. Run then raises the Lease's leaseTransitions to Floor and runs the leading
// work again with epoch Floor+1.
type EpochBehind struct{ Floor uint64 }

func (e *EpochBehind) Error() string {
	return fmt.Sprintf("agents applied epoch %d, above this term's", e.Floor)
}

// maxEpoch is the highest epoch the Lease can carry: leaseTransitions is an int32.
const maxEpoch = math.MaxInt32

// Config configures Run. Durations follow client-go's leaderelection: followers take the
// Lease over LeaseDuration after the last renewal they saw; the leader renews every
// RetryPeriod and gives up after failing to renew for RenewDeadline (< LeaseDuration);
// failed API calls are retried every RetryPeriod.
type Config struct {
	// Client reads, watches and writes the Lease (get, list, watch, create, update on leases).
	Client kubernetes.Interface
	// Namespace and Name locate the Lease.
	Namespace, Name string
	// Identity names this candidate in the Lease; it must be unique per process (see
	// DefaultIdentity and the package documentation).
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod: see Config.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// OnNewLeader is called with the holder's identity whenever a new holder is observed,
	// this candidate included. May be nil.
	OnNewLeader func(identity string)
	// Log receives election events; nil discards them.
	Log hclog.Logger
}

// DefaultIdentity is "<hostname>_<pid>_<random>": the random part keeps it unique across
// restarts of a container, whose hostname and pid (often 1) repeat.
func DefaultIdentity() (string, error) {
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("hostname: %w", err)
	}
	return host + "_" + strconv.Itoa(os.Getpid()) + "_" + rand.String(6), nil
}

// Epoch derives the fencing epoch of identity's term from the Lease's election record read
// while identity holds it: leaseTransitions+1 (see the package documentation). It errors
// when the record names another holder (the term already ended) or carries a negative count.
func Epoch(rec *resourcelock.LeaderElectionRecord, identity string) (uint64, error) {
	switch {
	case rec == nil:
		return 0, errors.New("no lease record")
	case rec.HolderIdentity != identity:
		return 0, fmt.Errorf("%w: the lease is held by %q", ErrLost, rec.HolderIdentity)
	case rec.LeaderTransitions < 0:
		return 0, fmt.Errorf("lease carries negative leaseTransitions %d", rec.LeaderTransitions)
	}
	return uint64(rec.LeaderTransitions) + 1, nil
}

// Run campaigns for the Lease until ctx ends. While it leads it runs lead with the term's
// epoch and a context that ends when the term does. It returns:
//   - nil (or lead's error) after ctx ended: the leading work has returned and the Lease was
//     released, so a follower takes over at its next retry instead of waiting for expiry;
//   - an error wrapping ErrLost when the term ended while ctx was live, without waiting for
//     anything else: the caller must exit (never campaign again in the same process);
//   - lead's error when lead returned on its own, or an error when the configuration is
//     invalid or the epoch cannot be read.
func Run(ctx context.Context, cfg Config, lead func(ctx context.Context, epoch uint64) error) error {
	log := cfg.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
		Client:     cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
	}
	// The election outlives ctx: it is cancelled (releasing the Lease) only once the leading
	// work has returned, as ReleaseOnCancel requires.
	electCtx, cancelElect := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelElect()
	var (
		mu      sync.Mutex
		leading bool
	)
	termEnd := make(chan error, 1)
	var reported string // the last holder reported, by the watch or the elector
	report := func(identity string) {
		mu.Lock()
		fresh := identity != reported
		reported = identity
		mu.Unlock()
		if !fresh {
			return
		}
		log.Info("leader observed", "leader", identity, "self", identity == cfg.Identity)
		if cfg.OnNewLeader != nil {
			cfg.OnNewLeader(identity)
		}
	}
	var le *leaderelection.LeaderElector
	var err error
	le, err = leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            cfg.Name,
		LeaseDuration:   cfg.LeaseDuration,
		RenewDeadline:   cfg.RenewDeadline,
		RetryPeriod:     cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				defer cancelElect()
				mu.Lock()
				live := ctx.Err() == nil
				leading = live
				mu.Unlock()
				if !live {
					termEnd <- nil
					return
				}
				termEnd <- term(ctx, lctx, cfg, le, log, lead)
			},
			// Required by client-go; the end of a term is handled where lead returns.
			OnStoppedLeading: func() {},
			OnNewLeader:      report,
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	electDone := make(chan struct{})
	go func() {
		defer close(electDone)
		// The elector starts once this candidate holds the Lease: it only renews it.
		if err := awaitLease(electCtx, cfg, report, log); err != nil {
			if electCtx.Err() == nil {
				termEnd <- fmt.Errorf("leader election: %w", err)
			}
			return
		}
		le.Run(electCtx)
	}()
	log.Info("campaigning", "lease", cfg.Namespace+"/"+cfg.Name, "identity", cfg.Identity)

	select {
	case err := <-termEnd:
		if ctx.Err() == nil {
			// Lost: return at once, so the caller exits before anyone could doubt it.
			return err
		}
		<-electDone
		return err
	case <-ctx.Done():
		mu.Lock()
		wasLeading := leading
		if !wasLeading {
			cancelElect()
		}
		mu.Unlock()
		var err error
		if wasLeading {
			err = <-termEnd
		}
		<-electDone
		return err
	}
}

// term runs one leadership term: reads the epoch, runs lead until ctx or the term ends, and
// tells why it ended.
func term(ctx, lctx context.Context, cfg Config, le *leaderelection.LeaderElector,
	log hclog.Logger, lead func(context.Context, uint64) error) error {
	// Read through the client, not the elector's lock: a LeaseLock is not safe for
	// concurrent use.
	lease, err := cfg.Client.CoordinationV1().Leases(cfg.Namespace).Get(lctx, cfg.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the lease after acquiring it: %w", err)
	}
	rec := resourcelock.LeaseSpecToLeaderElectionRecord(&lease.Spec)
	epoch, err := Epoch(rec, cfg.Identity)
	if err != nil {
		return err
	}
	log.Info("leading", "epoch", epoch, "lease_transitions", rec.LeaderTransitions)

	wctx, cancel := context.WithCancelCause(lctx)
	defer cancel(nil)
	defer context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })()
	go watchRenewals(wctx, cancel, le, cfg)
	for {
		err = lead(wctx, epoch)
		var behind *EpochBehind
		switch {
		case ctx.Err() != nil:
			return err
		case wctx.Err() != nil:
			cause := context.Cause(wctx)
			if errors.Is(cause, ErrLost) {
				return errors.Join(cause, err)
			}
			return errors.Join(fmt.Errorf("%w: the lease could not be renewed within %s", ErrLost, cfg.RenewDeadline), err)
		case errors.As(err, &behind):
			raised, rerr := raiseEpoch(wctx, cfg, behind.Floor)
			if rerr != nil {
				return errors.Join(err, rerr)
			}
			log.Warn("agents applied a higher epoch than this term's (the Lease was deleted or restored from an old copy): raised leaseTransitions; leading again",
				"agent_epoch", behind.Floor, "old_epoch", epoch, "epoch", raised)
			epoch = raised
			continue
		case err != nil:
			return err
		}
		return errors.New("leading work returned while leading")
	}
}

// raiseEpoch raises the Lease's leaseTransitions to floor while cfg.Identity holds it (a
// compare-and-swap, retried on conflict) and returns the epoch it now gives,
// leaseTransitions+1. It errors when floor is beyond what the Lease can carry (maxEpoch),
// when another candidate holds the Lease (wrapping ErrLost), or on an API error.
func raiseEpoch(ctx context.Context, cfg Config, floor uint64) (uint64, error) {
	if floor >= maxEpoch {
		return 0, fmt.Errorf("agents applied epoch %d, beyond the Lease's leaseTransitions (int32)", floor)
	}
	leases := cfg.Client.CoordinationV1().Leases(cfg.Namespace)
	var epoch uint64
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lease, err := leases.Get(ctx, cfg.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		rec := resourcelock.LeaseSpecToLeaderElectionRecord(&lease.Spec)
		if _, err := Epoch(rec, cfg.Identity); err != nil {
			return err
		}
		if uint64(rec.LeaderTransitions) < floor {
			lease.Spec.LeaseTransitions = ptr.To(int32(floor))
			if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
				return err
			}
			rec.LeaderTransitions = int(floor)
		}
		epoch, err = Epoch(rec, cfg.Identity)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("raise the lease's leaseTransitions to %d: %w", floor, err)
	}
	return epoch, nil
}

// watchRenewals ends the term (cancel with ErrLost) once this candidate no longer holds the
// Lease in the elector's view or has not renewed it for RenewDeadline. It checks four times
// per RetryPeriod, so the work stops well before the Lease expires for the followers
// (LeaseDuration after the last renewal).
func watchRenewals(ctx context.Context, cancel context.CancelCauseFunc, le *leaderelection.LeaderElector, cfg Config) {
	tick := time.NewTicker(cfg.RetryPeriod / 4)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !le.IsLeader() {
			cancel(fmt.Errorf("%w: the lease is now held by %q", ErrLost, le.GetLeader()))
			return
		}
		// Check fails once the last renewal is older than LeaseDuration plus its argument.
		if err := le.Check(cfg.RenewDeadline - cfg.LeaseDuration); err != nil {
			cancel(fmt.Errorf("%w: not renewed for %s: %w", ErrLost, cfg.RenewDeadline, err))
			return
		}
	}
}
