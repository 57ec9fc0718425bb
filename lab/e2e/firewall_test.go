package e2e

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"kuport.wlz.li/kuport/lab"
	"kuport.wlz.li/kuport/lab/netlab"
)

// TestPrivilegedE2EHostFirewall puts a block-mode firewall like Talos's (prerouting -110,
// new connections to the node's own addresses dropped unless opened) and a mesh's
// mark-and-drop pair like netbird's (-150 mark on local destinations, unmarked local
// deliveries dropped) on every node, then probes every shape from the client: Single
// same-node and cross-node, Multi through both forwarders with the pod remote from both and
// local to one, TCP and UDP. Each must answer from the dialed address and port with the
// client's address kept, while the firewall goes on dropping a new connection to a port
// nobody opened and counts none of kuport's flows among its drops, and the mesh drops none.
func TestPrivilegedE2EHostFirewall(t *testing.T) {
	l := startLab(t)
	require.NoError(t, l.ApplyClass(context.Background(), intranetClass()))
	hostFirewall(t, l)
}

// hostFirewall is TestPrivilegedE2EHostFirewall in a lab whose class intranet exists; the
// firewall stays on the nodes afterwards.
func hostFirewall(t *testing.T, l *lab.Lab) {
	ctx := context.Background()
	nodes := []string{"edge-a", "worker-b", "worker-c"}
	for _, n := range nodes {
		require.NoError(t, l.Net.AddHostFirewall(ctx, n), n)
	}
	counter := func(node, family, table, name string) uint64 {
		t.Helper()
		n, err := l.Net.NftCounter(ctx, node, family, table, name)
		require.NoError(t, err)
		return n
	}
	drops := func(node string) uint64 { return counter(node, "inet", netlab.FirewallTable, netlab.FirewallDrops) }

	t.Run("the firewall drops a new connection to a port nobody opened", func(t *testing.T) {
		before := drops("edge-a")
		podSaw, replyFrom, err := l.ProbeAddr(ctx, corev1.ProtocolTCP, lab.PublicAddr, 3299, 1)
		require.NoError(t, err)
		assert.Equal(t, "none", podSaw)
		assert.Equal(t, "none", replyFrom)
		assert.Greater(t, drops("edge-a"), before, "the firewall dropped the SYN")
	})

	type shape struct {
		name, class string
		port        int32
		pod         lab.Pod
		via         []string
	}
	shapes := []shape{
		{"fw-local", "public", 3200, lab.PodA, []string{lab.PublicAddr}},
		{"fw-remote", "public", 3201, lab.PodB, []string{lab.PublicAddr}},
		{"fw-multi", "intranet", 3202, lab.PodB, []string{lab.PublicAddr, workerCAddr}},
		{"fw-multi-local", "intranet", 3203, lab.PodA, []string{lab.PublicAddr, workerCAddr}},
	}
	protos := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP}
	for _, s := range shapes {
		for _, proto := range protos {
			serve(t, l, s.pod, proto, int(s.port))
			name := s.name
			if proto == corev1.ProtocolUDP {
				name += "-udp"
			}
			mapTo(t, l, name, s.class, proto, s.port, 0, s.port, s.pod)
		}
	}

	dropsBefore := map[string]uint64{}
	for _, n := range nodes {
		dropsBefore[n] = drops(n)
	}
	for _, s := range shapes {
		for _, proto := range protos {
			for _, addr := range s.via {
				t.Run(fmt.Sprintf("%s %s via %s", s.name, proto, addr), func(t *testing.T) {
					assertReaches(t, l, proto, addr, s.port, s.pod, int(s.port))
				})
			}
		}
	}
	for _, n := range nodes {
		assert.Equal(t, dropsBefore[n], drops(n), "%s: the firewall dropped none of kuport's flows", n)
		assert.Zero(t, counter(n, "ip", netlab.MeshMarkTable, netlab.MeshUnmarkedDrp), "%s: the mesh dropped nothing", n)
		assert.NotZero(t, counter(n, "ip", netlab.MeshMarkTable, netlab.MeshMarked), "%s: the mesh saw and marked kuport's traffic", n)
	}
	if t.Failed() {
		for _, n := range nodes {
			out, _ := l.Net.Exec(ctx, n, "nft", "list", "ruleset")
			t.Logf("%s:\n%s", n, out)
		}
	}
}
