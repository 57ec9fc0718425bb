// Package negative shows each element of the datapath load-bearing
// (docs/design/datapath.md#shown-load-bearing,
// docs/design/lab.md#datapath-facts-verified-in-namespaces): on the lab network (lab/netlab),
// with no API server, controller or agent, programs written by hand are applied straight
// through datapath into the node namespaces. Each test first proves the full program works
// (the pod sees the client, the reply comes from the dialed address), then takes one element
// away and asserts the failure measured there. No agent runs, so nothing repairs what a test
// removes. It runs only as root with KUPORT_PRIVILEGED=1.
package negative

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"kuport.wlz.li/kuport/datapath"
	"kuport.wlz.li/kuport/internal/testenv"
	"kuport.wlz.li/kuport/lab/labtest"
	"kuport.wlz.li/kuport/lab/netlab"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

const (
	client  = "198.51.100.7"
	podName = "web"
	podAddr = "10.244.18.107"
	podNode = "worker-b"
	port    = 3000
	// dialEdgeA and dialWorkerC are the accepting nodes' uplink addresses a client dials.
	dialEdgeA   = "203.0.113.9:3000"
	dialWorkerC = "198.18.0.3:3000"
	markEdgeA   = 0x6b700001
	markWorkerC = 0x6b700002
	// replyWait bounds a probe that is expected to get an answer; lostWait one that is
	// expected to get none, which always waits it out.
	replyWait = 2 * time.Second
	lostWait  = time.Second
)

var protocols = []string{"tcp", "udp"}

// testLab is the lab network with a Datapath on each node namespace and the pod web on
// worker-b serving tcp and udp on port.
type testLab struct {
	*netlab.Net
	ctx context.Context
	dps map[string]*datapath.Datapath
}

func startLab(t *testing.T) *testLab {
	t.Helper()
	testenv.Privileged(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	dir := t.TempDir()
	log := hclog.New(&hclog.LoggerOptions{Name: "netlab", Level: hclog.Info, Output: t.Output()})
	n, err := netlab.Build(ctx, netlab.Config{Log: log, Dir: dir, ToolBin: filepath.Join(labtest.KuportBin(t), "kuport-lab")})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, n.Close()) })
	l := &testLab{Net: n, ctx: ctx, dps: map[string]*datapath.Datapath{}}
	for _, s := range n.Nodes() {
		l.dps[s.Name] = newDatapath(t, s.Name, log)
	}
	require.NoError(t, n.AddPod(ctx, podName, podNode, podAddr))
	for _, proto := range protocols {
		_, err := n.Serve(podName, proto, port)
		require.NoError(t, err)
	}
	return l
}

// newDatapath points a Datapath at a node's namespace, as an agent inside it would be.
func newDatapath(t *testing.T, node string, log hclog.Logger) *datapath.Datapath {
	t.Helper()
	ns, err := netns.GetFromName(node)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ns.Close() })
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns)), datapath.NFTSocketOption())
	require.NoError(t, err)
	nl, err := netlink.NewHandleAt(ns)
	require.NoError(t, err)
	t.Cleanup(nl.Close)
	return datapath.New(datapath.Config{NFT: conn, Netlink: nl, NetNS: ns, Log: log.Named(node)})
}

func (l *testLab) apply(t *testing.T, programs ...*kuportv1.NodeProgram) {
	t.Helper()
	for _, p := range programs {
		require.NoError(t, l.dps[p.GetNode()].Apply(p), "apply %s", p.GetNode())
	}
}

func (l *testLab) probe(t *testing.T, proto, dst string, timeout time.Duration) netlab.ProbeResult {
	t.Helper()
	res, err := l.Probe(l.ctx, proto, dst, timeout)
	require.NoError(t, err)
	return res
}

// assertServed is the positive control: the pod saw the client's own address and the
// answer came from the address the client dialed.
func (l *testLab) assertServed(t *testing.T, dst string) {
	t.Helper()
	for _, proto := range protocols {
		assert.Equal(t, netlab.ProbeResult{PodSaw: client, ReplyFrom: dst}, l.probe(t, proto, dst, replyWait), "%s to %s", proto, dst)
	}
}

