package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"kuport.wlz.li/kuport/lab"
	"kuport.wlz.li/kuport/lab/netlab"
)

// TestPrivilegedE2EOnePodPortTwoWays (docs/design/datapath.md#kup-mangle-return-marking):
// web-b's port 3400 exposed publicly (class public, Single, dialed 3400 on edge-a, over
// public's link) and on the intranet (class intranet, Multi, dialed 3401 on edge-a and
// worker-c and a routed virtual address, over intranet's links from each), TCP and UDP. Both
// mappings are Programmed and answer from every accepting node and the virtual address, with
// the client's address kept and the reply from the dialed address; streams through all three
// ways at once lose nothing, and each way's replies leave worker-b by the link its requests
// came in by.
//
// It ends with the scenario every CNI profile runs: a pod that speaks first from its
// mapped port (podSpeaksFirst).
func TestPrivilegedE2EOnePodPortTwoWays(t *testing.T) {
	l := startLab(t)
	require.NoError(t, l.ApplyClass(context.Background(), intranetClass()))
	onePodPortTwoWays(t, l)
	podSpeaksFirst(t, l)
}

// onePodPortTwoWays is TestPrivilegedE2EOnePodPortTwoWays in a lab whose class intranet
// exists.
func onePodPortTwoWays(t *testing.T, l *lab.Lab) {
	ctx := context.Background()
	const podPort = 3400
	pod := lab.PodB
	protos := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP}
	for _, proto := range protos {
		serve(t, l, pod, proto, podPort)
		suffix := ""
		if proto == corev1.ProtocolUDP {
			suffix = "-udp"
		}
		mapTo(t, l, "pub"+suffix, "public", proto, podPort, 0, podPort, pod)
		mapTo(t, l, "intra"+suffix, "intranet", proto, podPort+1, 0, podPort, pod)
	}

	ways := []struct {
		addr string
		port int32
		link string // the link on worker-b the replies leave by
	}{
		{lab.PublicAddr, podPort, linkName("public", "edge-a")},
		{lab.PublicAddr, podPort + 1, linkName("intranet", "edge-a")},
		{workerCAddr, podPort + 1, linkName("intranet", "worker-c")},
	}
	for _, w := range ways {
		for _, proto := range protos {
			t.Run(fmt.Sprintf("%s %s:%d", proto, w.addr, w.port), func(t *testing.T) {
				before, ok := readLink(t, l, "worker-b", w.link)
				require.True(t, ok, w.link)
				assertReaches(t, l, proto, w.addr, w.port, pod, podPort)
				after, _ := readLink(t, l, "worker-b", w.link)
				assert.Greater(t, after.Stats64.TX.Packets, before.Stats64.TX.Packets, "replies must leave worker-b by %s", w.link)
			})
		}
	}
	for _, via := range []string{"edge-a", "worker-c"} {
		require.NoError(t, l.Net.RouteVirtual(ctx, netip.MustParseAddr(virtualAddr), via))
		for _, proto := range protos {
			assertReaches(t, l, proto, virtualAddr, podPort+1, pod, podPort)
		}
	}

	t.Run("all three ways at once", func(t *testing.T) {
		streams := map[string]*netlab.Stream{}
		for _, w := range ways {
			dst := fmt.Sprintf("%s:%d", w.addr, w.port)
			s, err := l.Net.StartStream("udp", dst, 20*time.Millisecond, 3*time.Second)
			require.NoError(t, err)
			streams[dst] = s
		}
		assertLossless(t, 30*time.Second, streams)
	})
}
