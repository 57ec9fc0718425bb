package kubelab

import (
	"context"
	"fmt"
	"os/exec"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodNetExec runs a host command (curl, say) in the network namespace of a running pod, as
// the pod's own traffic: the lab's images hold no such tools. It returns the command's
// combined output, and an error when it exits non-zero.
func (c *Cluster) PodNetExec(ctx context.Context, namespace, pod string, args ...string) (string, error) {
	pid, err := c.podPid(ctx, namespace, pod)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{fmt.Sprintf("--net=/proc/%s/ns/net", pid), "--"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubelab: in pod %s/%s: %s: %w", namespace, pod, strings.Join(args, " "), err)
	}
	return string(out), nil
}

// podPid is the host pid of a running pod's first container, from its node's containerd.
func (c *Cluster) podPid(ctx context.Context, namespace, pod string) (string, error) {
	p, err := c.kube.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("kubelab: %w", err)
	}
	if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].ContainerID == "" {
		return "", fmt.Errorf("kubelab: pod %s/%s has no container yet", namespace, pod)
	}
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	for _, n := range c.nodes {
		if n.spec.Name != p.Spec.NodeName {
			continue
		}
		tasks, err := n.ctr(ctx, "tasks", "ls")
		if err != nil {
			return "", fmt.Errorf("kubelab: %w", err)
		}
		for _, line := range strings.Split(tasks, "\n") {
			// TASK PID STATUS
			if f := strings.Fields(line); len(f) == 3 && f[0] == id && f[2] == "RUNNING" {
				return f[1], nil
			}
		}
		return "", fmt.Errorf("kubelab: pod %s/%s: container %s runs no task on %s", namespace, pod, id, n.spec.Name)
	}
	return "", fmt.Errorf("kubelab: pod %s/%s: no lab node %q", namespace, pod, p.Spec.NodeName)
}
