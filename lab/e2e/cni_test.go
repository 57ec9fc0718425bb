package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"kuport.wlz.li/kuport/lab"
	"kuport.wlz.li/kuport/lab/netlab"
)

// speaksFirstClientPort is where the client listens for a pod that speaks first.
const speaksFirstClientPort = 4500

// podSpeaksFirst is the scenario every CNI profile runs: a pod that speaks first from its
// mapped port to an outside host is masqueraded by the CNI as usual. Each pod's mapped UDP
// port (Single same-node, Single cross-node, Multi cross-node) sends one datagram to the
// client, which must see the pod's node's uplink address (the CNI's egress masquerade), not
// the pod's. The class intranet must exist.
//
// EXPECTED TO FAIL on a datapath whose reply exemption (`snat-reply-cilium_`: a null SNAT of
// the pod's mapped port on every device but the CNI's) also covers packets leaving by the
// node's uplink: it keeps the pod's address on the way out. Only packets leaving by
// kuport's own kup-* links need the exemption.
func podSpeaksFirst(t *testing.T, l *lab.Lab) {
	ctx := context.Background()
	cases := []struct {
		name, class string
		pod         lab.Pod
		port        int32
	}{
		{"speaks-local", "public", lab.PodA, 3500},
		{"speaks-remote", "public", lab.PodB, 3501},
		{"speaks-multi", "intranet", lab.PodB, 3502},
	}
	for _, c := range cases {
		mapTo(t, l, c.name, c.class, corev1.ProtocolUDP, c.port, 0, c.port, c.pod)
	}
	_, err := l.Net.ServeClient("udp", speaksFirstClientPort)
	require.NoError(t, err)
	to := fmt.Sprintf("%s:%d", lab.ClientAddr, speaksFirstClientPort)
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s %s pod speaks first from its mapped port", c.class, c.pod.Node), func(t *testing.T) {
			node, ok := l.Net.Node(c.pod.Node)
			require.True(t, ok)
			before := clientSaw(t, l)
			res, err := l.Net.SendFromPod(ctx, c.pod.Name, "udp", int(c.port), to, 2*time.Second)
			require.NoError(t, err)
			// The client's log says what it saw even when its answer to an unmasqueraded pod
			// address is lost (the router has no route to pod CIDRs).
			assert.Equal(t, []string{node.UplinkAddr.Addr().String()}, clientSaw(t, l)[len(before):],
				"the source the client saw of a datagram %s (%s) sent first from its mapped port %d: want its node's address, the CNI's egress masquerade",
				c.pod.Name, c.pod.IP, c.port)
			assert.Equal(t, to, res.ReplyFrom, "the client's answer reaches the pod")
		})
	}
}

// clientSaw lists the source addresses the client's server (speaksFirstClientPort) has
// logged, in order.
func clientSaw(t *testing.T, l *lab.Lab) []string {
	t.Helper()
	log, err := l.Net.ClientLog("udp", speaksFirstClientPort)
	require.NoError(t, err)
	var saw []string
	for line := range strings.Lines(log) {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "saw" {
			ap, err := netip.ParseAddrPort(f[1])
			require.NoError(t, err, line)
			saw = append(saw, ap.Addr().String())
		}
	}
	return saw
}

// profileScenarios runs the shapes of docs/design/datapath.md in a lab under a CNI profile,
// one subtest each: same-node and cross-node TCP and UDP (the demo's), a UDP range, Multi
// behind a moving virtual address, one pod port two ways, a pod that speaks first, the
// shapes for an IPv6 client beside IPv4 ones, and last (it stays) the host firewall.
func profileScenarios(t *testing.T, cni netlab.CNI) {
	start := time.Now()
	l := startLabWith(t, 1, cni)
	ctx := context.Background()
	require.Equal(t, cni, l.Net.CNI())
	t.Logf("%s lab up in %s", cni, time.Since(start).Round(time.Second))

	t.Run("pods sit behind the profile's devices", func(t *testing.T) {
		for _, p := range []lab.Pod{lab.PodA, lab.PodB} {
			out, err := l.Net.Exec(ctx, p.Node, "ip", "route", "get", p.IP)
			require.NoError(t, err)
			assert.Contains(t, out, "dev "+cni.PodDevice(p.Name)+" ", p.Name)
		}
	})
	t.Run("demo scenarios: same node, cross node TCP and UDP, refused", func(t *testing.T) {
		outcomes, err := l.RunDemo(ctx)
		require.NoError(t, err)
		for _, o := range outcomes {
			assert.True(t, o.Pass(), o.Line()+" %v", o.Problems)
		}
	})
	t.Run("a UDP range", func(t *testing.T) { udpRange(t, l) })
	require.NoError(t, l.ApplyClass(ctx, intranetClass()))
	t.Run("Multi behind a moving virtual address", func(t *testing.T) { multiMovingAddress(t, l) })
	t.Run("one pod port two ways", func(t *testing.T) { onePodPortTwoWays(t, l) })
	t.Run("a pod speaks first", func(t *testing.T) { podSpeaksFirst(t, l) })
	t.Run("IPv6 beside IPv4", func(t *testing.T) { dualStackShapes(t, l) })
	t.Run("host firewall", func(t *testing.T) { hostFirewall(t, l) })
	if t.Failed() {
		for _, n := range l.Net.Nodes() {
			out, _ := l.Net.Exec(ctx, n.Name, "nft", "list", "table", "ip", "lab-cni")
			t.Logf("%s lab-cni:\n%s", n.Name, strings.TrimSpace(out))
		}
	}
	t.Logf("%s profile scenarios took %s", cni, time.Since(start).Round(time.Second))
}

// TestPrivilegedE2ECNIFlannel runs the scenarios under the flannel profile: pods on cni0,
// Flannel's FLANNEL-POSTRTG masquerade.
func TestPrivilegedE2ECNIFlannel(t *testing.T) { profileScenarios(t, netlab.CNIFlannel) }

// TestPrivilegedE2ECNICalico runs the scenarios under the calico profile: pods on their own
// cali* veths with proxy ARP, Calico's nat-outgoing and its raw-table mark bits.
func TestPrivilegedE2ECNICalico(t *testing.T) { profileScenarios(t, netlab.CNICalico) }
