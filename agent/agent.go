// Package agent is kuport's node agent loop: it holds one kuport.v1.AgentService/Connect
// stream to the controller, applies every NodeProgram it receives through a Datapath,
// acknowledges each one and reports the node's state, counters and link statistics.
//
// The agent makes no decisions (docs/design/software.md#shape): everything it writes comes
// from the program. It owns no kernel state itself; the Datapath does. It never removes
// kernel state when the stream breaks or the process stops (fail static): the applied program
// stays in the kernel until the controller sends another one or an operator runs cleanup.
package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Datapath is what the agent needs from the node's kernel; *datapath.Datapath implements it.
// Its reads (Counters, LinkStats, NodeState) are called beside an Apply, from the goroutine
// that reports.
type Datapath interface {
	// Apply makes the kernel hold exactly p (idempotent: no writes when nothing differs).
	Apply(p *kuportv1.NodeProgram) error
	// Counters returns the nft counter of every entry of the applied program.
	Counters() ([]*kuportv1.Counter, error)
	// LinkStats returns the kernel statistics of every kup-* link device.
	LinkStats() ([]*kuportv1.LinkStats, error)
	// NodeState returns every interface of the node, the underlay name and ip_forward.
	NodeState(underlay string) (*kuportv1.NodeState, error)
}

// Defaults for the zero values of Config.
const (
	DefaultReportInterval    = 5 * time.Second
	DefaultStatePollInterval = 2 * time.Second
	DefaultResyncInterval    = 30 * time.Second
	DefaultFollowerRetry     = time.Second
)

// SweepDelay is the datapath's SweepDelay the agent runs with (cmd/kuport-agent): the
// conntrack entries a program's change of the DNAT rules left going the old way are deleted
// within it after the program is applied (and acknowledged), together with those of the
// programs applied since, so a burst of programs (a thousand PortMaps deleted at once) reads
// the conntrack table a few times instead of once a program (datapath/README.md#conntrack).
const SweepDelay = 250 * time.Millisecond

// DefaultBackoff is the reconnect backoff: 200 ms doubling up to a 5 s cap, 10 % jitter, so a
// restarted controller sees its agents back within a few seconds.
var DefaultBackoff = wait.Backoff{
	Duration: 200 * time.Millisecond,
	Factor:   2,
	Jitter:   0.1,
	Steps:    math.MaxInt32,
	Cap:      5 * time.Second,
}

// ReadyService is the grpc.health.v1 service of the agent's readiness, served by its
// InspectionServer: SERVING while a stream to a controller is open (Hello sent and the stream
// not yet ended) and the agent has taken a program since it started (applied it, whatever
// its entry errors, or found it already applied; a refused program, fenced or another
// node's, does not count). NOT_SERVING before that and while it reconnects. The overall
// service "" is its liveness: SERVING while the process answers.
var ReadyService = kuportv1.AgentService_ServiceDesc.ServiceName

