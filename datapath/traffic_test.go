package datapath

import (
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

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
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(p.addr), Port: sport}, &net.UDPAddr{IP: net.ParseIP(dst), Port: dport})
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
	privileged(t)
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
	assert.Contains(t, tn.exec(t, "nft", "list", "table", "ip", "kuport"), `"enp7s0" . udp . 27015 counter packets 3 `)
}
