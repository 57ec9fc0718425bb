// Command kuport-agent is kuport's node agent: it holds a stream to the controller and
// applies the node's program to the kernel of the network namespace it runs in.
//
//	kuport-agent --node-name N --controller TARGET [--controller TARGET2 ...]
//	             [--underlay-interface IF] [--report-interval 5s] [--resync-interval 30s]
//	             [--token-file /var/run/secrets/kuport/token] [--inspect-listen 127.0.0.1:7400]
//	             [--epoch-file /run/kuport/epoch] [--controller-ca-file /var/run/kuport/ca/ca.crt]
//	             [--controller-server-name NAME] [--log-level info]
//	kuport-agent cleanup [--wait] [--log-level info]
//	kuport-agent probe [--address 127.0.0.1:7400] [--service ""] [--timeout 1s]
//	kuport-agent --version
//
// TARGET is a gRPC target: unix:///run/kuport-lab/controller-0.sock or host:port. The stream
// runs over TLS: the controller's certificate must chain to a CA of --controller-ca-file (the
// ConfigMap kuport-controller-ca mounted by deploy/agent.yaml; read on every connect) and be
// valid for --controller-server-name, by default the host of the target (a unix target needs
// the flag). A controller that fails either is refused, and the log says why. The agent
// proves its node to the controller with the token in --token-file (a ServiceAccount token
// with audience "kuport" bound to its Pod, re-read on every connect; "" sends none, for a
// controller run with --agent-auth=false). It serves the program it applied
// (kuport.v1.AgentInspectionService, health, reflection) on --inspect-listen ("" for none),
// unauthenticated: keep it on loopback. --epoch-file keeps the highest program epoch applied on
// the node across agent restarts, so a deposed leader cannot get a stale program applied by a
// restarted agent ("" keeps it in memory only). The agent watches the kernel objects kuport
// owns and re-applies its program as soon as someone else changes one (datapath.Watch);
// --resync-interval is the backstop for whatever goes unnotified. SIGTERM and
// SIGINT stop the agent and leave the kernel as it is (fail static); `cleanup` removes
// everything kuport made on the node and exits (with --wait, it then waits for SIGTERM, so a
// cleanup DaemonSet's pods become Ready once their node is clean: deploy/cleanup).
//
// `probe` is the DaemonSet's liveness and readiness probe (an exec probe: the kubelet's gRPC
// and TCP probes of a host-network pod dial the node's address, and the inspection server
// stays on loopback). It runs a grpc.health.v1 Check of --service against a running agent's
// --inspect-listen address and exits 0 only on SERVING: service "" answers while the agent
// process serves (liveness), "kuport.v1.AgentService" while it is connected to a controller
// and has taken a program since it started (readiness, agent.ReadyService).
//
// The agent runs with GOGC=25 between applies and 100 during one unless the environment sets
// GOGC (main says why), and returns the garbage of each new program it applies to the system
// at once.
//
// Exit status: 0 on success, 2 on a usage error, 1 on any other error (for probe: anything
// but SERVING).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"github.com/spf13/pflag"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"kuport.wlz.li/kuport/agent"
	"kuport.wlz.li/kuport/datapath"
	"kuport.wlz.li/kuport/internal/version"
)

// Flag defaults: where the projected token volume of deploy/agent.yaml puts the token, and a
// loopback port clear of the controller's 7443 (the agent runs in the host network).
const (
	defaultTokenFile     = "/var/run/secrets/kuport/token"
	defaultInspectListen = "127.0.0.1:7400"
	// defaultCAFile is where deploy/agent.yaml mounts the ConfigMap kuport-controller-ca.
	defaultCAFile = "/var/run/kuport/ca/ca.crt"
	// defaultEpochFile lives on the host's /run, a tmpfs: a reboot clears it together with the
	// kernel state it fences.
	defaultEpochFile = "/run/kuport/epoch"
)

