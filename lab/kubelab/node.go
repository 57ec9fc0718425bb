package kubelab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"kuport.wlz.li/kuport/lab/netlab"
)

// node is one lab node namespace running containerd, a kubelet, kube-proxy, flanneld and
// kube-router.
type node struct {
	c     *Cluster
	spec  netlab.NodeSpec
	procs []*netlab.Proc // in start order
	// mounts holds the node's mount namespace (mountNamespace); nil until it is made.
	mounts *netlab.Proc
}

// dir holds the node's configs and sockets (small, on the lab dir); state its runtimes'
// heavy state (on disk).
func (n *node) dir() string   { return filepath.Join(labKubeDir, n.spec.Name) }
func (n *node) state() string { return filepath.Join(StateRoot, n.spec.Name) }

func (n *node) containerdSocket() string { return filepath.Join(n.dir(), "containerd.sock") }

// cgroupName is the node's kubelet cgroupRoot: its own, so that pods of different nodes
// never share a QoS hierarchy.
func (n *node) cgroupName() string { return "kuport-lab-" + n.spec.Name }

func (n *node) logFile(component string) string {
	return filepath.Join(n.c.logDir(), component+"-"+n.spec.Name+".log")
}

func (n *node) start(ctx context.Context) error {
	for _, d := range []string{n.dir(), n.state()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := n.apiBridge(ctx); err != nil {
		return err
	}
	if err := createCgroup(n.cgroupName()); err != nil {
		return err
	}
	if err := n.mountNamespace(ctx); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	if err := n.importImages(ctx); err != nil {
		return err
	}
	if err := n.startKubelet(); err != nil {
		return err
	}
	return n.startKubeProxy()
}

// apiBridge gives the node APIAddr on lo and a socat there that carries connections to the
// API server's unix socket in the root namespace.
func (n *node) apiBridge(ctx context.Context) error {
	if _, err := n.c.cfg.Net.Exec(ctx, n.spec.Name, "ip", "addr", "replace", APIAddr+"/32", "dev", "lo"); err != nil {
		return err
	}
	p, err := n.c.cfg.Net.Start(n.spec.Name, n.logFile("socat-apiserver"), "socat",
		"TCP-LISTEN:"+strconv.Itoa(APIPort)+",bind="+APIAddr+",fork,reuseaddr", "UNIX-CONNECT:"+n.c.apiSocket())
	if err != nil {
		return err
	}
	n.procs = append(n.procs, p)
	return nil
}

// runDir is a directory every real node has to itself, on a tmpfs, which kuport's agent
// DaemonSet mounts from the host (its fencing epoch file).
const runDir = "/run/kuport"

// mountNamespace starts a process holding the node's own mount namespace, which its
// runtimes then share (startShared): a copy of the host's, with its own tmpfs on runDir, so
// each node's agents see their node's files there, as on separate machines, and deploy/
// installs unchanged. The tmpfs lasts as long as the node, as a node's /run lasts until it
// reboots.
func (n *node) mountNamespace(ctx context.Context) error {
	// unshare's default propagation is private: the tmpfs and everything the runtimes mount
	// stay in this namespace and go with it.
	p, err := n.c.cfg.Net.StartShared(n.spec.Name, n.logFile("mounts"), "unshare", "--mount", "--",
		"sh", "-c", "mkdir -p "+runDir+" && mount -t tmpfs -o mode=0755,size=4m kuport-lab-run "+runDir+" && exec sleep infinity")
	if err != nil {
		return err
	}
	n.procs = append(n.procs, p)
	mountinfo := fmt.Sprintf("/proc/%d/mountinfo", p.Pid())
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		select {
		case <-p.Done():
			return false, errors.New("exited")
		default:
		}
		b, err := os.ReadFile(mountinfo)
		return err == nil && strings.Contains(string(b), " "+runDir+" "), nil
	})
	if err != nil {
		return fmt.Errorf("node %s: mount namespace (see %s): %w", n.spec.Name, n.logFile("mounts"), err)
	}
	n.mounts = p
	return nil
}

// startShared starts a runtime in the node's network namespace and its mount namespace.
func (n *node) startShared(component string, args ...string) (*netlab.Proc, error) {
	args = append([]string{"nsenter", fmt.Sprintf("--mount=/proc/%d/ns/mnt", n.mounts.Pid()), "--"}, args...)
	p, err := n.c.cfg.Net.StartShared(n.spec.Name, n.logFile(component), args...)
	if err != nil {
		return nil, err
	}
	n.procs = append(n.procs, p)
	return p, nil
}

