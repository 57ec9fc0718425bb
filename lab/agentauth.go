package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"kuport.wlz.li/kuport/controller/agents"
)

// agentTokenLifetime is how long a lab agent's token is valid: the controller reviews it on
// every connect, and the lab mints a fresh one only when it starts the agent, so it outlives
// any lab session (a kubelet would rotate a projected token hourly instead).
const agentTokenLifetime = 24 * time.Hour

// AgentPod is the name of the Pod object standing for node's agent, in the agents'
// ServiceAccount namespace: "kuport-agent-<node>".
func AgentPod(node string) string { return "kuport-agent-" + node }

// createAgentIdentities writes what a kubelet would give the agent DaemonSet: the agents'
// ServiceAccount (agents.DefaultAgentServiceAccount, no RBAC) and, per node, a running Pod of
// it bound to the node, to which each agent's token is bound (MintAgentToken).
func (l *Lab) createAgentIdentities(ctx context.Context) error {
	ns, name, err := agents.ParseServiceAccount(agents.DefaultAgentServiceAccount)
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	if err := l.Cluster.EnsureNamespace(ctx, ns, nil); err != nil {
		return fmt.Errorf("lab: agent namespace: %w", err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, AutomountServiceAccountToken: ptr.To(false)}
	if _, err := l.Kube.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("lab: agent service account: %w", err)
	}
	for _, n := range l.Net.Nodes() {
		if err := l.AddAgentIdentity(ctx, n.Name); err != nil {
			return err
		}
	}
	return nil
}

// AddAgentIdentity writes the running Pod AgentPod(node) of the agents' ServiceAccount,
// bound to node, as the kubelet of node would run the agent DaemonSet's pod there; tokens
// for node's agent are bound to it (MintAgentToken). The ServiceAccount exists once Up has
// run; bench/fanout adds identities for nodes the lab has no namespace for.
func (l *Lab) AddAgentIdentity(ctx context.Context, node string) error {
	ns, name, err := agents.ParseServiceAccount(agents.DefaultAgentServiceAccount)
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: AgentPod(node), Labels: map[string]string{"app.kubernetes.io/name": "kuport-agent"}},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			ServiceAccountName:           name,
			AutomountServiceAccountToken: ptr.To(false),
			HostNetwork:                  true,
			Containers:                   []corev1.Container{{Name: "agent", Image: "kuport-lab"}},
		},
	}
	created, err := l.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("lab: agent pod on %s: %w", node, err)
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning}
	if _, err := l.Kube.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("lab: agent pod on %s status: %w", node, err)
	}
	return nil
}

// AgentTokenFile is where node's agent reads its token (--token-file), in the lab dir.
func (l *Lab) AgentTokenFile(node string) string {
	return filepath.Join(l.opt.Dir, "tokens", node)
}

// MintAgentToken writes a fresh token for node's agent to AgentTokenFile(node): a
// TokenRequest for the agents' ServiceAccount, audience agents.TokenAudience, bound to
// AgentPod(node), as the projected volume of deploy/agent.yaml would hold.
func (l *Lab) MintAgentToken(ctx context.Context, node string) error {
	ns, name, err := agents.ParseServiceAccount(agents.DefaultAgentServiceAccount)
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	pod, err := l.Kube.CoreV1().Pods(ns).Get(ctx, AgentPod(node), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("lab: agent pod on %s: %w", node, err)
	}
	tr, err := l.Kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		Audiences:         []string{agents.TokenAudience},
		ExpirationSeconds: ptr.To(int64(agentTokenLifetime / time.Second)),
		BoundObjectRef:    &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("lab: token for the agent on %s: %w", node, err)
	}
	path := l.AgentTokenFile(node)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	if err := os.WriteFile(path, []byte(tr.Status.Token), 0o600); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	return nil
}
