// Package lab runs the whole of kuport on one machine with no cluster (docs/design/lab.md): a
// real etcd and kube-apiserver on loopback (lab/cluster), network namespaces for a client,
// the accepting node edge-a, the worker worker-b and pods, with a real WireGuard mesh and the
// CNI emulation (lab/netlab), the controller replicas in the root namespace (they elect a
// leader on a Lease in kuport-system) and one agent per node namespace reaching them over
// their unix sockets, over TLS with the certificate the replicas generate (controllertls.go).
// Node, Pod, Service and EndpointSlice objects are written by hand, as kwok does, since no
// kubelet or controller-manager runs; so are the agents' Pods, to which the lab binds each
// agent's token (agentauth.go), as a kubelet's projected volume would.
//
// `make demo`, `make lab-up` and the end-to-end tests all start the lab through Up.
package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"kuport.wlz.li/kuport/controller/leader"
	"kuport.wlz.li/kuport/lab/cluster"
	"kuport.wlz.li/kuport/lab/netlab"
)

const (
	// AgentResyncInterval is the lab agents' --resync-interval: long, so that a repair the
	// e2e suite sees within seconds is the agent's watch of its kernel objects at work, not
	// its periodic resync (the backstop).
	AgentResyncInterval = time.Minute
	// ControllerAddr is controller replica 0's loopback listener for grpcurl
	// (ReplicaAddr(0)); replica 0 is the first leader.
	ControllerAddr = "127.0.0.1:7443"
)

// ReplicaSocket is controller replica i's unix socket, relative to the lab dir
// ("controller-0.sock", ...): a filesystem path crosses network namespaces, so the agents in
// node namespaces reach it.
func ReplicaSocket(i int) string { return fmt.Sprintf("controller-%d.sock", i) }

// ReplicaAddr is controller replica i's loopback listener: 127.0.0.1:7443 for replica 0,
// 7444 for replica 1, and so on.
func ReplicaAddr(i int) string { return fmt.Sprintf("127.0.0.1:%d", 7443+i) }

// Options says where the lab keeps its state and finds its binaries.
type Options struct {
	// Dir is the lab's state dir (DefaultDir for `make lab-up`): kubeconfig, the controller
	// socket, certificates, etcd data and every process's log.
	Dir string
	// K8sBin holds etcd, kube-apiserver and kubectl (output of lab/build-binaries.sh).
	K8sBin string
	// Bin holds kuport-controller, kuport-agent and kuport-lab (`make build`).
	Bin string
	// CRDDir holds the CRD YAMLs to install (deploy/crds).
	CRDDir string
	// RBACFile holds the ServiceAccounts and RBAC to install (deploy/rbac.yaml); controller
	// replicas run as its kuport-controller ServiceAccount.
	RBACFile string
	// ControllerReplicas is how many controller replicas run (1 when zero); every agent is
	// given all of them as --controller targets.
	ControllerReplicas int
	// Log receives progress; nil discards.
	Log hclog.Logger
	// Kubelet makes `kuport-lab up` (and run) start the kubelet-backed cluster instead
	// (lab/kubelab) and install kuport on it from the image tarballs in Images.
	Kubelet bool
	Images  string
	// HostFirewall makes `kuport-lab up` (and demo) load a Talos-like block-mode firewall and
	// a netbird-like mark-and-drop pair into every node (netlab.AddHostFirewall).
	HostFirewall bool
	// CNI is the namespace lab's CNI profile (netlab.CNIs; "" is cilium): the pod devices
	// and the CNI's own masquerade and mark rules on every node.
	CNI netlab.CNI
	// APIServerArgs are added to kube-apiserver's flags (bench/control's wider
	// --service-node-port-range, say).
	APIServerArgs []string
	// ControllerArgs are added to every controller replica's flags (bench/fanout's --pprof).
	ControllerArgs []string
	// Empty empties Dir (but for the logs netlab has just cleared) once the lab lock is held:
	// a benchmark's run starts from nothing, and a run waiting for the lock leaves the dir
	// of the one holding it alone.
	Empty bool
}

