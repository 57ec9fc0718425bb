package datapath

import (
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// inNS runs fn on a thread in namespace ns. The thread stays locked and ends with its
// goroutine, so it is never reused outside ns.
func inNS(t *testing.T, ns netns.NsHandle, fn func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		done <- fn()
	}()
	require.NoError(t, <-done)
}

// peerNS is a namespace joined to a testNS by a veth pair: a client in front of the node.
type peerNS struct {
	name string
	ns   netns.NsHandle
	addr string
}

// addPeer creates a namespace holding eth0 with peerAddr/24, joined to dev in tn, which
// gets nodeAddr/24; both ends up. The namespace is removed when the test ends.
func (tn *testNS) addPeer(t *testing.T, dev, nodeAddr, peerAddr string) *peerNS {
	t.Helper()
	p := &peerNS{addr: peerAddr}
	p.name, p.ns = newNetNS(t, "kuptest-peer-")
	tn.exec(t, "ip", "link", "add", dev, "type", "veth", "peer", "name", "eth0", "netns", p.name)
	tn.exec(t, "ip", "addr", "add", nodeAddr+"/24", "dev", dev)
	tn.exec(t, "ip", "link", "set", dev, "up")
	for _, args := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "addr", "add", peerAddr + "/24", "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
	} {
		run(t, append([]string{"ip", "netns", "exec", p.name}, args...)...)
	}
	return p
}

// sendUDP sends one datagram from the peer's address and port sport to dst:dport.
func (p *peerNS) sendUDP(t *testing.T, sport int, dst string, dport int) {
	t.Helper()
	inNS(t, p.ns, func() error {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP(p.addr), Port: sport}, &net.UDPAddr{IP: net.ParseIP(dst), Port: dport})
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		_, err = c.Write([]byte("kuport"))
		return err
	})
}

// addPodNetwork gives tn forwarding and cilium_host holding 10.244.17.1/24 (a veth whose
// peer cilium_net stays in tn), so a request DNATed to a pod address there is forwarded,
// and its conntrack entry confirmed at postrouting, although no pod answers.
func (tn *testNS) addPodNetwork(t *testing.T) {
	t.Helper()
	for _, args := range [][]string{
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"ip", "link", "add", "cilium_host", "type", "veth", "peer", "name", "cilium_net"},
		{"ip", "addr", "add", "10.244.17.1/24", "dev", "cilium_host"},
		{"ip", "link", "set", "cilium_net", "up"},
		{"ip", "link", "set", "cilium_host", "up"},
	} {
		tn.exec(t, args...)
	}
}

// TestPrivilegedLateInterface applies a program whose DNAT rule names an interface that
// does not exist yet, then creates it: the rule matches its traffic (nft matches the
// name) without another Apply.
func TestPrivilegedLateInterface(t *testing.T) {
	testenv.Privileged(t)
	tn := newTestNS(t, "100.64.93.143")
	tn.addPodNetwork(t)
	p := &kuportv1.NodeProgram{Node: "edge-a", Version: 1, DnatRules: []*kuportv1.DnatRule{{
		Id: "games/late/dnat/enp7s0", Mapping: "games/late", InInterface: "enp7s0",
		Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: &kuportv1.PortRange{First: 27015, Last: 27015},
		ToAddress: "10.244.17.5", ToPort: 27015,
	}}}
	require.NoError(t, tn.dp.Apply(p))
	require.NotContains(t, tn.exec(t, "ip", "-o", "link", "show"), "enp7s0")
	assert.Equal(t, Render(p), tn.nftList(t), "the rule is in although its interface is not")

	client := tn.addPeer(t, "enp7s0", "203.0.113.9", "203.0.113.7")
	for sport := 40000; sport < 40003; sport++ {
		client.sendUDP(t, sport, "203.0.113.9", 27015)
	}
	// One first packet per flow, counted without a re-apply, once the datagrams arrive
	// (the client resolves the node's address first).
	packets := func() uint64 {
		counters, err := tn.dp.Counters()
		require.NoError(t, err)
		c := counterOf(counters, "games/late/dnat/enp7s0")
		require.NotNil(t, c)
		return c.GetPackets()
	}
	deadline := time.Now().Add(5 * time.Second)
	for packets() < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.Equal(t, uint64(3), packets())
	assert.Contains(t, tn.exec(t, "nft", "list", "table", "inet", "kuport"), `"enp7s0" . udp . 27015 counter packets 3 `)
}

