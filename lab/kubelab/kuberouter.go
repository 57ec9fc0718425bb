package kubelab

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"kuport.wlz.li/kuport/lab/cluster"
)

// Flannel enforces no NetworkPolicy, so the cluster runs a policy engine beside it, as
// Flannel-plus-policy clusters do (docs/design/cni.md#enforcing-networkpolicy): kube-router's
// network policy controller alone, with its routing and service proxy off, as its
// daemonset/kube-router-firewall-daemonset.yaml runs it, as a plain process in every node
// namespace like flanneld. It filters traffic to and from the node's pods in iptables'
// filter table (iptables-nft here) with ipsets of the policies' peers.

const (
	// kubeRouterUser is kube-router's client certificate name, bound to kubeRouterRole.
	kubeRouterUser = "kuport-lab:kube-router"
	kubeRouterRole = "kube-router"
	// kubeRouterReadyTimeout bounds the wait for kube-router's first sync.
	kubeRouterReadyTimeout = 60 * time.Second
)

// KubeRouterChains are the prefixes of the chains kube-router's network policy controller
// makes in the filter table (cloudnativelabs/kube-router pkg/controllers/netpol): its hooks
// into INPUT, FORWARD and OUTPUT, and a chain per local pod and per policy, whose names
// change with every sync.
var KubeRouterChains = []string{"KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-"}

// kubeRouterSets are the prefixes of the ipsets it makes: the policies' sources and
// destinations.
var kubeRouterSets = []string{"KUBE-SRC-", "KUBE-DST-"}

// kubeRouterRBAC grants kube-router what its network policy controller's informers read
// (cloudnativelabs/kube-router daemonset/generic-kuberouter.yaml's ClusterRole, without the
// leases and services/status its load balancer allocator writes), bound to kubeRouterUser.
func (c *Cluster) kubeRouterRBAC(ctx context.Context) error {
	read := []string{"get", "list", "watch"}
	return c.grant(ctx, kubeRouterRole, kubeRouterUser,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"namespaces", "pods", "services", "nodes", "endpoints"}, Verbs: read},
		rbacv1.PolicyRule{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: read},
		rbacv1.PolicyRule{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
	)
}

// startKubeRouter starts kube-router's network policy controller in the registered node's
// namespace and returns once its first sync has hooked its chain into FORWARD.
func (n *node) startKubeRouter(ctx context.Context) error {
	kubeconfig := filepath.Join(n.dir(), "kube-router.kubeconfig")
	if err := n.c.cfg.API.WriteClientKubeconfig(kubeconfig, nodeServer(), kubeRouterUser); err != nil {
		return err
	}
	p, err := n.c.cfg.Net.Start(n.spec.Name, n.logFile("kube-router"),
		filepath.Join(n.c.cfg.K8sBin, "kube-router"),
		"--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
		"--kubeconfig="+kubeconfig,
		"--hostname-override="+n.spec.Name,
		"--service-cluster-ip-range="+cluster.ServiceClusterIPRange,
		// Nothing reads its health port; without it kube-router listens on no port.
		"--health-port=0")
	if err != nil {
		return err
	}
	n.procs = append(n.procs, p)
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, kubeRouterReadyTimeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-p.Done():
			return false, errors.New("kube-router exited")
		default:
		}
		out, err := n.c.cfg.Net.Exec(ctx, n.spec.Name, "iptables", "-S", "FORWARD")
		return err == nil && strings.Contains(out, "-j "+KubeRouterChains[0]+"FORWARD"), nil
	})
	if err != nil {
		return fmt.Errorf("kube-router not ready (see %s): %w", n.logFile("kube-router"), err)
	}
	return nil
}

// removeKubeRouter deletes the chains and ipsets kube-router leaves in the node namespace
// once it has stopped, restoring the filter table without its chains and the rules that
// jump to them.
func (n *node) removeKubeRouter(ctx context.Context) error {
	chains := strings.Join(KubeRouterChains, "|")
	sets := "^(" + strings.Join(kubeRouterSets, "|") + ")"
	script := "if iptables -S " + KubeRouterChains[0] + "FORWARD >/dev/null 2>&1; then " +
		"iptables-save -t filter | grep -v -E '" + chains + "' | iptables-restore; fi; " +
		"for s in $(ipset list -n | grep -E '" + sets + "'); do ipset destroy \"$s\"; done"
	_, err := n.c.cfg.Net.Exec(ctx, n.spec.Name, "sh", "-c", script)
	return err
}
