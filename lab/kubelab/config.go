package kubelab

import (
	"fmt"
	"path/filepath"
)

// containerdConfig is containerd 1.6's config for one node
// (docs/design/lab.md#a-real-node-kubelet-and-containerd): its own root, state and socket;
// restrict_oom_score_adj, since runc cannot lower oom_score_adj without CAP_SYS_RESOURCE; pod
// network namespaces under its state dir; the lab's pause image.
func (n *node) containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, filepath.Join(n.state(), "containerd"), filepath.Join(n.dir(), "containerd-state"), n.containerdSocket(),
		filepath.Join(n.state(), "opt"), n.c.cfg.PauseImage, cniBinDir(), filepath.Join(n.dir(), "cni"))
}

// kubeletConfig is the kubelet's config for one node: cgroup v1 allowed, cgroupfs under the
// node's own cgroupRoot, imported images never collected, eviction thresholds low enough for
// a shared machine (docs/design/lab.md#a-real-node-kubelet-and-containerd).
func (n *node) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
failSwapOn: false
containerRuntimeEndpoint: unix://%s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
clusterDNS: [%s]
clusterDomain: cluster.local
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %q}
authorization: {mode: AlwaysAllow}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
podLogsDir: %q
serializeImagePulls: false
registerNode: true
`, n.cgroupName(), n.containerdSocket(), DNSServiceIP, n.c.cfg.API.PKIFile("ca.crt"), filepath.Join(n.state(), "pod-logs"))
}

// KubeProxyConfig runs kube-proxy in nftables mode as node, with kubeconfig, leaving
// conntrack sysctls as they are (0 = do not set). bench/control runs it so too.
func KubeProxyConfig(kubeconfig, node string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: %q
hostnameOverride: %s
clusterCIDR: %s
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
`, kubeconfig, node, ClusterCIDR)
}