// addPod gives tn forwarding and a pod: a namespace holding eth0 with addr/24 behind
// cilium_host (10.244.17.1/24 in tn), its default route through it, and a UDP server on
// port that answers every datagram to its sender with the sender's address as it saw it. It
// returns the pod's namespace.
func (tn *testNS) addPod(t *testing.T, addr string, port int) netns.NsHandle {
	t.Helper()
	name, ns := newNetNS(t, "kuptest-pod-")
	for _, args := range [][]string{
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"ip", "link", "add", "cilium_host", "type", "veth", "peer", "name", "eth0", "netns", name},
		{"ip", "addr", "add", "10.244.17.1/24", "dev", "cilium_host"},
		{"ip", "link", "set", "cilium_host", "up"},
	} {
		tn.exec(t, args...)
	}
	for _, args := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "addr", "add", addr + "/24", "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "route", "add", "default", "via", "10.244.17.1"},
	} {
		run(t, append([]string{"ip", "netns", "exec", name}, args...)...)
	}
	serveUDP(t, ns, addr, port)
	return ns
}

// serveUDP runs a UDP server in ns on addr:port that answers every datagram to its sender
// with the sender's address as it saw it, until the test ends.
func serveUDP(t *testing.T, ns netns.NsHandle, addr string, port int) {
	t.Helper()
	var conn *net.UDPConn
	inNS(t, ns, func() error {
		var err error
		conn, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(addr), Port: port})
		return err
	})
	t.Cleanup(func() { _ = conn.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			_, _ = conn.WriteToUDP([]byte(from.IP.String()), from)
		}
	}()
}

// exchangeUDP sends one datagram from the peer to dst:dport from a new port and returns
// the answer's text and source.
func (p *peerNS) exchangeUDP(t *testing.T, dst string, dport int) (string, string) {
	t.Helper()
	texts, from := p.flowUDP(t, dst, dport, 1)
	return texts[0], from
}

// flowUDP sends datagrams from the peer to dst:dport from one new port, in rounds: each round
// sends its number of datagrams back to back, then reads as many answers. It returns the
// answers' texts and the last one's source.
func (p *peerNS) flowUDP(t *testing.T, dst string, dport int, rounds ...int) ([]string, string) {
	t.Helper()
	var texts []string
	var from string
	inNS(t, p.ns, func() error {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(p.addr)})
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		for _, n := range rounds {
			for range n {
				if _, err := c.WriteToUDP([]byte("kuport"), &net.UDPAddr{IP: net.ParseIP(dst), Port: dport}); err != nil {
					return err
				}
			}
			for range n {
				if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
					return err
				}
				buf := make([]byte, 1500)
				n, src, err := c.ReadFromUDP(buf)
				if err != nil {
					return err
				}
				texts, from = append(texts, string(buf[:n])), src.String()
			}
		}
		return nil
	})
	return texts, from
}

