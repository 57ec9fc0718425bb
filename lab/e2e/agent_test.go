package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/lab"
	"kuport.wlz.li/kuport/lab/netlab"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// programService dials the lab controller's inspection listener (replica 0).
func programService(t *testing.T) kuportv1.ProgramServiceClient {
	t.Helper()
	return replicaService(t, 0)
}

// waitAgent waits until node's agent is connected with agentVersion ("" for any) and has
// acknowledged its current program.
func waitAgent(t *testing.T, c kuportv1.ProgramServiceClient, node, agentVersion string) {
	t.Helper()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		nodes, err := c.ListNodes(ctx, &kuportv1.ListNodesRequest{})
		if err != nil {
			return false
		}
		for _, n := range nodes.GetNodes() {
			if n.GetNode() == node {
				return n.GetConnected() && (agentVersion == "" || n.GetAgentVersion() == agentVersion) &&
					n.GetAckedVersion() == n.GetProgramVersion() && n.GetAckedVersion() > 0
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond, "agent on %s (version %q) did not reconnect and acknowledge", node, agentVersion)
}

// assertLossless waits (at most timeout) for each named stream to end and asserts it sent
// something, lost nothing and kept its TCP connection.
func assertLossless(t *testing.T, timeout time.Duration, streams map[string]*netlab.Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for name, s := range streams {
		res, err := s.Wait(ctx)
		require.NoError(t, err)
		t.Logf("%s stream: %s", name, res)
		assert.Positive(t, res.Sent, name)
		assert.Zero(t, res.Lost(), "%s stream lost packets: %s", name, res)
		assert.Empty(t, res.Error, "%s stream", name)
	}
}

// TestPrivilegedE2EAgent shows the agent keeps traffic flowing: streams through a cross-node
// mapping lose nothing while agents are killed, restarted and upgraded, and a UDP flow
// follows its mapping's endpoint within a second.
func TestPrivilegedE2EAgent(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	svc := programService(t)
	webB := lab.PodB

	t.Run("streams lose nothing while every agent is killed, restarted and upgraded", func(t *testing.T) {
		mapTo(t, l, "stream-tcp", "public", corev1.ProtocolTCP, 3000, 0, 3000, webB)
		mapTo(t, l, "stream-udp", "public", corev1.ProtocolUDP, 27015, 0, 27015, webB)
		nodes := []string{"edge-a", "worker-b"}
		before := map[string]string{}
		for _, n := range nodes {
			before[n] = kernelState(t, l, n)
		}
		// The upgrade is another build of the agent, stamped with another version.
		upgrade := filepath.Join(t.TempDir(), "kuport-agent")
		out, err := exec.Command("go", "build", "-ldflags", "-X kuport.wlz.li/kuport/internal/version.Version=e2e-upgrade", "-o", upgrade,
			"kuport.wlz.li/kuport/cmd/kuport-agent").CombinedOutput()
		require.NoError(t, err, "%s", out)

		const interval = 20 * time.Millisecond
		tcp, err := l.Net.StartStream("tcp", lab.PublicAddr+":3000", interval, 20*time.Second)
		require.NoError(t, err)
		udp, err := l.Net.StartStream("udp", lab.PublicAddr+":27015", interval, 20*time.Second)
		require.NoError(t, err)
		for _, n := range nodes {
			require.NoError(t, l.StopAgent(n, true))
			require.NoError(t, l.StartAgent(n))
			waitAgent(t, svc, n, "")
		}
		for _, n := range nodes {
			require.NoError(t, l.StopAgent(n, false))
			require.NoError(t, l.StartAgentBinary(n, upgrade))
			waitAgent(t, svc, n, "e2e-upgrade")
		}
		assertLossless(t, time.Minute, map[string]*netlab.Stream{"tcp": tcp, "udp": udp})
		for _, n := range nodes {
			assert.Equal(t, before[n], kernelState(t, l, n), "kernel state on %s changed across agent restarts", n)
		}
	})

	t.Run("a UDP flow follows its mapping's endpoint within a second", func(t *testing.T) {
		first := lab.Pod{Namespace: lab.DemoNamespace, Name: "udp-1", Node: "worker-b", IP: "10.244.18.71"}
		second := lab.Pod{Namespace: lab.DemoNamespace, Name: "udp-2", Node: "worker-b", IP: "10.244.18.72"}
		third := lab.Pod{Namespace: lab.DemoNamespace, Name: "udp-3", Node: "edge-a", IP: "10.244.17.73"}
		for _, p := range []lab.Pod{first, second, third} {
			require.NoError(t, l.AddPod(ctx, p))
			serve(t, l, p, corev1.ProtocolUDP, 27200)
		}
		mapTo(t, l, "udp-follow", "public", corev1.ProtocolUDP, 27200, 0, 27200, first)
		s, err := l.Net.StartStream("udp", lab.PublicAddr+":27200", 20*time.Millisecond, 15*time.Second)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return sawClient(t, l, first, corev1.ProtocolUDP, 27200) > 0 },
			5*time.Second, 20*time.Millisecond, "the stream does not reach %s", first.Name)
		// The old pods keep running: only the endpoint moves, first on the pod's node, then
		// to the accepting node, so each node's stale flow must go.
		for _, to := range []lab.Pod{second, third} {
			require.NoError(t, l.SetEndpoints(ctx, lab.DemoNamespace, "udp-follow", "app", corev1.ProtocolUDP, 27200,
				lab.Backend{Pod: to, Ready: true}))
			moved := time.Now()
			require.Eventually(t, func() bool { return sawClient(t, l, to, corev1.ProtocolUDP, 27200) > 0 },
				5*time.Second, 10*time.Millisecond, "the stream never reached %s", to.Name)
			took := time.Since(moved)
			t.Logf("the flow reached %s on %s %s after the endpoint moved", to.Name, to.Node, took)
			assert.Less(t, took, time.Second, "the flow took %s to reach %s", took, to.Name)
		}
		res, err := s.Wait(ctx)
		require.NoError(t, err)
		t.Logf("udp stream: %s", res)
		assert.Greater(t, res.Received, res.Sent/2, "the stream must keep being answered: %s", res)
	})
}

