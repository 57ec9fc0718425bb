package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"k8s.io/apimachinery/pkg/util/wait"

	"kuport.wlz.li/kuport/internal/fakecontroller"
	"kuport.wlz.li/kuport/internal/syncbuf"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// waitFor is a generous bound: it only limits how long a broken test hangs, never how fast
// code must be.
const waitFor = 10 * time.Second

// fakeDatapath is a transactional in-memory Datapath: Apply commits the whole program or,
// when failing, nothing.
type fakeDatapath struct {
	mu       sync.Mutex
	applied  *kuportv1.NodeProgram
	applies  int
	failWith error
	state    *kuportv1.NodeState
	counters []*kuportv1.Counter
	links    []*kuportv1.LinkStats
}

func (f *fakeDatapath) Apply(p *kuportv1.NodeProgram) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applies++
	if f.failWith != nil {
		return f.failWith
	}
	f.applied = proto.CloneOf(p)
	return nil
}

func (f *fakeDatapath) Counters() ([]*kuportv1.Counter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counters, nil
}

func (f *fakeDatapath) LinkStats() ([]*kuportv1.LinkStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.links, nil
}

func (f *fakeDatapath) NodeState(underlay string) (*kuportv1.NodeState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := proto.CloneOf(f.state)
	st.UnderlayInterface = underlay
	return st, nil
}

func (f *fakeDatapath) setState(st *kuportv1.NodeState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state = proto.CloneOf(st)
}

func (f *fakeDatapath) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failWith = err
}

// snapshot returns the committed program and the number of Apply calls.
func (f *fakeDatapath) snapshot() (*kuportv1.NodeProgram, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applied, f.applies
}

func newFakeDatapath() *fakeDatapath {
	return &fakeDatapath{
		state: &kuportv1.NodeState{
			Interfaces: []*kuportv1.Interface{
				{Name: "lo", Addresses: []string{"127.0.0.1"}, Mtu: 65536},
				{Name: "wt0", Addresses: []string{"100.64.93.143"}, Mtu: 1420},
			},
			IpForward: true,
		},
		counters: []*kuportv1.Counter{{Id: "games/gs/dnat/wt0", Packets: 3, Bytes: 180}},
		links:    []*kuportv1.LinkStats{{Name: "kup-1a2b3c4d", TxPackets: 2, RxPackets: 5}},
	}
}

// startController serves a fake controller with the controller's certificate
// (startControllerWith).
func startController(t testing.TB) (*fakecontroller.Controller, string) {
	t.Helper()
	return startControllerWith(t, controllerCert)
}

// startControllerWith serves a fake controller over TLS with cert on a unix socket in a
// temporary directory and returns it with the agent's target for it.
func startControllerWith(t testing.TB, cert tls.Certificate) (*fakecontroller.Controller, string) {
	t.Helper()
	c := fakecontroller.New(fakecontroller.Options{Wait: waitFor})
	return c, c.Start(t, filepath.Join(t.TempDir(), "controller.sock"), fakecontroller.TLS(cert))
}

// testConfig is a Config with timers that stay out of the way unless a test shortens them.
func testConfig(dp Datapath, logs *syncbuf.Buffer, targets ...string) Config {
	return Config{
		NodeName:          "edge-a",
		AgentVersion:      "v0.0.0-test",
		Underlay:          "wt0",
		Targets:           targets,
		CAFile:            controllerCAFile,
		ServerName:        testServerName,
		Datapath:          dp,
		Log:               hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Trace}),
		ReportInterval:    time.Hour,
		StatePollInterval: time.Hour,
		ResyncInterval:    time.Hour,
		Backoff:           wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Steps: 100, Cap: 100 * time.Millisecond},
	}
}

// startAgent runs an Agent made from cfg until stop is called or the test ends; stop
// cancels Run and checks that it returns nil.
func startAgent(t testing.TB, cfg Config) (a *Agent, stop func()) {
	t.Helper()
	a, err := New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(waitFor):
			t.Error("Run did not return after cancel")
		}
	})
	t.Cleanup(stop)
	return a, stop
}