// Lab is a running lab.
type Lab struct {
	opt     Options
	log     hclog.Logger
	Cluster *cluster.Cluster
	Net     *netlab.Net
	Kube    kubernetes.Interface
	Dyn     dynamic.Interface

	mu          sync.Mutex
	controllers []*netlab.Proc // by replica; nil while stopped
	agents      map[string]*netlab.Proc
	closeOnce   sync.Once
	closeErr    error
}

// Up starts everything and returns once the controller and every agent run. On error
// whatever it started is torn down again.
func Up(ctx context.Context, opt Options) (*Lab, error) {
	if opt.Log == nil {
		opt.Log = hclog.NewNullLogger()
	}
	for _, p := range []*string{&opt.Dir, &opt.K8sBin, &opt.Bin, &opt.CRDDir, &opt.RBACFile} {
		if *p == "" {
			return nil, errors.New("lab: Dir, K8sBin, Bin, CRDDir and RBACFile are required")
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, fmt.Errorf("lab: %w", err)
		}
		*p = abs
	}
	if opt.ControllerReplicas <= 0 {
		opt.ControllerReplicas = 1
	}
	l := &Lab{opt: opt, log: opt.Log, agents: map[string]*netlab.Proc{}, controllers: make([]*netlab.Proc, opt.ControllerReplicas)}
	if err := l.up(ctx); err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

func (l *Lab) up(ctx context.Context) error {
	if err := os.MkdirAll(l.logDir(), 0o755); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	var err error
	// Build first: it waits for the machine-wide lab lock, so a lab already running is
	// never torn down by the clean-up below.
	l.log.Info("building the lab network")
	l.Net, err = netlab.Build(ctx, netlab.Config{
		Log: l.log.Named("net"), Dir: l.logDir(), ToolBin: filepath.Join(l.opt.Bin, "kuport-lab"), CNI: l.opt.CNI,
	})
	if err != nil {
		return err
	}
	// Leftovers of a crashed run: stop its processes before reusing the dir.
	if err := cluster.StopDir(l.opt.Dir); err != nil {
		return fmt.Errorf("lab: stop leftovers: %w", err)
	}
	if l.opt.Empty {
		if err := emptyBut(l.opt.Dir, l.logDir()); err != nil {
			return fmt.Errorf("lab: %w", err)
		}
	}
	// Every lab starts from an empty cluster: objects of an earlier run would collide. Its
	// nodes are fresh too, as after a reboot, so the agents' fencing epochs go with it: the
	// new cluster's Lease counts from zero again.
	for _, dir := range []string{l.etcdDir(), l.epochDir()} {
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("lab: %w", err)
		}
	}
	l.log.Info("proving the WireGuard mesh's drop and the CNI emulation bite")
	if err := l.Net.SelfCheck(ctx); err != nil {
		return fmt.Errorf("lab self-check: %w", err)
	}
	l.log.Info("starting etcd and kube-apiserver")
	l.Cluster, err = cluster.Start(ctx, cluster.Config{
		Dir: l.opt.Dir, BinDir: l.opt.K8sBin, CRDDir: l.opt.CRDDir, ExtraArgs: l.opt.APIServerArgs, Log: l.log.Named("cluster"),
	})
	if err != nil {
		return err
	}
	if l.Kube, err = kubernetes.NewForConfig(l.Cluster.RESTConfig()); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	if l.Dyn, err = dynamic.NewForConfig(l.Cluster.RESTConfig()); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	for _, n := range l.Net.Nodes() {
		if err := l.CreateNode(ctx, n.Name, n.UnderlayAddr.Addr().String()); err != nil {
			return err
		}
	}
	if err := l.Cluster.EnsureNamespace(ctx, leader.DefaultNamespace, nil); err != nil {
		return fmt.Errorf("lab: lease namespace: %w", err)
	}
	if err := l.applyRBAC(ctx); err != nil {
		return err
	}
	if err := l.createAgentIdentities(ctx); err != nil {
		return err
	}
	// Replica 0 starts first, so it creates the Lease and leads.
	for i := range l.controllers {
		if err := l.StartReplica(i); err != nil {
			return err
		}
	}
	for _, n := range l.Net.Nodes() {
		if err := l.StartAgent(n.Name); err != nil {
			return err
		}
	}
	return nil
}