// logLen and seenSince read what the pod's server logged after a point: one
// "saw <peer ip:port>" line per request that reached it.
func (l *testLab) logLen(t *testing.T, proto string) int {
	t.Helper()
	log, err := l.ServerLog(podName, proto, port)
	require.NoError(t, err)
	return len(log)
}

func (l *testLab) seenSince(t *testing.T, proto string, from int) string {
	t.Helper()
	log, err := l.ServerLog(podName, proto, port)
	require.NoError(t, err)
	return log[from:]
}

// link is one end of a vxlan link (docs/design/datapath.md#the-link-device), 1370 = wt0's
// 1420 - 50.
func link(name, peer string, vni uint32, local, remote, addr, peerAddr string) *kuportv1.Link {
	return &kuportv1.Link{Name: name, ClassName: "negative", PeerNode: peer, Vni: vni, Port: 4790,
		LocalUnderlay: local, RemoteUnderlay: remote, LocalAddress: addr, PeerAddress: peerAddr, Mtu: 1370}
}

func protoOf(proto string) kuportv1.Protocol {
	if proto == "udp" {
		return kuportv1.Protocol_PROTOCOL_UDP
	}
	return kuportv1.Protocol_PROTOCOL_TCP
}

func ports() *kuportv1.PortRange { return &kuportv1.PortRange{First: port, Last: port} }

// forwarder is an accepting node without the pod (the shape of remote-edge-a): requests
// arriving on in are translated to the far end of l and claimed by the identity SNAT on
// l, so the client's source crosses the link.
func forwarder(node, in string, l *kuportv1.Link) *kuportv1.NodeProgram {
	p := &kuportv1.NodeProgram{Node: node, Links: []*kuportv1.Link{l}}
	for _, proto := range protocols {
		p.DnatRules = append(p.DnatRules, &kuportv1.DnatRule{Id: "dnat/" + in + "/" + proto, InInterface: in,
			Protocol: protoOf(proto), Ports: ports(), ToAddress: l.GetPeerAddress(), ToPort: port})
		p.SnatRules = append(p.SnatRules, &kuportv1.SnatRule{Id: "snat/" + proto, Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
			Address: l.GetPeerAddress(), Protocol: protoOf(proto), Ports: ports()})
	}
	return p
}

// podNodeProgram is worker-b's side (the shape of remote-worker-b): per link, the DNAT of
// what arrives on it to the pod and a return path with marks[i] and table 201+i; the
// identity SNAT ahead of the strict masquerade and the reply exemption. Return marking
// is Single's static mark of marks[0] when static, else Multi's save per link and
// restore.
func podNodeProgram(links []*kuportv1.Link, marks []uint32, static bool) *kuportv1.NodeProgram {
	p := &kuportv1.NodeProgram{Node: podNode, Links: links}
	for i, l := range links {
		p.ReturnPaths = append(p.ReturnPaths, &kuportv1.ReturnPath{Id: l.GetName() + "/return", Link: l.GetName(),
			Mark: marks[i], Table: 201 + uint32(i), PeerUnderlay: l.GetRemoteUnderlay(), PeerLinkAddress: l.GetPeerAddress()})
	}
	for _, proto := range protocols {
		pr := protoOf(proto)
		for i, l := range links {
			p.DnatRules = append(p.DnatRules, &kuportv1.DnatRule{Id: "dnat/" + l.GetName() + "/" + proto, InInterface: l.GetName(),
				MatchDestination: l.GetLocalAddress(), Protocol: pr, Ports: ports(), ToAddress: podAddr, ToPort: port})
			if !static {
				p.MarkRules = append(p.MarkRules, &kuportv1.MarkRule{Id: "ct-save/" + l.GetName() + "/" + proto,
					Kind: kuportv1.MarkKind_MARK_KIND_CT_SAVE, InInterface: l.GetName(), Address: l.GetLocalAddress(),
					Protocol: pr, Ports: ports(), Mark: marks[i]})
			}
		}
		p.SnatRules = append(p.SnatRules,
			&kuportv1.SnatRule{Id: "snat/" + proto, Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
				Address: podAddr, Protocol: pr, Ports: ports()},
			&kuportv1.SnatRule{Id: "snat-reply/" + proto, Kind: kuportv1.SnatKind_SNAT_KIND_REPLY,
				Address: podAddr, Protocol: pr, Ports: ports()})
		restore := &kuportv1.MarkRule{Id: "ct-restore/" + proto, Kind: kuportv1.MarkKind_MARK_KIND_CT_RESTORE,
			Address: podAddr, Protocol: pr, Ports: ports()}
		if static {
			restore = &kuportv1.MarkRule{Id: "mark/" + proto, Kind: kuportv1.MarkKind_MARK_KIND_STATIC,
				Address: podAddr, Protocol: pr, Ports: ports(), Mark: marks[0]}
		}
		p.MarkRules = append(p.MarkRules, restore)
	}
	return p
}

