package agents

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"kuport.wlz.li/kuport/controller/servingcert"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestServerOverUnixSocket drives the real gRPC server through a unix socket with a real
// client, as an agent and grpcurl would.
func TestServerOverUnixSocket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	acked := make(chan struct{}, 8)
	reg := NewRegistry(Config{Epoch: 77, Start: time.Now(), OnChange: func(c Change) {
		if c == Acked {
			acked <- struct{}{}
		}
	}})
	reg.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", false), "worker-b": {}}, edgeIndex(false))
	reg.Release(nil, time.Now())

	srv := NewServer(nil, nil, serverTLS(t))
	srv.Lead(reg)
	conn := serve(t, srv, "unix://"+filepath.Join(t.TempDir(), "run", "controller.sock"))

	// Health: SERVING.
	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, hr.Status)

	// Reflection lists the inspection service.
	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	require.NoError(t, rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	rr, err := rs.Recv()
	require.NoError(t, err)
	var services []string
	for _, s := range rr.GetListServicesResponse().GetService() {
		services = append(services, s.Name)
	}
	assert.Contains(t, services, "kuport.v1.ProgramService")
	assert.Contains(t, services, "kuport.v1.AgentService")
	require.NoError(t, rs.CloseSend())

	// A stream that does not open with Hello is refused.
	bad, err := kuportv1.NewAgentServiceClient(conn).Connect(ctx)
	require.NoError(t, err)
	require.NoError(t, bad.Send(&kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Ack{Ack: &kuportv1.Ack{}}}))
	_, err = bad.Recv()
	assert.Equal(t, codes.InvalidArgument, status.Code(err))

	// Hello -> the current program.
	agent, err := kuportv1.NewAgentServiceClient(conn).Connect(ctx)
	require.NoError(t, err)
	require.NoError(t, agent.Send(&kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Hello{Hello: &kuportv1.Hello{Node: "edge-a", AgentVersion: "v-test"}}}))
	msg, err := agent.Recv()
	require.NoError(t, err)
	prog := msg.GetProgram()
	require.NotNil(t, prog)
	assert.Equal(t, "edge-a", prog.Node)
	assert.Equal(t, uint64(1), prog.Version)
	assert.Equal(t, uint64(77), prog.Epoch)
	assert.Len(t, prog.DnatRules, 1)

	ps := kuportv1.NewProgramServiceClient(conn)
	gp, err := ps.GetProgram(ctx, &kuportv1.GetProgramRequest{Node: "edge-a"})
	require.NoError(t, err)
	assert.Equal(t, uint64(0), gp.AckedVersion)

	// Ack -> GetProgram shows the acked version.
	require.NoError(t, agent.Send(&kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Ack{Ack: &kuportv1.Ack{Epoch: 77, Version: 1}}}))
	select {
	case <-acked:
	case <-ctx.Done():
		t.Fatal("ack never recorded")
	}
	gp, err = ps.GetProgram(ctx, &kuportv1.GetProgramRequest{Node: "edge-a"})
	require.NoError(t, err)
	assert.Equal(t, uint64(1), gp.AckedVersion)
	assert.Equal(t, uint64(1), gp.Program.Version)

	// A program change is pushed on the open stream.
	reg.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", true), "worker-b": {}}, edgeIndex(true))
	msg, err = agent.Recv()
	require.NoError(t, err)
	assert.Equal(t, uint64(2), msg.GetProgram().GetVersion())
	assert.Len(t, msg.GetProgram().GetDnatRules(), 2)

	_, err = ps.GetProgram(ctx, &kuportv1.GetProgramRequest{Node: "nowhere"})
	assert.Equal(t, codes.NotFound, status.Code(err))

	ln, err := ps.ListNodes(ctx, &kuportv1.ListNodesRequest{})
	require.NoError(t, err)
	require.Len(t, ln.Nodes, 2)
	assert.Equal(t, "edge-a", ln.Nodes[0].Node)
	assert.True(t, ln.Nodes[0].Connected)
	assert.Equal(t, "v-test", ln.Nodes[0].AgentVersion)
	assert.Equal(t, uint64(2), ln.Nodes[0].ProgramVersion)
	assert.Equal(t, uint64(1), ln.Nodes[0].AckedVersion)
	assert.Equal(t, "worker-b", ln.Nodes[1].Node)
	assert.False(t, ln.Nodes[1].Connected)

	// Closing the stream marks the node disconnected, keeping what it knew.
	require.NoError(t, agent.CloseSend())
	_, err = agent.Recv()
	require.Error(t, err)
	require.Eventually(t, func() bool { return !connected(reg, "edge-a") }, 20*time.Second, 10*time.Millisecond)
	ln, err = ps.ListNodes(ctx, &kuportv1.ListNodesRequest{})
	require.NoError(t, err)
	assert.False(t, ln.Nodes[0].Connected)
	assert.Equal(t, "v-test", ln.Nodes[0].AgentVersion)
}

func TestListenReplacesStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.sock")
	lis, err := Listen("unix://" + path)
	require.NoError(t, err)
	// A crashed controller leaves the file behind: emulate by keeping it on Close.
	lis.(interface{ SetUnlinkOnClose(bool) }).SetUnlinkOnClose(false)
	require.NoError(t, lis.Close())
	lis, err = Listen("unix://" + path)
	require.NoError(t, err)
	require.NoError(t, lis.Close())
}

// TestFollowerRefusesUntilItLeads: a follower's Server refuses agent streams and inspection
// calls with FAILED_PRECONDITION naming the leader, and reports AgentService NOT_SERVING;
// once it leads it serves like any leader.
func TestFollowerRefusesUntilItLeads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := NewServer(nil, nil, serverTLS(t))
	conn := serve(t, srv, "unix://"+filepath.Join(t.TempDir(), "controller.sock"))
	health := healthpb.NewHealthClient(conn)
	agentHealth := func() healthpb.HealthCheckResponse_ServingStatus {
		hr, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: kuportv1.AgentService_ServiceDesc.ServiceName})
		require.NoError(t, err)
		return hr.Status
	}
	hello := &kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Hello{Hello: &kuportv1.Hello{Node: "edge-a"}}}
	connect := func() (*kuportv1.ConnectResponse, error) {
		stream, err := kuportv1.NewAgentServiceClient(conn).Connect(ctx)
		require.NoError(t, err)
		_ = stream.Send(hello) // may race with the refusal; Recv tells
		return stream.Recv()
	}
	ps := kuportv1.NewProgramServiceClient(conn)

	for _, leader := range []string{"", "replica-1"} {
		if leader != "" {
			srv.SetLeader(leader)
		}
		want := "leader: unknown"
		if leader != "" {
			want = "leader: " + leader
		}
		_, err := connect()
		assert.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
		assert.ErrorContains(t, err, want)
		_, err = ps.GetProgram(ctx, &kuportv1.GetProgramRequest{Node: "edge-a"})
		assert.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
		assert.ErrorContains(t, err, want)
		_, err = ps.ListNodes(ctx, &kuportv1.ListNodesRequest{})
		assert.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	}
	hr, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, hr.Status, "a follower is alive and ready")
	assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, agentHealth())

	reg := NewRegistry(Config{Epoch: 3, Start: time.Now()})
	reg.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", false)}, edgeIndex(false))
	reg.Release(nil, time.Now())
	srv.Lead(reg)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, agentHealth())
	msg, err := connect()
	require.NoError(t, err)
	assert.Equal(t, uint64(3), msg.GetProgram().GetEpoch())
	gp, err := ps.GetProgram(ctx, &kuportv1.GetProgramRequest{Node: "edge-a"})
	require.NoError(t, err)
	assert.Equal(t, uint64(3), gp.GetProgram().GetEpoch())
}

// TestServerAuthenticatesAgents: with a TokenReviewer, a stream needs a token proving the
// node its Hello names, and ProgramService answers loopback TCP clients only.
func TestServerAuthenticatesAgents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg := NewRegistry(Config{Epoch: 5, Start: time.Now()})
	reg.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", false), "worker-b": {}}, edgeIndex(false))
	reg.Release(nil, time.Now())
	srv := NewServer(nil, fakeReviewer(t), serverTLS(t))
	srv.Lead(reg)
	sock := "unix://" + filepath.Join(t.TempDir(), "controller.sock")
	for _, addr := range []string{sock, "127.0.0.1:0"} {
		conn := serve(t, srv, addr)
		if addr == sock {
			connectAs := func(token, node string) (*kuportv1.ConnectResponse, error) {
				sctx := ctx
				if token != "" {
					sctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
				}
				stream, err := kuportv1.NewAgentServiceClient(conn).Connect(sctx)
				require.NoError(t, err)
				_ = stream.Send(&kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Hello{Hello: &kuportv1.Hello{Node: node}}})
				return stream.Recv()
			}
			_, err := connectAs("", "edge-a")
			assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
			_, err = connectAs("garbage", "edge-a")
			assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
			_, err = connectAs("other-sa", "edge-a")
			assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
			_, err = connectAs("edge-a", "worker-b")
			assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
			assert.ErrorContains(t, err, `proves node "edge-a", not "worker-b"`)
			msg, err := connectAs("edge-a", "edge-a")
			require.NoError(t, err)
			assert.Equal(t, "edge-a", msg.GetProgram().GetNode())
			msg, err = connectAs("worker-b-old", "worker-b")
			require.NoError(t, err)
			assert.Equal(t, "worker-b", msg.GetProgram().GetNode())
		}

		// Inspection: refused over the unix socket, served on loopback TCP; health is open.
		ps := kuportv1.NewProgramServiceClient(conn)
		_, listErr := ps.ListNodes(ctx, &kuportv1.ListNodesRequest{})
		_, mapErr := ps.GetMapping(ctx, &kuportv1.GetMappingRequest{Namespace: "games", Name: "remote"})
		if addr == sock {
			assert.Equal(t, codes.PermissionDenied, status.Code(listErr), "%v", listErr)
			assert.Equal(t, codes.PermissionDenied, status.Code(mapErr), "%v", mapErr)
		} else {
			assert.NoError(t, listErr)
			assert.NoError(t, mapErr)
		}
		hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		assert.Equal(t, healthpb.HealthCheckResponse_SERVING, hr.Status)
	}
}

