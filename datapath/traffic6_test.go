package datapath

import (
	"encoding/binary"
	"io"
	"maps"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// The dual-stack addresses of TestPrivilegedDualStack: the client and the node's interface
// it dials, and the pod behind the node's cilium_host.
const (
	client6Addr = "2001:db8:1::7"
	node6Addr   = "2001:db8:1::9"
	pod6Addr    = "fd00:10:244:17::5"
	pod4Addr    = "10.244.17.5"
)

// addDualStackPod is addPod with IPv6 beside IPv4: the pod holds pod4Addr/24 and
// pod6Addr/64 behind cilium_host (10.244.17.1/24, fd00:10:244:17::1/64), both forwarded,
// and answers UDP on port in both families, and TCP on tcpPort in IPv6, with the address
// it saw its peer at. It returns the pod's namespace's name.
func (tn *testNS) addDualStackPod(t *testing.T, port, tcpPort int) string {
	t.Helper()
	name, ns := newNetNS(t, "kuptest-pod-")
	for _, args := range [][]string{
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"},
		{"ip", "link", "add", "cilium_host", "type", "veth", "peer", "name", "eth0", "netns", name},
		{"ip", "addr", "add", "10.244.17.1/24", "dev", "cilium_host"},
		{"ip", "addr", "add", "fd00:10:244:17::1/64", "dev", "cilium_host", "nodad"},
		{"ip", "link", "set", "cilium_host", "up"},
	} {
		tn.exec(t, args...)
	}
	for _, args := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "addr", "add", pod4Addr + "/24", "dev", "eth0"},
		{"ip", "addr", "add", pod6Addr + "/64", "dev", "eth0", "nodad"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "route", "add", "default", "via", "10.244.17.1"},
		{"ip", "-6", "route", "add", "default", "via", "fd00:10:244:17::1"},
	} {
		run(t, append([]string{"ip", "netns", "exec", name}, args...)...)
	}
	serveUDP(t, ns, pod4Addr, port)
	serveUDP(t, ns, pod6Addr, port)
	var l net.Listener
	inNS(t, ns, func() error {
		var err error
		l, err = net.Listen("tcp", net.JoinHostPort(pod6Addr, itoa(uint32(tcpPort))))
		return err
	})
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			_, _ = c.Write([]byte(host))
			_ = c.Close()
		}
	}()
	return name
}