func program(version, epoch uint64, port uint32) *kuportv1.NodeProgram {
	return &kuportv1.NodeProgram{
		Node:    "edge-a",
		Version: version,
		Epoch:   epoch,
		DnatRules: []*kuportv1.DnatRule{{
			Id: "games/gs/dnat/wt0", Mapping: "games/gs", InInterface: "wt0",
			Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: &kuportv1.PortRange{First: port, Last: port},
			ToAddress: "10.244.17.5", ToPort: port,
		}},
	}
}

func requireProtoEqual(t *testing.T, want, got proto.Message) {
	t.Helper()
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Fatalf("mismatch (-want +got):\n%s", diff)
	}
}

func TestHelloCarriesNodeState(t *testing.T) {
	c, target := startController(t)
	dp := newFakeDatapath()
	startAgent(t, testConfig(dp, &syncbuf.Buffer{}, target))

	s := c.NextSession(t)
	requireProtoEqual(t, &kuportv1.Hello{
		Node:         "edge-a",
		AgentVersion: "v0.0.0-test",
		AcceptsDelta: true,
		State: &kuportv1.NodeState{
			Interfaces: []*kuportv1.Interface{
				{Name: "lo", Addresses: []string{"127.0.0.1"}, Mtu: 65536},
				{Name: "wt0", Addresses: []string{"100.64.93.143"}, Mtu: 1420},
			},
			UnderlayInterface: "wt0",
			IpForward:         true,
		},
	}, s.Hello)
}

func TestProgramAppliedAndAcked(t *testing.T) {
	c, target := startController(t)
	dp := newFakeDatapath()
	logs := &syncbuf.Buffer{}
	startAgent(t, testConfig(dp, logs, target))

	s := c.NextSession(t)
	p := program(1, 1, 27015)
	s.Send(t, p)
	requireProtoEqual(t, &kuportv1.Ack{Version: 1, Epoch: 1}, s.NextAck(t))
	applied, applies := dp.snapshot()
	requireProtoEqual(t, p, applied)
	require.Equal(t, 1, applies)
	require.Contains(t, logs.String(), "program applied")
	require.Contains(t, logs.String(), "dnat_rules=1")
}

// TestProgramDeltaApplied: a delta applies to the program the stream carried last, giving
// the next program whole to the datapath; a delta from another version ends the stream and
// the agent reconnects.
func TestProgramDeltaApplied(t *testing.T) {
	c, target := startController(t)
	dp := newFakeDatapath()
	startAgent(t, testConfig(dp, &syncbuf.Buffer{}, target))

	s := c.NextSession(t)
	p1 := program(1, 1, 27015)
	s.Send(t, p1)
	requireProtoEqual(t, &kuportv1.Ack{Version: 1, Epoch: 1}, s.NextAck(t))
	p2 := program(2, 1, 27016)
	s.SendMessage(t, &kuportv1.ConnectResponse{Message: &kuportv1.ConnectResponse_Delta{Delta: kuportv1.Delta(p1, p2)}})
	requireProtoEqual(t, &kuportv1.Ack{Version: 2, Epoch: 1}, s.NextAck(t))
	applied, _ := dp.snapshot()
	requireProtoEqual(t, p2, applied)

	s.SendMessage(t, &kuportv1.ConnectResponse{Message: &kuportv1.ConnectResponse_Delta{Delta: kuportv1.Delta(p1, program(3, 1, 27017))}})
	again := c.NextSession(t)
	require.Equal(t, uint64(2), again.Hello.AppliedVersion, "reconnected holding version 2")
}

func TestFailedApplyAcksErrorsAndResyncRetries(t *testing.T) {
	errEntry := errors.New("link kup-1a2b3c4d: file exists")
	for _, tc := range []struct {
		name        string
		entryErrors func(error) []*kuportv1.EntryError
		want        []*kuportv1.EntryError
	}{
		{
			name: "datapath entry errors",
			entryErrors: func(err error) []*kuportv1.EntryError {
				return []*kuportv1.EntryError{{Id: "games/gs/dnat/wt0", Message: err.Error()}}
			},
			want: []*kuportv1.EntryError{{Id: "games/gs/dnat/wt0", Message: errEntry.Error()}},
		},
		{
			name: "whole program error",
			want: []*kuportv1.EntryError{{Message: errEntry.Error()}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, target := startController(t)
			dp := newFakeDatapath()
			dp.setFail(errEntry)
			cfg := testConfig(dp, &syncbuf.Buffer{}, target)
			cfg.EntryErrors = tc.entryErrors
			cfg.ResyncInterval = 20 * time.Millisecond
			startAgent(t, cfg)

			s := c.NextSession(t)
			p := program(1, 1, 27015)
			s.Send(t, p)
			requireProtoEqual(t, &kuportv1.Ack{Version: 1, Epoch: 1, Errors: tc.want}, s.NextAck(t))
			applied, _ := dp.snapshot()
			require.Nil(t, applied)

			dp.setFail(nil)
			// Resync ticks ack each retry; the first clean Ack marks the repair.
			deadline := time.Now().Add(waitFor)
			for len(s.NextAck(t).GetErrors()) > 0 {
				require.True(t, time.Now().Before(deadline), "no clean Ack after the failure cleared")
			}
			applied, _ = dp.snapshot()
			requireProtoEqual(t, p, applied)
		})
	}
}

