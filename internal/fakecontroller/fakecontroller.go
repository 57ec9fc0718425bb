// Package fakecontroller is the one fake kuport controller of the tests and benchmarks: a real
// AgentService gRPC server on which every agent stream becomes a Session that hands the agent
// programs and passes on its Hello, Acks and Reports. The caller decides what each agent is
// handed; controller/agents/server.go is the real server it stands in for.
package fakecontroller

import (
	"crypto/tls"
	"net"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"kuport.wlz.li/kuport/controller/servingcert"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// DefaultWait is how long the testing helpers wait for the agent when Options.Wait is zero: a
// generous bound that only limits how long a broken test hangs.
const DefaultWait = 10 * time.Second

// Options shape a Controller.
type Options struct {
	// Program, when set, goes to every agent right after its Hello, before the Session is
	// handed on, as a leader sends the program it holds for the node.
	Program *kuportv1.NodeProgram
	// Refuse, when set, ends every stream with it before reading anything, as a replica that
	// is not the leader does (controller/agents/server.go).
	Refuse error
	// Wait bounds how long NextSession, Send, NextAck and NextReport wait; zero: DefaultWait.
	Wait time.Duration
}

// Controller is the fake controller; serve it with Serve or Start.
type Controller struct {
	kuportv1.UnimplementedAgentServiceServer
	opts     Options
	sessions chan *Session
	acks     chan *kuportv1.Ack
}

// Session is one agent stream.
type Session struct {
	Hello     *kuportv1.Hello
	MD        metadata.MD                    // the stream's request metadata
	messages  chan *kuportv1.ConnectRequest  // everything after Hello
	responses chan *kuportv1.ConnectResponse // sent to the agent
	end       chan struct{}                  // closed to end the stream
	wait      time.Duration
}

// New returns a Controller shaped by opts.
func New(opts Options) *Controller {
	if opts.Wait == 0 {
		opts.Wait = DefaultWait
	}
	return &Controller{opts: opts, sessions: make(chan *Session, 8), acks: make(chan *kuportv1.Ack, 1)}
}

// Serve serves c on lis, over TLS with creds (nil: in plaintext), until stop is called.
func (c *Controller) Serve(lis net.Listener, creds credentials.TransportCredentials) (stop func()) {
	var opts []grpc.ServerOption
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	srv := grpc.NewServer(opts...)
	kuportv1.RegisterAgentServiceServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	return srv.Stop
}

// Start serves c on a unix socket at path until the test ends and returns the agent's target
// for it.
func (c *Controller) Start(t testing.TB, path string, creds credentials.TransportCredentials) string {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("listen on %s: %v", path, err)
	}
	t.Cleanup(c.Serve(lis, creds))
	return "unix://" + path
}

// TLS are server credentials serving cert, as the controller's listeners do.
func TLS(cert tls.Certificate) credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}})
}

// Cert generates a fresh CA and a serving certificate for serverName signed by it, and writes
// the CA's certificate to caFile ("" writes none) for the agent to trust.
func Cert(serverName, caFile string) (tls.Certificate, error) {
	b, err := servingcert.Generate([]string{serverName}, time.Now())
	if err != nil {
		return tls.Certificate{}, err
	}
	if caFile != "" {
		if err := os.WriteFile(caFile, b.CACert, 0o600); err != nil {
			return tls.Certificate{}, err
		}
	}
	cert, err := b.Certificate()
	if err != nil {
		return tls.Certificate{}, err
	}
	return *cert, nil
}

// Sessions yields the streams no NextSession has taken yet.
func (c *Controller) Sessions() <-chan *Session { return c.sessions }

// Acks yields the first Ack of any stream not taken yet; the Acks that arrive while it waits
// are dropped, so a caller waiting for one answer never holds the streams up.
func (c *Controller) Acks() <-chan *kuportv1.Ack { return c.acks }