// TestPrivilegedDualStack serves one mapping in both families on one node: an IPv4 and
// an IPv6 client each reach the pod, which sees each client's own address, and each answer
// comes from the address and port its client dialed; the IPv6 request's checksums survive
// the stand-in's rewrite and the DNAT (a datagram whose checksum the client computed itself,
// sent past every offload, still arrives); each family's entries count their own flows.
func TestPrivilegedDualStack(t *testing.T) {
	testenv.Privileged(t)
	tn := newTestNS(t, "100.64.93.143")
	pod := tn.addDualStackPod(t, 3000, 3001)
	client := tn.addPeer(t, "enp1s0", "203.0.113.9", "203.0.113.7")
	tn.exec(t, "ip", "addr", "add", node6Addr+"/64", "dev", "enp1s0", "nodad")
	run(t, "ip", "netns", "exec", client.name, "ip", "addr", "add", client6Addr+"/64", "dev", "eth0", "nodad")
	client6 := &peerNS{name: client.name, ns: client.ns, addr: client6Addr}
	// A device's first neighbour discovery may go unanswered while its link-local address
	// is tentative: begin once none is.
	for _, ns := range []string{tn.name, client.name, pod} {
		require.Eventually(t, func() bool {
			return run(t, "ip", "netns", "exec", ns, "ip", "-6", "addr", "show", "tentative") == ""
		}, 5*time.Second, 50*time.Millisecond, "addresses of %s still tentative", ns)
	}

	udp, tcp := kuportv1.Protocol_PROTOCOL_UDP, kuportv1.Protocol_PROTOCOL_TCP
	dnat := func(id string, proto kuportv1.Protocol, dialed uint32, to string, toPort uint32) *kuportv1.DnatRule {
		return &kuportv1.DnatRule{Id: id, Mapping: "g/dual", InInterface: "enp1s0", Protocol: proto,
			Ports: &kuportv1.PortRange{First: dialed, Last: dialed}, ToAddress: to, ToPort: toPort, StandIn: to}
	}
	snat := func(id string, proto kuportv1.Protocol, to string, port uint32) *kuportv1.SnatRule {
		return &kuportv1.SnatRule{Id: id, Mapping: "g/dual", Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
			Address: to, Protocol: proto, Ports: &kuportv1.PortRange{First: port, Last: port}}
	}
	p := &kuportv1.NodeProgram{Node: "edge-a", Version: 1,
		DnatRules: []*kuportv1.DnatRule{
			dnat("g/dual/dnat/enp1s0", udp, 4000, pod4Addr, 3000),
			dnat("g/dual/dnat6/enp1s0", udp, 4000, pod6Addr, 3000),
			dnat("g/tcp6/dnat6/enp1s0", tcp, 4001, pod6Addr, 3001),
		},
		SnatRules: []*kuportv1.SnatRule{
			snat("g/dual/snat", udp, pod4Addr, 3000), snat("g/dual/snat6", udp, pod6Addr, 3000), snat("g/tcp6/snat6", tcp, pod6Addr, 3001),
		},
	}
	require.NoError(t, tn.dp.Apply(p))

	const flows4, flows6 = 2, 3
	for range flows4 {
		texts, from := client.flowUDP(t, "203.0.113.9", 4000, 2, 1)
		assert.Equal(t, []string{"203.0.113.7", "203.0.113.7", "203.0.113.7"}, texts, "the pod saw the IPv4 client")
		assert.Equal(t, "203.0.113.9:4000", from, "the IPv4 answer comes from the dialed address and port")
	}
	for range flows6 {
		texts, from := client6.flowUDP(t, node6Addr, 4000, 2, 1)
		assert.Equal(t, []string{client6Addr, client6Addr, client6Addr}, texts, "the pod saw the IPv6 client")
		assert.Equal(t, net.JoinHostPort(node6Addr, "4000"), from, "the IPv6 answer comes from the dialed address and port")
	}
	text, from := client6.exchangeRawUDP6(t, node6Addr, 4000)
	assert.Equal(t, client6Addr, text, "a datagram with the client's own checksum arrives whole")
	assert.Equal(t, net.JoinHostPort(node6Addr, "4000"), from)

	inNS(t, client.ns, func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(node6Addr, "4001"), 5*time.Second)
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		b, err := io.ReadAll(c)
		assert.Equal(t, client6Addr, string(b), "the IPv6 TCP pod saw the client")
		return err
	})

	counters, err := tn.dp.Counters()
	require.NoError(t, err)
	for id, n := range map[string]uint64{"g/dual/dnat/enp1s0": flows4, "g/dual/dnat6/enp1s0": flows6 + 1, "g/tcp6/dnat6/enp1s0": 1} {
		c := counterOf(counters, id)
		require.NotNil(t, c, id)
		assert.Equal(t, n, c.GetPackets(), "%s: flows", id)
	}
	assert.Equal(t, uint64(flows6*3+1), counterOf(counters, "g/dual/dnat6/enp1s0").GetForwardedOut().GetPackets(), "IPv6 answers")

	require.NoError(t, tn.dp.Cleanup())
	assert.Empty(t, tn.nftList(t), "cleanup leaves no table inet kuport")
}

// exchangeRawUDP6 sends one UDP datagram from the peer's IPv6 address to dst:dport through
// a raw socket, its checksum computed here, so no offload fills it in later and the
// receiver checks it; it returns the answer's text and source.
func (p *peerNS) exchangeRawUDP6(t *testing.T, dst string, dport int) (string, string) {
	t.Helper()
	var text, from string
	inNS(t, p.ns, func() error {
		answers, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(p.addr)})
		if err != nil {
			return err
		}
		defer func() { _ = answers.Close() }()
		raw, err := net.ListenPacket("ip6:udp", p.addr)
		if err != nil {
			return err
		}
		defer func() { _ = raw.Close() }()
		sport := answers.LocalAddr().(*net.UDPAddr).Port
		datagram := udp6Datagram(netip.MustParseAddr(p.addr), netip.MustParseAddr(dst), uint16(sport), uint16(dport), []byte("kuport"))
		if _, err := raw.WriteTo(datagram, &net.IPAddr{IP: net.ParseIP(dst)}); err != nil {
			return err
		}
		if err := answers.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			return err
		}
		buf := make([]byte, 1500)
		n, src, err := answers.ReadFromUDP(buf)
		text, from = string(buf[:n]), src.String()
		return err
	})
	return text, from
}

// udp6Datagram is a UDP header and payload with the checksum over the IPv6 pseudo-header
// (RFC 8200, section 8.1).
func udp6Datagram(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(len(b)))
	copy(b[8:], payload)
	var sum uint32
	add := func(data []byte) {
		for i := 0; i+1 < len(data); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(data[i:]))
		}
		if len(data)%2 == 1 {
			sum += uint32(data[len(data)-1]) << 8
		}
	}
	s, d := src.As16(), dst.As16()
	add(s[:])
	add(d[:])
	add([]byte{0, 0, byte(len(b) >> 8), byte(len(b)), 0, 0, 0, 17})
	add(b)
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	c := ^uint16(sum)
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(b[6:], c)
	return b
}

