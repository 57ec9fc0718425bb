// Command kuport-controller watches the kuport API and the objects it refers to, compiles one
// program per node and streams it to the node agents over gRPC
// (docs/design/software.md#shape).
//
//	kuport-controller [--kubeconfig PATH] [--grpc-listen ADDR]... [--link-retention 24h] [--log-level info]
//	                  [--leader-elect=true] [--lease-namespace kuport-system] [--lease-name kuport-controller]
//	                  [--lease-duration 15s] [--renew-deadline 10s] [--retry-period 2s] [--identity ID]
//	                  [--agent-auth=true] [--agent-service-account kuport-system:kuport-agent]
//	                  [--tls-cert-file PATH --tls-key-file PATH | --tls-secret kuport-controller-tls
//	                   --tls-ca-configmap kuport-controller-ca --tls-names NAME,...] [--health-listen ADDR]
//	                  [--http-listen ADDR] [--http-loopback-listen 127.0.0.1:PORT] [--pprof]
//	                  [--unanswered-reports 2] [--unanswered-window 4s]
//	                  [--return-mark-mask 0x301f] [--return-tables 27505-27631] [--return-rule-prefs 101,102]
//	kuport-controller --version
//
// --return-mark-mask, --return-tables and --return-rule-prefs place the return paths' marks,
// routing tables and ip rules on every node clear of the CNI's, a mesh's and kube-proxy's
// (compile.DefaultReturnMarking). A value the datapath cannot work with stops the controller
// with the reason; one that overlaps a known user's marks, tables or prefs is logged as a
// warning naming that user at every start (docs/operations.md).
//
// A node that forwards a mapping's requests (Counter.forwarded_in rising) and sees no reply
// (forwarded_out not rising) for --unanswered-reports consecutive reports spanning at least
// --unanswered-window makes the mapping unanswered there: a Warning Event RequestsUnanswered
// on the PortMap naming the node, the interface and the counters, kuport_mapping_unanswered 1,
// GetMapping's unanswered and the dashboard's mark, until a reply (Normal RequestsAnswered).
//
// Agent streams must carry a token of --agent-service-account bound to a Pod on the node they
// claim (audience "kuport", reviewed with a TokenReview); ProgramService then answers loopback
// clients only (package controller/agents, Server). --agent-auth=false turns both off, for
// development only.
//
// --grpc-listen is repeatable: "unix:///run/kuport/controller.sock" (the default) or
// "127.0.0.1:7443". Every gRPC listener serves TLS (package controller/servingcert), with the
// certificate and key of --tls-cert-file and --tls-key-file (cert-manager's, say) or else the
// one in the Secret --tls-secret in --lease-namespace, which the first replica generates with
// its own CA for --tls-names and whose CA it publishes in the ConfigMap --tls-ca-configmap for
// the agents; either is re-read every minute. --health-listen serves grpc.health.v1 alone in
// plaintext, for the kubelet's gRPC probes, which cannot speak TLS.
//
// --http-listen serves the dashboard (/, /state, /mapping) and Prometheus metrics
// (/metrics) over TLS with the same serving certificate, to a request whose bearer token the
// API server authenticates (TokenReview) and allows get on the path (SubjectAccessReview,
// the ClusterRole kuport-metrics-reader), both answers cached briefly (package
// controller/webauth). --http-loopback-listen serves the same in plain HTTP without
// authentication on a loopback address only, for a person's kubectl port-forward.
//
// Replicas elect a leader on a coordination.k8s.io Lease (package controller/leader): only
// the leader watches the API, compiles, writes status and serves programs; a follower
// listens but refuses agent streams and inspection calls with FAILED_PRECONDITION.
// --leader-elect=false runs a single replica that leads at once, with
// the start's unix seconds as its epoch (never mix it with elected replicas: their
// lease-derived epochs are lower, so agents would refuse them until restarted).
//
// The Go runtime's soft memory limit (GOMEMLIMIT) is 90% of the container's cgroup memory
// limit, read at the start (none without one); GOMEMLIMIT in the environment replaces it,
// AUTOMEMLIMIT=<ratio> changes the share and AUTOMEMLIMIT=off leaves the runtime's default
// (docs/sizing.md).
//
// SIGTERM or SIGINT stops it gracefully (a leader stops serving, then releases the Lease).
// Exit status: 0 after a signal, 1 on an error, including the loss of the leadership: a
// supervisor restarts the process as a follower.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"kuport.wlz.li/kuport/controller"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/apiclient"
	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/dashboard"
	"kuport.wlz.li/kuport/controller/leader"
	"kuport.wlz.li/kuport/controller/metrics"
	"kuport.wlz.li/kuport/controller/servingcert"
	"kuport.wlz.li/kuport/controller/webauth"
	"kuport.wlz.li/kuport/internal/version"
)

