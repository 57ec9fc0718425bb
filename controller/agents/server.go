package agents

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"kuport.wlz.li/kuport/controller/compile"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Server serves kuport.v1.AgentService and kuport.v1.ProgramService over the Registry of the
// leader, plus grpc.health.v1 and server reflection (for grpcurl), over TLS on every listener
// (Serve), so an agent's token never crosses the network in the clear and agents verify the
// controller's certificate. ServeHealth serves grpc.health.v1 alone in plaintext, for the
// kubelet's gRPC probes, which cannot speak TLS.
//
// With an Authenticator, an agent stream must carry "authorization: Bearer <token>" proving
// the node its Hello names (proto/kuport/v1/program.proto, AgentService), and
// ProgramService answers loopback TCP clients only: inspection is authorised by who can
// reach the controller's loopback (its host, or `kubectl port-forward`), never by an agent
// token, which proves a node and grants nothing else. Health and reflection are open.
//
// A Server starts as a follower's: it refuses agent streams and inspection calls with
// FAILED_PRECONDITION, naming the leader when known (SetLeader), so an agent moves on to its
// next controller target. Lead makes it serve a Registry for the rest of its life; a replica
// that loses the leadership stops its Server and exits. Health reports the overall service
// ("") SERVING while it runs, and kuport.v1.AgentService SERVING only while it leads.
type Server struct {
	kuportv1.UnimplementedAgentServiceServer
	kuportv1.UnimplementedProgramServiceServer

	reg      atomic.Pointer[Registry] // nil while following
	leader   atomic.Pointer[string]   // identity of the leader, as last observed
	auth     Authenticator            // nil: agent streams and inspection are not authenticated
	log      hclog.Logger
	grpc     *grpc.Server
	plain    *grpc.Server // health only, plaintext (ServeHealth)
	health   *health.Server
	stopping chan struct{}
	stopOnce sync.Once
}

// NewServer returns a follower's Server (see Server); nothing listens until Serve. auth nil
// turns authentication off (development only: any client may then claim any node). tlsConfig
// holds the serving certificate (package controller/servingcert) and must not be nil.
func NewServer(log hclog.Logger, auth Authenticator, tlsConfig *tls.Config) *Server {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	s := &Server{
		auth:     auth,
		log:      log,
		health:   health.NewServer(),
		stopping: make(chan struct{}),
	}
	s.grpc = grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsConfig)),
		// Probe idle streams so a vanished agent is seen as disconnected within about 40 s.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.UnaryInterceptor(s.authorizeInspection),
		// No read buffer of gRPC's own per connection (BENCHMARKS.md, "Fan-out after branch
		// `fanout`"): the framer reads from the TLS connection, which holds each record it
		// decrypted anyway.
		grpc.ReadBufferSize(0),
		// No write buffer either: a stream took one from gRPC's pool while it wrote, a change
		// for every node has 1,000 streams write at once, and the pool kept their buffers
		// until two collections had passed (BENCHMARKS.md, "Figures moved out of code
		// comments"). Each frame goes to the TLS connection as it is written: a program
		// change is one frame a stream.
		grpc.WriteBufferSize(0),
	)
	kuportv1.RegisterAgentServiceServer(s.grpc, s)
	kuportv1.RegisterProgramServiceServer(s.grpc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	s.plain = grpc.NewServer()
	healthpb.RegisterHealthServer(s.plain, s.health)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(kuportv1.AgentService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	return s
}

// Lead makes the Server serve reg's programs and state from now on; it never follows again.
// A registry it led with before is closed, ending its agent streams: the agents reconnect
// to reg (a term that restarted with a higher epoch).
func (s *Server) Lead(reg *Registry) {
	if old := s.reg.Swap(reg); old != nil && old != reg {
		old.Close()
	}
	s.health.SetServingStatus(kuportv1.AgentService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
}

// SetLeader records the identity of the current leader, which a follower's refusals name.
func (s *Server) SetLeader(identity string) { s.leader.Store(&identity) }

// leading returns the Registry to serve, or the FAILED_PRECONDITION refusal of a follower.
func (s *Server) leading() (*Registry, error) {
	if reg := s.reg.Load(); reg != nil {
		return reg, nil
	}
	leader := "unknown"
	if l := s.leader.Load(); l != nil && *l != "" {
		leader = *l
	}
	return nil, status.Errorf(codes.FailedPrecondition, "this controller replica is not the leader (leader: %s)", leader)
}

// Serve accepts TLS connections on lis until Stop; it returns nil after Stop.
func (s *Server) Serve(lis net.Listener) error { return serveUntilStop(s.grpc, lis) }

// ServeHealth serves grpc.health.v1 alone, in plaintext, on lis until Stop; it returns nil
// after Stop. Health tells nothing secret: it is what the kubelet's probes ask.
func (s *Server) ServeHealth(lis net.Listener) error { return serveUntilStop(s.plain, lis) }

func serveUntilStop(srv *grpc.Server, lis net.Listener) error {
	if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
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
		s.plain.GracefulStop()
	})
}

// authorizeInspection lets ProgramService calls through only from loopback TCP clients when
// the Server authenticates agents (see Server); PERMISSION_DENIED otherwise.
func (s *Server) authorizeInspection(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.auth == nil || !strings.HasPrefix(info.FullMethod, "/"+kuportv1.ProgramService_ServiceDesc.ServiceName+"/") {
		return handler(ctx, req)
	}
	if p, ok := peer.FromContext(ctx); ok {
		if addr, ok := p.Addr.(*net.TCPAddr); ok && addr.IP.IsLoopback() {
			return handler(ctx, req)
		}
		s.log.Warn("inspection call refused", "method", info.FullMethod, "peer", p.Addr)
	}
	return nil, status.Error(codes.PermissionDenied, "inspection is served to loopback clients only (use kubectl port-forward)")
}

