package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/status"
	"kuport.wlz.li/kuport/lab"
	"kuport.wlz.li/kuport/lab/labtest"
	"kuport.wlz.li/kuport/lab/netlab"
)

// meshWatch counts, on a node, what leaves by wt0 (the WireGuard device): packets between two
// nodes' mesh addresses to the class's link port (kuport's links), and packets whose source
// is the client's address (a forwarded packet that kept it, which the mesh would drop).
const meshWatch = `table ip lab-meshwatch {
	counter link_packets {
	}
	counter client_packets {
	}
	chain postrouting {
		type filter hook postrouting priority filter; policy accept;
		oifname "wt0" ip saddr { 100.64.93.143, 100.64.93.150, 100.64.93.160 } ip daddr { 100.64.93.143, 100.64.93.150, 100.64.93.160 } udp dport 4790 counter name "link_packets"
		oifname "wt0" ip saddr 198.51.100.7 counter name "client_packets"
	}
}
`

// probeSized probes from the client with a request of size bytes (and a reply as large,
// labtool's serve) and returns the result line.
func probeSized(t *testing.T, l *lab.Lab, proto, dst string, size int, timeout time.Duration) string {
	t.Helper()
	out, err := l.Net.Exec(context.Background(), netlab.ClientNS, filepath.Join(labtest.KuportBin(t), "kuport-lab"), "probe",
		"--proto", proto, "--to", dst, "--size", fmt.Sprint(size), "--timeout", timeout.String())
	require.NoError(t, err)
	return strings.TrimSpace(out)
}

// testMesh runs the demo's remote mapping (TestPrivilegedE2E has it Programmed) over the
// lab's real WireGuard mesh (wireguard-go on every node's wt0): the client's packets cross
// inside kuport's link, the outer header between the two nodes' mesh addresses, and never
// with the client's source; the link's MTU is the mesh's less 50; a request and a reply
// larger than the link's MTU cross it (path MTU discovery over TCP); a DF datagram too large
// for the link draws an ICMP "fragmentation needed" with the link's MTU, which the client
// caches. It leaves no mapping of its own behind.
func testMesh(t *testing.T, l *lab.Lab) {
	ctx := context.Background()

	t.Run("the client's packets cross inside the link", func(t *testing.T) {
		require.NoError(t, l.Net.NftApply(ctx, "edge-a", meshWatch))
		t.Cleanup(func() { _, _ = l.Net.Exec(ctx, "edge-a", "nft", "delete", "table", "ip", "lab-meshwatch") })
		assertAnswers(t, l, 3000)
		linked, err := l.Net.NftCounter(ctx, "edge-a", "ip", "lab-meshwatch", "link_packets")
		require.NoError(t, err)
		client, err := l.Net.NftCounter(ctx, "edge-a", "ip", "lab-meshwatch", "client_packets")
		require.NoError(t, err)
		assert.Positive(t, linked, "edge-a sent no link packet between mesh addresses into wt0")
		assert.Zero(t, client, "edge-a sent a packet with the client's source into wt0")
	})

	t.Run("the link's MTU is the mesh's less 50", func(t *testing.T) {
		for dev, mtu := range map[string]string{"wt0": "1420", linkOnEdgeA: "1370"} {
			out, err := l.Net.Exec(ctx, "edge-a", "cat", "/sys/class/net/"+dev+"/mtu")
			require.NoError(t, err)
			assert.Equal(t, mtu, strings.TrimSpace(out), dev)
		}
	})

	t.Run("a request and a reply larger than the link's MTU cross", func(t *testing.T) {
		want := fmt.Sprintf("pod_saw=%s reply_from=%s:3000", lab.ClientAddr, lab.PublicAddr)
		assert.Equal(t, want, probeSized(t, l, "tcp", lab.PublicAddr+":3000", 1400, 5*time.Second))
	})

	t.Run("a DF datagram too large for the link draws ICMP with its MTU", func(t *testing.T) {
		const name, port = "mesh-mtu", 27330
		serve(t, l, lab.PodB, corev1.ProtocolUDP, port)
		mapTo(t, l, name, "public", corev1.ProtocolUDP, port, 0, port, lab.PodB)
		defer func() {
			require.NoError(t, l.DeletePortMap(ctx, lab.DemoNamespace, name))
			require.NoError(t, l.Unexpose(ctx, lab.DemoNamespace, name))
			require.NoError(t, l.WaitRulesGone(ctx, 30*time.Second, `"demo/`+name+`/`))
		}()
		assertAnswersAt(t, l, corev1.ProtocolUDP, lab.PublicAddr, port)
		_, err := l.Net.Exec(ctx, netlab.ClientNS, "ip", "route", "flush", "cache")
		require.NoError(t, err)
		before := sawClient(t, l, lab.PodB, corev1.ProtocolUDP, port)
		// Linux sends a UDP datagram with DF while it knows no smaller path MTU.
		assert.Equal(t, "pod_saw=none reply_from=none", probeSized(t, l, "udp", fmt.Sprintf("%s:%d", lab.PublicAddr, port), 1400, time.Second))
		assert.Equal(t, before, sawClient(t, l, lab.PodB, corev1.ProtocolUDP, port), "the DF datagram reached the pod")
		route, err := l.Net.Exec(ctx, netlab.ClientNS, "ip", "route", "get", lab.PublicAddr)
		require.NoError(t, err)
		assert.Contains(t, route, "mtu 1370", "the client caches the link's MTU from edge-a's ICMP")
	})
}

