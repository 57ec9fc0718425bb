package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/lab"
)

// The lab's second accepting node and the routed virtual address of the Multi class.
const (
	workerCAddr = "198.18.0.3"
	virtualAddr = "198.18.100.1"
)

// linkName is the device a node names after its peer: "kup-" + the first 8 hex digits of
// sha256("<class>/<peer node>") (docs/design/datapath.md#the-link-device).
func linkName(class, peer string) string {
	sum := sha256.Sum256([]byte(class + "/" + peer))
	return "kup-" + hex.EncodeToString(sum[:4])
}

// intranetClass is the Multi class `intranet` of docs/design/datapath.md#serving-modes on the
// lab's nodes: its own vni and subnet because it shares edge-a with `public`. The lab's
// client reaches the nodes by their uplinks (a mesh client would need a mesh peer of its
// own), so the class accepts on edge-a's enp1s0 and worker-c's eth0 rather than wt0.
func intranetClass() *v1alpha1.PortMapClass {
	return &v1alpha1.PortMapClass{
		ObjectMeta: metav1.ObjectMeta{Name: "intranet"},
		Spec: v1alpha1.PortMapClassSpec{
			ServingMode: v1alpha1.ServingModeMulti,
			Nodes: map[string]v1alpha1.ClassNode{
				"edge-a":   {Interfaces: []string{"enp1s0"}},
				"worker-c": {Interfaces: []string{"eth0"}},
			},
			ReturnPath: v1alpha1.ReturnPath{Mode: v1alpha1.ReturnPathVxlan,
				Vxlan: v1alpha1.VxlanConfig{VNI: 4300, Subnet: "169.254.79.0/24"}},
		},
	}
}

// mapTo exposes pod on a Service named name (port name "app", the slice giving podPort),
// creates a PortMap of class with the dialed port..endPort (0: a single port) and waits
// until it is Programmed.
func mapTo(t *testing.T, l *lab.Lab, name, class string, proto corev1.Protocol, port, endPort, podPort int32, pod lab.Pod) {
	t.Helper()
	createMapping(t, l, name, class, proto, port, endPort, podPort, pod)
	waitCondition(t, l, lab.DemoNamespace, name, v1alpha1.ConditionProgrammed, "True", 30*time.Second)
}

// createMapping is mapTo without the wait, for a mapping that is not to be Programmed.
func createMapping(t *testing.T, l *lab.Lab, name, class string, proto corev1.Protocol, port, endPort, podPort int32, pod lab.Pod) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, l.Expose(ctx, lab.DemoNamespace, name, "app", proto, podPort, lab.Backend{Pod: pod, Ready: true}))
	pm := &v1alpha1.PortMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: lab.DemoNamespace, Name: name},
		Spec: v1alpha1.PortMapSpec{ClassName: class, Protocol: v1alpha1.Protocol(proto), Port: port,
			ServiceRef: v1alpha1.ServiceRef{Name: name, Port: "app"}},
	}
	if endPort != 0 {
		pm.Spec.EndPort = ptr.To(endPort)
	}
	require.NoError(t, l.ApplyPortMap(ctx, pm))
}

// serve starts pod servers on each port.
func serve(t *testing.T, l *lab.Lab, pod lab.Pod, proto corev1.Protocol, ports ...int) {
	t.Helper()
	for _, p := range ports {
		_, err := l.Net.Serve(pod.Name, strings.ToLower(string(proto)), p)
		require.NoError(t, err)
	}
}

// sawClient counts the requests from the lab's client, in either family, the pod's server
// on port logged.
func sawClient(t *testing.T, l *lab.Lab, pod lab.Pod, proto corev1.Protocol, port int) int {
	t.Helper()
	log, err := l.Net.ServerLog(pod.Name, strings.ToLower(string(proto)), port)
	require.NoError(t, err)
	return strings.Count(log, "saw "+lab.ClientAddr+":") + strings.Count(log, "saw ["+lab.ClientAddr6+"]:")
}

