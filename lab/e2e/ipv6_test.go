package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/lab"
	"kuport.wlz.li/kuport/lab/netlab"
)

// edgeAUplink6 is edge-a's uplink's IPv6 address with its prefix, and its IPv6 gateway;
// workerCAddr6 worker-c's uplink's IPv6 address (lab/netlab/netlab.go); virtualAddr6 the
// IPv6 virtual address of the Multi class intranet6.
const (
	edgeAUplink6   = lab.PublicAddr6 + "/64"
	edgeAGateway6  = "2001:db8:113::1"
	edgeAUplinkDev = "enp1s0"
	workerCAddr6   = "2001:db8:18::3"
	virtualAddr6   = "2001:db8:100:1::1"
)

// intranet6Class is intranetClass with its own VNI, subnet and subnet6: a class whose
// subnet6 overlaps an older class's builds links without IPv6.
func intranet6Class() *v1alpha1.PortMapClass {
	c := intranetClass()
	c.Name = "intranet6"
	c.Spec.ReturnPath.Vxlan = v1alpha1.VxlanConfig{VNI: 4400, Subnet: "169.254.80.0/24", Subnet6: "fd64:f5ac:e962::/112"}
	return c
}

// TestPrivilegedE2EIPv6 runs docs/design/datapath.md's scenarios for an IPv6 client beside
// IPv4 ones, on the same mappings of class public to dual-stack pods: same-node and
// cross-node, TCP and UDP, a range and a shifted range, each answered from the address and
// port the client dialed with the client's own address kept, in both families. Streams of
// both families at once through one mapping lose nothing while every agent is killed and
// restarted; a deleted table comes back within 2 s for IPv6 too; an interface that loses
// its IPv6 address makes the node's row say ipv6Unavailable while IPv4 keeps serving, and
// IPv6 comes back with the address; a host firewall like Talos's passes IPv6 flows too; a
// request larger than the link's MTU crosses it and a datagram too large draws an ICMPv6
// Packet Too Big with the link's MTU. A
// Multi class reaches one pod port a second way, through both its accepting nodes and a
// virtual address routed to one, then the other.
func TestPrivilegedE2EIPv6(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	podB := l.DualStack(lab.PodB)
	tcp := corev1.ProtocolTCP
	both := []string{lab.PublicAddr6, lab.PublicAddr}
	mappings := dualStackShapes(t, l)

	t.Run("one pod port through two ways, Multi with a moving IPv6 virtual address", func(t *testing.T) {
		require.NoError(t, l.ApplyClass(ctx, intranet6Class()))
		const podPort = 3630
		serve(t, l, podB, tcp, podPort)
		mapTo(t, l, "v6-pub", "public", tcp, podPort, 0, podPort, podB)
		mapTo(t, l, "v6-multi", "intranet6", tcp, podPort+1, 0, podPort, podB)
		assertReaches(t, l, tcp, lab.PublicAddr6, podPort, podB, podPort)
		for _, addr := range []string{lab.PublicAddr6, workerCAddr6} {
			assertReaches(t, l, tcp, addr, podPort+1, podB, podPort)
		}
		for _, via := range []string{"edge-a", "worker-c"} {
			require.NoError(t, l.Net.RouteVirtual(ctx, netip.MustParseAddr(virtualAddr6), via))
			assertReaches(t, l, tcp, virtualAddr6, podPort+1, podB, podPort)
		}
	})

	t.Run("a request and a reply larger than the link's MTU cross; a datagram too large draws Packet Too Big", func(t *testing.T) {
		dst := net.JoinHostPort(lab.PublicAddr6, "3602")
		assert.Equal(t, fmt.Sprintf("pod_saw=%s reply_from=%s", lab.ClientAddr6, dst), probeSized(t, l, "tcp", dst, 1400, 5*time.Second))
		_, err := l.Net.Exec(ctx, netlab.ClientNS, "ip", "-6", "route", "flush", "cache")
		require.NoError(t, err)
		probeSized(t, l, "udp", net.JoinHostPort(lab.PublicAddr6, "3603"), 1400, time.Second)
		route, err := l.Net.Exec(ctx, netlab.ClientNS, "ip", "-6", "route", "get", lab.PublicAddr6)
		require.NoError(t, err)
		assert.Contains(t, route, "mtu 1370", "the client caches the link's MTU from edge-a's ICMPv6 Packet Too Big")
	})

	t.Run("both families at once lose nothing while every agent restarts", func(t *testing.T) {
		svc := programService(t)
		streams := map[string]*netlab.Stream{}
		for _, addr := range both {
			for _, m := range mappings[2:4] {
				dst := net.JoinHostPort(addr, strconv.Itoa(int(m.port)))
				s, err := l.Net.StartStream(strings.ToLower(string(m.proto)), dst, 20*time.Millisecond, 15*time.Second)
				require.NoError(t, err)
				streams[string(m.proto)+" "+dst] = s
			}
		}
		for _, n := range []string{"edge-a", "worker-b"} {
			require.NoError(t, l.StopAgent(n, true))
			require.NoError(t, l.StartAgent(n))
			waitAgent(t, svc, n, "")
		}
		assertLossless(t, time.Minute, streams)
	})

	t.Run("a deleted table is back within 2 s for IPv6", func(t *testing.T) {
		_, err := l.Net.Exec(ctx, "edge-a", "nft", "delete", "table", "inet", "kuport")
		require.NoError(t, err)
		dst := net.JoinHostPort(lab.PublicAddr6, "3602")
		require.Eventually(t, func() bool {
			r, err := l.Net.Probe(ctx, "tcp", dst, 200*time.Millisecond)
			return err == nil && r.PodSaw == lab.ClientAddr6 && r.ReplyFrom == dst
		}, 2*time.Second, 50*time.Millisecond, "IPv6 traffic not back within 2 s")
	})

	t.Run("an interface without IPv6 is said on the node's row and IPv4 keeps serving", func(t *testing.T) {
		_, err := l.Net.Exec(ctx, "edge-a", "ip", "-6", "addr", "del", edgeAUplink6, "dev", edgeAUplinkDev)
		require.NoError(t, err)
		row := waitClassRow(t, l, "public", "edge-a", func(r v1alpha1.ClassNodeStatus) bool {
			return strings.Contains(r.IPv6Unavailable, edgeAUplinkDev)
		})
		assert.True(t, row.Ready, "IPv6 missing leaves the node ready: %+v", row)
		assertReaches(t, l, tcp, lab.PublicAddr, 3602, podB, 3602)
		waitCondition(t, l, lab.DemoNamespace, "v6-remote-tcp", v1alpha1.ConditionProgrammed, "True", 10*time.Second)

		for _, args := range [][]string{
			{"ip", "-6", "addr", "add", edgeAUplink6, "dev", edgeAUplinkDev, "nodad"},
			{"ip", "-6", "route", "replace", "default", "via", edgeAGateway6, "dev", edgeAUplinkDev},
		} {
			_, err := l.Net.Exec(ctx, "edge-a", args...)
			require.NoError(t, err, "%v", args)
		}
		waitClassRow(t, l, "public", "edge-a", func(r v1alpha1.ClassNodeStatus) bool {
			return !strings.Contains(r.IPv6Unavailable, edgeAUplinkDev) && r.Addresses6[edgeAUplinkDev] == lab.PublicAddr6
		})
		require.Eventually(t, func() bool {
			podSaw, _, err := l.ProbeAddr(ctx, tcp, lab.PublicAddr6, 3602, 1)
			return err == nil && podSaw == lab.ClientAddr6
		}, 10*time.Second, 200*time.Millisecond, "IPv6 served again on %s", edgeAUplinkDev)
	})

	t.Run("a host firewall passes IPv6 flows", func(t *testing.T) {
		for _, n := range []string{"edge-a", "worker-b"} {
			require.NoError(t, l.Net.AddHostFirewall(ctx, n), n)
		}
		drops := func() uint64 {
			n, err := l.Net.NftCounter(ctx, "edge-a", "inet", netlab.FirewallTable, netlab.FirewallDrops)
			require.NoError(t, err)
			return n
		}
		before := drops()
		for _, m := range mappings {
			assertReaches(t, l, m.proto, lab.PublicAddr6, m.probe, m.pod, int(m.sees))
		}
		assert.Equal(t, before, drops(), "the firewall dropped none of kuport's IPv6 flows")
	})
}

