package kubelab

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// apiSocket is the root-namespace end of the API server bridge.
func (c *Cluster) apiSocket() string { return filepath.Join(labKubeDir, "apiserver.sock") }

// nodeServer is the API server's URL as seen from inside a node namespace.
func nodeServer() string { return "https://" + APIAddr + ":" + strconv.Itoa(APIPort) }

// startControlPlane starts the unix-socket bridge to the API server, kube-controller-manager
// and kube-scheduler in the root namespace, and writes the default/kubernetes endpoints the
// lab's API server (--endpoint-reconciler-type=none) does not.
func (c *Cluster) startControlPlane(ctx context.Context) error {
	u, err := url.Parse(c.cfg.API.Server())
	if err != nil {
		return fmt.Errorf("kubelab: API server URL: %w", err)
	}
	bridge, err := c.cfg.Net.Start("", filepath.Join(c.logDir(), "socat-apiserver.log"), "socat",
		"UNIX-LISTEN:"+c.apiSocket()+",fork,unlink-early,mode=600", "TCP:"+u.Host)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, bridge)

	kcmConfig := filepath.Join(labKubeDir, "kube-controller-manager.kubeconfig")
	if err := c.cfg.API.WriteClientKubeconfig(kcmConfig, c.cfg.API.Server(), "system:kube-controller-manager"); err != nil {
		return err
	}
	kcm, err := c.cfg.Net.Start("", filepath.Join(c.logDir(), "kube-controller-manager.log"),
		filepath.Join(c.cfg.K8sBin, "kube-controller-manager"),
		"--kubeconfig="+kcmConfig,
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+c.cfg.API.PKIFile("sa.key"),
		"--root-ca-file="+c.cfg.API.PKIFile("ca.crt"),
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
		// Pod CIDRs are the lab's (netlab), not allocated; no cloud.
		"--allocate-node-cidrs=false", "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller",
		"--v=1")
	if err != nil {
		return err
	}
	c.procs = append(c.procs, kcm)

	schedConfig := filepath.Join(labKubeDir, "kube-scheduler.kubeconfig")
	if err := c.cfg.API.WriteClientKubeconfig(schedConfig, c.cfg.API.Server(), "system:kube-scheduler"); err != nil {
		return err
	}
	sched, err := c.cfg.Net.Start("", filepath.Join(c.logDir(), "kube-scheduler.log"),
		filepath.Join(c.cfg.K8sBin, "kube-scheduler"),
		"--kubeconfig="+schedConfig,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0", "--v=1")
	if err != nil {
		return err
	}
	c.procs = append(c.procs, sched)
	return c.writeKubernetesEndpoints(ctx)
}

// writeKubernetesEndpoints points default/kubernetes at APIAddr:APIPort, which every node
// bridges to the API server.
func (c *Cluster) writeKubernetesEndpoints(ctx context.Context) error {
	labels := map[string]string{discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: "kuport-lab"}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "kubernetes", Namespace: "default", Labels: labels},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{APIAddr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(APIPort)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	// The Service appears once the API server's bootstrap controller has run.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := c.kube.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("kubelab: default/kubernetes Service: %w", err)
	}
	if _, err := c.kube.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubelab: default/kubernetes EndpointSlice: %w", err)
	}
	return nil
}

// waitNodesReady waits until every node reports Ready.
func (c *Cluster) waitNodesReady(ctx context.Context) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, nodeReadyTimeout, true, func(ctx context.Context) (bool, error) {
		for _, n := range c.nodes {
			node, err := c.kube.CoreV1().Nodes().Get(ctx, n.spec.Name, metav1.GetOptions{})
			if err != nil {
				last = fmt.Sprintf("node %s: %v", n.spec.Name, err)
				return false, nil
			}
			if !nodeReady(node) {
				last = "node " + n.spec.Name + " not Ready"
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("kubelab: nodes not ready (%s; see %s): %w", last, c.logDir(), err)
	}
	return nil
}

func nodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// deleteWorkloads deletes every workload and pod outside the lab's own kube-system
// components, then the rest, and waits until no pod is left, so that the kubelets run each
// pod's CNI DEL and unmount its volumes before they stop.
func (c *Cluster) deleteWorkloads(ctx context.Context) error {
	nss, err := c.kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("kubelab: list namespaces: %w", err)
	}
	for _, ns := range nss.Items {
		name := ns.Name
		_ = c.kube.AppsV1().DaemonSets(name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = c.kube.AppsV1().Deployments(name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = c.kube.AppsV1().ReplicaSets(name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = c.kube.BatchV1().Jobs(name).DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}, metav1.ListOptions{})
		_ = c.kube.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(1))}, metav1.ListOptions{})
	}
	err = wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := c.kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		return len(pods.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("kubelab: pods still present at teardown: %w", err)
	}
	return nil
}