// Config configures an Agent. Zero durations take the Default* values.
type Config struct {
	// NodeName is the node this agent runs on; programs for another node are refused.
	NodeName string
	// AgentVersion is sent in Hello.
	AgentVersion string
	// Underlay is the underlay interface name passed to Datapath.NodeState; empty lets the
	// datapath resolve it (the IPv4 default route's device) on every read.
	Underlay string
	// Targets are gRPC targets of the controller replicas ("unix:///path" or "host:port"),
	// tried in turn: each failed or broken stream moves to the next.
	Targets []string
	// CAFile holds the PEM certificate(s) of the CA that the controller's serving certificate
	// must chain to (deploy/agent.yaml mounts the controller's ConfigMap kuport-controller-ca
	// there). The stream always runs over TLS, and a controller whose certificate does not
	// verify is refused. Read afresh for every stream, so a CA the controller published anew
	// is picked up at the next connect.
	CAFile string
	// ServerName is the name the controller's certificate must be valid for; empty takes the
	// host of each target. Required with a unix target, whose host names nothing.
	ServerName string
	// Datapath applies programs and reads the node's kernel state.
	Datapath Datapath
	// EntryErrors extracts per-entry failures from an Apply or Validate error; nil, or an
	// empty result, yields one EntryError with an empty id and the error's text.
	EntryErrors func(error) []*kuportv1.EntryError
	// Validate checks a program before anything of it reaches the kernel (datapath.Validate).
	// A program it rejects is refused whole: Apply is not called, the kernel keeps the
	// previous program, and the Ack carries the error per entry (EntryErrors), each naming
	// the entry. nil leaves validation to Apply.
	Validate func(*kuportv1.NodeProgram) error
	// Applied, when set, is called after Apply of a program received from the controller
	// (not of a resync) returns, off the stream's path. cmd/kuport-agent returns the apply's
	// garbage to the system there (FreeOSMemory).
	Applied func()
	// Log receives the agent's logs; nil discards them.
	Log hclog.Logger
	// ReportInterval is the period of Reports (default 5 s: the controller judges a mapping
	// unanswered from two of them, within 15 s of its requests going unanswered).
	ReportInterval time.Duration
	// StatePollInterval is how often NodeState is read; a change is reported at once
	// (default 2 s).
	StatePollInterval time.Duration
	// ResyncInterval is how often the last program is applied again, which retries a failed
	// Apply and repairs kernel state others removed (default 30 s); Drift repairs sooner.
	ResyncInterval time.Duration
	// Drift, when set, signals that kernel state the datapath owns changed (Datapath.Watch
	// of package datapath): each value resyncs at once, as the ResyncInterval tick does, so
	// what someone else removed is repaired in well under a second instead of at the next
	// tick.
	Drift <-chan struct{}
	// Backoff paces reconnects; the zero value means DefaultBackoff. It restarts from its
	// first step after a stream that delivered a program.
	Backoff wait.Backoff
	// FollowerRetry is the wait before the next target after a controller replica refused
	// the stream with FAILED_PRECONDITION because it is not the leader (default 1 s): a
	// controller is up and the leader is elsewhere or about to be elected, so the Backoff
	// starts over instead of growing, and a failover is followed within about this much.
	FollowerRetry time.Duration
	// TokenFile holds the agent's token (a ServiceAccount token with audience "kuport" bound
	// to the agent's Pod), sent as "authorization: Bearer <token>" on every stream and read
	// afresh for each, since projected tokens rotate. Empty sends no token.
	TokenFile string
	// EpochFile keeps the highest epoch the agent applied across its own restarts, so that
	// fencing survives them (a decimal number; on a tmpfs, so a reboot clears it with the
	// kernel state). Empty keeps it in memory only.
	EpochFile string
	// DialOptions are added to the defaults (TLS verifying CAFile and ServerName, the
	// TokenFile credentials, connect backoff capped like Backoff).
	DialOptions []grpc.DialOption
}

// Agent is one node's agent. Create it with New and start it with Run.
type Agent struct {
	cfg Config
	log hclog.Logger

	// Owned by the Run goroutine, the only one that calls Apply; written through setCurrent.
	current    *kuportv1.NodeProgram // last program handed to Apply (nil before the first)
	currentErr []*kuportv1.EntryError
	// epochFloor is the highest epoch applied by this agent or, per Config.EpochFile, an
	// earlier one on this node: a program of a lower epoch is refused.
	epochFloor uint64
	// applied is what setCurrent last published, for the inspection server (nil before the
	// first program).
	applied atomic.Pointer[kuportv1.GetAppliedProgramResponse]
	// health is the inspection server's grpc.health.v1: "" and ReadyService.
	health *health.Server
}

// New checks cfg and returns an Agent. It errors when the node name, the targets, the CA file
// or the datapath are missing, a unix target has no server name, or Config.EpochFile cannot
// be read.
func New(cfg Config) (*Agent, error) {
	switch {
	case cfg.NodeName == "":
		return nil, errors.New("agent: node name is required")
	case len(cfg.Targets) == 0:
		return nil, errors.New("agent: at least one controller target is required")
	case cfg.CAFile == "":
		return nil, errors.New("agent: the controller's CA file is required")
	case cfg.Datapath == nil:
		return nil, errors.New("agent: datapath is required")
	}
	for _, target := range cfg.Targets {
		if (strings.HasPrefix(target, "unix:") || strings.HasPrefix(target, "unix-abstract:")) && cfg.ServerName == "" {
			return nil, fmt.Errorf("agent: unix target %s needs the controller's server name", target)
		}
	}
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	if cfg.ReportInterval <= 0 {
		cfg.ReportInterval = DefaultReportInterval
	}
	if cfg.StatePollInterval <= 0 {
		cfg.StatePollInterval = DefaultStatePollInterval
	}
	if cfg.ResyncInterval <= 0 {
		cfg.ResyncInterval = DefaultResyncInterval
	}
	if cfg.Backoff.Duration <= 0 {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.FollowerRetry <= 0 {
		cfg.FollowerRetry = DefaultFollowerRetry
	}
	floor, err := loadEpoch(cfg.EpochFile)
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: cfg.Log, epochFloor: floor, health: health.NewServer()}
	a.setReady(false)
	return a, nil
}

// setReady sets the status of ReadyService.
func (a *Agent) setReady(ready bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	a.health.SetServingStatus(ReadyService, st)
}