// TestResyncReappliesCleanProgram: every resync tick applies the current program again,
// so kernel state someone removed is repaired; a clean re-apply sends no Ack.
func TestResyncReappliesCleanProgram(t *testing.T) {
	c, target := startController(t)
	dp := newFakeDatapath()
	cfg := testConfig(dp, &syncbuf.Buffer{}, target)
	cfg.ResyncInterval = 20 * time.Millisecond
	var received atomic.Int32
	cfg.Applied = func() { received.Add(1) }
	startAgent(t, cfg)

	s := c.NextSession(t)
	p := program(1, 1, 27015)
	s.Send(t, p)
	requireProtoEqual(t, &kuportv1.Ack{Version: 1, Epoch: 1}, s.NextAck(t))
	_, first := dp.snapshot()
	deadline := time.Now().Add(waitFor)
	for {
		applied, applies := dp.snapshot()
		if applies >= first+2 {
			requireProtoEqual(t, p, applied)
			break
		}
		require.True(t, time.Now().Before(deadline), "no resync")
		time.Sleep(5 * time.Millisecond)
	}
	for len(s.Messages()) > 0 {
		require.Nil(t, (<-s.Messages()).GetAck(), "a clean resync is not acknowledged")
	}
	require.Eventually(t, func() bool { return received.Load() == 1 }, waitFor, 5*time.Millisecond, "Config.Applied runs for the program received")
	time.Sleep(3 * cfg.ResyncInterval)
	require.Equal(t, int32(1), received.Load(), "Config.Applied does not run for a resync")
}

func TestReconnectKeepsProgramAndDoesNotReapply(t *testing.T) {
	c, target := startController(t)
	dp := newFakeDatapath()
	startAgent(t, testConfig(dp, &syncbuf.Buffer{}, target))

	s := c.NextSession(t)
	p := program(7, 3, 27015)
	s.Send(t, p)
	s.NextAck(t)
	s.End()

	s = c.NextSession(t)
	require.Equal(t, uint64(7), s.Hello.GetAppliedVersion())
	require.Equal(t, uint64(3), s.Hello.GetAppliedEpoch())
	applied, applies := dp.snapshot()
	requireProtoEqual(t, p, applied)

	s.Send(t, proto.CloneOf(p))
	requireProtoEqual(t, &kuportv1.Ack{Version: 7, Epoch: 3}, s.NextAck(t))
	_, after := dp.snapshot()
	require.Equal(t, applies, after, "the same content must not be applied again")

	// A new leader's epoch with unchanged content is acknowledged without an Apply too, and
	// becomes the applied version.
	s.Send(t, program(1, 4, 27015))
	requireProtoEqual(t, &kuportv1.Ack{Version: 1, Epoch: 4}, s.NextAck(t))
	_, after = dp.snapshot()
	require.Equal(t, applies, after)
	s.End()
	s = c.NextSession(t)
	require.Equal(t, uint64(1), s.Hello.GetAppliedVersion())
	require.Equal(t, uint64(4), s.Hello.GetAppliedEpoch())
}

func TestHelloAfterFailedApplyClaimsNothing(t *testing.T) {
	c, target := startController(t)
	dp := newFakeDatapath()
	dp.setFail(errors.New("nftables: transaction refused"))
	startAgent(t, testConfig(dp, &syncbuf.Buffer{}, target))

	s := c.NextSession(t)
	s.Send(t, program(5, 2, 27015))
	require.NotEmpty(t, s.NextAck(t).GetErrors())
	s.End()

	// The kernel does not hold version 5 whole: Hello must not present it as applied, or
	// the controller would count it as acknowledged. Its epoch still fences.
	s = c.NextSession(t)
	require.Zero(t, s.Hello.GetAppliedVersion())
	require.Equal(t, uint64(2), s.Hello.GetAppliedEpoch())
}