// The Single shape: edge-a accepts on enp1s0 and forwards over one link to worker-b.
var (
	singleEdgeA   = link("kup-e2b", "worker-b", 4242, "100.64.93.143", "100.64.93.150", "169.254.77.0", "169.254.77.1")
	singleWorkerB = link("kup-b2e", "edge-a", 4242, "100.64.93.150", "100.64.93.143", "169.254.77.1", "169.254.77.0")
)

// applySingle applies the full Single programs and checks the positive control.
func (l *testLab) applySingle(t *testing.T) (workerB *kuportv1.NodeProgram) {
	t.Helper()
	workerB = podNodeProgram([]*kuportv1.Link{singleWorkerB}, []uint32{markEdgeA}, true)
	l.apply(t, forwarder("edge-a", "enp1s0", singleEdgeA), workerB)
	l.assertServed(t, dialEdgeA)
	return workerB
}

// Without the identity SNAT on the pod's node the forwarded request leaves by cilium_host
// with a foreign source, and Cilium's own rules leave it alone: its tunnel-mode host->cluster
// masquerade (cilium/cilium pkg/datapath/iptables/iptables.go) spares destinations in the
// node's pod CIDR, so the pod still sees the client. The strict masquerade of
// docs/design/lab.md#emulating-the-cni-and-the-mesh, under which the pod saw worker-b's
// cilium_host address, is stricter than Cilium (lab/netlab/cni.go has the real rules).
func TestPrivilegedNoIdentitySNATOnPodNode(t *testing.T) {
	l := startLab(t)
	workerB := l.applySingle(t)

	var kept []*kuportv1.SnatRule
	for _, s := range workerB.GetSnatRules() {
		if s.GetKind() != kuportv1.SnatKind_SNAT_KIND_REQUEST {
			kept = append(kept, s)
		}
	}
	workerB.SnatRules = kept
	l.apply(t, workerB)
	for _, proto := range protocols {
		assert.Equal(t, netlab.ProbeResult{PodSaw: client, ReplyFrom: dialEdgeA}, l.probe(t, proto, dialEdgeA, replyWait), proto)
	}
}

// Without the pref 101 rule the encapsulated reply, which carries the inner packet's mark,
// matches pref 102 and is routed back into the link it just left: the kernel refuses it
// silently, counts a tx_error on the link, and the reply is lost
// (docs/design/datapath.md#the-return-path-ip-rules-101-and-102).
func TestPrivilegedLoopGuardRule(t *testing.T) {
	l := startLab(t)
	workerB := l.applySingle(t)

	_, err := l.Exec(l.ctx, podNode, "ip", "rule", "del", "pref", "101")
	require.NoError(t, err)
	before := l.txErrors(t, singleWorkerB.GetName())
	from := l.logLen(t, "udp")
	assert.Equal(t, netlab.ProbeResult{}, l.probe(t, "udp", dialEdgeA, lostWait), "the reply is lost")
	assert.Contains(t, l.seenSince(t, "udp", from), "saw "+client+":", "the request reached the pod")
	assert.Equal(t, before+1, l.txErrors(t, singleWorkerB.GetName()), "one tx_error on %s for the one reply", singleWorkerB.GetName())

	// Re-applying the program, as an agent's resync would, puts the rule back.
	l.apply(t, workerB)
	l.assertServed(t, dialEdgeA)
}

func (l *testLab) txErrors(t *testing.T, name string) uint64 {
	t.Helper()
	stats, err := l.dps[podNode].LinkStats()
	require.NoError(t, err)
	for _, s := range stats {
		if s.GetName() == name {
			return s.GetTxErrors()
		}
	}
	require.Failf(t, "no link", "%s is not on %s", name, podNode)
	return 0
}