// TestPrivilegedSharedPodPortCounts sends traffic through two mappings dialed on 4000 and
// 4001 of one interface, both to the same pod port: each mapping's counters count its own
// flows' packets, both ways, and none of the other's. Each flow sends two datagrams before
// the first answer (the second may still be a new flow's, already translated) and one more
// after (an established flow's), so kup-steer's two counting rules both count, each packet
// once. The pod sees the client's address and the answers come from the dialed ports.
func TestPrivilegedSharedPodPortCounts(t *testing.T) {
	testenv.Privileged(t)
	tn := newTestNS(t, "100.64.93.143")
	tn.addPod(t, "10.244.17.5", 3000)
	client := tn.addPeer(t, "enp1s0", "203.0.113.9", "203.0.113.7")
	mapping := func(key string, dialed uint32) (*kuportv1.DnatRule, *kuportv1.SnatRule) {
		return &kuportv1.DnatRule{Id: key + "/dnat/enp1s0", Mapping: key, InInterface: "enp1s0", Protocol: kuportv1.Protocol_PROTOCOL_UDP,
				Ports: &kuportv1.PortRange{First: dialed, Last: dialed}, ToAddress: "10.244.17.5", ToPort: 3000, StandIn: "10.244.17.5"},
			&kuportv1.SnatRule{Id: key + "/snat", Mapping: key, Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
				Address: "10.244.17.5", Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: &kuportv1.PortRange{First: 3000, Last: 3000}}
	}
	d1, s1 := mapping("g/four-thousand", 4000)
	d2, s2 := mapping("g/four-thousand-one", 4001)
	p := &kuportv1.NodeProgram{Node: "edge-a", Version: 1, DnatRules: []*kuportv1.DnatRule{d1, d2}, SnatRules: []*kuportv1.SnatRule{s1, s2}}
	require.NoError(t, tn.dp.Apply(p))

	const first, second, perFlow = 3, 5, 3
	for dport, n := range map[int]int{4000: first, 4001: second} {
		for range n {
			texts, from := client.flowUDP(t, "203.0.113.9", dport, 2, 1)
			assert.Equal(t, []string{"203.0.113.7", "203.0.113.7", "203.0.113.7"}, texts, "the pod saw the client")
			assert.Equal(t, net.JoinHostPort("203.0.113.9", itoa(uint32(dport))), from, "the answer comes from the dialed port")
		}
	}
	counters, err := tn.dp.Counters()
	require.NoError(t, err)
	for id, n := range map[string]uint64{d1.Id: first, d2.Id: second} {
		c := counterOf(counters, id)
		require.NotNil(t, c, id)
		assert.Equal(t, n, c.GetPackets(), "%s: flows", id)
		assert.Equal(t, n*perFlow, c.GetForwardedIn().GetPackets(), "%s: requests", id)
		assert.Equal(t, n*perFlow, c.GetForwardedOut().GetPackets(), "%s: answers", id)
		assert.Equal(t, n*perFlow*(20+8+6), c.GetForwardedIn().GetBytes(), "%s: request bytes", id)
	}
	// The identity SNAT element both mappings need is one, the first's: it claims every flow.
	assert.Equal(t, uint64(first+second), counterOf(counters, s1.Id).GetPackets())
	assert.Nil(t, counterOf(counters, s2.Id))
}

// TestPrivilegedHostNetworkTarget: a mapping to a pod in the node's network namespace, whose
// stand-in compile makes its target, the node's own address (a host firewall then judges
// the flow as the node's own): the request dialed on enp1s0 is steered to that address,
// translated to the listener's port and answered from the dialed address and port, and
// every packet is counted once each way.
func TestPrivilegedHostNetworkTarget(t *testing.T) {
	testenv.Privileged(t)
	tn := newTestNS(t, "100.64.93.143")
	serveUDP(t, tn.ns, "100.64.93.143", 3000)
	client := tn.addPeer(t, "enp1s0", "203.0.113.9", "203.0.113.7")
	d := &kuportv1.DnatRule{Id: "g/host/dnat/enp1s0", Mapping: "g/host", InInterface: "enp1s0", Protocol: kuportv1.Protocol_PROTOCOL_UDP,
		Ports: &kuportv1.PortRange{First: 4000, Last: 4000}, ToAddress: "100.64.93.143", ToPort: 3000, StandIn: "100.64.93.143"}
	require.NoError(t, tn.dp.Apply(&kuportv1.NodeProgram{Node: "edge-a", Version: 1, DnatRules: []*kuportv1.DnatRule{d}}))

	const flows, perFlow = 2, 3
	for range flows {
		texts, from := client.flowUDP(t, "203.0.113.9", 4000, 2, 1)
		assert.Equal(t, []string{"203.0.113.7", "203.0.113.7", "203.0.113.7"}, texts, "the listener saw the client")
		assert.Equal(t, "203.0.113.9:4000", from, "the answer comes from the dialed address and port")
	}
	counters, err := tn.dp.Counters()
	require.NoError(t, err)
	c := counterOf(counters, d.Id)
	require.NotNil(t, c)
	assert.Equal(t, uint64(flows), c.GetPackets(), "flows")
	assert.Equal(t, uint64(flows*perFlow), c.GetForwardedIn().GetPackets(), "requests")
	assert.Equal(t, uint64(flows*perFlow), c.GetForwardedOut().GetPackets(), "answers")
}
