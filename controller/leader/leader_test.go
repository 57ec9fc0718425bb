package leader

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func TestEpoch(t *testing.T) {
	for name, tc := range map[string]struct {
		rec  *resourcelock.LeaderElectionRecord
		want uint64
		err  string
	}{
		"first holder":        {rec: &resourcelock.LeaderElectionRecord{HolderIdentity: "a"}, want: 1},
		"fifth holder":        {rec: &resourcelock.LeaderElectionRecord{HolderIdentity: "a", LeaderTransitions: 4}, want: 5},
		"held by another":     {rec: &resourcelock.LeaderElectionRecord{HolderIdentity: "b", LeaderTransitions: 4}, err: `leadership lost: the lease is held by "b"`},
		"released":            {rec: &resourcelock.LeaderElectionRecord{LeaderTransitions: 4}, err: `the lease is held by ""`},
		"negative transition": {rec: &resourcelock.LeaderElectionRecord{HolderIdentity: "a", LeaderTransitions: -1}, err: "negative"},
		"no record":           {err: "no lease record"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Epoch(tc.rec, "a")
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestDefaultIdentityIsUniquePerCall(t *testing.T) {
	a, err := DefaultIdentity()
	require.NoError(t, err)
	b, err := DefaultIdentity()
	require.NoError(t, err)
	assert.NotEqual(t, a, b)
}

// testConfig is a candidate with the shortest durations the Lease can express (whole
// seconds), on client.
func testConfig(client *fake.Clientset, identity string) Config {
	return Config{
		Client: client, Namespace: DefaultNamespace, Name: DefaultName, Identity: identity,
		LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond,
	}
}

// candidate is one Run in the background: epoch receives its term's epoch, ended closes
// when lead returned, done when Run returned (with err).
type candidate struct {
	epoch chan uint64
	ended chan struct{}
	done  chan struct{}
	err   error
	stop  context.CancelFunc
}

func campaign(t *testing.T, cfg Config) *candidate {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	tm := &candidate{epoch: make(chan uint64, 1), ended: make(chan struct{}), done: make(chan struct{}), stop: stop}
	go func() {
		defer close(tm.done)
		tm.err = Run(ctx, cfg, func(ctx context.Context, epoch uint64) error {
			defer close(tm.ended)
			tm.epoch <- epoch
			<-ctx.Done()
			return nil
		})
	}()
	t.Cleanup(func() {
		stop()
		<-tm.done
	})
	return tm
}

func (tm *candidate) waitEpoch(t *testing.T) uint64 {
	t.Helper()
	select {
	case e := <-tm.epoch:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("never led")
		return 0
	}
}

// TestEpochRisesWithEveryTerm: each new holder of the Lease leads with a higher epoch, a
// graceful stop releases the Lease so the next candidate leads at once, and a follower does
// not lead while the Lease is held.
func TestEpochRisesWithEveryTerm(t *testing.T) {
	client := fake.NewClientset()
	a := campaign(t, testConfig(client, "a"))
	require.Equal(t, uint64(1), a.waitEpoch(t))

	leaders := make(chan string, 8)
	bcfg := testConfig(client, "b")
	bcfg.OnNewLeader = func(id string) { leaders <- id }
	b := campaign(t, bcfg)
	select {
	case <-b.epoch:
		t.Fatal("b leads while a holds the lease")
	case <-time.After(3 * time.Second):
	}
	a.stop()
	<-a.done
	require.NoError(t, a.err)
	started := time.Now()
	require.Equal(t, uint64(2), b.waitEpoch(t))
	assert.Less(t, time.Since(started), time.Second, "a released the lease, b must not wait for it to expire")
	lease, err := client.CoordinationV1().Leases(DefaultNamespace).Get(context.Background(), DefaultName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "b", *lease.Spec.HolderIdentity)
	assert.Equal(t, int32(1), *lease.Spec.LeaseTransitions)
	assert.Equal(t, "a", <-leaders, "b names the leader it follows")
	assert.Equal(t, "b", <-leaders)

	b.stop()
	<-b.done
	require.NoError(t, b.err)
	c := campaign(t, testConfig(client, "c"))
	require.Equal(t, uint64(3), c.waitEpoch(t))
}

// TestFollowerTakesOverWhenTheLeaseExpires: while another holder renews the Lease the two
// followers wait; once the renewals stop exactly one of them takes the Lease, no sooner than
// LeaseDuration and sooner than LeaseDuration + RetryPeriod after the last renewal (the bound
// of docs/leader-election.md), with leaseTransitions one higher.
func TestFollowerTakesOverWhenTheLeaseExpires(t *testing.T) {
	client := fake.NewClientset()
	ctx := context.Background()
	leases := client.CoordinationV1().Leases(DefaultNamespace)
	holder, duration, transitions := "dead", int32(2), int32(4)
	renewed := metav1.NewMicroTime(time.Now())
	lease, err := leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: DefaultName},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &duration,
			LeaseTransitions: &transitions, AcquireTime: &renewed, RenewTime: &renewed},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	followers := map[string]*candidate{}
	for _, id := range []string{"b", "c"} {
		cfg := testConfig(client, id)
		cfg.RenewDeadline, cfg.RetryPeriod = time.Second, 500*time.Millisecond
		followers[id] = campaign(t, cfg)
	}
	retry, leaseDuration := 500*time.Millisecond, time.Duration(duration)*time.Second
	// The holder renews every RetryPeriod for longer than LeaseDuration, then dies.
	for range 6 {
		time.Sleep(retry)
		renewed = metav1.NewMicroTime(time.Now())
		lease.Spec.RenewTime = &renewed
		lease, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	died := time.Now()
	for id, f := range followers {
		select {
		case <-f.epoch:
			t.Fatalf("%s took a lease that was being renewed", id)
		default:
		}
	}
	var winner string
	select {
	case e := <-followers["b"].epoch:
		winner = "b"
		require.Equal(t, uint64(transitions)+2, e, "epoch = leaseTransitions+1 after one more transition")
	case e := <-followers["c"].epoch:
		winner = "c"
		require.Equal(t, uint64(transitions)+2, e, "epoch = leaseTransitions+1 after one more transition")
	case <-time.After(10 * time.Second):
		t.Fatal("nobody took the expired lease")
	}
	took := time.Since(died)
	t.Logf("%s led %s after the last renewal (lease %s, retry %s)", winner, took, leaseDuration, retry)
	assert.GreaterOrEqual(t, took, leaseDuration, "the lease was taken before it expired")
	assert.Less(t, took, leaseDuration+retry, "the lease was taken too late")
	loser := map[string]string{"b": "c", "c": "b"}[winner]
	select {
	case <-followers[loser].epoch:
		t.Fatalf("both %s and %s lead", winner, loser)
	case <-time.After(2 * leaseDuration):
	}
	got, err := leases.Get(ctx, DefaultName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, winner, *got.Spec.HolderIdentity)
	assert.Equal(t, transitions+1, *got.Spec.LeaseTransitions)
}

// TestLostLeaseEndsTheTerm: once the leader cannot renew, its leading work stops and Run
// returns ErrLost within RenewDeadline and a check period, before the Lease (LeaseDuration)
// expires for followers.
func TestLostLeaseEndsTheTerm(t *testing.T) {
	client := fake.NewClientset()
	// Reactors must be in place before the client is used: the fake is not safe otherwise.
	var down atomic.Bool
	unreachable := func(k8stesting.Action) (bool, runtime.Object, error) {
		return down.Load(), nil, errors.New("api server unreachable")
	}
	client.PrependReactor("update", "leases", unreachable)
	client.PrependReactor("get", "leases", unreachable)
	cfg := testConfig(client, "a")
	a := campaign(t, cfg)
	require.Equal(t, uint64(1), a.waitEpoch(t))

	down.Store(true)
	cut := time.Now()
	select {
	case <-a.done:
		took := time.Since(cut)
		require.ErrorIs(t, a.err, ErrLost)
		t.Logf("term ended %s after renewals started failing: %v", took, a.err)
		assert.Less(t, took, cfg.LeaseDuration, "the work must stop before the lease expires for followers")
		select {
		case <-a.ended:
		default:
			t.Fatal("Run returned while the leading work still ran")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the term did not end")
	}
}

// TestEpochBehindRaisesTheEpoch: leading work that finds agents at a higher epoch (the Lease
// was deleted) makes Run raise leaseTransitions to it and lead again above it, in the same
// term.
func TestEpochBehindRaisesTheEpoch(t *testing.T) {
	client := fake.NewClientset()
	epochs := make(chan uint64, 4)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, testConfig(client, "a"), func(ctx context.Context, epoch uint64) error {
			epochs <- epoch
			if epoch < 7 {
				return &EpochBehind{Floor: 7}
			}
			<-ctx.Done()
			return nil
		})
	}()
	for _, want := range []uint64{1, 8} {
		select {
		case got := <-epochs:
			assert.Equal(t, want, got)
		case <-time.After(10 * time.Second):
			t.Fatalf("never led with epoch %d", want)
		}
	}
	lease, err := client.CoordinationV1().Leases(DefaultNamespace).Get(context.Background(), DefaultName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, int32(7), *lease.Spec.LeaseTransitions)
	assert.Equal(t, "a", *lease.Spec.HolderIdentity)
	stop()
	require.NoError(t, <-done)

	_, err = raiseEpoch(context.Background(), testConfig(client, "b"), 9)
	require.ErrorIs(t, err, ErrLost, "only the holder raises the epoch")
	_, err = raiseEpoch(context.Background(), testConfig(client, "a"), maxEpoch)
	require.ErrorContains(t, err, "beyond the Lease's leaseTransitions")
}

// TestLeaderRecreatesADeletedLease: a running leader whose Lease is deleted creates it
// again at its next renewal and keeps leading (README, leader election).
func TestLeaderRecreatesADeletedLease(t *testing.T) {
	client := fake.NewClientset()
	a := campaign(t, testConfig(client, "a"))
	require.Equal(t, uint64(1), a.waitEpoch(t))
	leases := client.CoordinationV1().Leases(DefaultNamespace)
	require.NoError(t, leases.Delete(context.Background(), DefaultName, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		l, err := leases.Get(context.Background(), DefaultName, metav1.GetOptions{})
		return err == nil && *l.Spec.HolderIdentity == "a"
	}, 5*time.Second, 50*time.Millisecond, "the leader did not recreate its Lease")
	select {
	case <-a.ended:
		t.Fatal("the term ended")
	case <-time.After(3 * testConfig(client, "a").RenewDeadline):
	}
}

// TestRunRejectsBadDurations: client-go's constraints surface as an error, before any term.
func TestRunRejectsBadDurations(t *testing.T) {
	cfg := testConfig(fake.NewClientset(), "a")
	cfg.RenewDeadline = cfg.LeaseDuration
	err := Run(context.Background(), cfg, func(context.Context, uint64) error {
		t.Fatal("led with an invalid configuration")
		return nil
	})
	require.ErrorContains(t, err, "leader election")
}
