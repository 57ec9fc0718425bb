package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/lab"
	"kuport.wlz.li/kuport/lab/netlab"
)

// The recovery bound: traffic through kuport answers within this long of the agent applying
// its program again
// (docs/troubleshooting.md#traffic-stops-after-a-reboot-or-a-recreated-link: a recreated link
// is the same link to its peer).
const recoveredWithin = 2 * time.Second

// probeInterval is the recovery probe's: a UDP request every 50 ms times each recovery to
// within 50 ms.
const probeInterval = 50 * time.Millisecond

// udpProbe sends a UDP request to dst from the client namespace every probeInterval and
// records when each reply from dst arrived, so a test reads when traffic stopped and when it
// answered again. kuport-lab stream gives only its longest gap, not when it was.
type udpProbe struct {
	conn *net.UDPConn
	dst  *net.UDPAddr

	mu      sync.Mutex
	replies []time.Time
}

// startProbe opens the probe's socket inside the client namespace (a socket stays in the
// namespace it was made in) and runs it until the test ends.
func startProbe(t *testing.T, dst string) *udpProbe {
	t.Helper()
	addr, err := net.ResolveUDPAddr("udp4", dst)
	require.NoError(t, err)
	conn := clientSocket(t)
	p := &udpProbe{conn: conn, dst: addr}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			_, from, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			// Unmapped: ResolveUDPAddr gives a 16-byte IPv4 address, ReadFromUDP a 4-byte one.
			if from.IP.Equal(addr.IP) && from.Port == addr.Port {
				p.mu.Lock()
				p.replies = append(p.replies, time.Now())
				p.mu.Unlock()
			}
		}
	}()
	go func() {
		defer wg.Done()
		tick := time.NewTicker(probeInterval)
		defer tick.Stop()
		for {
			_, _ = conn.WriteToUDP([]byte("probe\n"), addr)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); _ = conn.Close(); wg.Wait() })
	return p
}

// clientSocket opens an unconnected UDP socket in the lab's client namespace.
func clientSocket(t *testing.T) *net.UDPConn {
	t.Helper()
	ns, err := netns.GetFromName(netlab.ClientNS)
	require.NoError(t, err)
	defer ns.Close()
	runtime.LockOSThread()
	orig, err := netns.Get()
	require.NoError(t, err)
	defer orig.Close()
	require.NoError(t, netns.Set(ns))
	conn, err := net.ListenUDP("udp4", nil)
	if netns.Set(orig) == nil {
		// A thread left in the client namespace is not unlocked: the runtime ends it with
		// the goroutine rather than reusing it.
		runtime.UnlockOSThread()
	}
	require.NoError(t, err)
	return conn
}

// firstReplyAfter waits (at most timeout) for a reply that arrived at or after from.
func (p *udpProbe) firstReplyAfter(from time.Time, timeout time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(timeout)
	for {
		p.mu.Lock()
		for _, r := range p.replies {
			if !r.Before(from) {
				p.mu.Unlock()
				return r, true
			}
		}
		p.mu.Unlock()
		if time.Now().After(deadline) {
			return time.Time{}, false
		}
		time.Sleep(probeInterval / 2)
	}
}

// outage is the longest stretch without a reply between from and to.
func (p *udpProbe) outage(from, to time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	last, longest := from, time.Duration(0)
	for _, r := range p.replies {
		if r.Before(from) {
			last = r
			continue
		}
		if r.After(to) {
			break
		}
		longest = max(longest, r.Sub(last))
		last = r
	}
	return max(longest, to.Sub(last))
}

// agentLogOffset is the size of node's agent log now: applies after it are the ones
// appliedAfter looks for.
func agentLogOffset(t *testing.T, l *lab.Lab, node string) int64 {
	t.Helper()
	fi, err := os.Stat(l.AgentLog(node))
	require.NoError(t, err)
	return fi.Size()
}