// emptyBut removes everything in dir but keep.
func emptyBut(dir, keep string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if p := filepath.Join(dir, e.Name()); p != keep {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *Lab) logDir() string { return filepath.Join(l.opt.Dir, "logs") }

// ReplicaLog is the log file of controller replica i, in the lab dir.
func (l *Lab) ReplicaLog(i int) string {
	return filepath.Join(l.logDir(), fmt.Sprintf("controller-%d.log", i))
}

// etcdDir is where lab/cluster keeps etcd's data.
func (l *Lab) etcdDir() string { return filepath.Join(l.opt.Dir, "etcd") }

// CreateNode writes the Node object name, Ready, with internalIP (a lab node's mesh
// address) as InternalIP, as a kubelet would. An existing Node is left as it is.
func (l *Lab) CreateNode(ctx context.Context, name, internalIP string) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	created, err := l.Kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("lab: node %s: %w", name, err)
	}
	created.Status = corev1.NodeStatus{
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now()}},
		Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: internalIP}},
	}
	if _, err := l.Kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("lab: node %s status: %w", name, err)
	}
	return nil
}

// StartController starts controller replica 0 (StartReplica).
func (l *Lab) StartController() error { return l.StartReplica(0) }

// StopController stops controller replica 0 (StopReplica).
func (l *Lab) StopController(kill bool) error { return l.StopReplica(0, kill) }

