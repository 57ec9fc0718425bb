// Package kubelab turns the lab's node namespaces into real Kubernetes nodes
// (docs/design/lab.md#a-real-node-kubelet-and-containerd): each node namespace runs
// containerd and a kubelet (entered with nsenter, so they share the node's own mount
// namespace, node.mountNamespace) and kube-proxy in nftables mode; the root namespace runs
// kube-controller-manager and kube-scheduler beside the lab's API server, and CoreDNS runs as a Deployment. The CNI is
// real Flannel (flannel.go): flanneld in each node namespace carries pod traffic between
// nodes in vxlan over the mesh (wt0) and masquerades pods' traffic leaving the cluster with
// its own nftables rules, and its CNI plugin puts pods on the cni0 bridge; the lab's mesh
// drop still applies. kube-router's network policy controller beside it enforces
// NetworkPolicy (kuberouter.go). kuport itself is then installed the way operators do, with
// `kubectl apply -k examples/install/` in an operator's checkout (Checkout).
//
// The API server stays on the root namespace's loopback: a unix socket (a filesystem path
// crosses network namespaces) bridged by socat carries every node's API traffic, reaching
// each node on APIAddr:6443, which is also the endpoint of the default/kubernetes Service
// (10.96.0.1:443 through kube-proxy) for pods.
//
// It owns the processes it starts, its state directories (Config.Dir and StateRoot), the
// cgroups named kuport-lab-<node>, and the kube-proxy and Flannel tables, Flannel's
// devices (flannel.1, cni0) and kube-router's chains and ipsets in the node namespaces.
// Close removes all of them, unmounting what the kubelets and containerd mounted.
package kubelab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/kubernetes"

	"kuport.wlz.li/kuport/lab/cluster"
	"kuport.wlz.li/kuport/lab/netlab"
)

const (
	// APIAddr is the address every node namespace holds on lo for the API server bridge:
	// kubelets and kube-proxy dial it, and it is the default/kubernetes endpoint. It lies
	// outside the service, pod and lab ranges.
	APIAddr = "10.95.0.1"
	// APIPort is the bridge's port on APIAddr.
	APIPort = 6443
	// DNSServiceIP is CoreDNS's ClusterIP, the kubelets' clusterDNS.
	DNSServiceIP = "10.96.0.10"
	// ClusterCIDR covers every node's pod CIDR.
	ClusterCIDR = "10.244.0.0/16"
	// StateRoot holds the runtimes' heavy state (images, snapshots, kubelet volumes) on disk,
	// one directory per node: /run is a small tmpfs.
	StateRoot = "/var/lib/kuport-lab"

	nodeReadyTimeout = 3 * time.Minute
)

// labKubeDir holds configs, sockets, kubeconfigs and logs. It is fixed, like the lab's
// namespace names: one lab runs on a machine at a time (netlab's lock).
var labKubeDir = filepath.Join(cluster.DefaultDir, "kube")

// Config says where the cluster keeps its state and what it runs.
type Config struct {
	Net *netlab.Net
	API *cluster.Cluster
	// K8sBin holds kubelet, kube-proxy, kube-controller-manager, kube-scheduler, flanneld,
	// Flannel's CNI plugin (flannel) and kube-router (lab/build-binaries.sh).
	K8sBin string
	// Images are image tarballs imported into every node's containerd; PauseImage names the
	// sandbox image among them and CoreDNSImage the DNS server's.
	Images       []string
	PauseImage   string
	CoreDNSImage string
	Log          hclog.Logger
}

// Cluster is a running kubelet-backed cluster.
type Cluster struct {
	cfg   Config
	log   hclog.Logger
	kube  kubernetes.Interface
	nodes []*node

	procs     []*netlab.Proc // root-namespace processes: socat bridge, controller-manager, scheduler
	proxy     *kubeletProxy
	sysctls   map[string]string
	closeOnce sync.Once
	closeErr  error
}

