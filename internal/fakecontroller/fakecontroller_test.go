package fakecontroller

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// connect serves c in plaintext on an in-memory listener and opens an agent stream to it.
func connect(t *testing.T, c *Controller) kuportv1.AgentService_ConnectClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	t.Cleanup(c.Serve(lis, nil))
	conn, err := grpc.NewClient("passthrough:///fake", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	// A bound on the stream, so a broken controller fails the test instead of hanging it.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	stream, err := kuportv1.NewAgentServiceClient(conn).Connect(ctx)
	require.NoError(t, err)
	return stream
}

func hello() *kuportv1.ConnectRequest {
	return &kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Hello{Hello: &kuportv1.Hello{Node: "edge-a"}}}
}

func ack(version uint64) *kuportv1.ConnectRequest {
	return &kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Ack{Ack: &kuportv1.Ack{Version: version}}}
}

func TestProgramGoesOutAfterHelloAndAcksComeBack(t *testing.T) {
	p := &kuportv1.NodeProgram{Node: "edge-a", Version: 3, Epoch: 1}
	c := New(Options{Program: p, Wait: time.Second})
	stream := connect(t, c)
	require.NoError(t, stream.Send(hello()))
	got, err := stream.Recv()
	require.NoError(t, err)
	require.True(t, proto.Equal(p, got.GetProgram()), "got %v", got)

	require.NoError(t, stream.Send(ack(3)))
	require.NoError(t, stream.Send(ack(4)))
	s := c.NextSession(t)
	require.Equal(t, "edge-a", s.Hello.GetNode())
	require.Equal(t, uint64(3), s.NextAck(t).GetVersion(), "the session keeps every message")
	require.Equal(t, uint64(4), s.NextAck(t).GetVersion())
	require.Equal(t, uint64(3), c.NextAck(t).GetVersion(), "the first Ack of any stream")
	require.Empty(t, c.Acks(), "the Acks that came while the first waited are dropped")
}

func TestSessionSendsAndEnds(t *testing.T) {
	c := New(Options{Wait: time.Second})
	stream := connect(t, c)
	require.NoError(t, stream.Send(hello()))
	s := c.NextSession(t)
	p := &kuportv1.NodeProgram{Node: "edge-a", Version: 1}
	s.Send(t, p)
	got, err := stream.Recv()
	require.NoError(t, err)
	require.True(t, proto.Equal(p, got.GetProgram()), "got %v", got)
	s.End()
	_, err = stream.Recv()
	require.ErrorIs(t, err, io.EOF)
}

func TestRefuse(t *testing.T) {
	c := New(Options{Refuse: status.Error(codes.FailedPrecondition, "not the leader")})
	stream := connect(t, c)
	_, err := stream.Recv()
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	require.Empty(t, c.Sessions())
}