// assertReaches probes addr:port and asserts the pod saw the client, the reply came from
// the dialed address, and the request landed on the pod's server on podPort.
func assertReaches(t *testing.T, l *lab.Lab, proto corev1.Protocol, addr string, port int32, pod lab.Pod, podPort int) {
	t.Helper()
	before := sawClient(t, l, pod, proto, podPort)
	assertAnswersAt(t, l, proto, addr, port)
	assert.Greater(t, sawClient(t, l, pod, proto, podPort), before, "%s %s:%d did not reach %s port %d", proto, addr, port, pod.Name, podPort)
}

// vxlanLink is what `ip -j -d addr show` says of a kup-* device.
type vxlanLink struct {
	Name     string `json:"ifname"`
	LinkInfo struct {
		Data struct {
			ID uint32 `json:"id"`
		} `json:"info_data"`
	} `json:"linkinfo"`
	Addrs []struct {
		Local string `json:"local"`
	} `json:"addr_info"`
}

func vxlanLinks(t *testing.T, l *lab.Lab, node string) map[string]vxlanLink {
	t.Helper()
	out, err := l.Net.Exec(context.Background(), node, "ip", "-4", "-j", "-d", "addr", "show", "type", "vxlan")
	require.NoError(t, err)
	var links []vxlanLink
	require.NoError(t, json.Unmarshal([]byte(out), &links))
	m := map[string]vxlanLink{}
	for _, k := range links {
		if k.Name != "" { // -4 lists links with no IPv4 address as empty objects
			m[k.Name] = k
		}
	}
	return m
}