// Multi with two forwarders, edge-a and worker-c, each with its own link to worker-b. Saving
// the arrival link's mark on the flow and restoring it on the reply sends each reply back
// through the forwarder that holds its conntrack entry. A static mark sends every reply to
// edge-a, so a client that came in through worker-c gets nothing
// (docs/design/datapath.md#kup-mangle-return-marking).
func TestPrivilegedMultiReturnMarking(t *testing.T) {
	l := startLab(t)
	edgeA := link("kup-e2b", "worker-b", 4300, "100.64.93.143", "100.64.93.150", "169.254.79.0", "169.254.79.1")
	workerC := link("kup-c2b", "worker-b", 4301, "100.64.93.160", "100.64.93.150", "169.254.79.3", "169.254.79.2")
	links := []*kuportv1.Link{
		link("kup-aaaaaaaa", "edge-a", 4300, "100.64.93.150", "100.64.93.143", "169.254.79.1", "169.254.79.0"),
		link("kup-bbbbbbbb", "worker-c", 4301, "100.64.93.150", "100.64.93.160", "169.254.79.2", "169.254.79.3"),
	}
	marks := []uint32{markEdgeA, markWorkerC}
	l.apply(t, forwarder("edge-a", "enp1s0", edgeA), forwarder("worker-c", "eth0", workerC), podNodeProgram(links, marks, false))
	l.assertServed(t, dialEdgeA)
	l.assertServed(t, dialWorkerC)

	l.apply(t, podNodeProgram(links, marks, true))
	l.assertServed(t, dialEdgeA)
	// The request reaches the pod; its reply goes to edge-a, which holds no conntrack entry
	// for the flow and forwards it untranslated, from worker-b's end of the worker-c link.
	// The probe's unconnected UDP socket shows that source; a TCP client gets no answer.
	assert.Equal(t, netlab.ProbeResult{PodSaw: client, ReplyFrom: "169.254.79.2:3000"}, l.probe(t, "udp", dialWorkerC, lostWait))
	assert.Equal(t, netlab.ProbeResult{}, l.probe(t, "tcp", dialWorkerC, lostWait), "no tcp reply through worker-c")
}

// A DNAT on the accepting node straight to the remote pod sends a packet with the client's
// source into the mesh, where WireGuard's cryptokey routing finds no peer whose allowed-IPs
// (each a node's own /32) holds the pod: the packet enters wt0 and dies there
// (docs/design/datapath.md#why-a-link; the receive side of the drop is the lab self-check's,
// lab/netlab/selfcheck.go).
func TestPrivilegedDirectDNATDiesAtMesh(t *testing.T) {
	l := startLab(t)
	l.applySingle(t)

	direct := &kuportv1.NodeProgram{Node: "edge-a"}
	for _, proto := range protocols {
		direct.DnatRules = append(direct.DnatRules, &kuportv1.DnatRule{Id: "dnat/enp1s0/" + proto, InInterface: "enp1s0",
			Protocol: protoOf(proto), Ports: ports(), ToAddress: podAddr, ToPort: port})
	}
	l.apply(t, direct)
	spec, _ := l.Node(podNode)
	_, err := l.Exec(l.ctx, "edge-a", "ip", "route", "add", spec.PodCIDR.String(), "via", spec.UnderlayAddr.Addr().String(), "dev", "wt0")
	require.NoError(t, err)

	txPackets := func() int {
		out, err := l.Exec(l.ctx, "edge-a", "cat", "/sys/class/net/wt0/statistics/tx_packets")
		require.NoError(t, err)
		n, err := strconv.Atoi(strings.TrimSpace(out))
		require.NoError(t, err)
		return n
	}
	for _, proto := range protocols {
		before := txPackets()
		from := l.logLen(t, proto)
		assert.Equal(t, netlab.ProbeResult{}, l.probe(t, proto, dialEdgeA, lostWait), "%s: no reply", proto)
		assert.NotContains(t, l.seenSince(t, proto, from), "saw ", "%s: the pod received nothing", proto)
		assert.Greater(t, txPackets(), before, "%s: the request entered edge-a's wt0", proto)
	}
}
