package main

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"kuport.wlz.li/kuport/agent"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// probeRun runs `kuport-agent probe args...` and returns its exit status and output.
func probeRun(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(append([]string{"probe"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

// serveOnLoopback serves srv on a free 127.0.0.1 port until the test ends.
func serveOnLoopback(t *testing.T, srv *grpc.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// TestProbe checks the exit status against a real health server on loopback: 0 only on
// SERVING, 1 on NOT_SERVING, an unknown service or nothing listening, 2 on usage errors.
func TestProbe(t *testing.T) {
	hs := health.NewServer()
	hs.SetServingStatus("down", healthpb.HealthCheckResponse_NOT_SERVING)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	addr := serveOnLoopback(t, srv)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nothing := closed.Addr().String()
	require.NoError(t, closed.Close())

	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{name: "serving", args: []string{"--address", addr}, code: 0, stdout: `service "": SERVING` + "\n"},
		{name: "not serving", args: []string{"--address", addr, "--service", "down"}, code: 1, stderr: `service "down": NOT_SERVING`},
		{name: "unknown service", args: []string{"--address", addr, "--service", "other"}, code: 1, stderr: "NotFound"},
		{name: "nothing listening", args: []string{"--address", nothing}, code: 1, stderr: "connection refused"},
		{name: "bad timeout", args: []string{"--timeout", "0s"}, code: 2, stderr: "--timeout must be positive"},
		{name: "extra argument", args: []string{"now"}, code: 2, stderr: "unexpected arguments"},
		{name: "agent flag", args: []string{"--node-name", "edge-a"}, code: 2, stderr: "unknown flag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := probeRun(tc.args...)
			require.Equal(t, tc.code, code, stderr)
			require.Equal(t, tc.stdout, stdout)
			require.Contains(t, stderr, tc.stderr)
		})
	}
}

// TestProbeDefaultAddress: without --address the probe dials --inspect-listen's default.
func TestProbeDefaultAddress(t *testing.T) {
	l, err := net.Listen("tcp", defaultInspectListen)
	if err != nil {
		t.Skipf("%s is in use here", defaultInspectListen)
	}
	require.NoError(t, l.Close())
	code, _, stderr := probeRun("--timeout", "200ms")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "probe 127.0.0.1:7400 ")
}

// TestProbeAgent probes a real agent's inspection server: alive at once, ready once it has
// taken the program its controller sent, not ready again once the controller is gone.
func TestProbeAgent(t *testing.T) {
	ctrl, controller := serveOneShot(t, &kuportv1.NodeProgram{Node: "edge-a", Version: 1, Epoch: 1})
	a, err := agent.New(agent.Config{NodeName: "edge-a", Targets: []string{controller.target}, CAFile: controller.caFile,
		ServerName: controller.serverName, Datapath: stubDatapath{}})
	require.NoError(t, err)
	addr := serveOnLoopback(t, a.InspectionServer())
	ready := []string{"--address", addr, "--service", agent.ReadyService}

	code, _, stderr := probeRun("--address", addr)
	require.Equal(t, 0, code, "liveness before any controller: %s", stderr)
	code, _, stderr = probeRun(ready...)
	require.Equal(t, 1, code, "not ready before a program")
	require.Contains(t, stderr, "NOT_SERVING")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stop := sync.OnceFunc(func() {
		cancel()
		require.NoError(t, <-done)
	})
	defer stop()
	ctrl.NextAck(t)
	code, _, stderr = probeRun(ready...)
	require.Equal(t, 0, code, "ready once the program is acknowledged: %s", stderr)

	stop()
	code, _, _ = probeRun(ready...)
	require.Equal(t, 1, code, "not ready once the stream is gone")
	code, _, _ = probeRun("--address", addr)
	require.Equal(t, 0, code, "still alive")
}

// stubDatapath holds nothing and accepts every program.
type stubDatapath struct{}

func (stubDatapath) Apply(*kuportv1.NodeProgram) error         { return nil }
func (stubDatapath) Counters() ([]*kuportv1.Counter, error)    { return nil, nil }
func (stubDatapath) LinkStats() ([]*kuportv1.LinkStats, error) { return nil, nil }
func (stubDatapath) NodeState(string) (*kuportv1.NodeState, error) {
	return &kuportv1.NodeState{}, nil
}
