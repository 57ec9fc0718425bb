package kubelab

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// coreDNSManifest runs CoreDNS as kubeadm does, reduced: one replica answering for
// cluster.local from the API (Services, EndpointSlices) behind kube-dns at DNSServiceIP.
// Names outside the cluster get NXDOMAIN: the lab has no upstream resolver.
const coreDNSManifest = `apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
  - apiGroups: [""]
    resources: [services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 5
        loop
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      tolerations: [{operator: Exists}]
      containers:
        - name: coredns
          image: %s
          imagePullPolicy: Never
          args: ["-conf", "/etc/coredns/Corefile"]
          ports:
            - {name: dns, containerPort: 53, protocol: UDP}
            - {name: dns-tcp, containerPort: 53, protocol: TCP}
          readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 2}
          securityContext:
            allowPrivilegeEscalation: false
            capabilities: {add: [NET_BIND_SERVICE], drop: [ALL]}
            readOnlyRootFilesystem: true
          volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes: [{name: config, configMap: {name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: %s
  ports:
    - {name: dns, port: 53, protocol: UDP}
    - {name: dns-tcp, port: 53, protocol: TCP}
`

func (c *Cluster) startCoreDNS(ctx context.Context) error {
	if _, err := c.KubectlRun(ctx, fmt.Sprintf(coreDNSManifest, c.cfg.CoreDNSImage, DNSServiceIP), "apply", "-f", "-"); err != nil {
		return err
	}
	if _, err := c.KubectlRun(ctx, "", "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=120s"); err != nil {
		return fmt.Errorf("kubelab: CoreDNS: %w", err)
	}
	return nil
}

// KubectlRun runs the lab's kubectl with the admin kubeconfig, stdin fed from stdin, and
// returns its stdout; an error carries stderr.
func (c *Cluster) KubectlRun(ctx context.Context, stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Kubectl(), append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