// errSessionEnded marks a stream the controller closed cleanly.
var errSessionEnded = errors.New("controller closed the stream")

// Run connects to the controller and serves programs until ctx is done; it then returns nil
// and leaves the kernel as it is. A broken stream is retried with backoff (after
// Config.FollowerRetry when a follower refused it), rotating through Config.Targets, while
// the applied program stays in the kernel and is still resynced.
func (a *Agent) Run(ctx context.Context) error {
	resync := time.NewTicker(a.cfg.ResyncInterval)
	defer resync.Stop()
	bo := a.cfg.Backoff
	for attempt := 0; ; attempt++ {
		target := a.cfg.Targets[attempt%len(a.cfg.Targets)]
		healthy, err := a.session(ctx, target, resync.C)
		if ctx.Err() != nil {
			return nil
		}
		if healthy {
			bo = a.cfg.Backoff
		}
		delay := bo.Step()
		if status.Code(err) == codes.FailedPrecondition {
			// A follower refused: the next target may be the leader (or soon become it).
			bo = a.cfg.Backoff
			delay = a.cfg.FollowerRetry
		}
		a.log.Warn("controller stream ended, reconnecting", "target", target, "error", err, "retry_in", delay)
		if !a.waitResyncing(ctx, delay, resync.C) {
			return nil
		}
	}
}

// waitResyncing waits d while still serving resync ticks; false when ctx ended.
func (a *Agent) waitResyncing(ctx context.Context, d time.Duration, resync <-chan time.Time) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		case <-resync:
			a.resync()
		case <-a.cfg.Drift:
			a.resync()
		}
	}
}

// dialOptions are the defaults: TLS trusting the CA of Config.CAFile (read now), the token of
// Config.TokenFile, and a connect backoff no slower than the agent's own.
func (a *Agent) dialOptions() ([]grpc.DialOption, error) {
	pem, err := os.ReadFile(a.cfg.CAFile)
	if err != nil {
		return nil, fmt.Errorf("read controller CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("read controller CA: no PEM certificate in %s", a.cfg.CAFile)
	}
	bc := backoff.DefaultConfig
	bc.MaxDelay = a.cfg.Backoff.Cap
	if bc.MaxDelay <= 0 {
		bc.MaxDelay = DefaultBackoff.Cap
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: roots, ServerName: a.cfg.ServerName, MinVersion: tls.VersionTLS13,
		})),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: 5 * time.Second}),
	}
	if a.cfg.TokenFile != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(tokenFile(a.cfg.TokenFile)))
	}
	return append(opts, a.cfg.DialOptions...), nil
}