// authenticate returns the node the stream's bearer token proves, or the refusal:
// UNAUTHENTICATED without one, else the Authenticator's error.
func (s *Server) authenticate(ctx context.Context) (Identity, error) {
	var token string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) == 1 {
			token, _ = strings.CutPrefix(v[0], "Bearer ")
		}
	}
	if token == "" {
		return Identity{}, status.Error(codes.Unauthenticated, `agent stream without "authorization: Bearer <token>" metadata`)
	}
	return s.auth.Authenticate(ctx, token)
}

// helloTimeout bounds how long a new stream may stay silent before its Hello.
const helloTimeout = 10 * time.Second

// Connect implements kuport.v1.AgentService/Connect: a follower refuses it with
// FAILED_PRECONDITION. With an Authenticator, a stream without a valid agent token is
// refused before its Hello (see Server.authenticate). The first message must be a Hello
// naming the node (else INVALID_ARGUMENT, or DEADLINE_EXCEEDED after helloTimeout without
// one), and the node the token proves (else PERMISSION_DENIED); the stream then
// receives the node's current program and every new version, and carries the agent's Acks
// and Reports. A newer stream of the same node ends this one with ABORTED.
func (s *Server) Connect(stream grpc.BidiStreamingServer[kuportv1.ConnectRequest, kuportv1.ConnectResponse]) error {
	reg, err := s.leading()
	if err != nil {
		return err
	}
	var id Identity
	if s.auth != nil {
		if id, err = s.authenticate(stream.Context()); err != nil {
			s.log.Warn("agent stream refused", "peer", peerAddr(stream.Context()), "error", err)
			return err
		}
	}
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
	if s.auth != nil && hello.Node != id.Node {
		err := status.Errorf(codes.PermissionDenied, "agent token of Pod %s proves node %q, not %q", id.Pod, id.Node, hello.Node)
		s.log.Warn("agent stream refused", "peer", peerAddr(stream.Context()), "error", err)
		return err
	}
	sess := reg.connect(hello)
	defer reg.disconnect(sess)

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
				reg.ack(sess, m.Ack)
			case *kuportv1.ConnectRequest_Report:
				reg.report(sess, m.Report)
			case *kuportv1.ConnectRequest_Hello:
				s.log.Warn("ignoring a second hello", "node", sess.node)
			}
		}
	}()

	for {
		select {
		case <-sess.wake:
			if msg := reg.next(sess); msg != nil {
				if err := stream.Send(msg); err != nil {
					return fmt.Errorf("send program to %s: %w", sess.node, err)
				}
				s.log.Debug("program sent", "node", sess.node, "version", msg.GetProgram().GetVersion()+msg.GetDelta().GetChanged().GetVersion(),
					"delta", msg.GetDelta() != nil)
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
		case <-reg.Done():
			return status.Error(codes.Unavailable, "leadership term restarted with a higher epoch")
		}
	}
}

// peerAddr is the client address of a call, for logs ("unknown" without one).
func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return "unknown"
}

// GetProgram implements kuport.v1.ProgramService/GetProgram; NOT_FOUND for a node neither
// compile nor an agent has named, FAILED_PRECONDITION on a follower. A node known only from
// its agent gets an empty program.
func (s *Server) GetProgram(_ context.Context, req *kuportv1.GetProgramRequest) (*kuportv1.GetProgramResponse, error) {
	reg, err := s.leading()
	if err != nil {
		return nil, err
	}
	p, acked, ok := reg.Program(req.Node)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "node %q is unknown", req.Node)
	}
	if p == nil {
		p = &kuportv1.NodeProgram{Node: req.Node, Epoch: reg.Epoch()}
	}
	return &kuportv1.GetProgramResponse{Program: p, AckedVersion: acked}, nil
}

// ListNodes implements kuport.v1.ProgramService/ListNodes: every known node, sorted by name;
// FAILED_PRECONDITION on a follower.
func (s *Server) ListNodes(context.Context, *kuportv1.ListNodesRequest) (*kuportv1.ListNodesResponse, error) {
	reg, err := s.leading()
	if err != nil {
		return nil, err
	}
	return &kuportv1.ListNodesResponse{Nodes: reg.Nodes()}, nil
}

// GetMapping implements kuport.v1.ProgramService/GetMapping: the mapping's state per node
// (Registry.Mapping); INVALID_ARGUMENT without namespace and name, NOT_FOUND when no node's
// program carries it, FAILED_PRECONDITION on a follower.
func (s *Server) GetMapping(_ context.Context, req *kuportv1.GetMappingRequest) (*kuportv1.GetMappingResponse, error) {
	reg, err := s.leading()
	if err != nil {
		return nil, err
	}
	if req.Namespace == "" || req.Name == "" {
		return nil, status.Error(codes.InvalidArgument, "namespace and name are required")
	}
	nodes := reg.Mapping(compile.Key(req.Namespace, req.Name))
	if len(nodes) == 0 {
		return nil, status.Errorf(codes.NotFound, "no node's program carries mapping %s/%s", req.Namespace, req.Name)
	}
	return &kuportv1.GetMappingResponse{Nodes: nodes}, nil
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