// testMeshDown breaks the pod node's WireGuard, a real mesh failure, both ways a daemon
// fails, and checks what an operator sees and that it heals:
//   - hung (SIGSTOP): wt0 stays and nothing crosses it, so a cross-node mapping through the
//     node goes unanswered and its PortMap gets RequestsUnanswered about the accepting node;
//     resumed, the mapping answers and RequestsAnswered follows;
//   - exited: its wt0 goes with it (a TUN device lives as long as its process), so the
//     node has no underlay address and the mapping is Programmed=False NodeNotReady naming
//     it; restarted (same keys, a new device), the mapping is Programmed and answers again.
//
// TestPrivilegedE2EUnanswered runs it on its lab.
func testMeshDown(t *testing.T, l *lab.Lab) {
	ctx := context.Background()
	const name, port = "mesh-down", 27331
	serve(t, l, lab.PodB, corev1.ProtocolUDP, port)
	mapTo(t, l, name, "public", corev1.ProtocolUDP, port, 0, port, lab.PodB)
	dst := fmt.Sprintf("%s:%d", lab.PublicAddr, port)
	assertAnswersAt(t, l, corev1.ProtocolUDP, lab.PublicAddr, port)

	onEdgeA := func(reason string) *corev1.Event {
		list, err := l.Kube.CoreV1().Events(lab.DemoNamespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=PortMap,involvedObject.name=" + name + ",reason=" + reason})
		require.NoError(t, err)
		for i, e := range list.Items {
			if strings.Contains(e.Message, "node edge-a interface enp1s0:") {
				return &list.Items[i]
			}
		}
		return nil
	}
	// probeUntil probes about every 500 ms until an Event of reason about edge-a exists.
	probeUntil := func(reason string) *corev1.Event {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			if e := onEdgeA(reason); e != nil {
				t.Logf("event: %s %s: %s", e.Type, e.Reason, e.Message)
				return e
			}
			require.True(t, time.Now().Before(deadline), "no %s within 90 s", reason)
			_, _ = l.Net.Probe(ctx, "udp", dst, 500*time.Millisecond)
		}
	}
	heals := func(what string) {
		t.Helper()
		require.Eventually(t, func() bool {
			res, err := l.Net.Probe(ctx, "udp", dst, 500*time.Millisecond)
			return err == nil && res.PodSaw == lab.ClientAddr && res.ReplyFrom == dst
		}, 60*time.Second, 200*time.Millisecond, "the mapping does not heal once worker-b's WireGuard %s", what)
	}

	t.Run("hung", func(t *testing.T) {
		require.NoError(t, l.Net.FreezeWireGuard("worker-b"))
		thawed := false
		defer func() {
			if !thawed {
				_ = l.Net.ThawWireGuard("worker-b")
			}
		}()
		res, err := l.Net.Probe(ctx, "udp", dst, time.Second)
		require.NoError(t, err)
		assert.Equal(t, netlab.ProbeResult{}, res, "the mapping answers with worker-b's WireGuard hung")
		warning := probeUntil(status.ReasonRequestsUnanswered)
		assert.Equal(t, corev1.EventTypeWarning, warning.Type)
		assert.Contains(t, warning.Message, "0 replies")
		assert.True(t, mappingRow(t, name, "edge-a").GetUnanswered())

		require.NoError(t, l.Net.ThawWireGuard("worker-b"))
		thawed = true
		// Clearing the mark once replies flow is TestPrivilegedE2EUnanswered's; the mesh's
		// part is that they flow again.
		heals("resumes")
	})

	t.Run("exited", func(t *testing.T) {
		require.NoError(t, l.Net.StopWireGuard(ctx, "worker-b"))
		waitCondition(t, l, lab.DemoNamespace, name, v1alpha1.ConditionProgrammed, "False:"+v1alpha1.ReasonNodeNotReady, 30*time.Second)
		pm, err := l.GetPortMap(ctx, lab.DemoNamespace, name)
		require.NoError(t, err)
		assert.Contains(t, fmt.Sprint(pm.Status.Conditions), `node worker-b: underlay interface "wt0" has no IPv4 address`)
		res, err := l.Net.Probe(ctx, "udp", dst, time.Second)
		require.NoError(t, err)
		assert.Equal(t, netlab.ProbeResult{}, res, "the mapping answers with worker-b's WireGuard gone")

		require.NoError(t, l.Net.StartWireGuard(ctx, "worker-b"))
		waitCondition(t, l, lab.DemoNamespace, name, v1alpha1.ConditionProgrammed, "True", 30*time.Second)
		heals("is back")
	})
}