// TestPrivilegedE2EDriftRepaired (docs/design/software.md#the-program): what someone else
// removes of kuport's on a node (its table, its pref 101 rule, its link) is put back within
// 2 s, by the agent's watch of its own kernel objects: the lab's agents resync only every
// minute. Traffic through a cross-node mapping answers again within those 2 s.
func TestPrivilegedE2EDriftRepaired(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	mapTo(t, l, "repair", "public", corev1.ProtocolTCP, 3000, 0, 3000, lab.PodB)
	assertAnswers(t, l, 3000)
	for _, damage := range []struct{ node, what string }{
		{"edge-a", "nft delete table inet kuport"},
		{"worker-b", "ip rule del pref 101"},
		{"edge-a", "ip link del " + linkOnEdgeA},
		{"worker-b", "ip link del " + linkOnWorkerB},
	} {
		_, err := l.Net.Exec(ctx, damage.node, strings.Fields(damage.what)...)
		require.NoError(t, err, damage.what)
		start := time.Now()
		require.Eventually(t, func() bool {
			r, err := l.Net.Probe(ctx, "tcp", lab.PublicAddr+":3000", 200*time.Millisecond)
			return err == nil && r.PodSaw == lab.ClientAddr && r.ReplyFrom == lab.PublicAddr+":3000"
		}, 2*time.Second, 50*time.Millisecond, "%s on %s: traffic not back within 2 s", damage.what, damage.node)
		t.Logf("%s on %s: answering again after %s", damage.what, damage.node, time.Since(start).Round(10*time.Millisecond))
	}
}

// TestPrivilegedE2ELateInterface: a class interface that a node does not have yet is
// programmed anyway (nft matches by name); the mapping says NodeNotReady naming the missing
// interface until the agent reports it, then turns True with no new program pushed.
func TestPrivilegedE2ELateInterface(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	svc := programService(t)
	late := lab.DemoClass("late", v1alpha1.ReturnPathVxlan)
	late.Spec.Nodes["edge-a"] = v1alpha1.ClassNode{Interfaces: []string{"enp1s0", "enp9s0"}}
	require.NoError(t, l.ApplyClass(ctx, late))
	createMapping(t, l, "late", "late", corev1.ProtocolTCP, 3000, 0, 3000, lab.PodA)
	waitCondition(t, l, lab.DemoNamespace, "late", v1alpha1.ConditionProgrammed, "False:"+v1alpha1.ReasonNodeNotReady, 20*time.Second)
	pm, err := l.GetPortMap(ctx, lab.DemoNamespace, "late")
	require.NoError(t, err)
	assert.Contains(t, meta.FindStatusCondition(pm.Status.Conditions, v1alpha1.ConditionProgrammed).Message, "interface enp9s0 not present")
	require.Eventually(t, func() bool {
		table, err := l.NftTable(ctx, "edge-a")
		return err == nil && strings.Contains(table, `"enp9s0" . tcp . 3000 `)
	}, 10*time.Second, 100*time.Millisecond, "the rule for the missing interface is not in edge-a's kernel")
	assertAnswers(t, l, 3000)
	before, err := svc.GetProgram(ctx, &kuportv1.GetProgramRequest{Node: "edge-a"})
	require.NoError(t, err)

	for _, args := range [][]string{
		{"ip", "link", "add", "enp9s0", "type", "veth", "peer", "name", "enp9s0-peer"}, // no dummy module here
		{"ip", "addr", "add", "192.0.2.99/32", "dev", "enp9s0"},
		{"ip", "link", "set", "enp9s0", "up"},
	} {
		_, err := l.Net.Exec(ctx, "edge-a", args...)
		require.NoError(t, err)
	}
	waitCondition(t, l, lab.DemoNamespace, "late", v1alpha1.ConditionProgrammed, "True", 20*time.Second)
	after, err := svc.GetProgram(ctx, &kuportv1.GetProgramRequest{Node: "edge-a"})
	require.NoError(t, err)
	assert.Equal(t, before.GetProgram().GetVersion(), after.GetProgram().GetVersion(), "no new program was needed")
	cls, err := l.GetClass(ctx, "late")
	require.NoError(t, err)
	require.Len(t, cls.Status.Nodes, 1)
	assert.True(t, cls.Status.Nodes[0].Ready, cls.Status.Nodes[0].Message)
	assert.Equal(t, "192.0.2.99", cls.Status.Nodes[0].Addresses["enp9s0"])
}