// Connect serves one agent stream as a Session.
func (c *Controller) Connect(stream kuportv1.AgentService_ConnectServer) error {
	if c.opts.Refuse != nil {
		return c.opts.Refuse
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if c.opts.Program != nil {
		if err := stream.Send(programMessage(c.opts.Program)); err != nil {
			return err
		}
	}
	md, _ := metadata.FromIncomingContext(stream.Context())
	s := &Session{
		Hello:     first.GetHello(),
		MD:        md,
		messages:  make(chan *kuportv1.ConnectRequest, 64),
		responses: make(chan *kuportv1.ConnectResponse),
		end:       make(chan struct{}),
		wait:      c.opts.Wait,
	}
	go c.receive(stream, s)
	select {
	case c.sessions <- s:
	case <-stream.Context().Done():
		return stream.Context().Err()
	}
	for {
		select {
		case msg := <-s.responses:
			if err := stream.Send(msg); err != nil {
				return err
			}
		case <-s.end:
			return nil
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

// receive passes on what the agent sends after its Hello until the stream ends.
func (c *Controller) receive(stream kuportv1.AgentService_ConnectServer, s *Session) {
	for {
		m, err := stream.Recv()
		if err != nil {
			return
		}
		if ack := m.GetAck(); ack != nil {
			select {
			case c.acks <- ack:
			default:
			}
		}
		select {
		case s.messages <- m:
		case <-stream.Context().Done():
			return
		}
	}
}

// NextSession waits for the next agent stream.
func (c *Controller) NextSession(t testing.TB) *Session {
	t.Helper()
	return within(t, c.sessions, c.opts.Wait, "no agent session")
}

// NextAck waits for the first Ack of any stream not taken yet (Acks).
func (c *Controller) NextAck(t testing.TB) *kuportv1.Ack {
	t.Helper()
	return within(t, c.acks, c.opts.Wait, "no Ack from any agent")
}

// within receives from ch, failing t with failure after wait.
func within[T any](t testing.TB, ch <-chan T, wait time.Duration, failure string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatal(failure)
		var zero T
		return zero
	}
}

// Messages yields what the agent sent after its Hello, in order, as no Next* has taken it.
func (s *Session) Messages() <-chan *kuportv1.ConnectRequest { return s.messages }

// End ends the stream, as a controller that goes away does; call it once.
func (s *Session) End() { close(s.end) }

// Send hands the agent p whole.
func (s *Session) Send(t testing.TB, p *kuportv1.NodeProgram) {
	t.Helper()
	s.SendMessage(t, programMessage(p))
}

// SendMessage hands the agent msg.
func (s *Session) SendMessage(t testing.TB, msg *kuportv1.ConnectResponse) {
	t.Helper()
	select {
	case s.responses <- msg:
	case <-time.After(s.wait):
		t.Fatal("program not taken by the session")
	}
}

// NextAck returns the agent's next Ack, skipping its other messages.
func (s *Session) NextAck(t testing.TB) *kuportv1.Ack {
	t.Helper()
	return next(t, s, (*kuportv1.ConnectRequest).GetAck)
}

// NextReport returns the agent's next Report, skipping its other messages.
func (s *Session) NextReport(t testing.TB) *kuportv1.Report {
	t.Helper()
	return next(t, s, (*kuportv1.ConnectRequest).GetReport)
}

// next returns the next message for which pick returns non-nil, skipping the others.
func next[M proto.Message](t testing.TB, s *Session, pick func(*kuportv1.ConnectRequest) M) M {
	t.Helper()
	deadline := time.After(s.wait)
	for {
		select {
		case m := <-s.messages:
			if got := pick(m); got.ProtoReflect().IsValid() {
				return got
			}
		case <-deadline:
			var zero M
			t.Fatalf("no %T from the agent", zero)
			return zero
		}
	}
}

func programMessage(p *kuportv1.NodeProgram) *kuportv1.ConnectResponse {
	return &kuportv1.ConnectResponse{Message: &kuportv1.ConnectResponse_Program{Program: p}}
}