// Start brings up the cluster's components and returns once every node is Ready and CoreDNS
// answers. On error whatever it started is torn down again.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Net == nil || cfg.API == nil || cfg.K8sBin == "" || cfg.PauseImage == "" || cfg.CoreDNSImage == "" {
		return nil, errors.New("kubelab: Net, API, K8sBin, PauseImage and CoreDNSImage are required")
	}
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	kube, err := kubernetes.NewForConfig(cfg.API.RESTConfig())
	if err != nil {
		return nil, fmt.Errorf("kubelab: %w", err)
	}
	c := &Cluster{cfg: cfg, log: cfg.Log, kube: kube}
	if err := c.start(ctx); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	// Leftovers of a crashed run would hold mounts and cgroups under the same names.
	if err := removeLeftovers(c.log); err != nil {
		return fmt.Errorf("kubelab: remove leftovers: %w", err)
	}
	if err := markRuntimeDirs(); err != nil {
		return fmt.Errorf("kubelab: %w", err)
	}
	if err := os.RemoveAll(c.logDir()); err != nil {
		return fmt.Errorf("kubelab: %w", err)
	}
	for _, d := range []string{labKubeDir, c.logDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("kubelab: %w", err)
		}
	}
	var err error
	if c.sysctls, err = readKubeletSysctls(); err != nil {
		return err
	}
	if err := c.linkCNIPlugins(); err != nil {
		return err
	}
	if c.proxy, err = startKubeletProxy(EgressSocket, c.nodeNamespace); err != nil {
		return err
	}
	if err := c.startControlPlane(ctx); err != nil {
		return err
	}
	if err := c.flannelRBAC(ctx); err != nil {
		return err
	}
	if err := c.kubeRouterRBAC(ctx); err != nil {
		return err
	}
	for _, spec := range c.cfg.Net.Nodes() {
		c.nodes = append(c.nodes, &node{c: c, spec: spec})
	}
	// Nodes start one after another: containerd's image import and the kubelet's start both
	// use the two cores fully, so starting them together gains little and times out more.
	for _, n := range c.nodes {
		if err := n.start(ctx); err != nil {
			return fmt.Errorf("kubelab: node %s: %w", n.spec.Name, err)
		}
	}
	// flanneld reads its node's pod CIDR, which the node has once its kubelet registered it,
	// and kube-router the node's address; both run before any pod.
	for _, n := range c.nodes {
		if err := n.startFlannel(ctx); err != nil {
			return fmt.Errorf("kubelab: node %s: %w", n.spec.Name, err)
		}
		if err := n.startKubeRouter(ctx); err != nil {
			return fmt.Errorf("kubelab: node %s: %w", n.spec.Name, err)
		}
	}
	// The kubelet rewrites global sysctls when it starts
	// (docs/design/lab.md#a-real-node-kubelet-and-containerd); put them back.
	if err := writeKubeletSysctls(c.sysctls); err != nil {
		return err
	}
	if err := c.waitNodesReady(ctx); err != nil {
		return err
	}
	c.log.Info("nodes ready; starting a pod on every node and CoreDNS")
	if err := c.startPodNetwork(ctx); err != nil {
		return err
	}
	return c.startCoreDNS(ctx)
}

// nodeNamespace names the node namespace holding a kubelet's address (its wt0 address, the
// Node's InternalIP).
func (c *Cluster) nodeNamespace(host string) (string, bool) {
	for _, s := range c.cfg.Net.Nodes() {
		if s.UnderlayAddr.Addr().String() == host {
			return s.Name, true
		}
	}
	return "", false
}

// Kubeconfig is the admin kubeconfig (the API server's).
func (c *Cluster) Kubeconfig() string { return c.cfg.API.Kubeconfig() }

// Kubectl is the path of the lab's kubectl.
func (c *Cluster) Kubectl() string { return filepath.Join(c.cfg.K8sBin, "kubectl") }

// logDir outlives Close, so a failed run's logs can be read.
func (c *Cluster) logDir() string { return filepath.Join(cluster.DefaultDir, "logs", "kube") }

// Close deletes the workloads (so their network and volumes are torn down by the kubelets),
// stops every component, kills what the runtimes left, unmounts, removes the cgroups and
// state directories and restores the sysctls the kubelets changed. It is idempotent.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		if len(c.nodes) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			errs = append(errs, c.deleteWorkloads(ctx))
			cancel()
		}
		for _, n := range c.nodes {
			errs = append(errs, n.stop())
		}
		for i := len(c.procs) - 1; i >= 0; i-- {
			if err := c.procs[i].Stop(); err != nil {
				c.log.Debug("stop", "error", err)
			}
		}
		if c.proxy != nil {
			c.proxy.close()
		}
		errs = append(errs, removeLeftovers(c.log))
		if c.sysctls != nil {
			errs = append(errs, writeKubeletSysctls(c.sysctls))
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}