// serve serves srv on addr (a --grpc-listen address; "127.0.0.1:0" picks a port) until the
// test ends, then stops it and requires Serve to return nil; it returns a client of it.
func serve(t *testing.T, srv *Server, addr string) *grpc.ClientConn {
	t.Helper()
	lis, err := Listen(addr)
	require.NoError(t, err)
	if !strings.HasPrefix(addr, "unix://") {
		addr = lis.Addr().String()
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		assert.NoError(t, <-served)
	})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(clientTLS(t)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// testServerName is the name the tests' serving certificate is valid for.
const testServerName = "kuport-controller.test"

// testBundle is the tests' CA and serving certificate, generated once.
var testBundle = sync.OnceValues(func() (*servingcert.Bundle, error) {
	return servingcert.Generate([]string{testServerName}, time.Now())
})

// serverTLS is a Server's TLS configuration serving testBundle's certificate.
func serverTLS(t *testing.T) *tls.Config {
	t.Helper()
	b, err := testBundle()
	require.NoError(t, err)
	c, err := b.Certificate()
	require.NoError(t, err)
	return &tls.Config{Certificates: []tls.Certificate{*c}}
}

// clientTLS are client credentials trusting testBundle's CA, verifying testServerName, as an
// agent's.
func clientTLS(t *testing.T) credentials.TransportCredentials {
	t.Helper()
	b, err := testBundle()
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(b.CACert))
	return credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: testServerName})
}

// TestHealthListenerIsPlaintext: ServeHealth answers grpc.health.v1 in plaintext, as the
// kubelet's probe asks, and nothing else; the TLS listener refuses a plaintext client.
func TestHealthListenerIsPlaintext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := NewServer(nil, nil, serverTLS(t))
	healthLis, err := Listen("127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.ServeHealth(healthLis) }()
	t.Cleanup(func() { assert.NoError(t, <-served) }) // after serve's cleanup stopped srv
	tlsConn := serve(t, srv, "127.0.0.1:0")

	plain, err := grpc.NewClient(healthLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer plain.Close()
	hr, err := healthpb.NewHealthClient(plain).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, hr.Status)
	_, err = kuportv1.NewProgramServiceClient(plain).ListNodes(ctx, &kuportv1.ListNodesRequest{})
	assert.Equal(t, codes.Unimplemented, status.Code(err), "%v", err)

	plainToTLS, err := grpc.NewClient(tlsConn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer plainToTLS.Close()
	_, err = healthpb.NewHealthClient(plainToTLS).Check(ctx, &healthpb.HealthCheckRequest{})
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
}

// TestGetMapping: per-node state of one mapping; NOT_FOUND for a mapping no program carries.
func TestGetMapping(t *testing.T) {
	reg := NewRegistry(Config{Epoch: 5, Start: time.Now()})
	reg.SetPrograms(map[string]*kuportv1.NodeProgram{"edge-a": remoteProgram("10.244.17.5", false)}, edgeIndex(false))
	srv := NewServer(nil, nil, serverTLS(t))
	srv.Lead(reg)
	resp, err := srv.GetMapping(context.Background(), &kuportv1.GetMappingRequest{Namespace: "games", Name: "remote"})
	require.NoError(t, err)
	require.Len(t, resp.Nodes, 1)
	assert.Equal(t, "edge-a", resp.Nodes[0].Node)
	assert.Equal(t, "node edge-a: agent not connected", resp.Nodes[0].Message)
	_, err = srv.GetMapping(context.Background(), &kuportv1.GetMappingRequest{Namespace: "games", Name: "none"})
	assert.Equal(t, codes.NotFound, status.Code(err))
	_, err = srv.GetMapping(context.Background(), &kuportv1.GetMappingRequest{Name: "remote"})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
}