// TestPrivilegedE2EShapes runs every mapping shape of docs/design/datapath.md in the lab:
// port ranges, a shifted range, Multi with two forwarders and a routed virtual address, two
// classes over one node pair, rescheduling under Single, and a controller restart with all of
// them live.
func TestPrivilegedE2EShapes(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	webB := lab.PodB

	t.Run("a UDP range answers on its first, middle and last port and not beyond", func(t *testing.T) { udpRange(t, l) })

	t.Run("a shifted range reaches each pod port", func(t *testing.T) {
		serve(t, l, webB, corev1.ProtocolTCP, 7000, 7003, 7009)
		mapTo(t, l, "shifted", "public", corev1.ProtocolTCP, 40000, 40009, 7000, webB)
		for _, p := range []int32{40000, 40003, 40009} {
			assertReaches(t, l, corev1.ProtocolTCP, lab.PublicAddr, p, webB, int(p-40000+7000))
		}
	})

	t.Run("Multi: two accepting nodes forward to one remote pod behind a moving virtual address", func(t *testing.T) {
		require.NoError(t, l.ApplyClass(ctx, intranetClass()))
		multiMovingAddress(t, l)
	})

	t.Run("Multi: a flow whose conntrack entry is gone on the pod's node heals on the client's next packet", func(t *testing.T) {
		s, err := l.Net.StartStream("udp", workerCAddr+":6000", 20*time.Millisecond, 3*time.Second)
		require.NoError(t, err)
		time.Sleep(time.Second)
		_, err = l.Net.Exec(ctx, "worker-b", "conntrack", "-D", "-p", "udp", "--orig-port-dst", "6000")
		require.NoError(t, err, "the flow's entry on worker-b")
		res, err := s.Wait(ctx)
		require.NoError(t, err)
		t.Logf("udp stream through worker-c: %s", res)
		assert.Positive(t, res.Sent)
		assert.LessOrEqual(t, res.Lost(), 1, "at most the datagram in flight is lost: %s", res)
	})

	t.Run("two classes over the same nodes get distinct links, VNIs, /31s, marks and tables", func(t *testing.T) {
		onA, onB := vxlanLinks(t, l, "edge-a"), vxlanLinks(t, l, "worker-b")
		pub, intra := onA[linkName("public", "worker-b")], onA[linkName("intranet", "worker-b")]
		require.NotEmpty(t, pub.Name, "edge-a's public link")
		require.NotEmpty(t, intra.Name, "edge-a's intranet link")
		assert.NotEqual(t, pub.LinkInfo.Data.ID, intra.LinkInfo.Data.ID, "VNIs")
		assert.Equal(t, uint32(4242), pub.LinkInfo.Data.ID)
		assert.Equal(t, uint32(4300), intra.LinkInfo.Data.ID)
		require.Len(t, pub.Addrs, 1)
		require.Len(t, intra.Addrs, 1)
		assert.True(t, strings.HasPrefix(pub.Addrs[0].Local, "169.254.77."), pub.Addrs[0].Local)
		assert.True(t, strings.HasPrefix(intra.Addrs[0].Local, "169.254.79."), intra.Addrs[0].Local)
		assert.Len(t, onB, 3, "worker-b: one public and two intranet links")
		rules, err := l.Net.Exec(ctx, "worker-b", "ip", "rule", "show", "pref", "102")
		require.NoError(t, err)
		tables := map[string]bool{}
		marks := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(rules), "\n") {
			f := strings.Fields(line)
			require.Len(t, f, 9, "102: from all fwmark <mark>/<mask> lookup <table> proto 107: %s", line)
			require.Equal(t, "0x301f", f[4][strings.Index(f[4], "/")+1:], "the default mask: %s", line)
			marks[f[4]] = true
			tables[f[6]] = true
		}
		assert.Len(t, tables, 3, "one table per link on worker-b: %s", rules)
		assert.Len(t, marks, 3, "one mark per link on worker-b: %s", rules)
		// Both classes carry traffic at once.
		assertReaches(t, l, corev1.ProtocolUDP, lab.PublicAddr, 27015, webB, 27015)
		assertReaches(t, l, corev1.ProtocolTCP, lab.PublicAddr, 6000, webB, 6000)
	})

	t.Run("a pod rescheduled between worker-b and edge-a keeps answering under Single", func(t *testing.T) {
		onB := lab.Pod{Namespace: lab.DemoNamespace, Name: "mover", Node: "worker-b", IP: "10.244.18.60"}
		onA := lab.Pod{Namespace: lab.DemoNamespace, Name: "mover", Node: "edge-a", IP: "10.244.17.60"}
		require.NoError(t, l.AddPod(ctx, onB))
		serve(t, l, onB, corev1.ProtocolTCP, 3100)
		mapTo(t, l, "mover", "public", corev1.ProtocolTCP, 3100, 0, 3100, onB)
		assertReaches(t, l, corev1.ProtocolTCP, lab.PublicAddr, 3100, onB, 3100)
		for _, move := range [][2]lab.Pod{{onB, onA}, {onA, onB}} {
			from, to := move[0], move[1]
			require.NoError(t, l.RemovePod(ctx, from))
			require.NoError(t, l.SetEndpoints(ctx, lab.DemoNamespace, "mover", "app", corev1.ProtocolTCP, 3100))
			require.NoError(t, l.AddPod(ctx, to))
			serve(t, l, to, corev1.ProtocolTCP, 3100)
			require.NoError(t, l.SetEndpoints(ctx, lab.DemoNamespace, "mover", "app", corev1.ProtocolTCP, 3100, lab.Backend{Pod: to, Ready: true}))
			require.NoError(t, wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				pm, err := l.GetPortMap(ctx, lab.DemoNamespace, "mover")
				if err != nil || pm.Status.Endpoint == nil {
					return false, nil
				}
				return pm.Status.Endpoint.Node == to.Node && pm.Status.Endpoint.Address == to.IP && condition(pm, v1alpha1.ConditionProgrammed) == "True", nil
			}), "status follows the pod to %s", to.Node)
			assertReaches(t, l, corev1.ProtocolTCP, lab.PublicAddr, 3100, to, 3100)
			if t.Failed() {
				for _, n := range []string{"edge-a", "worker-b"} {
					t.Logf("%s after the move to %s:\n%s", n, to.Node, kernelState(t, l, n))
				}
				t.FailNow()
			}
		}
	})

	t.Run("a controller restart keeps every link: ifindex, VNI and addresses", func(t *testing.T) {
		nodes := []string{"edge-a", "worker-b", "worker-c"}
		before := map[string]string{}
		for _, n := range nodes {
			before[n] = kernelState(t, l, n)
		}
		restartController(t, l, nodes...)
		for _, n := range nodes {
			assert.Equal(t, before[n], kernelState(t, l, n), "kernel state on %s changed across a controller restart", n)
		}
		assertReaches(t, l, corev1.ProtocolTCP, virtualAddr, 6000, webB, 6000)
		assertReaches(t, l, corev1.ProtocolUDP, lab.PublicAddr, 27115, webB, 27115)
	})
}

