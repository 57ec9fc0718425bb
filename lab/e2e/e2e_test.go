// Package e2e is kuport's end-to-end suite: a real kube-apiserver, real network namespaces,
// the real kernel's nftables, vxlan and policy routing, real gRPC and real traffic, all
// started through the lab (package lab). It runs only as root with KUPORT_PRIVILEGED=1
// and KUPORT_LAB_BIN naming the lab's etcd/kube-apiserver/kubectl (`make test` sets both).
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller"
	"kuport.wlz.li/kuport/lab"
	"kuport.wlz.li/kuport/lab/cluster"
	"kuport.wlz.li/kuport/lab/labtest"
	"kuport.wlz.li/kuport/lab/netlab"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// The demo class public's link devices (linkName).
var (
	linkOnEdgeA   = linkName("public", "worker-b") // kup-5e30a797
	linkOnWorkerB = linkName("public", "edge-a")   // kup-dcc4266d
)

var repoRoot = func() string { r, _ := filepath.Abs("../.."); return r }()

// startLab brings the lab up in the default state dir (so lab/env, as docs/lab.md uses it,
// points at it) with the demo's classes and pods and one controller replica.
func startLab(t *testing.T) *lab.Lab {
	t.Helper()
	return startLabReplicas(t, 1)
}

// startLabReplicas is startLab with replicas controller replicas.
func startLabReplicas(t *testing.T, replicas int) *lab.Lab {
	t.Helper()
	return startLabWith(t, replicas, netlab.CNICilium)
}

// startLabWith is startLab with replicas controller replicas and the CNI profile cni.
func startLabWith(t *testing.T, replicas int, cni netlab.CNI) *lab.Lab {
	t.Helper()
	k8sBin := labtest.K8sBin(t)
	bin := labtest.KuportBin(t)
	// The bound includes waiting for the machine-wide lab lock, which another lab may hold
	// for minutes; bringing the lab up takes well under one.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	l, err := lab.Up(ctx, lab.Options{
		Dir:      cluster.DefaultDir,
		K8sBin:   k8sBin,
		Bin:      bin,
		CRDDir:   filepath.Join(repoRoot, "deploy", "crds"),
		RBACFile: filepath.Join(repoRoot, "deploy", "rbac.yaml"),
		Log:      hclog.New(&hclog.LoggerOptions{Name: "lab", Level: hclog.Info, Output: os.Stderr}),

		ControllerReplicas: replicas,
		CNI:                cni,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, l.Close())
		assertPermitted(t, l, replicas)
	})
	require.NoError(t, l.SetupDemo(ctx))
	return l
}

// assertPermitted fails the test if the API server refused a controller replica anything:
// the replicas run as deploy/rbac.yaml's ServiceAccount, so this checks that its least
// privilege is enough.
func assertPermitted(t *testing.T, l *lab.Lab, replicas int) {
	t.Helper()
	for i := range replicas {
		log, err := os.ReadFile(l.ReplicaLog(i))
		if !assert.NoError(t, err) {
			continue
		}
		for line := range strings.Lines(string(log)) {
			assert.NotContains(t, line, "is forbidden", "controller replica %d was refused by RBAC", i)
		}
	}
}

func condition(pm *v1alpha1.PortMap, typ string) string {
	c := meta.FindStatusCondition(pm.Status.Conditions, typ)
	if c == nil || c.ObservedGeneration != pm.Generation {
		return "none"
	}
	if c.Status == metav1.ConditionTrue {
		return "True"
	}
	return "False:" + c.Reason
}

func waitCondition(t *testing.T, l *lab.Lab, ns, name, typ, want string, timeout time.Duration) {
	t.Helper()
	last := "none"
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pm, err := l.GetPortMap(ctx, ns, name)
		if err != nil {
			return false, nil
		}
		last = condition(pm, typ)
		return last == want, nil
	})
	require.NoError(t, err, "PortMap %s/%s %s: want %s, last saw %s", ns, name, typ, want, last)
}

// assertAnswers probes TCP port on the public address from the client (assertAnswersAt).
func assertAnswers(t *testing.T, l *lab.Lab, port int32) {
	t.Helper()
	assertAnswersAt(t, l, corev1.ProtocolTCP, lab.PublicAddr, port)
}

