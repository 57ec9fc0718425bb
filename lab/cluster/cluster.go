// Package cluster runs the lab's real Kubernetes control plane: one etcd and one
// kube-apiserver (v1.36.3, built by lab/build-binaries.sh) on loopback in the root network
// namespace, with a generated PKI and an admin kubeconfig
// (docs/design/lab.md#a-real-api-server-built-from-the-module-proxy). No kubelet,
// controller-manager or scheduler runs: callers create Nodes, ServiceAccounts and Pod status
// themselves, and nothing is garbage collected.
//
// It owns only its state directory and the processes it starts (recorded as pid files there);
// it listens on 127.0.0.1 only and touches no interface, route or firewall state.
package cluster

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const (
	// DefaultDir is the state directory of the lab started by `make lab-up`; lab/env points
	// KUBECONFIG at DefaultDir/kubeconfig.
	DefaultDir = "/run/kuport-lab"

	// Preferred loopback ports; each falls back to a free port when taken (by a running
	// `make lab-up` lab, say), and the kubeconfig always names the port actually used.
	apiserverPort = 6443
	etcdPort      = 2379
	etcdPeerPort  = 2380

	// readyTimeout bounds the wait for /readyz; the apiserver is ready in 3–6 s here.
	readyTimeout = 60 * time.Second

	// ServiceClusterIPRange is kube-apiserver's --service-cluster-ip-range, which the
	// kubelet-backed lab's network policy controller is told too.
	ServiceClusterIPRange = "10.96.0.0/16"
	// KubernetesServiceIP is the ClusterIP of default/kubernetes, the first address of
	// ServiceClusterIPRange: in the serving certificate, since in-cluster clients dial it.
	KubernetesServiceIP = "10.96.0.1"
)

// Config says where the control plane keeps its state and finds its binaries.
type Config struct {
	// Dir is the state directory (created if missing): pki/, etcd/ data, kubeconfig,
	// <name>.log and <name>.pid per process. Usually DefaultDir or a test's temp dir.
	Dir string
	// BinDir holds etcd, kube-apiserver and kubectl (the output of lab/build-binaries.sh).
	BinDir string
	// CRDDir, if set, holds CustomResourceDefinition YAMLs (*.yaml, one or more documents
	// each) that Start creates or updates and waits for until Established.
	CRDDir string
	// Detached leaves the processes running after the caller exits (`make lab-up`): no
	// parent-death signal, a new session. Stop them with StopDir(Dir).
	Detached bool
	// ExtraArgs are added to kube-apiserver's flags (the kubelet-backed lab's egress
	// selector, say).
	ExtraArgs []string
	// Log receives progress messages; nil discards them.
	Log hclog.Logger
}

// Cluster is a running etcd + kube-apiserver pair.
type Cluster struct {
	pki        *pki
	dir        string
	kubeconfig string
	rest       *rest.Config
	clients    kubernetes.Interface
	procs      []*process // in start order: etcd, kube-apiserver
	log        hclog.Logger
	// cfg and ports are Start's, for Resume.
	cfg   Config
	ports []int

	stopOnce sync.Once
	stopErr  error
}

