package kubelab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// The cluster's CNI is Flannel, run for real (docs/design/cni.md#running-flannel-for-real):
// flanneld on every node with the kube subnet manager, vxlan on UDP 4789, its nftables mode
// and --ip-masq, as Talos configures it (siderolabs/talos
// internal/app/machined/pkg/controllers/k8s/internal/k8stemplates/flannel.go), over the mesh
// interface; pods join through Flannel's CNI plugin, which hands the bridge plugin the node's
// subnet from flanneld's subnet file. flanneld runs as a plain process in the node namespace,
// as kube-proxy does here, rather than as Talos's DaemonSet: the lab has no registry for its
// image.

// flannelNetConf is Talos's net-conf.json for a cluster with one IPv4 pod network and no
// KubeSpan (no MTU: flanneld derives it from the mesh interface, wt0's 1420 less vxlan's 50).
var flannelNetConf = fmt.Sprintf(`{
  "Network": %q,
  "EnableNFTables": true,
  "Backend": {"Type": "vxlan", "Port": 4789}
}
`, ClusterCIDR)

const (
	// flannelUser is flanneld's client certificate name, bound to flannelRole.
	flannelUser = "kuport-lab:flanneld"
	flannelRole = "flannel"
	// flannelVxlan is the device flanneld makes: flannel.<VNI>, VNI 1 by default.
	flannelVxlan = "flannel.1"
	// flannelBridge is the bridge Flannel's CNI plugin delegates to (the bridge plugin's
	// default name).
	flannelBridge = "cni0"
	// flannelReadyTimeout bounds the wait for flanneld's subnet file.
	flannelReadyTimeout = 60 * time.Second
)

// flannelTables are the tables flanneld's nftables mode makes
// (flannel-io/flannel pkg/trafficmngr/nftables/nftables.go).
var flannelTables = []string{"ip flannel-ipv4", "ip6 flannel-ipv6"}

// flannelRBAC grants flanneld what kube-flannel's ClusterRole grants
// (flannel-io/flannel chart/kube-flannel/templates/rbac.yaml), bound to flannelUser.
func (c *Cluster) flannelRBAC(ctx context.Context) error {
	err := c.grant(ctx, flannelRole, flannelUser,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods", "nodes", "namespaces"}, Verbs: []string{"get", "list", "watch"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
	)
	if err != nil {
		return err
	}
	return os.WriteFile(c.flannelNetConfPath(), []byte(flannelNetConf), 0o644)
}

// grant creates the ClusterRole name with rules and binds it to user.
func (c *Cluster) grant(ctx context.Context, name, user string, rules ...rbacv1.PolicyRule) error {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := c.kube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubelab: %s ClusterRole: %w", name, err)
	}
	if _, err := c.kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubelab: %s ClusterRoleBinding: %w", name, err)
	}
	return nil
}

func (c *Cluster) flannelNetConfPath() string {
	return filepath.Join(labKubeDir, "flannel-net-conf.json")
}

// cniBinDir is containerd's CNI plugin directory: the Debian plugins (bridge, host-local,
// portmap, loopback) and Flannel's plugin side by side, as links, since containerd 1.6
// reads plugins from one directory.
func cniBinDir() string { return filepath.Join(labKubeDir, "cni-bin") }

// linkCNIPlugins fills cniBinDir.
func (c *Cluster) linkCNIPlugins() error {
	if err := os.MkdirAll(cniBinDir(), 0o755); err != nil {
		return err
	}
	plugins, err := filepath.Glob(filepath.Join(debianCNIDir, "*"))
	if err != nil {
		return err
	}
	plugins = append(plugins, filepath.Join(c.cfg.K8sBin, "flannel"))
	for _, p := range plugins {
		if err := os.Symlink(p, filepath.Join(cniBinDir(), filepath.Base(p))); err != nil {
			return fmt.Errorf("kubelab: CNI plugin %s: %w", p, err)
		}
	}
	return nil
}

// debianCNIDir holds the containernetworking-plugins package's plugins (`make deps`).
const debianCNIDir = "/usr/lib/cni"

func (n *node) flannelSubnetFile() string { return filepath.Join(n.dir(), "flannel", "subnet.env") }

