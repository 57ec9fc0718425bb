package agent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"kuport.wlz.li/kuport/internal/syncbuf"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestTokenFileReadOnEveryConnect: the token file's content goes out as a bearer token, and
// a rotated token is sent on the next stream.
func TestTokenFileReadOnEveryConnect(t *testing.T) {
	c, target := startController(t)
	token := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(token, []byte("token-1\n"), 0o600))
	cfg := testConfig(newFakeDatapath(), &syncbuf.Buffer{}, target)
	cfg.TokenFile = token
	startAgent(t, cfg)

	s := c.NextSession(t)
	assert.Equal(t, []string{"Bearer token-1"}, s.MD.Get("authorization"))
	require.NoError(t, os.WriteFile(token, []byte("token-2"), 0o600))
	s.End()
	s = c.NextSession(t)
	assert.Equal(t, []string{"Bearer token-2"}, s.MD.Get("authorization"))
}

// dialInspection serves a's inspection server on a unix socket and returns a client
// connection to it; both close when the test ends.
func dialInspection(t *testing.T, a *Agent) *grpc.ClientConn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "inspect.sock")
	lis, err := net.Listen("unix", sock)
	require.NoError(t, err)
	srv := a.InspectionServer()
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestInspectionServesAppliedProgram drives the agent's inspection server with a real client:
// health, NOT_FOUND before the first program, then the applied program with its time.
func TestInspectionServesAppliedProgram(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, target := startController(t)
	a, _ := startAgent(t, testConfig(newFakeDatapath(), &syncbuf.Buffer{}, target))

	conn := dialInspection(t, a)

	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, hr.Status)
	client := kuportv1.NewAgentInspectionServiceClient(conn)
	_, err = client.GetAppliedProgram(ctx, &kuportv1.GetAppliedProgramRequest{})
	assert.Equal(t, codes.NotFound, status.Code(err), "%v", err)

	before := time.Now()
	s := c.NextSession(t)
	p := program(3, 7, 27015)
	s.Send(t, p)
	s.NextAck(t)
	got, err := client.GetAppliedProgram(ctx, &kuportv1.GetAppliedProgramRequest{})
	require.NoError(t, err)
	requireProtoEqual(t, p, got.Program)
	assert.Empty(t, got.Errors)
	assert.False(t, got.ApplyTime.AsTime().Before(before), "apply_time %v is before the program was sent", got.ApplyTime.AsTime())
}

// TestReadiness follows ReadyService through an agent's life: NOT_SERVING while connected
// without a program or with only a refused one, SERVING once a program is taken, NOT_SERVING
// once the stream ends, SERVING again on a reconnect that claims the applied program
// without getting one. The overall service stays SERVING throughout.
func TestReadiness(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, target := startController(t)
	cfg := testConfig(newFakeDatapath(), &syncbuf.Buffer{}, target)
	// Hold the reconnect, so the state between two streams can be seen.
	cfg.Backoff.Duration, cfg.Backoff.Cap = 500*time.Millisecond, 500*time.Millisecond
	a, _ := startAgent(t, cfg)

	conn := dialInspection(t, a)
	hc := healthpb.NewHealthClient(conn)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		require.NoError(t, err)
		return r.Status
	}
	eventually := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(waitFor)
		for check(ReadyService) != want && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		require.Equal(t, want, check(ReadyService))
	}
	const serving, notServing = healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
	assert.Equal(t, "kuport.v1.AgentService", ReadyService)

	s := c.NextSession(t)
	assert.Equal(t, notServing, check(ReadyService), "connected, no program yet")
	other := program(1, 1, 27015)
	other.Node = "worker-b"
	s.Send(t, other)
	require.NotEmpty(t, s.NextAck(t).GetErrors())
	assert.Equal(t, notServing, check(ReadyService), "another node's program is refused")
	s.Send(t, program(2, 1, 27015))
	require.Empty(t, s.NextAck(t).GetErrors())
	assert.Equal(t, serving, check(ReadyService))
	assert.Equal(t, serving, check(""))

	s.End()
	eventually(notServing)
	assert.Equal(t, serving, check(""), "alive while reconnecting")
	s = c.NextSession(t)
	require.Equal(t, uint64(2), s.Hello.GetAppliedVersion())
	eventually(serving)
}