func (n *node) startContainerd(ctx context.Context) error {
	conf := filepath.Join(n.dir(), "containerd.toml")
	if err := os.WriteFile(conf, []byte(n.containerdConfig()), 0o644); err != nil {
		return err
	}
	cniDir := filepath.Join(n.dir(), "cni")
	for _, d := range []string{cniDir, filepath.Dir(n.flannelSubnetFile())} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// The file name and network name are Talos's (10-flannel.conflist, cbr0).
	if err := os.WriteFile(filepath.Join(cniDir, "10-flannel.conflist"), []byte(n.cniConfig()), 0o644); err != nil {
		return err
	}
	p, err := n.startShared("containerd", "containerd", "--config", conf)
	if err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case <-p.Done():
			return false, errors.New("containerd exited")
		default:
		}
		_, err := n.ctr(ctx, "version")
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("containerd not ready (see %s): %w", n.logFile("containerd"), err)
	}
	return nil
}

// ctr runs ctr against the node's containerd in the k8s.io namespace (the CRI's).
func (n *node) ctr(ctx context.Context, args ...string) (string, error) {
	// The socket is a path: ctr reaches it from the root namespace.
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", n.containerdSocket(), "-n", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// importImage loads an image tarball into the node's containerd, as an operator's
// registry pull would make it present.
func (n *node) importImage(ctx context.Context, tarball string) error {
	if _, err := n.ctr(ctx, "images", "import", "--no-unpack=false", tarball); err != nil {
		return fmt.Errorf("import %s: %w", tarball, err)
	}
	return nil
}

func (n *node) importImages(ctx context.Context) error {
	for _, img := range n.c.cfg.Images {
		if err := n.importImage(ctx, img); err != nil {
			return err
		}
	}
	return nil
}

func (n *node) startKubelet() error {
	kubeconfig := filepath.Join(n.dir(), "kubelet.kubeconfig")
	if err := n.c.cfg.API.WriteClientKubeconfig(kubeconfig, nodeServer(), "system:node:"+n.spec.Name, "system:nodes"); err != nil {
		return err
	}
	conf := filepath.Join(n.dir(), "kubelet.yaml")
	if err := os.WriteFile(conf, []byte(n.kubeletConfig()), 0o644); err != nil {
		return err
	}
	_, err := n.startShared("kubelet", filepath.Join(n.c.cfg.K8sBin, "kubelet"),
		"--config="+conf, "--kubeconfig="+kubeconfig,
		"--root-dir="+filepath.Join(n.state(), "kubelet"),
		"--cert-dir="+filepath.Join(n.dir(), "kubelet-pki"),
		"--hostname-override="+n.spec.Name,
		"--node-ip="+n.spec.UnderlayAddr.Addr().String(),
		"--v=1")
	return err
}

func (n *node) startKubeProxy() error {
	kubeconfig := filepath.Join(n.dir(), "kube-proxy.kubeconfig")
	if err := n.c.cfg.API.WriteClientKubeconfig(kubeconfig, nodeServer(), "system:kube-proxy"); err != nil {
		return err
	}
	conf := filepath.Join(n.dir(), "kube-proxy.yaml")
	if err := os.WriteFile(conf, []byte(KubeProxyConfig(kubeconfig, n.spec.Name)), 0o644); err != nil {
		return err
	}
	_, err := n.startShared("kube-proxy", filepath.Join(n.c.cfg.K8sBin, "kube-proxy"), "--config="+conf, "--v=1")
	return err
}

// stop stops kube-router, flanneld, kube-proxy, the kubelet and containerd (in reverse
// start order) and then removes kube-proxy's tables, Flannel's tables and devices and
// kube-router's chains and ipsets, which they leave behind.
func (n *node) stop() error {
	var errs []error
	for i := len(n.procs) - 1; i >= 0; i-- {
		if err := n.procs[i].Stop(); err != nil {
			n.c.log.Debug("stop", "node", n.spec.Name, "error", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, t := range []string{"ip kube-proxy", "ip6 kube-proxy"} {
		if _, err := n.c.cfg.Net.Exec(ctx, n.spec.Name, "sh", "-c", "nft list table "+t+" >/dev/null 2>&1 && nft delete table "+t+" || true"); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, n.removeFlannel(ctx), n.removeKubeRouter(ctx))
	return errors.Join(errs...)
}