func TestLowerEpochProgramRefused(t *testing.T) {
	c, target := startController(t)
	dp := newFakeDatapath()
	logs := &syncbuf.Buffer{}
	startAgent(t, testConfig(dp, logs, target))

	s := c.NextSession(t)
	s.Send(t, program(3, 2, 27015))
	s.NextAck(t)

	s.Send(t, program(9, 1, 27016))
	// The stale program is not applied; its Ack says it was fenced.
	fenced := s.NextAck(t)
	require.Equal(t, uint64(9), fenced.GetVersion())
	require.Len(t, fenced.GetErrors(), 1)
	require.Contains(t, fenced.GetErrors()[0].GetMessage(), "refused by fencing")
	current := program(4, 2, 27017)
	s.Send(t, current)
	requireProtoEqual(t, &kuportv1.Ack{Version: 4, Epoch: 2}, s.NextAck(t))
	applied, applies := dp.snapshot()
	requireProtoEqual(t, current, applied)
	require.Equal(t, 2, applies)
	require.Contains(t, logs.String(), "refusing a program from a lower epoch")
}

// An agent restarted on a node keeps refusing the epochs below what an agent there applied
// before (Config.EpochFile), and raises the stored epoch as it applies newer ones.
func TestEpochFloorSurvivesRestart(t *testing.T) {
	epochFile := filepath.Join(t.TempDir(), "kuport", "epoch")
	first := func() {
		c, target := startController(t)
		cfg := testConfig(newFakeDatapath(), &syncbuf.Buffer{}, target)
		cfg.EpochFile = epochFile
		_, stop := startAgent(t, cfg)
		s := c.NextSession(t)
		s.Send(t, program(3, 2, 27015))
		requireProtoEqual(t, &kuportv1.Ack{Version: 3, Epoch: 2}, s.NextAck(t))
		stop()
	}
	first()
	stored, err := os.ReadFile(epochFile)
	require.NoError(t, err)
	require.Equal(t, "2\n", string(stored))

	c, target := startController(t)
	dp := newFakeDatapath()
	cfg := testConfig(dp, &syncbuf.Buffer{}, target)
	cfg.EpochFile = epochFile
	startAgent(t, cfg)
	s := c.NextSession(t)
	s.Send(t, program(9, 1, 27016))
	fenced := s.NextAck(t)
	require.Len(t, fenced.GetErrors(), 1)
	require.Contains(t, fenced.GetErrors()[0].GetMessage(), "refused by fencing: program epoch 1 is lower than the applied epoch 2")
	_, applies := dp.snapshot()
	require.Zero(t, applies, "the restarted agent applied a deposed leader's program")

	s.Send(t, program(1, 3, 27017))
	requireProtoEqual(t, &kuportv1.Ack{Version: 1, Epoch: 3}, s.NextAck(t))
	stored, err = os.ReadFile(epochFile)
	require.NoError(t, err)
	require.Equal(t, "3\n", string(stored))

	require.NoError(t, os.WriteFile(epochFile, []byte("junk"), 0o644))
	_, err = New(cfg)
	require.ErrorContains(t, err, "epoch file")
}

func TestEqualEpochLowerVersion(t *testing.T) {
	c, target := startController(t)
	dp := newFakeDatapath()
	startAgent(t, testConfig(dp, &syncbuf.Buffer{}, target))

	s := c.NextSession(t)
	s.Send(t, program(5, 1, 27015))
	s.NextAck(t)

	changed := program(4, 1, 27016)
	s.Send(t, changed)
	requireProtoEqual(t, &kuportv1.Ack{Version: 4, Epoch: 1}, s.NextAck(t))
	applied, applies := dp.snapshot()
	requireProtoEqual(t, changed, applied)
	require.Equal(t, 2, applies, "differing content is applied again")

	s.Send(t, program(3, 1, 27016))
	requireProtoEqual(t, &kuportv1.Ack{Version: 3, Epoch: 1}, s.NextAck(t))
	_, after := dp.snapshot()
	require.Equal(t, applies, after, "equal content is only acknowledged")
}