const defaultListen = "unix:///run/kuport/controller.sock"

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kuport-controller:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("kuport-controller", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig path; empty uses the in-cluster service account")
	var listen listFlag
	fs.Var(&listen, "grpc-listen", "gRPC listen address, repeatable: unix:///path or host:port (default "+defaultListen+")")
	retention := fs.Duration("link-retention", controller.DefaultLinkRetention, "how long an unused link slot claim is kept")
	level := fs.String("log-level", "info", "log level: trace, debug, info, warn, error")
	elect := fs.Bool("leader-elect", true, "elect a leader among replicas on a Lease; false runs one replica that leads at once")
	leaseNamespace := fs.String("lease-namespace", leader.DefaultNamespace, "namespace of the leader election Lease")
	leaseName := fs.String("lease-name", leader.DefaultName, "name of the leader election Lease")
	leaseDuration := fs.Duration("lease-duration", leader.DefaultLeaseDuration, "how long followers wait after the leader's last renewal before taking the Lease over")
	renewDeadline := fs.Duration("renew-deadline", leader.DefaultRenewDeadline, "how long the leader tries to renew before it gives up the leadership and exits (< --lease-duration)")
	retryPeriod := fs.Duration("retry-period", leader.DefaultRetryPeriod, "how often candidates try to acquire and the leader renews")
	httpListen := fs.String("http-listen", "", "HTTPS listen address (host:port) of the dashboard (/, /state, /mapping) and Prometheus metrics (/metrics), "+
		"with the gRPC listeners' serving certificate, for requests whose bearer token the API server authenticates (TokenReview) and allows get on the path (SubjectAccessReview); empty serves none")
	httpLoopback := fs.String("http-loopback-listen", "", "loopback address (127.0.0.1:port or [::1]:port) serving what --http-listen serves in plain HTTP without authentication, for kubectl port-forward; empty serves none")
	identity := fs.String("identity", "", "this replica's identity in the Lease, unique per process (default <hostname>_<pid>_<random>)")
	agentAuth := fs.Bool("agent-auth", true, "require agent tokens (TokenReview) on agent streams and serve inspection to loopback clients only; false is for development")
	agentSA := fs.String("agent-service-account", agents.DefaultAgentServiceAccount, "the agents' ServiceAccount, <namespace>:<name>, whose Pod-bound tokens (audience "+agents.TokenAudience+") prove a node")
	tlsCertFile := fs.String("tls-cert-file", "", "PEM serving certificate (chain) of the gRPC listeners, with --tls-key-file (a mounted cert-manager Secret, say), re-read every minute; empty uses --tls-secret")
	tlsKeyFile := fs.String("tls-key-file", "", "PEM private key of --tls-cert-file")
	tlsSecret := fs.String("tls-secret", servingcert.DefaultSecret, "Secret (kubernetes.io/tls) in --lease-namespace holding the serving certificate and its CA, generated when absent and reissued before it expires; without --tls-cert-file")
	tlsCAConfigMap := fs.String("tls-ca-configmap", servingcert.DefaultCAConfigMap, "ConfigMap in --lease-namespace where the CA of --tls-secret is published (key "+servingcert.CACertKey+") for the agents")
	tlsNames := fs.String("tls-names", "", "comma-separated DNS names and IP addresses of the certificate in --tls-secret (default: the Service "+servingcert.Service+"'s names in --lease-namespace and 127.0.0.1)")
	unansweredReports := fs.Int("unanswered-reports", agents.DefaultUnansweredWindow.Reports,
		"consecutive reports of a node's agent (the first being the one showing the first unanswered request) a mapping's requests must go without a reply before the mapping is unanswered on the node; see --unanswered-window")
	unansweredWindow := fs.Duration("unanswered-window", agents.DefaultUnansweredWindow.Duration,
		"the least time the --unanswered-reports reports must span before a mapping is unanswered on a node (Warning Event RequestsUnanswered, kuport_mapping_unanswered 1, GetMapping's unanswered)")
	statusQPS := fs.Float64("status-qps", controller.DefaultStatusQPS, "status writes a second to the API server, at most (client-go's token bucket)")
	statusBurst := fs.Int("status-burst", controller.DefaultStatusBurst, "status writes in a burst above --status-qps, at most")
	pprofOn := fs.Bool("pprof", false, "also serve Go's runtime profiles (net/http/pprof) under /debug/pprof/ on --http-listen (to users allowed get on those paths) and --http-loopback-listen")
	healthListen := fs.String("health-listen", "", "host:port serving grpc.health.v1 alone, in plaintext, for the kubelet's gRPC probes; empty serves none")
	def := compile.DefaultReturnMarking
	markMask := fs.String("return-mark-mask", fmt.Sprintf("%#x", def.MarkMask),
		"the packet and conntrack mark bits kuport's return marks take on every node; n bits give 2^n - 1 return paths per node (docs/operations.md)")
	returnTables := fs.String("return-tables", fmt.Sprintf("%d-%d", def.FirstTable, def.LastTable),
		"first-last: the routing tables of return paths, one per return path on a node")
	rulePrefs := fs.String("return-rule-prefs", fmt.Sprintf("%d,%d", def.LoopGuardPref, def.DivertPref),
		"loopguard,divert: the prefs of every return path's two ip rules")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if *showVersion {
		fmt.Println(version.String("kuport-controller"))
		return nil
	}
	if len(listen) == 0 {
		listen = listFlag{defaultListen}
	}
	if *unansweredReports < 1 || *unansweredWindow < 0 {
		return fmt.Errorf("--unanswered-reports must be at least 1 and --unanswered-window not negative")
	}
	if *statusQPS <= 0 || *statusBurst < 1 {
		return fmt.Errorf("--status-qps must be positive and --status-burst at least 1")
	}
	if *httpLoopback != "" {
		if err := checkLoopback(*httpLoopback); err != nil {
			return fmt.Errorf("--http-loopback-listen: %w", err)
		}
	}
	lvl := hclog.LevelFromString(*level)
	if lvl == hclog.NoLevel {
		return fmt.Errorf("unknown --log-level %q", *level)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "kuport-controller", Level: lvl, Output: os.Stderr})
	log.Info("starting", "version", version.Version, "commit", version.Commit)
	marking, err := returnMarking(*markMask, *returnTables, *rulePrefs, log)
	if err != nil {
		return err
	}
	setMemoryLimit(log, memlimit.FromCgroup)
	setGCPercent(log)

	cfg, err := restConfig(*kubeconfig)
	if err != nil {
		return err
	}
	// The status writer's limiter is the one that binds: the client's own (5 a second by
	// default) leaves room above it for the informers, Events and the Lease.
	cfg.QPS = max(cfg.QPS, float32(*statusQPS)+clientHeadroom)
	cfg.Burst = max(cfg.Burst, *statusBurst+clientHeadroom)
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	kuport, err := apiclient.NewForConfig(cfg)
	if err != nil {
		return err
	}

	if *identity == "" {
		if *identity, err = leader.DefaultIdentity(); err != nil {
			return err
		}
	}
	var auth agents.Authenticator
	if *agentAuth {
		if auth, err = agents.NewTokenReviewer(kube, *agentSA); err != nil {
			return fmt.Errorf("--agent-service-account: %w", err)
		}
	} else {
		log.Warn("agent authentication is off: any client may claim any node and inspect every program")
	}
	var webAuth *webauth.Filter
	if *httpListen != "" {
		if webAuth, err = webFilter(cfg, log.Named("http")); err != nil {
			return err
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	var loadCert func(context.Context) (*tls.Certificate, error)
	switch {
	case (*tlsCertFile == "") != (*tlsKeyFile == ""):
		return errors.New("--tls-cert-file and --tls-key-file go together")
	case *tlsCertFile != "":
		loadCert = servingcert.Files(*tlsCertFile, *tlsKeyFile)
	default:
		names := servingcert.DefaultNames(*leaseNamespace)
		if *tlsNames != "" {
			names = strings.FieldsFunc(*tlsNames, func(r rune) bool { return r == ',' || r == ' ' })
		}
		loadCert = (&servingcert.Secret{
			Client: kube, Namespace: *leaseNamespace, Name: *tlsSecret, CAConfigMap: *tlsCAConfigMap,
			Names: names, Log: log.Named("tls"),
		}).Load
	}
	certs, err := servingcert.NewReloader(ctx, loadCert, log.Named("tls"))
	if err != nil {
		return err
	}
	srv := agents.NewServer(log.Named("grpc"), auth, certs.TLSConfig())

	var wg sync.WaitGroup
	wg.Go(func() { certs.Run(ctx) })
	for _, addr := range listen {
		lis, err := agents.Listen(addr)
		if err != nil {
			cancel(err)
			break
		}
		log.Info("grpc listening", "address", addr)
		wg.Go(func() {
			if err := srv.Serve(lis); err != nil {
				cancel(err)
			}
		})
	}
	if *healthListen != "" {
		if lis, err := net.Listen("tcp", *healthListen); err != nil {
			cancel(fmt.Errorf("health listen: %w", err))
		} else {
			log.Info("health listening", "address", *healthListen)
			wg.Go(func() {
				if err := srv.ServeHealth(lis); err != nil {
					cancel(err)
				}
			})
		}
	}

	web := dashboard.New()
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler())
	mux.Handle("/", web)
	if *pprofOn {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	}
	var webServers []*http.Server
	if *httpListen != "" {
		webServers = append(webServers, &http.Server{Addr: *httpListen, Handler: webAuth.Wrap(mux), TLSConfig: certs.TLSConfig(),
			ReadHeaderTimeout: 10 * time.Second})
	}
	if *httpLoopback != "" {
		webServers = append(webServers, &http.Server{Addr: *httpLoopback, Handler: mux, ReadHeaderTimeout: 10 * time.Second})
	}
	for _, hs := range webServers {
		lis, err := net.Listen("tcp", hs.Addr)
		if err != nil {
			cancel(fmt.Errorf("http listen: %w", err))
			break
		}
		log.Info("http listening", "address", hs.Addr, "tls", hs.TLSConfig != nil)
		wg.Go(func() {
			serve := hs.Serve
			if hs.TLSConfig != nil {
				serve = func(lis net.Listener) error { return hs.ServeTLS(lis, "", "") }
			}
			if err := serve(lis); !errors.Is(err, http.ErrServerClosed) {
				cancel(err)
			}
		})
	}

	// lead is one leadership term at one epoch: the controller runs, and the server serves
	// its programs, only until ctx ends. Under leader election, an agent holding a higher
	// epoch ends it early with *leader.EpochBehind, and leader.Run calls it again with an
	// epoch above the agent's.
	lead := func(ctx context.Context, epoch uint64) error {
		defer context.AfterFunc(ctx, srv.Stop)()
		run, stopRun := context.WithCancelCause(ctx)
		defer stopRun(nil)
		var onEpochBehind func(uint64)
		if *elect {
			onEpochBehind = func(floor uint64) { stopRun(&leader.EpochBehind{Floor: floor}) }
		}
		ctl, err := controller.New(controller.Config{
			Kube: kube, Kuport: kuport, Dynamic: dyn, Epoch: epoch, Start: time.Now(),
			LinkRetention: *retention, ReturnMarking: marking, Log: log, OnEpochBehind: onEpochBehind,
			StatusQPS: float32(*statusQPS), StatusBurst: *statusBurst,
			Unanswered: agents.Window{Reports: *unansweredReports, Duration: *unansweredWindow},
		})
		if err != nil {
			return err
		}
		srv.Lead(ctl.Registry())
		metrics.SetLeader(ctl.Registry())
		defer metrics.SetLeader(nil)
		web.SetSource(&dashboard.Source{Agents: ctl.Registry(), PortMaps: ctl.PortMaps, Classes: ctl.PortMapClasses})
		defer web.SetSource(nil)
		go web.Run(run)
		err = ctl.Run(run)
		if behind := (*leader.EpochBehind)(nil); ctx.Err() == nil && errors.As(context.Cause(run), &behind) {
			return behind
		}
		return err
	}
	var leadErr error
	if *elect {
		leadErr = leader.Run(ctx, leader.Config{
			Client: kube, Namespace: *leaseNamespace, Name: *leaseName, Identity: *identity,
			LeaseDuration: *leaseDuration, RenewDeadline: *renewDeadline, RetryPeriod: *retryPeriod,
			OnNewLeader: srv.SetLeader, Log: log.Named("leader"),
		}, lead)
	} else {
		leadErr = lead(ctx, uint64(time.Now().Unix()))
	}

	log.Info("stopping", "cause", context.Cause(ctx), "error", leadErr)
	cancel(nil) // ends the certificate reloads, also after the leadership was lost
	srv.Stop()
	for _, hs := range webServers {
		_ = hs.Close()
	}
	wg.Wait()
	if leadErr != nil {
		return leadErr
	}
	if err := context.Cause(ctx); !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// clientHeadroom is the API requests a second (and of a burst) the client allows beyond the
// status writes.
const clientHeadroom = 50

// webReviewQPS and webReviewBurst limit the reviews of --http-listen's requests, on a client
// of their own: requests with ever new invalid tokens, each reviewed anew, then wait on this
// limiter instead of the informers', the Lease's and the status writes'.
const (
	webReviewQPS   = 10
	webReviewBurst = 20
)

// webFilter returns the authentication and authorization of --http-listen's requests,
// reviewing on a client of cfg with its own rate limiter.
func webFilter(cfg *rest.Config, log hclog.Logger) (*webauth.Filter, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst, cfg.RateLimiter = webReviewQPS, webReviewBurst, nil
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("review client: %w", err)
	}
	return webauth.New(kube, log)
}