// session runs one stream to target until it breaks or ctx ends. healthy reports whether
// the stream delivered at least one program.
func (a *Agent) session(ctx context.Context, target string, resync <-chan time.Time) (healthy bool, err error) {
	opts, err := a.dialOptions()
	if err != nil {
		return false, err
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return false, fmt.Errorf("client for %s: %w", target, err)
	}
	defer func() { _ = conn.Close() }()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := kuportv1.NewAgentServiceClient(conn).Connect(sctx)
	if err != nil {
		return false, fmt.Errorf("open stream to %s: %w", target, err)
	}
	state, err := a.cfg.Datapath.NodeState(a.cfg.Underlay)
	if err != nil {
		return false, fmt.Errorf("read node state: %w", err)
	}
	hello := &kuportv1.Hello{Node: a.cfg.NodeName, AgentVersion: a.cfg.AgentVersion, State: state, AcceptsDelta: true}
	// Claim only a program the kernel holds whole: the controller takes Hello's version as
	// an acknowledgement, and a failed one must be resent and acked with its errors.
	if len(a.currentErr) == 0 {
		hello.AppliedVersion = a.current.GetVersion()
	}
	// The fencing floor, so a leader whose epoch is below it knows every program it sends
	// here will be refused.
	hello.AppliedEpoch = a.epochFloor
	if err := stream.Send(&kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Hello{Hello: hello}}); err != nil {
		if errors.Is(err, io.EOF) {
			// The controller ended the stream (a follower's refusal): Recv tells why.
			_, err = stream.Recv()
		}
		return false, fmt.Errorf("send hello to %s: %w", target, err)
	}
	a.log.Info("connected to controller", "target", target, "applied_version", hello.AppliedVersion, "applied_epoch", hello.AppliedEpoch)
	// Connected: ready when a program was taken since start (a reconnect that claims the
	// applied version gets no program), until the stream ends.
	a.setReady(a.current != nil)
	defer a.setReady(false)

	// latest holds the newest program received and not yet taken for applying: a version
	// that arrives while the agent applies another replaces the one waiting, so a burst of
	// versions (a thousand PortMaps created at once) is applied as its newest, once, not one
	// by one behind each other. Versions are whole programs (deltas are applied here, in
	// order), so skipping one loses nothing; the Ack of the newest covers the ones before.
	latest := make(chan *kuportv1.NodeProgram, 1)
	recvErr := make(chan error, 1)
	go func() {
		// base is the last program the stream carried: a delta applies to it.
		var base *kuportv1.NodeProgram
		for {
			resp, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			received := time.Now()
			p := resp.GetProgram()
			d := resp.GetDelta()
			if d != nil {
				if p, err = d.Apply(base); err != nil {
					// Out of step with the controller: a new stream starts with the whole program.
					recvErr <- fmt.Errorf("program delta from %s: %w", target, err)
					return
				}
			}
			if p == nil {
				a.log.Debug("ignoring a controller message without a program")
				continue
			}
			// When the stream gave it and how long its delta took, for the time from the
			// controller's "program sent" to the datapath's "applied program".
			a.log.Debug("program received", "version", p.GetVersion(), "delta", d != nil, "delta_us", time.Since(received).Microseconds())
			base = p
			select {
			case old := <-latest:
				a.log.Debug("program superseded before it was applied", "version", old.GetVersion(), "by", p.GetVersion())
			default:
			}
			latest <- p
		}
	}()

	// Sends come from this loop (acks) and from the reporter (reports), one at a time.
	var sendMu sync.Mutex
	send := func(what string, req *kuportv1.ConnectRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		if err := stream.Send(req); err != nil {
			return fmt.Errorf("send %s to %s: %w", what, target, err)
		}
		return nil
	}
	sendAck := func(ack *kuportv1.Ack) error {
		if ack == nil {
			return nil
		}
		return send("ack", &kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Ack{Ack: ack}})
	}
	// Reports are read and sent beside this loop, not in it: reading every entry's counters
	// takes long at 10,000 mappings, and a program arriving meanwhile waited for it
	// (BENCHMARKS.md, "Figures moved out of code comments").
	reportErr := make(chan error, 1)
	var reporter sync.WaitGroup
	reporter.Go(func() {
		if err := a.reportLoop(sctx, state, send); err != nil {
			reportErr <- err
		}
	})
	defer func() {
		cancel()
		reporter.Wait()
	}()
	for {
		var err error
		select {
		case <-ctx.Done():
			return healthy, ctx.Err()
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				err = errSessionEnded
			}
			return healthy, fmt.Errorf("receive from %s: %w", target, err)
		case p := <-latest:
			healthy = true
			ack := a.handleProgram(p)
			a.setReady(a.current != nil)
			err = sendAck(ack)
		case <-resync:
			err = sendAck(a.resync())
		case <-a.cfg.Drift:
			err = sendAck(a.resync())
		case err = <-reportErr:
		}
		if err != nil {
			return healthy, err
		}
	}
}

// reportLoop sends a Report every ReportInterval, and at once when the node's state (read
// every StatePollInterval) differs from the one last reported (first: reported), until ctx
// ends; it returns the error of a send that failed.
func (a *Agent) reportLoop(ctx context.Context, reported *kuportv1.NodeState, send func(string, *kuportv1.ConnectRequest) error) error {
	report := time.NewTicker(a.cfg.ReportInterval)
	defer report.Stop()
	poll := time.NewTicker(a.cfg.StatePollInterval)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-report.C:
		case <-poll.C:
			st, err := a.cfg.Datapath.NodeState(a.cfg.Underlay)
			if err != nil {
				a.log.Warn("read node state", "error", err)
				continue
			}
			if proto.Equal(st, reported) {
				continue
			}
			a.log.Info("node state changed, reporting")
		}
		r, err := a.report()
		if err != nil {
			a.log.Warn("no report", "error", err)
			continue
		}
		reported = r.State
		if err := send("report", &kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Report{Report: r}}); err != nil {
			return err
		}
	}
}

// report reads a Report from the datapath. Counters and link statistics that cannot be read
// are logged and left out; the state is required.
func (a *Agent) report() (*kuportv1.Report, error) {
	state, err := a.cfg.Datapath.NodeState(a.cfg.Underlay)
	if err != nil {
		return nil, fmt.Errorf("read node state: %w", err)
	}
	r := &kuportv1.Report{State: state}
	if r.Counters, err = a.cfg.Datapath.Counters(); err != nil {
		a.log.Warn("read counters", "error", err)
	}
	if r.Links, err = a.cfg.Datapath.LinkStats(); err != nil {
		a.log.Warn("read link stats", "error", err)
	}
	return r, nil
}