func TestProgramForAnotherNodeRefused(t *testing.T) {
	c, target := startController(t)
	dp := newFakeDatapath()
	startAgent(t, testConfig(dp, &syncbuf.Buffer{}, target))

	s := c.NextSession(t)
	p := program(1, 1, 27015)
	p.Node = "worker-b"
	s.Send(t, p)
	ack := s.NextAck(t)
	require.Len(t, ack.GetErrors(), 1)
	require.Contains(t, ack.GetErrors()[0].GetMessage(), "worker-b")
	_, applies := dp.snapshot()
	require.Zero(t, applies)
}

func TestReportOnStateChange(t *testing.T) {
	c, target := startController(t)
	dp := newFakeDatapath()
	cfg := testConfig(dp, &syncbuf.Buffer{}, target)
	cfg.StatePollInterval = 20 * time.Millisecond
	startAgent(t, cfg)

	s := c.NextSession(t)
	changed := &kuportv1.NodeState{
		Interfaces: []*kuportv1.Interface{
			{Name: "lo", Addresses: []string{"127.0.0.1"}, Mtu: 65536},
			{Name: "wt0", Addresses: []string{"100.64.93.143"}, Mtu: 1420},
			{Name: "enp1s0", Addresses: []string{"203.0.113.9"}, Mtu: 1500},
		},
		IpForward: true,
	}
	dp.setState(changed)
	report := s.NextReport(t)
	changed.UnderlayInterface = "wt0"
	requireProtoEqual(t, changed, report.GetState())
	requireProtoEqual(t, &kuportv1.Report{
		State:    changed,
		Counters: []*kuportv1.Counter{{Id: "games/gs/dnat/wt0", Packets: 3, Bytes: 180}},
		Links:    []*kuportv1.LinkStats{{Name: "kup-1a2b3c4d", TxPackets: 2, RxPackets: 5}},
	}, report)
}

func TestPeriodicReport(t *testing.T) {
	c, target := startController(t)
	dp := newFakeDatapath()
	cfg := testConfig(dp, &syncbuf.Buffer{}, target)
	cfg.ReportInterval = 20 * time.Millisecond
	startAgent(t, cfg)

	s := c.NextSession(t)
	for range 2 {
		report := s.NextReport(t)
		require.Equal(t, "wt0", report.GetState().GetUnderlayInterface())
		require.Len(t, report.GetCounters(), 1)
		require.Len(t, report.GetLinks(), 1)
	}
}

func TestRotatesThroughTargets(t *testing.T) {
	c, target := startController(t)
	missing := "unix://" + filepath.Join(t.TempDir(), "absent.sock")
	dp := newFakeDatapath()
	logs := &syncbuf.Buffer{}
	startAgent(t, testConfig(dp, logs, missing, target))

	s := c.NextSession(t)
	require.Equal(t, "edge-a", s.Hello.GetNode())
	require.Contains(t, logs.String(), "absent.sock")
}

func TestNewRequiresNodeTargetsCAAndDatapath(t *testing.T) {
	dp := newFakeDatapath()
	for name, cfg := range map[string]Config{
		"node":        {Targets: []string{"unix:///x"}, CAFile: "ca.crt", ServerName: "c", Datapath: dp},
		"target":      {NodeName: "edge-a", CAFile: "ca.crt", Datapath: dp},
		"CA file":     {NodeName: "edge-a", Targets: []string{"c:7443"}, Datapath: dp},
		"server name": {NodeName: "edge-a", Targets: []string{"c:7443", "unix:///x"}, CAFile: "ca.crt", Datapath: dp},
		"datapath":    {NodeName: "edge-a", Targets: []string{"unix:///x"}, CAFile: "ca.crt", ServerName: "c"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(cfg)
			require.ErrorContains(t, err, name)
		})
	}
}