// checkLoopback errors unless addr is host:port with host a loopback IP address: the
// listener serves without authentication, so it must not be reachable from the network.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address: it serves without authentication, so give 127.0.0.1:PORT or [::1]:PORT", addr)
	}
	return nil
}

// restConfig loads the kubeconfig at path, or the in-cluster config when path is empty.
func restConfig(path string) (*rest.Config, error) {
	if path == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (pass --kubeconfig outside a cluster): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}

// returnMarking reads the return-marking flags and checks the setting: an error names the
// flag and the reason; every overlap with a known user is logged as a warning.
func returnMarking(mask, tables, prefs string, log hclog.Logger) (compile.ReturnMarking, error) {
	var r compile.ReturnMarking
	var err error
	if r.MarkMask, err = compile.ParseMarkMask(mask); err != nil {
		return r, fmt.Errorf("--return-mark-mask: %w", err)
	}
	if r.FirstTable, r.LastTable, err = compile.ParseTables(tables); err != nil {
		return r, fmt.Errorf("--return-tables: %w", err)
	}
	if r.LoopGuardPref, r.DivertPref, err = compile.ParsePrefs(prefs); err != nil {
		return r, fmt.Errorf("--return-rule-prefs: %w", err)
	}
	warnings, err := r.Check()
	if err != nil {
		return r, fmt.Errorf("--return-mark-mask, --return-tables, --return-rule-prefs: %w", err)
	}
	for _, w := range warnings {
		log.Warn("the return marking overlaps a known user of marks, tables or rule prefs", "overlap", w)
	}
	return r, nil
}