// udpRange maps web-b's UDP 27015-27115 on class public (Single, the pod remote from the
// accepting node): the first, middle and last port answer, the next one does not.
func udpRange(t *testing.T, l *lab.Lab) {
	ctx := context.Background()
	webB := lab.PodB
	serve(t, l, webB, corev1.ProtocolUDP, 27065, 27115, 27116)
	mapTo(t, l, "games", "public", corev1.ProtocolUDP, 27015, 27115, 27015, webB)
	for _, p := range []int32{27015, 27065, 27115} {
		assertReaches(t, l, corev1.ProtocolUDP, lab.PublicAddr, p, webB, int(p))
	}
	podSaw, replyFrom, err := l.ProbeAddr(ctx, corev1.ProtocolUDP, lab.PublicAddr, 27116, 1)
	require.NoError(t, err)
	assert.Equal(t, "none", podSaw, "27116 is outside the range")
	assert.Equal(t, "none", replyFrom)
	assert.Zero(t, sawClient(t, l, webB, corev1.ProtocolUDP, 27116), "27116 reached the pod")
}

// multiMovingAddress maps web-b's TCP and UDP 6000 on class intranet (Multi, which must
// exist): each forwarder answers on its own address, and a routed virtual address reaches
// the pod wherever the network lands it, the replies leaving by that forwarder's link.
func multiMovingAddress(t *testing.T, l *lab.Lab) {
	ctx := context.Background()
	webB := lab.PodB
	serve(t, l, webB, corev1.ProtocolTCP, 6000)
	serve(t, l, webB, corev1.ProtocolUDP, 6000)
	mapTo(t, l, "shared", "intranet", corev1.ProtocolTCP, 6000, 0, 6000, webB)
	mapTo(t, l, "shared-udp", "intranet", corev1.ProtocolUDP, 6000, 0, 6000, webB)
	onB := vxlanLinks(t, l, "worker-b")
	require.Contains(t, onB, linkName("intranet", "edge-a"), "worker-b's link to edge-a")
	require.Contains(t, onB, linkName("intranet", "worker-c"), "worker-b's link to worker-c")
	for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		// Each forwarder answers on its own address...
		assertReaches(t, l, proto, lab.PublicAddr, 6000, webB, 6000)
		assertReaches(t, l, proto, workerCAddr, 6000, webB, 6000)
	}
	// ...and a routed virtual address reaches the pod wherever the network lands it.
	for _, via := range []string{"edge-a", "worker-c", "edge-a"} {
		require.NoError(t, l.Net.RouteVirtual(ctx, netip.MustParseAddr(virtualAddr), via))
		dev := linkName("intranet", via)
		before, ok := readLink(t, l, "worker-b", dev)
		require.True(t, ok)
		for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
			assertReaches(t, l, proto, virtualAddr, 6000, webB, 6000)
		}
		after, _ := readLink(t, l, "worker-b", dev)
		assert.Greater(t, after.Stats64.TX.Packets, before.Stats64.TX.Packets, "replies via %s must leave by %s", via, dev)
		assert.Equal(t, before.Stats64.TX.Errors, after.Stats64.TX.Errors, "tx_errors on %s", dev)
	}
	pm, err := l.GetPortMap(ctx, lab.DemoNamespace, "shared")
	require.NoError(t, err)
	var published []string
	for _, p := range pm.Status.Published {
		published = append(published, p.Node+"/"+p.Interface+"="+p.Address)
	}
	assert.ElementsMatch(t, []string{"edge-a/enp1s0=" + lab.PublicAddr, "worker-c/eth0=" + workerCAddr}, published)
}