// Start generates the PKI, starts etcd and kube-apiserver on 127.0.0.1, writes
// Dir/kubeconfig for the admin (O=system:masters) client certificate, waits up to 60 s for
// /readyz and installs the CRDs of cfg.CRDDir. It refuses to start while a pid file in Dir
// names a live process (a lab already running there). On any error the processes it started
// are stopped again; their logs stay in Dir.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Dir == "" || cfg.BinDir == "" {
		return nil, errors.New("cluster: Dir and BinDir are required")
	}
	log := cfg.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	if pids, err := runningPids(dir); err != nil {
		return nil, err
	} else if len(pids) > 0 {
		return nil, fmt.Errorf("cluster: processes %v from %s still run; stop them with StopDir", pids, dir)
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("cluster: binary %s: %w", b, err)
		}
	}

	p, err := writePKI(filepath.Join(dir, "pki"))
	if err != nil {
		return nil, fmt.Errorf("cluster pki: %w", err)
	}
	ports, err := pickPorts(apiserverPort, etcdPort, etcdPeerPort)
	if err != nil {
		return nil, err
	}
	server := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	c := &Cluster{
		pki:        p,
		dir:        dir,
		kubeconfig: filepath.Join(dir, "kubeconfig"),
		log:        log,
		cfg:        cfg,
		ports:      ports,
		rest: &rest.Config{
			Host: server,
			TLSClientConfig: rest.TLSClientConfig{
				CAData: p.caPEM, CertData: p.adminCertPEM, KeyData: p.adminKeyPEM,
			},
		},
	}
	if c.clients, err = kubernetes.NewForConfig(c.rest); err != nil {
		return nil, fmt.Errorf("cluster client: %w", err)
	}
	if err := c.writeKubeconfig(server, p); err != nil {
		return nil, err
	}

	if err := c.start(ctx, cfg, p, ports); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context, cfg Config, p *pki, ports []int) error {
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[2])
	etcd, err := startProcess(c.dir, "etcd", filepath.Join(cfg.BinDir, "etcd"), []string{
		"--name=lab",
		"--data-dir=" + filepath.Join(c.dir, "etcd"),
		"--listen-client-urls=" + etcdURL,
		"--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=lab=" + peerURL,
		"--log-level=warn",
	}, cfg.Detached)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, etcd)
	c.log.Debug("etcd started", "pid", etcd.pid, "url", etcdURL)

	apiserver, err := startProcess(c.dir, "kube-apiserver", filepath.Join(cfg.BinDir, "kube-apiserver"), append(apiserverArgs(c.dir, p, etcdURL, ports[0]), cfg.ExtraArgs...), cfg.Detached)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, apiserver)
	c.log.Debug("kube-apiserver started", "pid", apiserver.pid, "url", c.rest.Host)

	if err := c.waitReady(ctx); err != nil {
		return err
	}
	c.log.Info("control plane ready", "server", c.rest.Host, "kubeconfig", c.kubeconfig)
	if cfg.CRDDir != "" {
		if err := c.installCRDs(ctx, cfg.CRDDir); err != nil {
			return err
		}
	}
	return nil
}

// apiserverArgs are the kube-apiserver v1.36 flags for a loopback-only lab: RBAC with the
// admin in system:masters, service-account tokens signed by the lab key, and no endpoint
// reconciler (it rejects a loopback advertise address).
func apiserverArgs(dir string, p *pki, etcdURL string, port int) []string {
	return []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(dir, "pki"),
		"--tls-cert-file=" + p.servingCert,
		"--tls-private-key-file=" + p.servingKey,
		"--client-ca-file=" + p.caCert,
		"--kubelet-client-certificate=" + p.kubeletClientCert,
		"--kubelet-client-key=" + p.kubeletClientKey,
		// Node first: the kubelet-backed cluster's kubelets (system:node:<name>) read only
		// what their own pods need; RBAC for everyone else.
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + p.saPub,
		"--service-account-signing-key-file=" + p.saKey,
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}
}

// waitReady polls /readyz with the admin credentials until it answers "ok", a process exits,
// ctx ends or readyTimeout passes.
func (c *Cluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	rc := c.clients.Discovery().RESTClient()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		body, err := rc.Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		lastErr = err
		for _, p := range c.procs {
			select {
			case <-p.done:
				return fmt.Errorf("%s exited before the apiserver was ready; see %s", p.name, filepath.Join(c.dir, p.name+".log"))
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("apiserver not ready (last error: %v): %w", lastErr, ctx.Err())
		case <-tick.C:
		}
	}
}

func (c *Cluster) writeKubeconfig(server string, p *pki) error {
	return writeKubeconfig(c.kubeconfig, server, p.caPEM, "admin",
		&clientcmdapi.AuthInfo{ClientCertificateData: p.adminCertPEM, ClientKeyData: p.adminKeyPEM})
}

// WriteTokenKubeconfig writes a kubeconfig to path for this cluster that authenticates with
// token (a ServiceAccount's bearer token, say), as user. It errors if path cannot be written.
func (c *Cluster) WriteTokenKubeconfig(path, user, token string) error {
	return writeKubeconfig(path, c.rest.Host, c.rest.CAData, user, &clientcmdapi.AuthInfo{Token: token})
}