// StartReplica starts controller replica i (0 <= i < Options.ControllerReplicas) in the root
// namespace, listening on ReplicaSocket(i) and ReplicaAddr(i) (gRPC), ReplicaHTTPSAddr(i) and
// ReplicaHTTPAddr(i) (the dashboard and metrics), with the default leader
// election flags (Lease kuport-system/kuport-controller, 15 s, 10 s, 2 s) and TLS flags (the
// generated Secret, see ControllerCAFile), as the kuport-controller ServiceAccount with a
// freshly minted token (ControllerKubeconfig).
func (l *Lab) StartReplica(i int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i < 0 || i >= len(l.controllers) {
		return fmt.Errorf("lab: no controller replica %d", i)
	}
	if l.controllers[i] != nil {
		return fmt.Errorf("lab: controller replica %d already running", i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.writeControllerKubeconfig(ctx); err != nil {
		return err
	}
	args := append([]string{filepath.Join(l.opt.Bin, "kuport-controller"),
		"--kubeconfig", l.ControllerKubeconfig(),
		"--grpc-listen", "unix://" + filepath.Join(l.opt.Dir, ReplicaSocket(i)),
		"--grpc-listen", ReplicaAddr(i),
		"--http-listen", ReplicaHTTPSAddr(i),
		"--http-loopback-listen", ReplicaHTTPAddr(i),
		"--log-level", "debug"}, l.opt.ControllerArgs...)
	p, err := l.Net.Start("", l.ReplicaLog(i), args...)
	if err != nil {
		return err
	}
	l.controllers[i] = p
	return nil
}

// ReplicaPid is the pid of controller replica i, 0 while it is stopped.
func (l *Lab) ReplicaPid(i int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i < 0 || i >= len(l.controllers) || l.controllers[i] == nil {
		return 0
	}
	return l.controllers[i].Pid()
}

// ReplicaDone is closed once controller replica i's process has exited (nil while it is
// stopped).
func (l *Lab) ReplicaDone(i int) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i < 0 || i >= len(l.controllers) || l.controllers[i] == nil {
		return nil
	}
	return l.controllers[i].Done()
}

// AgentPid is the pid of node's agent, 0 while it is stopped.
func (l *Lab) AgentPid(node string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.agents[node]; p != nil {
		return p.Pid()
	}
	return 0
}

// StopReplica stops controller replica i (SIGTERM: a leader stops serving and releases the
// Lease); kill sends SIGKILL instead. A stopped or unknown replica is a no-op.
func (l *Lab) StopReplica(i int, kill bool) error {
	l.mu.Lock()
	var p *netlab.Proc
	if i >= 0 && i < len(l.controllers) {
		p, l.controllers[i] = l.controllers[i], nil
	}
	l.mu.Unlock()
	return stop(p, kill)
}

// StartAgent starts kuport-agent inside the node's namespace, as
// docs/design/lab.md#what-runs-where pins it, with a freshly minted token (AgentTokenFile),
// the controller's CA as published now (ControllerCAFile; it waits up to 30 s for a replica
// to publish it) and its inspection server on 127.0.0.1:7400 there.
func (l *Lab) StartAgent(node string) error {
	return l.StartAgentBinary(node, filepath.Join(l.opt.Bin, "kuport-agent"))
}

// StartAgentBinary is StartAgent with another kuport-agent binary (an upgrade), and extra
// flags after the lab's, which they override (a flag given twice takes the last value).
func (l *Lab) StartAgentBinary(node, binary string, extra ...string) error {
	spec, ok := l.Net.Node(node)
	if !ok {
		return fmt.Errorf("lab: no node %s", node)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.agents[node] != nil {
		return fmt.Errorf("lab: agent on %s already running", node)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.MintAgentToken(ctx, node); err != nil {
		return err
	}
	if err := l.writeControllerCA(ctx); err != nil {
		return err
	}
	args := []string{binary, "--node-name", node, "--underlay-interface", spec.UnderlayIface, "--token-file", l.AgentTokenFile(node),
		"--epoch-file", l.AgentEpochFile(node),
		"--controller-ca-file", filepath.Join(l.opt.Dir, ControllerCAFile), "--controller-server-name", ControllerServerName}
	for i := range l.controllers {
		args = append(args, "--controller", "unix://"+filepath.Join(l.opt.Dir, ReplicaSocket(i)))
	}
	args = append(args, "--report-interval", "2s", "--resync-interval", AgentResyncInterval.String(), "--log-level", "debug")
	p, err := l.Net.Start(node, l.AgentLog(node), append(args, extra...)...)
	if err != nil {
		return err
	}
	l.agents[node] = p
	return nil
}

// AgentLog is the log file of node's agent, in the lab dir; a restarted agent appends to it.
func (l *Lab) AgentLog(node string) string {
	return filepath.Join(l.logDir(), "agent-"+node+".log")
}

// Bin is the directory holding the lab's kuport binaries (Options.Bin).
func (l *Lab) Bin() string { return l.opt.Bin }

// AgentEpochFile is where node's agent keeps its fencing epoch across restarts: one file per
// node, since the lab's agents share one filesystem.
func (l *Lab) AgentEpochFile(node string) string {
	return filepath.Join(l.epochDir(), node)
}

func (l *Lab) epochDir() string { return filepath.Join(l.opt.Dir, "epoch") }

// StopAgent stops the node's agent (SIGTERM: it leaves its kernel state in place); kill
// sends SIGKILL instead.
func (l *Lab) StopAgent(node string, kill bool) error {
	l.mu.Lock()
	p := l.agents[node]
	delete(l.agents, node)
	l.mu.Unlock()
	return stop(p, kill)
}

func stop(p *netlab.Proc, kill bool) error {
	if p == nil {
		return nil
	}
	if kill {
		p.Kill()
		return nil
	}
	return p.Stop()
}

// NftTable returns `nft list table inet kuport` on a node, or "" when the table is absent.
func (l *Lab) NftTable(ctx context.Context, node string) (string, error) {
	out, err := l.Net.Exec(ctx, node, "nft", "list", "table", "inet", "kuport")
	if err != nil {
		if strings.Contains(err.Error(), "No such file or directory") {
			return "", nil
		}
		return "", err
	}
	return out, nil
}

// Close stops the agents, the controller, the API server and removes every namespace.
// Idempotent; kernel state inside the lab's namespaces goes with them.
func (l *Lab) Close() error {
	l.closeOnce.Do(func() {
		var errs []error
		l.mu.Lock()
		agents := l.agents
		l.agents = map[string]*netlab.Proc{}
		l.mu.Unlock()
		for _, p := range agents {
			errs = append(errs, stop(p, false))
		}
		for i := range l.controllers {
			errs = append(errs, l.StopReplica(i, false))
		}
		if l.Cluster != nil {
			errs = append(errs, l.Cluster.Stop())
		}
		// Only a lab that got the lab lock (built its Net) owns the state dir: one that gave
		// up waiting must not remove the running lab's etcd data.
		if l.Net != nil {
			errs = append(errs, os.RemoveAll(l.etcdDir()), l.Net.Close())
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}