// dualMapping is one of dualStackShapes' mappings.
type dualMapping struct {
	name        string
	pod         lab.Pod
	proto       corev1.Protocol
	port, end   int32 // dialed ports (end 0: one port)
	podPort     int32
	probe, sees int32 // a dialed port probed, and the pod port it reaches
}

// dualStackShapes maps dual-stack pods through class public (same-node and cross-node, TCP
// and UDP, a range and a shifted range) and asserts that each answers in both families, the
// pod seeing the client's own address and the answer coming from the address and port the
// client dialed, and that each PortMap's endpoint has the pod's IPv6 address. It returns the
// mappings.
func dualStackShapes(t *testing.T, l *lab.Lab) []dualMapping {
	ctx := context.Background()
	podA, podB := l.DualStack(lab.PodA), l.DualStack(lab.PodB)
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	mappings := []dualMapping{
		{"v6-local-tcp", podA, tcp, 3600, 0, 3600, 3600, 3600},
		{"v6-local-udp", podA, udp, 3601, 0, 3601, 3601, 3601},
		{"v6-remote-tcp", podB, tcp, 3602, 0, 3602, 3602, 3602},
		{"v6-remote-udp", podB, udp, 3603, 0, 3603, 3603, 3603},
		{"v6-range", podB, udp, 3610, 3619, 3610, 3615, 3615},
		{"v6-shifted", podB, udp, 3620, 3624, 3700, 3622, 3702},
	}
	for _, m := range mappings {
		serve(t, l, m.pod, m.proto, int(m.sees))
		mapTo(t, l, m.name, "public", m.proto, m.port, m.end, m.podPort, m.pod)
		for _, addr := range []string{lab.PublicAddr6, lab.PublicAddr} {
			assertReaches(t, l, m.proto, addr, m.probe, m.pod, int(m.sees))
		}
		pm, err := l.GetPortMap(ctx, lab.DemoNamespace, m.name)
		require.NoError(t, err)
		require.NotNil(t, pm.Status.Endpoint, m.name)
		assert.Equal(t, m.pod.IP6, pm.Status.Endpoint.Address6, "%s: the endpoint's IPv6 address", m.name)
	}
	return mappings
}

// waitClassRow waits up to 30 s for the class's status row of node to satisfy ok and
// returns it.
func waitClassRow(t *testing.T, l *lab.Lab, class, node string, ok func(v1alpha1.ClassNodeStatus) bool) v1alpha1.ClassNodeStatus {
	t.Helper()
	var last v1alpha1.ClassNodeStatus
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := l.GetClass(ctx, class)
		if err != nil {
			return false, nil
		}
		for _, r := range c.Status.Nodes {
			if r.Name == node {
				last = r
				return ok(r), nil
			}
		}
		return false, nil
	})
	require.NoError(t, err, "class %s row %s: last %+v", class, node, last)
	return last
}