// assertAnswersAt probes addr:port from the client: the pod must see the client's address
// and the reply come from the address dialed.
func assertAnswersAt(t *testing.T, l *lab.Lab, proto corev1.Protocol, addr string, port int32) {
	t.Helper()
	podSaw, replyFrom, err := l.ProbeAddr(context.Background(), proto, addr, port, 3)
	require.NoError(t, err)
	assert.Equal(t, clientOf(addr), podSaw, "%s %s:%d: the address the pod saw", proto, addr, port)
	assert.Equal(t, net.JoinHostPort(addr, strconv.Itoa(int(port))), replyFrom, "%s %s:%d: where the reply came from", proto, addr, port)
}

// clientOf is the lab client's address of addr's family: the one it dials addr from.
func clientOf(addr string) string {
	if netip.MustParseAddr(addr).Is6() {
		return lab.ClientAddr6
	}
	return lab.ClientAddr
}

// updatePortMap reads, mutates and updates a demo PortMap, retrying while the controller's
// status writes make the read stale.
func updatePortMap(ctx context.Context, l *lab.Lab, name string, mutate func(*v1alpha1.PortMap)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := l.GetPortMap(ctx, lab.DemoNamespace, name)
		if err != nil {
			return err
		}
		mutate(cur)
		return l.UpdatePortMap(ctx, cur)
	})
}

// linkStats reads a kup-* device's rx/tx packets and tx_errors in a node's namespace.
type linkStats struct {
	Ifindex int `json:"ifindex"`
	Stats64 struct {
		RX struct {
			Packets uint64 `json:"packets"`
		} `json:"rx"`
		TX struct {
			Packets uint64 `json:"packets"`
			Errors  uint64 `json:"errors"`
		} `json:"tx"`
	} `json:"stats64"`
}

func readLink(t *testing.T, l *lab.Lab, node, dev string) (linkStats, bool) {
	t.Helper()
	out, err := l.Net.Exec(context.Background(), node, "ip", "-j", "-s", "link", "show", "dev", dev)
	if err != nil {
		return linkStats{}, false
	}
	var s []linkStats
	require.NoError(t, json.Unmarshal([]byte(out), &s))
	require.Len(t, s, 1)
	return s[0], true
}

// kernelState is what kuport owns on a node, as the kernel lists it: links named kup-*
// (index, name, mtu, VNI, underlay ends and /31 address), ip rules at prefs 101/102,
// routes in tables 201+, and the inet kuport table with handles.
func kernelState(t *testing.T, l *lab.Lab, node string) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	links, err := l.Net.Exec(ctx, node, "ip", "-o", "link", "show", "type", "vxlan")
	require.NoError(t, err)
	for _, line := range strings.Split(links, "\n") {
		// Keep index, name, flags and mtu; drop the queue state that traffic may change.
		if f := strings.Fields(line); len(f) > 4 {
			fmt.Fprintln(&b, strings.Join(f[:5], " "))
		}
	}
	details, err := l.Net.Exec(ctx, node, "ip", "-o", "-d", "link", "show", "type", "vxlan")
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`vxlan id \d+ remote \S+ local \S+`).FindAllString(details, -1) {
		fmt.Fprintln(&b, m)
	}
	addrs, err := l.Net.Exec(ctx, node, "ip", "-o", "-4", "addr", "show")
	require.NoError(t, err)
	for _, line := range strings.Split(addrs, "\n") {
		if f := strings.Fields(line); len(f) > 3 && strings.HasPrefix(f[1], "kup-") {
			fmt.Fprintln(&b, strings.Join(f[:4], " "))
		}
	}
	for _, pref := range []string{"101", "102"} {
		rules, err := l.Net.Exec(ctx, node, "ip", "rule", "show", "pref", pref)
		require.NoError(t, err)
		b.WriteString(rules)
	}
	routes, err := l.Net.Exec(ctx, node, "ip", "-4", "route", "show", "table", "all")
	require.NoError(t, err)
	for _, line := range strings.Split(routes, "\n") {
		if strings.Contains(line, "kup-") {
			fmt.Fprintln(&b, line)
		}
	}
	table, err := l.Net.Exec(ctx, node, "nft", "-a", "list", "table", "inet", "kuport")
	if err == nil {
		b.WriteString(regexp.MustCompile(`counter packets \d+ bytes \d+`).ReplaceAllString(table, "counter"))
	}
	return b.String()
}