// writeKubeconfig writes a one-context kubeconfig: the lab cluster at server trusted by ca
// (PEM), as user with auth.
func writeKubeconfig(path, server string, ca []byte, user string, auth *clientcmdapi.AuthInfo) error {
	if err := clientcmd.WriteToFile(*kubeconfig(server, ca, user, auth), path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// WriteClientKubeconfig writes a kubeconfig to path that reaches the API server at server
// (an address that leads to it from where the client runs) with a client certificate for
// user cn in groups orgs, signed by the lab's CA: the identities of kubelets
// (system:node:<name> in system:nodes), kube-proxy, the controller-manager and the scheduler.
func (c *Cluster) WriteClientKubeconfig(path, server, cn string, orgs ...string) error {
	certPEM, keyPEM, err := signLeaf(c.pki.ca, c.pki.caKey, x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: orgs},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return fmt.Errorf("client cert %s: %w", cn, err)
	}
	kc := kubeconfig(server, c.pki.caPEM, cn, &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM})
	// Whatever address server names (a node's bridge to the API server, say), the
	// certificate is checked for a name it holds.
	kc.Clusters["kuport-lab"].TLSServerName = "kubernetes.default.svc"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// Server is the API server's loopback URL (https://127.0.0.1:<port>).
func (c *Cluster) Server() string { return c.rest.Host }

// PKIFile returns the path of one of the lab's PKI files: "ca.crt", "sa.key", "sa.pub".
func (c *Cluster) PKIFile(name string) string { return filepath.Join(c.dir, "pki", name) }

// kubeconfig is a one-context kubeconfig: the lab cluster at server trusted by ca (PEM), as
// user with auth.
func kubeconfig(server string, ca []byte, user string, auth *clientcmdapi.AuthInfo) *clientcmdapi.Config {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kuport-lab"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	kc.AuthInfos[user] = auth
	kc.Contexts["kuport-lab"] = &clientcmdapi.Context{Cluster: "kuport-lab", AuthInfo: user}
	kc.CurrentContext = "kuport-lab"
	return kc
}

// Kubeconfig returns the path of the admin kubeconfig, Dir/kubeconfig.
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// RESTConfig returns a fresh copy of the admin client configuration.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.rest) }

// Pids returns the pids of the processes Start launched (etcd, kube-apiserver), in start
// order, whether or not they still run.
func (c *Cluster) Pids() []int {
	pids := make([]int, 0, len(c.procs))
	for _, p := range c.procs {
		pids = append(pids, p.pid)
	}
	return pids
}

// Stop terminates kube-apiserver then etcd (SIGTERM, SIGKILL after 5 s), waits for them and
// removes their pid files; everything else in Dir stays. It is idempotent and returns the
// first run's error on later calls.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.stopErr = c.terminate()
		c.log.Debug("control plane stopped", "dir", c.dir, "error", c.stopErr)
	})
	return c.stopErr
}

// Halt stops kube-apiserver and etcd as Stop does, keeping etcd's data, for a control plane
// outage that Resume ends.
func (c *Cluster) Halt() error { return c.terminate() }

// Resume starts etcd and kube-apiserver again after Halt, on the same ports and data, and
// waits for /readyz as Start does (the CRDs are in etcd already).
func (c *Cluster) Resume(ctx context.Context) error {
	c.procs = nil
	cfg := c.cfg
	cfg.CRDDir = ""
	return c.start(ctx, cfg, c.pki, c.ports)
}

// terminate stops the processes in reverse start order and removes their pid files.
func (c *Cluster) terminate() error {
	var errs []error
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		if err := terminate(p.pid, p.done); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", p.name, err))
			continue
		}
		if err := os.Remove(p.pidFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove pid file: %w", err))
		}
	}
	return errors.Join(errs...)
}

// pickPorts returns, for each preferred loopback port, that port if it is free and otherwise
// a free one chosen by the kernel; all distinct.
func pickPorts(preferred ...int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, len(preferred))
	for _, want := range preferred {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(want)))
		if err != nil {
			if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
				return nil, fmt.Errorf("find a free port: %w", err)
			}
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
