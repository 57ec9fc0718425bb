package agents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Server serves kuport.v1.AgentService and kuport.v1.ProgramService over a Registry, plus
// grpc.health.v1 (SERVING while it runs) and server reflection (for grpcurl).
type Server struct {
	kuportv1.UnimplementedAgentServiceServer
	kuportv1.UnimplementedProgramServiceServer

	reg      *Registry
	log      hclog.Logger
	grpc     *grpc.Server
	health   *health.Server
	stopping chan struct{}
	stopOnce sync.Once
}

// NewServer returns a Server over reg; nothing listens until Serve.
func NewServer(reg *Registry, log hclog.Logger) *Server {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	s := &Server{
		reg:      reg,
		log:      log,
		health:   health.NewServer(),
		stopping: make(chan struct{}),
		grpc: grpc.NewServer(
			// Probe idle streams so a vanished agent is seen as disconnected within about 40 s.
			grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		),
	}
	kuportv1.RegisterAgentServiceServer(s.grpc, s)
	kuportv1.RegisterProgramServiceServer(s.grpc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	return s
}

// Serve accepts connections on lis until Stop; it returns nil after Stop.
func (s *Server) Serve(lis net.Listener) error {
	if err := s.grpc.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve %s: %w", lis.Addr(), err)
	}
	return nil
}

// Stop reports NOT_SERVING, ends every agent stream with UNAVAILABLE (agents reconnect to
// another replica or retry), waits for in-flight calls and closes the listeners.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.health.Shutdown()
		close(s.stopping)
		s.grpc.GracefulStop()
	})
}

// helloTimeout bounds how long a new stream may stay silent before its Hello.
const helloTimeout = 10 * time.Second

// Connect implements kuport.v1.AgentService/Connect: the first message must be a Hello
// naming the node (else INVALID_ARGUMENT, or DEADLINE_EXCEEDED after helloTimeout without
// one); the stream then receives the node's current
// program and every new version, and carries the agent's Acks and Reports. A newer stream
// of the same node ends this one with ABORTED.
func (s *Server) Connect(stream grpc.BidiStreamingServer[kuportv1.ConnectRequest, kuportv1.ConnectResponse]) error {
	type received struct {
		msg *kuportv1.ConnectRequest
		err error
	}
	firstc := make(chan received, 1)
	go func() {
		msg, err := stream.Recv()
		firstc <- received{msg, err}
	}()
	var first received
	select {
	case first = <-firstc:
	case <-time.After(helloTimeout):
		// Returning ends the stream, which unblocks the Recv above.
		return status.Errorf(codes.DeadlineExceeded, "no Hello within %s", helloTimeout)
	}
	if first.err != nil {
		return first.err
	}
	hello := first.msg.GetHello()
	if hello == nil || hello.Node == "" {
		return status.Error(codes.InvalidArgument, "first message must be a Hello with the node name")
	}
	sess := s.reg.connect(hello)
	defer s.reg.disconnect(sess)

	recvErr := make(chan error, 1)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			switch m := msg.Message.(type) {
			case *kuportv1.ConnectRequest_Ack:
				s.reg.ack(sess, m.Ack)
			case *kuportv1.ConnectRequest_Report:
				s.reg.report(sess, m.Report)
			case *kuportv1.ConnectRequest_Hello:
				s.log.Warn("ignoring a second hello", "node", sess.node)
			}
		}
	}()

	for {
		select {
		case <-sess.wake:
			if p := s.reg.next(sess); p != nil {
				if err := stream.Send(&kuportv1.ConnectResponse{Message: &kuportv1.ConnectResponse_Program{Program: p}}); err != nil {
					return fmt.Errorf("send program to %s: %w", sess.node, err)
				}
				s.log.Debug("program sent", "node", sess.node, "version", p.Version)
			}
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-sess.replaced:
			return status.Error(codes.Aborted, "replaced by a newer stream of the same node")
		case <-s.stopping:
			return status.Error(codes.Unavailable, "controller stopping")
		}
	}
}

// GetProgram implements kuport.v1.ProgramService/GetProgram; NOT_FOUND for a node neither
// compile nor an agent has named. A node known only from its agent gets an empty program.
func (s *Server) GetProgram(_ context.Context, req *kuportv1.GetProgramRequest) (*kuportv1.GetProgramResponse, error) {
	p, acked, ok := s.reg.Program(req.Node)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "node %q is unknown", req.Node)
	}
	if p == nil {
		p = &kuportv1.NodeProgram{Node: req.Node, Epoch: s.reg.Epoch()}
	}
	return &kuportv1.GetProgramResponse{Program: p, AckedVersion: acked}, nil
}

// ListNodes implements kuport.v1.ProgramService/ListNodes: every known node, sorted by name.
func (s *Server) ListNodes(context.Context, *kuportv1.ListNodesRequest) (*kuportv1.ListNodesResponse, error) {
	return &kuportv1.ListNodesResponse{Nodes: s.reg.Nodes()}, nil
}

// Listen opens one --grpc-listen address: "unix:///path/to.sock" (the directory is created
// and a stale socket file removed first) or "host:port" (TCP, e.g. "127.0.0.1:7443").
func Listen(addr string) (net.Listener, error) {
	path, isUnix := strings.CutPrefix(addr, "unix://")
	if !isUnix {
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listen %s: %w", addr, err)
		}
		return lis, nil
	}
	if path == "" {
		return nil, fmt.Errorf("listen %s: empty socket path", addr)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen %s: %s exists and is not a socket", addr, path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen %s: remove stale socket: %w", addr, err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return lis, nil
}