// restartController stops the controller (SIGTERM), starts it again and waits until every
// named node's agent has reconnected and acknowledged the new controller's program.
func restartController(t *testing.T, l *lab.Lab, nodes ...string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, l.StopController(false))
	require.NoError(t, l.StartController())
	client := programService(t)
	require.Eventually(t, func() bool {
		for _, n := range nodes {
			r, err := client.GetProgram(ctx, &kuportv1.GetProgramRequest{Node: n})
			if err != nil || r.GetAckedVersion() == 0 || r.GetAckedVersion() != r.GetProgram().GetVersion() {
				return false
			}
		}
		return true
	}, 60*time.Second, 250*time.Millisecond, "agents did not acknowledge the restarted controller's programs")
}

func TestPrivilegedE2E(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()

	t.Run("demo scenarios", func(t *testing.T) {
		outcomes, err := l.RunDemo(ctx)
		require.NoError(t, err)
		require.Len(t, outcomes, 4)
		for _, o := range outcomes {
			assert.True(t, o.Pass(), o.Line()+" %v", o.Problems)
			assert.True(t, strings.HasSuffix(o.Line(), " PASS"), o.Line())
		}
	})

	remote := lab.DemoScenarios()[1]

	t.Run("remote reaches worker-b over the link", func(t *testing.T) {
		require.NoError(t, l.StartScenario(ctx, remote))
		waitCondition(t, l, lab.DemoNamespace, remote.Name, v1alpha1.ConditionProgrammed, "True", 30*time.Second)
		before, ok := readLink(t, l, "worker-b", linkOnWorkerB)
		require.True(t, ok, "worker-b has no link %s", linkOnWorkerB)
		assertAnswers(t, l, 3000)
		after, _ := readLink(t, l, "worker-b", linkOnWorkerB)
		assert.Greater(t, after.Stats64.RX.Packets, before.Stats64.RX.Packets, "worker-b's link received nothing")
		assert.Greater(t, after.Stats64.TX.Packets, before.Stats64.TX.Packets, "worker-b's link sent nothing")
		assert.Zero(t, after.Stats64.TX.Errors-before.Stats64.TX.Errors, "tx_errors rose: the pref 101 rule is not doing its job")
		log, err := l.Net.ServerLog(lab.PodB.Name, "tcp", 3000)
		require.NoError(t, err)
		assert.Contains(t, log, "saw "+lab.ClientAddr+":")
	})

	t.Run("remote over the real WireGuard mesh", func(t *testing.T) { testMesh(t, l) })

	t.Run("docs/lab.md commands against the lab", func(t *testing.T) {
		sh := func(cmd string) string { return labShell(t, "", repoRoot, cmd) }
		out := sh("kubectl get portmaps -A")
		assert.Regexp(t, `(?m)^NAMESPACE\s+NAME\s+CLASS\s+PROTOCOL\s+PORT\s+ENDPOINT\s+PROGRAMMED\s+UNANSWERED\s*$`, out)
		assert.Regexp(t, `(?m)^demo\s+remote\s+public\s+TCP\s+3000\s+10\.244\.18\.107\s+True(\s+<none>)?\s*$`, out)
		out = sh("kubectl get portmaps -A -o wide")
		assert.Regexp(t, `(?m)^NAMESPACE\s+NAME\s+CLASS\s+PROTOCOL\s+PORT\s+ENDPOINT\s+PROGRAMMED\s+UNANSWERED\s+NODE\s+ENDPOINT6\s+PUBLISHED\s*$`, out)
		assert.Regexp(t, `(?m)^demo\s+remote\s+public\s+TCP\s+3000\s+10\.244\.18\.107\s+True\s+(<none>\s+)?worker-b\s+(<none>\s+)?203\.0\.113\.9,100\.64\.93\.143\s*$`, out)
		out = sh("grpcurl -cacert /run/kuport-lab/controller-ca.crt 127.0.0.1:7443 list")
		assert.Contains(t, out, "kuport.v1.ProgramService")
		assert.Contains(t, out, "kuport.v1.AgentService")
		out = sh(`grpcurl -cacert /run/kuport-lab/controller-ca.crt -d '{"node":"edge-a"}' 127.0.0.1:7443 kuport.v1.ProgramService/GetProgram`)
		assert.Contains(t, out, `"node": "edge-a"`)
		assert.Contains(t, out, `"demo/remote/dnat/enp1s0"`)
		assert.Contains(t, out, `"name": "`+linkOnEdgeA+`"`)
		out = sh(`grpcurl -cacert /run/kuport-lab/controller-ca.crt 127.0.0.1:7443 kuport.v1.ProgramService/ListNodes`)
		assert.Contains(t, out, `"node": "worker-b"`)
		assert.Contains(t, out, `"connectedSince": "`)
		out = sh(`grpcurl -cacert /run/kuport-lab/controller-ca.crt -d '{"namespace":"demo","name":"remote"}' 127.0.0.1:7443 kuport.v1.ProgramService/GetMapping`)
		assert.Contains(t, out, `"demo/remote/dnat/enp1s0"`)
		assert.Contains(t, out, `"acked": true`)
		out = sh("ip netns exec edge-a grpcurl -plaintext 127.0.0.1:7400 list")
		assert.Contains(t, out, "kuport.v1.AgentInspectionService")
		assert.Contains(t, out, "grpc.health.v1.Health")
		out = sh("ip netns exec edge-a grpcurl -plaintext 127.0.0.1:7400 kuport.v1.AgentInspectionService/GetAppliedProgram")
		assert.Contains(t, out, `"node": "edge-a"`)
		assert.Contains(t, out, `"demo/remote/dnat/enp1s0"`)
		assert.Contains(t, out, `"applyTime": "`)
	})

	t.Run("the deploy base is accepted by the API server", func(t *testing.T) {
		// Server-side dry run validates every object against the real API; the namespace must
		// exist for its namespaced objects to be checked.
		require.NoError(t, l.Cluster.EnsureNamespace(ctx, "kuport-system", nil))
		out := labShell(t, "", repoRoot, "kubectl apply --dry-run=server -k deploy/")
		for _, obj := range []string{"clusterrole.rbac.authorization.k8s.io/kuport-controller", "role.rbac.authorization.k8s.io/kuport-controller-leader-election", "role.rbac.authorization.k8s.io/kuport-controller-agent-pods",
			"role.rbac.authorization.k8s.io/kuport-controller-serving-cert",
			"deployment.apps/kuport-controller", "daemonset.apps/kuport-agent"} {
			assert.Contains(t, string(out), obj)
		}
	})

	t.Run("bad input is refused and the other mappings keep working", func(t *testing.T) {
		reserving := lab.DemoClass("reserving", v1alpha1.ReturnPathNone)
		reserving.Spec.Ports.Reserved = []int32{3005}
		require.NoError(t, l.ApplyClass(ctx, reserving))
		t.Cleanup(func() { _ = l.DeleteClass(ctx, "reserving") })
		require.NoError(t, l.Expose(ctx, lab.DemoNamespace, "notready", "app", corev1.ProtocolTCP, 3010, lab.Backend{Pod: lab.PodA, Ready: false}))
		t.Cleanup(func() { _ = l.Unexpose(ctx, lab.DemoNamespace, "notready") })
		cases := []struct {
			name, class string
			port        int32
			svc         string
			cond, want  string
		}{
			{"noclass", "missing", 3002, "remote", v1alpha1.ConditionAccepted, "False:" + v1alpha1.ReasonClassNotFound},
			{"outofrange", "public", 1000, "remote", v1alpha1.ConditionAccepted, "False:" + v1alpha1.ReasonPortOutOfRange},
			{"reserved", "reserving", 3005, "remote", v1alpha1.ConditionAccepted, "False:" + v1alpha1.ReasonPortReserved},
			{"notready", "public", 3010, "notready", v1alpha1.ConditionProgrammed, "False:" + v1alpha1.ReasonNoReadyEndpoint},
		}
		for _, c := range cases {
			require.NoError(t, l.ApplyPortMap(ctx, &v1alpha1.PortMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: lab.DemoNamespace, Name: c.name},
				Spec: v1alpha1.PortMapSpec{ClassName: c.class, Protocol: v1alpha1.ProtocolTCP, Port: c.port,
					ServiceRef: v1alpha1.ServiceRef{Name: c.svc, Port: "app"}},
			}))
			t.Cleanup(func() { _ = l.DeletePortMap(ctx, lab.DemoNamespace, c.name) })
		}
		for _, c := range cases {
			waitCondition(t, l, lab.DemoNamespace, c.name, c.cond, c.want, 20*time.Second)
		}
		rules, err := l.RulesMentioning(ctx, `"demo/noclass/`, `"demo/outofrange/`, `"demo/reserved/`, `"demo/notready/`)
		require.NoError(t, err)
		assert.Empty(t, rules, "a refused mapping reached a kernel")
		waitCondition(t, l, lab.DemoNamespace, remote.Name, v1alpha1.ConditionProgrammed, "True", 10*time.Second)
		assertAnswers(t, l, 3000)
	})

	t.Run("two mappings to pods sharing a port on one node stay apart", func(t *testing.T) {
		webC := lab.Pod{Namespace: lab.DemoNamespace, Name: "web-c", Node: "worker-b", IP: "10.244.18.200"}
		require.NoError(t, l.AddPod(ctx, webC))
		_, err := l.Net.Serve(webC.Name, "tcp", 3000)
		require.NoError(t, err)
		require.NoError(t, l.Expose(ctx, lab.DemoNamespace, "other", "app", corev1.ProtocolTCP, 3000, lab.Backend{Pod: webC, Ready: true}))
		t.Cleanup(func() { _ = l.Unexpose(ctx, lab.DemoNamespace, "other") })
		// Port 5000 reaches web-c's port 3000 across the same link as remote's 3000 to web-b.
		require.NoError(t, l.ApplyPortMap(ctx, &v1alpha1.PortMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: lab.DemoNamespace, Name: "other"},
			Spec: v1alpha1.PortMapSpec{ClassName: "public", Protocol: v1alpha1.ProtocolTCP, Port: 5000,
				ServiceRef: v1alpha1.ServiceRef{Name: "other", Port: "app"}},
		}))
		t.Cleanup(func() { _ = l.DeletePortMap(ctx, lab.DemoNamespace, "other") })
		waitCondition(t, l, lab.DemoNamespace, "other", v1alpha1.ConditionProgrammed, "True", 20*time.Second)
		waitCondition(t, l, lab.DemoNamespace, remote.Name, v1alpha1.ConditionProgrammed, "True", 10*time.Second)

		seen := func(pod lab.Pod) int { return sawClient(t, l, pod, corev1.ProtocolTCP, 3000) }
		for _, c := range []struct {
			port       int32
			pod, other lab.Pod
		}{{5000, webC, lab.PodB}, {3000, lab.PodB, webC}} {
			before, otherBefore := seen(c.pod), seen(c.other)
			assertAnswers(t, l, c.port)
			assert.Equal(t, before+1, seen(c.pod), "port %d must reach %s", c.port, c.pod.Name)
			assert.Equal(t, otherBefore, seen(c.other), "port %d reached %s", c.port, c.other.Name)
		}
		// Gone before the next step reads the kernel.
		require.NoError(t, l.DeletePortMap(ctx, lab.DemoNamespace, "other"))
		require.NoError(t, l.WaitRulesGone(ctx, 30*time.Second, `"demo/other/`))
	})

	t.Run("a restarted controller changes nothing in the kernel", func(t *testing.T) {
		before := map[string]string{}
		for _, n := range []string{"edge-a", "worker-b"} {
			before[n] = kernelState(t, l, n)
		}
		require.Contains(t, before["edge-a"], linkOnEdgeA)
		require.Contains(t, before["worker-b"], linkOnWorkerB)
		restartController(t, l, "edge-a", "worker-b")
		for _, n := range []string{"edge-a", "worker-b"} {
			assert.Equal(t, before[n], kernelState(t, l, n), "kernel state on %s changed across a controller restart", n)
		}
		assertAnswers(t, l, 3000)
	})

	t.Run("deleting the mapping removes its rules, then the link", func(t *testing.T) {
		require.NoError(t, l.DeletePortMap(ctx, lab.DemoNamespace, remote.Name))
		require.NoError(t, l.Unexpose(ctx, lab.DemoNamespace, remote.Name))
		require.NoError(t, l.WaitRulesGone(ctx, 30*time.Second, `"demo/remote/`))
		require.Eventually(t, func() bool {
			_, onA := readLink(t, l, "edge-a", linkOnEdgeA)
			_, onB := readLink(t, l, "worker-b", linkOnWorkerB)
			return !onA && !onB
		}, 30*time.Second, 200*time.Millisecond, "the unused link is still there")
		for _, n := range []string{"edge-a", "worker-b"} {
			state := kernelState(t, l, n)
			assert.NotContains(t, state, "kup-", "node %s still holds kuport objects:\n%s", n, state)
			assert.NotContains(t, state, "fwmark", "node %s still holds ip rules:\n%s", n, state)
		}
		cls, err := l.GetClass(ctx, "public")
		require.NoError(t, err)
		require.Len(t, cls.Status.Links, 1, "the slot claim must stay")
		assert.Equal(t, "edge-a/worker-b", cls.Status.Links[0].Key)
		assert.NotNil(t, cls.Status.Links[0].UnusedSince, "an unused claim carries unusedSince")
	})

	t.Run("a node whose agent is down holds Programmed at NodeNotReady", func(t *testing.T) {
		require.NoError(t, l.StopAgent("worker-b", false))
		require.NoError(t, l.StartScenario(ctx, remote))
		waitCondition(t, l, lab.DemoNamespace, remote.Name, v1alpha1.ConditionProgrammed, "False:"+v1alpha1.ReasonNodeNotReady, 10*time.Second)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			pm, err := l.GetPortMap(ctx, lab.DemoNamespace, remote.Name)
			require.NoError(t, err)
			require.Equal(t, "False:"+v1alpha1.ReasonNodeNotReady, condition(pm, v1alpha1.ConditionProgrammed))
			time.Sleep(time.Second)
		}
		pm, err := l.GetPortMap(ctx, lab.DemoNamespace, remote.Name)
		require.NoError(t, err)
		assert.Contains(t, meta.FindStatusCondition(pm.Status.Conditions, v1alpha1.ConditionProgrammed).Message, "worker-b")
		// The Node says why: its agent's stream ended.
		events, err := l.Kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Node,involvedObject.name=worker-b,reason=" + controller.ReasonAgentDisconnected})
		require.NoError(t, err)
		assert.NotEmpty(t, events.Items, "no %s Event on Node worker-b", controller.ReasonAgentDisconnected)
		require.NoError(t, l.StartAgent("worker-b"))
		waitCondition(t, l, lab.DemoNamespace, remote.Name, v1alpha1.ConditionProgrammed, "True", 10*time.Second)
		assertAnswers(t, l, 3000)
	})

	t.Run("deleting the class removes everything it made", func(t *testing.T) {
		require.NoError(t, l.DeleteClass(ctx, "public"))
		waitCondition(t, l, lab.DemoNamespace, remote.Name, v1alpha1.ConditionAccepted, "False:"+v1alpha1.ReasonClassNotFound, 20*time.Second)
		require.Eventually(t, func() bool {
			for _, n := range []string{"edge-a", "worker-b"} {
				if strings.Contains(kernelState(t, l, n), "kup-") {
					return false
				}
			}
			return true
		}, 30*time.Second, 200*time.Millisecond, "class objects left in a kernel")
		for _, n := range []string{"edge-a", "worker-b"} {
			table, err := l.NftTable(ctx, n)
			require.NoError(t, err)
			assert.NotContains(t, table, "demo/", "node %s still has rules", n)
		}
		podSaw, replyFrom, err := l.Probe(ctx, corev1.ProtocolTCP, 3000, 1)
		require.NoError(t, err)
		assert.Equal(t, "none", podSaw)
		assert.Equal(t, "none", replyFrom)
	})
	t.Run("the founding project's classes apply unchanged and get their defaults", func(t *testing.T) {
		labShell(t, "", repoRoot, "kubectl apply -f lab/e2e/testdata/founding-classes.yaml")
		t.Cleanup(func() { _ = l.DeleteClass(ctx, "public"); _ = l.DeleteClass(ctx, "intranet") })
		public, err := l.GetClass(ctx, "public")
		require.NoError(t, err)
		assert.Equal(t, v1alpha1.ServingModeSingle, public.Spec.ServingMode)
		assert.Equal(t, v1alpha1.VxlanConfig{VNI: 4242, Port: 4790, Subnet: "169.254.77.0/24", Subnet6: "fd64:f5ac:e961::/112"},
			public.Spec.ReturnPath.Vxlan)
		intranet, err := l.GetClass(ctx, "intranet")
		require.NoError(t, err)
		assert.Equal(t, v1alpha1.ServingModeMulti, intranet.Spec.ServingMode)
		assert.Equal(t, v1alpha1.PortPolicy{Min: 1, Max: 65535}, intranet.Spec.Ports)
		assert.Equal(t, v1alpha1.VxlanConfig{VNI: 4300, Port: 4790, Subnet: "169.254.79.0/24", Subnet6: "fd64:f5ac:e961::/112"},
			intranet.Spec.ReturnPath.Vxlan)
	})

	t.Run("the API server enforces the schema and the CEL rules", func(t *testing.T) {
		pm := func(name string, port int32, end *int32) *v1alpha1.PortMap {
			return &v1alpha1.PortMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: lab.DemoNamespace, Name: name},
				Spec: v1alpha1.PortMapSpec{ClassName: "public", Protocol: v1alpha1.ProtocolUDP, Port: port, EndPort: end,
					ServiceRef: v1alpha1.ServiceRef{Name: "svc", Port: "app"}},
			}
		}
		end := int32(27000)
		err := l.ApplyPortMap(ctx, pm("backwards", 27015, &end))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "endPort must be >= port")

		end = int32(27115)
		require.NoError(t, l.ApplyPortMap(ctx, pm("games", 27015, &end)))
		t.Cleanup(func() { _ = l.DeletePortMap(ctx, lab.DemoNamespace, "games") })
		for field, mutate := range map[string]func(*v1alpha1.PortMap){
			"className is immutable": func(p *v1alpha1.PortMap) { p.Spec.ClassName = "other" },
			"protocol is immutable":  func(p *v1alpha1.PortMap) { p.Spec.Protocol = v1alpha1.ProtocolTCP },
			"port is immutable":      func(p *v1alpha1.PortMap) { p.Spec.Port = 27016 },
			"endPort is immutable":   func(p *v1alpha1.PortMap) { p.Spec.EndPort = nil },
		} {
			err := updatePortMap(ctx, l, "games", mutate)
			require.Error(t, err, field)
			assert.Contains(t, err.Error(), field)
		}
		// interfaces stays mutable, and holds interface names only.
		require.NoError(t, updatePortMap(ctx, l, "games", func(p *v1alpha1.PortMap) { p.Spec.Interfaces = []string{"wt0"} }))
		err = updatePortMap(ctx, l, "games", func(p *v1alpha1.PortMap) { p.Spec.Interfaces = []string{"eth*"} })
		require.Error(t, err)
		assert.Contains(t, err.Error(), "spec.interfaces[0]")

		for name, mutate := range map[string]func(*v1alpha1.PortMapClass){
			"spec.nodes.edge-a.interfaces[0]": func(c *v1alpha1.PortMapClass) {
				c.Spec.Nodes["edge-a"] = v1alpha1.ClassNode{Interfaces: []string{"a very long name"}}
			},
			"spec.ports.reserved[0]": func(c *v1alpha1.PortMapClass) { c.Spec.Ports.Reserved = []int32{-5} },
		} {
			c := lab.DemoClass("invalid", v1alpha1.ReturnPathNone)
			mutate(c)
			err := l.ApplyClass(ctx, c)
			require.Error(t, err, name)
			assert.Contains(t, err.Error(), name)
		}
	})
}