// cniConfig is Talos's Flannel conflist (cni-conf.json) with the node's own paths: every
// lab node shares the host's filesystem, so flanneld's subnet file, the plugin's scratch
// directory and host-local's leases are per node rather than Flannel's fixed defaults.
func (n *node) cniConfig() string {
	return fmt.Sprintf(`{
  "name": "cbr0",
  "cniVersion": "0.4.0",
  "plugins": [
    {
      "type": "flannel",
      "subnetFile": %q,
      "dataDir": %q,
      "ipam": {"dataDir": %q},
      "delegate": {
        "hairpinMode": true,
        "isDefaultGateway": true
      }
    },
    {
      "type": "portmap",
      "capabilities": {"portMappings": true}
    }
  ]
}
`, n.flannelSubnetFile(), filepath.Join(n.dir(), "flannel-cni"), filepath.Join(n.dir(), "ipam"))
}

// startFlannel gives the registered node its pod CIDR (the lab's, as nodeipam would) and
// starts flanneld there, returning once flanneld has written its subnet file.
func (n *node) startFlannel(ctx context.Context) error {
	cidr := n.spec.PodCIDR.Masked().String()
	patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q]}}`, cidr, cidr)
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, nodeReadyTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := n.c.kube.CoreV1().Nodes().Patch(ctx, n.spec.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil // the kubelet has not registered yet
		}
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("pod CIDR (see %s): %w", n.logFile("kubelet"), err)
	}
	kubeconfig := filepath.Join(n.dir(), "flanneld.kubeconfig")
	if err := n.c.cfg.API.WriteClientKubeconfig(kubeconfig, nodeServer(), flannelUser); err != nil {
		return err
	}
	p, err := n.c.cfg.Net.Start(n.spec.Name, n.logFile("flanneld"), "env", "NODE_NAME="+n.spec.Name,
		filepath.Join(n.c.cfg.K8sBin, "flanneld"),
		"--ip-masq", "--kube-subnet-mgr",
		"--kubeconfig-file="+kubeconfig,
		"--iface="+n.spec.UnderlayIface,
		"--net-config-path="+n.c.flannelNetConfPath(),
		"--subnet-file="+n.flannelSubnetFile())
	if err != nil {
		return err
	}
	n.procs = append(n.procs, p)
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, flannelReadyTimeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-p.Done():
			return false, errors.New("flanneld exited")
		default:
		}
		b, err := os.ReadFile(n.flannelSubnetFile())
		return err == nil && strings.Contains(string(b), "FLANNEL_SUBNET="+n.spec.PodGateway().String()), nil
	})
	if err != nil {
		return fmt.Errorf("flanneld not ready (see %s): %w", n.logFile("flanneld"), err)
	}
	return nil
}

// removeFlannel deletes what flanneld and the bridge plugin leave in the node namespace
// once they have stopped: flanneld's tables, its vxlan device and the pods' bridge.
func (n *node) removeFlannel(ctx context.Context) error {
	var errs []error
	for _, t := range flannelTables {
		if _, err := n.c.cfg.Net.Exec(ctx, n.spec.Name, "sh", "-c", "nft list table "+t+" >/dev/null 2>&1 && nft delete table "+t+" || true"); err != nil {
			errs = append(errs, err)
		}
	}
	for _, dev := range []string{flannelVxlan, flannelBridge} {
		if _, err := n.c.cfg.Net.Exec(ctx, n.spec.Name, "sh", "-c", "! ip link show "+dev+" >/dev/null 2>&1 || ip link delete "+dev); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// podNetworkManifest runs the sandbox image on every node, so that Flannel's CNI plugin has
// made every node's cni0 before anything reads the nodes' state, as on a cluster whose nodes
// have all run pods: the bridge plugin creates cni0 at a node's first pod and never removes
// it, which would otherwise show as a change wherever a rollout put a node's first pod.
const podNetworkManifest = `apiVersion: apps/v1
kind: DaemonSet
metadata: {name: pod-network, namespace: kube-system}
spec:
  selector: {matchLabels: {app: pod-network}}
  template:
    metadata: {labels: {app: pod-network}}
    spec:
      automountServiceAccountToken: false
      tolerations: [{operator: Exists}]
      containers:
        - {name: pause, image: %s, imagePullPolicy: Never}
`

// startPodNetwork applies podNetworkManifest and waits until its pod runs on every node.
func (c *Cluster) startPodNetwork(ctx context.Context) error {
	if _, err := c.KubectlRun(ctx, fmt.Sprintf(podNetworkManifest, c.cfg.PauseImage), "apply", "-f", "-"); err != nil {
		return err
	}
	if _, err := c.KubectlRun(ctx, "", "-n", "kube-system", "rollout", "status", "daemonset/pod-network", "--timeout=120s"); err != nil {
		return fmt.Errorf("kubelab: pods on every node's pod network: %w", err)
	}
	return nil
}