func main() {
	// The agent process's pace of collection: agent.SetSteadyPace, PacedApply, FreeOSMemory.
	agent.SetSteadyPace()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// errUsage marks a command line that cannot run; it exits with status 2.
var errUsage = errors.New("usage error")

func run(args []string, stdout, stderr io.Writer) int {
	err := runErr(args, stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		_, _ = fmt.Fprintf(stderr, "kuport-agent: %v\n", err)
		return 2
	default:
		_, _ = fmt.Fprintf(stderr, "kuport-agent: %v\n", err)
		return 1
	}
}

func runErr(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "probe" {
		return probe(args[1:], stdout, stderr)
	}
	fs := pflag.NewFlagSet("kuport-agent", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	nodeName := fs.String("node-name", "", "name of this node (required to run)")
	underlay := fs.String("underlay-interface", "", "underlay interface (default: the device of the IPv4 default route)")
	targets := fs.StringArray("controller", nil, "controller gRPC target, unix:///path or host:port; repeat for replicas, tried in turn (required to run)")
	reportInterval := fs.Duration("report-interval", agent.DefaultReportInterval, "period of reports to the controller")
	resyncInterval := fs.Duration("resync-interval", agent.DefaultResyncInterval,
		"period of full resyncs of the applied program against the kernel, which repair what others changed (a change the kernel notifies is repaired at once)")
	caFile := fs.String("controller-ca-file", defaultCAFile, "PEM CA certificate(s) the controller's serving certificate must chain to, read on every connect")
	serverName := fs.String("controller-server-name", "", "name the controller's certificate must be valid for (default: the host of each target; required with unix targets)")
	tokenFile := fs.String("token-file", defaultTokenFile, `file holding the agent's token (audience "kuport", bound to its Pod), read on every connect; "" sends none`)
	epochFile := fs.String("epoch-file", defaultEpochFile, `file keeping the highest program epoch applied on this node across agent restarts (fencing); "" keeps it in memory`)
	inspectListen := fs.String("inspect-listen", defaultInspectListen, `host:port serving the applied program to grpcurl (keep it on loopback); "" serves nothing`)
	logLevel := fs.String("log-level", "info", "log level: trace, debug, info, warn or error")
	showVersion := fs.Bool("version", false, "print the version and exit")
	wait := fs.Bool("wait", false, "with cleanup: after cleaning up, wait for SIGTERM or SIGINT before exiting")
	fs.Usage = func() {
		_, _ = fmt.Fprintln(stderr, "usage: kuport-agent --node-name N --controller TARGET [flags]\n       kuport-agent cleanup [--wait] [--log-level L]\n"+
			"       kuport-agent probe [--address A] [--service S] [--timeout D]\n       kuport-agent --version")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if *showVersion {
		_, _ = fmt.Fprintln(stdout, version.String("kuport-agent"))
		return nil
	}
	level := hclog.LevelFromString(*logLevel)
	if level == hclog.NoLevel {
		return fmt.Errorf("%w: unknown --log-level %q", errUsage, *logLevel)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "kuport-agent", Level: level, Output: stderr})

	cleanup := false
	switch rest := fs.Args(); {
	case len(rest) == 1 && rest[0] == "cleanup":
		cleanup = true
	case len(rest) > 0:
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, rest)
	case *nodeName == "":
		return fmt.Errorf("%w: --node-name is required", errUsage)
	case len(*targets) == 0:
		return fmt.Errorf("%w: --controller is required", errUsage)
	case *reportInterval <= 0:
		return fmt.Errorf("%w: --report-interval must be positive", errUsage)
	case *resyncInterval <= 0:
		return fmt.Errorf("%w: --resync-interval must be positive", errUsage)
	}

	dp, closeKernel, err := openDatapath(log)
	if err != nil {
		return err
	}
	defer closeKernel()
	if cleanup {
		if err := dp.Cleanup(); err != nil {
			return fmt.Errorf("cleanup: %w", err)
		}
		log.Info("removed everything kuport made on this node")
		if *wait {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			<-ctx.Done()
		}
		return nil
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	drift, err := dp.Watch(ctx)
	if err != nil {
		return err
	}
	a, err := agent.New(agent.Config{
		NodeName:       *nodeName,
		AgentVersion:   version.Version,
		Underlay:       *underlay,
		Targets:        *targets,
		CAFile:         *caFile,
		ServerName:     *serverName,
		Datapath:       agent.PacedApply(dp),
		EntryErrors:    datapath.EntryErrors,
		Validate:       dp.Validate,
		Applied:        agent.FreeOSMemory,
		Log:            log,
		ReportInterval: *reportInterval,
		ResyncInterval: *resyncInterval,
		Drift:          drift,
		TokenFile:      *tokenFile,
		EpochFile:      *epochFile,
	})
	if err != nil {
		return err
	}
	if *inspectListen != "" {
		lis, err := net.Listen("tcp", *inspectListen)
		if err != nil {
			return fmt.Errorf("--inspect-listen: %w", err)
		}
		srv := a.InspectionServer()
		go func() {
			if err := srv.Serve(lis); err != nil {
				log.Error("inspection server stopped", "error", err)
			}
		}()
		defer srv.Stop()
		log.Info("inspection listening", "address", *inspectListen)
	}
	log.Info("starting", "version", version.Version, "commit", version.Commit, "node", *nodeName, "controllers", *targets, "underlay", *underlay)
	if err := a.Run(ctx); err != nil {
		return err
	}
	log.Info("stopping; kernel state left in place")
	return nil
}

// openDatapath opens the kernel handles of the agent's own network namespace and returns
// the datapath over them with a function that closes them.
func openDatapath(log hclog.Logger) (*datapath.Datapath, func(), error) {
	nft, err := nftables.New(nftables.AsLasting(), datapath.NFTSocketOption())
	if err != nil {
		return nil, nil, fmt.Errorf("open nftables: %w", err)
	}
	nl, err := netlink.NewHandle()
	if err != nil {
		_ = nft.CloseLasting()
		return nil, nil, fmt.Errorf("open netlink: %w", err)
	}
	dp := datapath.New(datapath.Config{NFT: nft, Netlink: nl, NetNS: netns.None(), Log: log.Named("datapath"),
		SweepDelay: agent.SweepDelay})
	return dp, func() {
		dp.SweepNow()
		nl.Close()
		_ = nft.CloseLasting()
	}, nil
}

// probe runs `kuport-agent probe`: one grpc.health.v1 Check; nil only on SERVING.
func probe(args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("kuport-agent probe", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	address := fs.String("address", defaultInspectListen, "gRPC target of the agent's --inspect-listen")
	service := fs.String("service", "", `health service to check: "" (the agent answers) or `+agent.ReadyService+" (connected, a program taken)")
	timeout := fs.Duration("timeout", time.Second, "deadline of the check")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("%w: probe: unexpected arguments %q", errUsage, fs.Args())
	case *timeout <= 0:
		return fmt.Errorf("%w: probe: --timeout must be positive", errUsage)
	}
	conn, err := grpc.NewClient(*address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("probe %s: %w", *address, err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: *service})
	if err != nil {
		return fmt.Errorf("probe %s service %q: %w", *address, *service, err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("probe %s service %q: %s", *address, *service, resp.GetStatus())
	}
	_, _ = fmt.Fprintf(stdout, "service %q: %s\n", *service, resp.GetStatus())
	return nil
}