// appliedAfter waits (at most timeout) for node's agent to log "program applied" past
// offset in its log and returns that line's time (hclog's, to the millisecond): when the
// agent wrote its program to the kernel, a repair or a restarted agent's first apply.
func appliedAfter(t *testing.T, l *lab.Lab, node string, offset int64, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if at := applies(t, l, node, offset); len(at) > 0 {
			return at[0]
		}
		require.True(t, time.Now().Before(deadline), "the agent on %s applied nothing within %s", node, timeout)
		time.Sleep(20 * time.Millisecond)
	}
}

// applies returns the times of the "program applied" lines past offset in node's agent log.
func applies(t *testing.T, l *lab.Lab, node string, offset int64) []time.Time {
	t.Helper()
	f, err := os.Open(l.AgentLog(node))
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Seek(offset, io.SeekStart)
	require.NoError(t, err)
	var out []time.Time
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "program applied:") {
			continue
		}
		stamp, _, _ := strings.Cut(line, " ")
		at, err := time.Parse("2006-01-02T15:04:05.000Z0700", stamp)
		require.NoError(t, err, "agent log line %q", line)
		out = append(out, at)
	}
	return out
}

// recovery is one event's measurement: the outage the probe saw, when node's agent applied
// after the event, and how long after that traffic answered again.
type recovery struct {
	outage, toApply, afterApply time.Duration
}

func (r recovery) String() string {
	return fmt.Sprintf("outage=%s agent_applied_after=%s answered_after_apply=%s",
		r.outage.Round(time.Millisecond), r.toApply.Round(time.Millisecond), r.afterApply.Round(time.Millisecond))
}

// measureRecovery runs event, waits for node's agent to apply after it and for the probe to
// answer after that (each at most 30 s), and asserts it answered within recoveredWithin of
// the apply, or of the last apply of a peer's agent before the answer (a node's first start
// can change its peer's program too).
func measureRecovery(t *testing.T, l *lab.Lab, p *udpProbe, node string, event func(), peers ...string) recovery {
	t.Helper()
	offsets := map[string]int64{}
	for _, n := range append([]string{node}, peers...) {
		offsets[n] = agentLogOffset(t, l, n)
	}
	start := time.Now()
	event()
	applied := appliedAfter(t, l, node, offsets[node], 30*time.Second)
	answered, ok := p.firstReplyAfter(applied, 30*time.Second)
	require.True(t, ok, "no reply within 30 s of the agent on %s applying", node)
	for _, n := range peers {
		for _, at := range applies(t, l, n, offsets[n]) {
			if at.After(applied) && at.Before(answered) {
				applied = at
			}
		}
	}
	r := recovery{outage: p.outage(start, answered), toApply: applied.Sub(start), afterApply: answered.Sub(applied)}
	t.Logf("%s: %s", t.Name(), r)
	assert.LessOrEqual(t, r.afterApply, recoveredWithin, "traffic answered too long after the agent on %s applied", node)
	return r
}

// wipeKuport removes what a reboot takes from node: kuport's nft table, its kup-* links
// (their addresses and routes go with them), its ip rules at prefs 101 and 102, and every
// conntrack entry.
func wipeKuport(t *testing.T, l *lab.Lab, node string) {
	t.Helper()
	ctx := context.Background()
	_, _ = l.Net.Exec(ctx, node, "nft", "delete", "table", "inet", "kuport")
	for _, link := range vxlanLinks(t, l, node) {
		_, err := l.Net.Exec(ctx, node, "ip", "link", "del", link.Name)
		require.NoError(t, err)
	}
	for _, pref := range []string{"101", "102"} {
		for range 64 {
			if _, err := l.Net.Exec(ctx, node, "ip", "rule", "del", "pref", pref); err != nil {
				break
			}
		}
	}
	_, err := l.Net.Exec(ctx, node, "conntrack", "-F")
	require.NoError(t, err)
}

// reboot is a node's reboot as kuport sees it: the agent killed, everything wipeKuport
// removes and the epoch file (on /run) gone, the agent started again.
func reboot(t *testing.T, l *lab.Lab, node string) {
	t.Helper()
	require.NoError(t, l.StopAgent(node, true))
	wipeKuport(t, l, node)
	require.NoError(t, os.Remove(l.AgentEpochFile(node)))
	require.NoError(t, l.StartAgent(node))
}