// TestFollowerRefusalMovesOnWithoutBackoff: a follower's refusal sends the agent to its next
// target after FollowerRetry, however long the reconnect backoff has grown.
func TestFollowerRefusalMovesOnWithoutBackoff(t *testing.T) {
	// A follower refuses every stream as a replica that is not the leader does.
	follower := fakecontroller.New(fakecontroller.Options{
		Refuse: status.Error(codes.FailedPrecondition, "this controller replica is not the leader (leader: replica-1)")})
	followerTarget := follower.Start(t, filepath.Join(t.TempDir(), "follower.sock"), fakecontroller.TLS(controllerCert))

	c, target := startController(t)
	dp := newFakeDatapath()
	logs := &syncbuf.Buffer{}
	cfg := testConfig(dp, logs, followerTarget, target)
	cfg.Backoff = wait.Backoff{Duration: time.Hour, Factor: 2, Steps: 100, Cap: time.Hour}
	cfg.FollowerRetry = 10 * time.Millisecond
	startAgent(t, cfg)

	s := c.NextSession(t)
	require.Equal(t, "edge-a", s.Hello.GetNode())
	require.Contains(t, logs.String(), "leader: replica-1")
}

// blockingDatapath is a fakeDatapath whose first Apply waits until release is closed.
type blockingDatapath struct {
	*fakeDatapath
	started chan struct{} // closed when the first Apply begins
	release chan struct{}
	once    sync.Once
}

func (b *blockingDatapath) Apply(p *kuportv1.NodeProgram) error {
	first := false
	b.once.Do(func() { first = true; close(b.started) })
	if first {
		<-b.release
	}
	return b.fakeDatapath.Apply(p)
}

// TestBurstAppliedAsNewest: versions that arrive while the agent applies another are not
// applied one by one: the newest replaces those waiting, is applied once and acknowledged.
func TestBurstAppliedAsNewest(t *testing.T) {
	c, target := startController(t)
	dp := &blockingDatapath{fakeDatapath: newFakeDatapath(), started: make(chan struct{}), release: make(chan struct{})}
	logs := &syncbuf.Buffer{}
	startAgent(t, testConfig(dp, logs, target))

	s := c.NextSession(t)
	s.Send(t, program(1, 1, 27015))
	select {
	case <-dp.started:
	case <-time.After(waitFor):
		t.Fatal("version 1 not applied")
	}
	for v := uint64(2); v <= 4; v++ {
		s.Send(t, program(v, 1, 27015+uint32(v)))
	}
	// 2 and 3 were each replaced while version 1's Apply waits.
	require.Eventually(t, func() bool {
		return strings.Count(logs.String(), "program superseded before it was applied") == 2
	}, waitFor, time.Millisecond)
	close(dp.release)
	requireProtoEqual(t, &kuportv1.Ack{Version: 1, Epoch: 1}, s.NextAck(t))
	requireProtoEqual(t, &kuportv1.Ack{Version: 4, Epoch: 1}, s.NextAck(t))
	applied, applies := dp.snapshot()
	requireProtoEqual(t, program(4, 1, 27019), applied)
	require.Equal(t, 2, applies, "version 1, then 4 alone")
}

// reportingDatapath is a fakeDatapath whose Counters waits until release is closed; the
// first call closes reading.
type reportingDatapath struct {
	*fakeDatapath
	reading chan struct{}
	release chan struct{}
	once    sync.Once
}

func (c *reportingDatapath) Counters() ([]*kuportv1.Counter, error) {
	c.once.Do(func() { close(c.reading) })
	<-c.release
	return c.fakeDatapath.Counters()
}

// TestProgramNotHeldByReport: a program arriving while a report reads the counters (about
// 100 ms at 10,000 mappings) is applied and acknowledged without waiting for it; the report
// is sent when the read ends.
func TestProgramNotHeldByReport(t *testing.T) {
	c, target := startController(t)
	dp := &reportingDatapath{fakeDatapath: newFakeDatapath(), reading: make(chan struct{}), release: make(chan struct{})}
	cfg := testConfig(dp, &syncbuf.Buffer{}, target)
	cfg.ReportInterval = 10 * time.Millisecond
	startAgent(t, cfg)

	s := c.NextSession(t)
	select {
	case <-dp.reading:
	case <-time.After(waitFor):
		t.Fatal("no report read")
	}
	s.Send(t, program(1, 1, 27015))
	requireProtoEqual(t, &kuportv1.Ack{Version: 1, Epoch: 1}, s.NextAck(t))
	applied, _ := dp.snapshot()
	requireProtoEqual(t, program(1, 1, 27015), applied)
	close(dp.release)
	require.NotNil(t, s.NextReport(t).GetState())
}