// flows6BySport is flowsBySport of the namespace's IPv6 conntrack table.
func (tn *testNS) flows6BySport(t *testing.T) map[uint16]string {
	t.Helper()
	flows, err := tn.nl.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V6)
	require.NoError(t, err)
	out := map[uint16]string{}
	for _, f := range flows {
		if f.Forward.Protocol == 17 {
			out[f.Forward.SrcPort] = net.JoinHostPort(f.Forward.DstIP.String(), itoa(uint32(f.Forward.DstPort))) + " -> " +
				net.JoinHostPort(f.Reverse.SrcIP.String(), itoa(uint32(f.Reverse.SrcPort)))
		}
	}
	return out
}

// TestPrivilegedConntrack6: the conntrack sweep of a change keeps each flow to its family.
// One port mapped in IPv4 and in IPv6 to one pod, both sides moved to another pod address in
// one change: each family's flow its old translation made is deleted. An IPv6 side that comes
// in the same change, after its clients, deletes the un-NATed IPv6 flow to its port and not
// the IPv4 one, although the sweep reads both families' tables.
func TestPrivilegedConntrack6(t *testing.T) {
	testenv.Privileged(t)
	tn := newTestNS(t, "100.64.93.143")
	tn.addPodNetwork(t)
	for _, args := range [][]string{
		{"sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"},
		{"ip", "addr", "add", "fd00:10:244:17::1/64", "dev", "cilium_host", "nodad"},
	} {
		tn.exec(t, args...)
	}
	client := tn.addPeer(t, "enp1s0", "203.0.113.9", "203.0.113.7")
	tn.exec(t, "ip", "addr", "add", node6Addr+"/64", "dev", "enp1s0", "nodad")
	run(t, "ip", "netns", "exec", client.name, "ip", "addr", "add", client6Addr+"/64", "dev", "eth0", "nodad")
	client6 := &peerNS{name: client.name, ns: client.ns, addr: client6Addr}
	const pod5, pod6 = "fd00:10:244:17::5", "fd00:10:244:17::6"
	const flow, early = 5000, 5001
	sent := func() {
		client.sendUDP(t, flow, "203.0.113.9", 3000)
		client6.sendUDP(t, flow, node6Addr, 3000)
	}
	require.NoError(t, tn.dp.Apply(edgeProgram(udpRule("g/m", 3000, "10.244.17.5"), udpRule6("g/m", 3000, pod5))))
	sent()
	client.sendUDP(t, early, "203.0.113.9", 3001)
	client6.sendUDP(t, early, node6Addr, 3001)
	want4 := map[uint16]string{flow: "203.0.113.9:3000 -> 10.244.17.5:3000", early: "203.0.113.9:3001 -> 203.0.113.9:3001"}
	tn.waitFlows(t, want4)
	require.Eventually(t, func() bool {
		return maps.Equal(map[uint16]string{
			flow:  "[2001:db8:1::9]:3000 -> [fd00:10:244:17::5]:3000",
			early: "[2001:db8:1::9]:3001 -> [2001:db8:1::9]:3001",
		}, tn.flows6BySport(t))
	}, 5*time.Second, 10*time.Millisecond, "IPv6 flows: %v", tn.flows6BySport(t))

	require.NoError(t, tn.dp.Apply(edgeProgram(udpRule("g/m", 3000, "10.244.17.6"), udpRule6("g/m", 3000, pod6), udpRule6("g/early", 3001, pod5))))
	assert.Equal(t, map[uint16]string{early: want4[early]}, tn.flowsBySport(t, 17), "the moved IPv4 flow deleted, the IPv4 one to the new IPv6 side's port kept")
	assert.Empty(t, tn.flows6BySport(t), "the moved and the early IPv6 flows deleted")

	require.NoError(t, tn.dp.Cleanup())
	assert.Equal(t, map[uint16]string{early: "203.0.113.9:3001 -> 203.0.113.9:3001"}, tn.flowsBySport(t, 17))
}

// udpRule6 is udpRule's IPv6 side: its own id, to the pod's IPv6 address.
func udpRule6(mapping string, port uint32, pod string) *kuportv1.DnatRule {
	r := udpRule(mapping, port, pod)
	r.Id = mapping + "/dnat6/enp1s0"
	return r
}