// testRecovery measures, with real traffic, how soon a mapping across the link answers again
// after the events operators live through, on one lab: each end's link deleted, the table
// deleted, table and link together, a node reboot, an agent's first start on a node, the mesh
// interface down and up, and the control plane away (the API server and etcd stopped, every
// controller replica gone) while established streams lose nothing and no kernel object is
// rebuilt.
func testRecovery(t *testing.T, l *lab.Lab) {
	ctx := context.Background()
	const udpPort, tcpPort = 27400, 3400
	serve(t, l, lab.PodB, corev1.ProtocolUDP, udpPort)
	serve(t, l, lab.PodB, corev1.ProtocolTCP, tcpPort)
	mapTo(t, l, "rec-udp", "public", corev1.ProtocolUDP, udpPort, 0, udpPort, lab.PodB)
	mapTo(t, l, "rec-tcp", "public", corev1.ProtocolTCP, tcpPort, 0, tcpPort, lab.PodB)
	p := startProbe(t, fmt.Sprintf("%s:%d", lab.PublicAddr, udpPort))
	_, ok := p.firstReplyAfter(time.Now(), 10*time.Second)
	require.True(t, ok, "the probe is not answered")
	nodes := []string{"edge-a", "worker-b"}
	svc := programService(t)

	run := func(node string, what ...string) func() {
		return func() {
			_, err := l.Net.Exec(ctx, node, what...)
			require.NoError(t, err)
		}
	}
	t.Run("the pod node's link deleted", func(t *testing.T) {
		measureRecovery(t, l, p, "worker-b", run("worker-b", "ip", "link", "del", linkOnWorkerB))
	})
	t.Run("the accepting node's link deleted", func(t *testing.T) {
		measureRecovery(t, l, p, "edge-a", run("edge-a", "ip", "link", "del", linkOnEdgeA))
	})
	t.Run("the table deleted", func(t *testing.T) {
		measureRecovery(t, l, p, "worker-b", run("worker-b", "nft", "delete", "table", "inet", "kuport"))
	})
	t.Run("table and link deleted together", func(t *testing.T) {
		measureRecovery(t, l, p, "worker-b", func() {
			run("worker-b", "nft", "delete", "table", "inet", "kuport")()
			run("worker-b", "ip", "link", "del", linkOnWorkerB)()
		})
	})
	t.Run("the pod node reboots", func(t *testing.T) {
		measureRecovery(t, l, p, "worker-b", func() { reboot(t, l, "worker-b") })
		waitAgent(t, svc, "worker-b", "")
	})

	t.Run("the mesh interface down and up", func(t *testing.T) {
		spec, ok := l.Net.Node("worker-b")
		require.True(t, ok)
		run("worker-b", "ip", "link", "set", spec.UnderlayIface, "down")()
		time.Sleep(2 * time.Second)
		offset := agentLogOffset(t, l, "worker-b")
		up := time.Now()
		run("worker-b", "ip", "link", "set", spec.UnderlayIface, "up")()
		answered, ok := p.firstReplyAfter(up, 30*time.Second)
		require.True(t, ok, "no reply within 30 s of the mesh interface coming up")
		// Where the agent applied meanwhile, the bound runs from its apply.
		from := up
		for _, at := range applies(t, l, "worker-b", offset) {
			if at.After(from) && at.Before(answered) {
				from = at
			}
		}
		t.Logf("%s: outage=%s answered_after_up=%s answered_after_last_change=%s", t.Name(),
			p.outage(up.Add(-2*time.Second), answered).Round(time.Millisecond),
			answered.Sub(up).Round(time.Millisecond), answered.Sub(from).Round(time.Millisecond))
		assert.LessOrEqual(t, answered.Sub(from), recoveredWithin)
	})

	// A node whose agent has never run: worker-c holds no kuport state and no epoch file
	// when a mapping to its pod makes edge-a build a link to it and send into it; its
	// agent's first start applies the program.
	t.Run("an agent's first start on a node", func(t *testing.T) {
		podC := lab.Pod{Namespace: lab.DemoNamespace, Name: "rec-c", Node: "worker-c", IP: "10.244.19.40"}
		require.NoError(t, l.StopAgent("worker-c", true))
		wipeKuport(t, l, "worker-c")
		_ = os.Remove(l.AgentEpochFile("worker-c"))
		require.NoError(t, l.AddPod(ctx, podC))
		serve(t, l, podC, corev1.ProtocolUDP, udpPort+1)
		createMapping(t, l, "rec-first", "public", corev1.ProtocolUDP, udpPort+1, 0, udpPort+1, podC)
		waitCondition(t, l, lab.DemoNamespace, "rec-first", v1alpha1.ConditionProgrammed, "False:"+v1alpha1.ReasonNodeNotReady, 20*time.Second)
		first := startProbe(t, fmt.Sprintf("%s:%d", lab.PublicAddr, udpPort+1))
		// The controller knows worker-c's underlay from its earlier agent: edge-a has its link
		// to worker-c and sends into it, unanswered.
		require.Eventually(t, func() bool {
			_, ok := vxlanLinks(t, l, "edge-a")[linkName("public", "worker-c")]
			return ok
		}, 20*time.Second, 50*time.Millisecond, "edge-a has no link to worker-c")
		time.Sleep(time.Second)
		measureRecovery(t, l, first, "worker-c", func() { require.NoError(t, l.StartAgent("worker-c")) }, "edge-a")
		waitCondition(t, l, lab.DemoNamespace, "rec-first", v1alpha1.ConditionProgrammed, "True", 20*time.Second)
	})

	// The control plane away: the kernels keep every object (fail static), so established
	// streams lose nothing and, once it is back, nothing is rebuilt (the links' ifindexes
	// and the table's rule handles are unchanged).
	away := func(t *testing.T, outage time.Duration, stop, start func()) {
		for _, n := range nodes {
			waitAgent(t, svc, n, "")
		}
		before := map[string]string{}
		for _, n := range nodes {
			before[n] = kernelState(t, l, n)
		}
		const interval = 20 * time.Millisecond
		duration := outage + 15*time.Second
		tcp, err := l.Net.StartStream("tcp", fmt.Sprintf("%s:%d", lab.PublicAddr, tcpPort), interval, duration)
		require.NoError(t, err)
		udp, err := l.Net.StartStream("udp", fmt.Sprintf("%s:%d", lab.PublicAddr, udpPort), interval, duration)
		require.NoError(t, err)
		time.Sleep(time.Second)
		stop()
		time.Sleep(outage)
		start()
		for _, n := range nodes {
			waitAgent(t, svc, n, "")
		}
		assertLossless(t, duration+time.Minute, map[string]*netlab.Stream{"tcp": tcp, "udp": udp})
		for _, n := range nodes {
			assert.Equal(t, before[n], kernelState(t, l, n), "kernel state on %s changed while only the control plane was away", n)
		}
	}
	// restartReplica starts controller replica 0 again, as its Deployment would, once it has
	// exited (a leader that cannot renew its Lease exits) or was stopped.
	restartReplica := func() {
		if done := l.ReplicaDone(0); done != nil {
			select {
			case <-done:
				require.NoError(t, l.StopReplica(0, true))
			default:
			}
		}
		if l.ReplicaPid(0) == 0 {
			require.NoError(t, l.StartReplica(0))
		}
	}
	t.Run("the API server and etcd stopped for 30 s", func(t *testing.T) {
		away(t, 30*time.Second, func() { require.NoError(t, l.Cluster.Halt()) }, func() {
			resumeCtx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			require.NoError(t, l.Cluster.Resume(resumeCtx))
			restartReplica()
		})
	})
	t.Run("every controller replica gone for 30 s", func(t *testing.T) {
		away(t, 30*time.Second, func() { require.NoError(t, l.StopReplica(0, true)) }, restartReplica)
	})
}
