package main

import (
	"encoding/json"
	"net"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// sendUDP sends one datagram from src:sport to dst:dport inside namespace ns, on a thread
// that ends with its goroutine so it is never reused outside ns.
func sendUDP(t *testing.T, ns, src string, sport int, dst string, dport int) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		h, err := netns.GetFromName(ns)
		if err != nil {
			done <- err
			return
		}
		defer func() { _ = h.Close() }()
		if err := netns.Set(h); err != nil {
			done <- err
			return
		}
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(src), Port: sport}, &net.UDPAddr{IP: net.ParseIP(dst), Port: dport})
		if err != nil {
			done <- err
			return
		}
		defer func() { _ = c.Close() }()
		_, err = c.Write([]byte("kuport"))
		done <- err
	}()
	require.NoError(t, <-done)
}

// traffic is one counter's packets and bytes.
type traffic struct{ packets, bytes uint64 }

// nftCounters reads the element counters of table inet kuport from `nft -j list table ip
// kuport`, summed by element comment (an entry id), with " in" for the steering maps and " out"
// for the count-out sets, whose elements carry no comment: each is the DNAT element's of the
// same key (every DNAT entry here matches no destination, so both have the dialed key).
func (n *agentNS) nftCounters(t *testing.T) map[string]traffic {
	t.Helper()
	type element struct {
		Elem struct {
			Val     json.RawMessage `json:"val"`
			Comment string          `json:"comment"`
			Counter struct {
				Packets uint64 `json:"packets"`
				Bytes   uint64 `json:"bytes"`
			} `json:"counter"`
		} `json:"elem"`
	}
	type set struct {
		Name string            `json:"name"`
		Elem []json.RawMessage `json:"elem"`
	}
	var listing struct {
		Nftables []struct {
			Set *set `json:"set"`
			Map *set `json:"map"`
		} `json:"nftables"`
	}
	listed := n.exec(t, "nft", "-j", "list", "table", "inet", "kuport")
	require.NoError(t, json.Unmarshal([]byte(listed), &listing))
	type named struct {
		set string
		element
	}
	var elems []named
	dnatID := map[string]string{} // the DNAT elements' ids by key
	for _, o := range listing.Nftables {
		s := o.Set
		if s == nil {
			s = o.Map
		}
		if s == nil {
			continue
		}
		for _, raw := range s.Elem {
			var e element
			if o.Map != nil { // [element, data]
				var pair []json.RawMessage
				require.NoError(t, json.Unmarshal(raw, &pair))
				raw = pair[0]
			}
			require.NoError(t, json.Unmarshal(raw, &e))
			elems = append(elems, named{s.Name, e})
			if strings.HasPrefix(s.Name, "dnat-") {
				dnatID[string(e.Elem.Val)] = e.Elem.Comment
			}
		}
	}
	out := map[string]traffic{}
	for _, e := range elems {
		key := e.Elem.Comment
		switch {
		case strings.HasPrefix(e.set, "steer-"):
			key = dnatID[string(e.Elem.Val)] + " in"
		case strings.HasPrefix(e.set, "count-out-"):
			key = dnatID[string(e.Elem.Val)] + " out"
		}
		c := out[key]
		c.packets += e.Elem.Counter.Packets
		c.bytes += e.Elem.Counter.Bytes
		out[key] = c
	}
	return out
}

// linkStats reads a device's statistics from `ip -j -s link show`.
func (n *agentNS) linkStats(t *testing.T, dev string) *kuportv1.LinkStats {
	t.Helper()
	type dir struct {
		Packets uint64 `json:"packets"`
		Errors  uint64 `json:"errors"`
	}
	var links []struct {
		Stats struct {
			Rx dir `json:"rx"`
			Tx dir `json:"tx"`
		} `json:"stats64"`
	}
	require.NoError(t, json.Unmarshal([]byte(n.ip(t, "-j", "-s", "link", "show", "dev", dev)), &links))
	require.Len(t, links, 1)
	s := links[0].Stats
	return &kuportv1.LinkStats{Name: dev, TxPackets: s.Tx.Packets, RxPackets: s.Rx.Packets, TxErrors: s.Tx.Errors, RxErrors: s.Rx.Errors}
}

// TestPrivilegedAgentReportsCounters runs kuport-agent in a namespace, sends client traffic
// through a mapping to a local pod and one to a remote pod over a link, and checks that
// the agent's Report carries exactly the counters `nft list table inet kuport` shows and
// the statistics `ip -s link` shows for the link.
func TestPrivilegedAgentReportsCounters(t *testing.T) {
	ns := newAgentNS(t, "counters")
	// No IPv6, so the link sends nothing of its own (router solicitations, MLD).
	ns.exec(t, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1", "net.ipv4.ip_forward=1")
	// The pod network: cilium_host, a veth whose peer stays here.
	ns.ip(t, "link", "add", "cilium_host", "type", "veth", "peer", "name", "cilium_net")
	ns.ip(t, "addr", "add", "10.244.17.1/24", "dev", "cilium_host")
	ns.ip(t, "link", "set", "cilium_net", "up")
	ns.ip(t, "link", "set", "cilium_host", "up")
	// The client, in a namespace of its own behind enp1s0.
	client := ns.name + "-client"
	sh(t, "ip", "netns", "add", client)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", client).Run() })
	ns.ip(t, "link", "add", "enp1s0", "type", "veth", "peer", "name", "eth0", "netns", client)
	ns.ip(t, "addr", "add", "203.0.113.9/24", "dev", "enp1s0")
	ns.ip(t, "link", "set", "enp1s0", "up")
	sh(t, "ip", "-n", client, "addr", "add", "203.0.113.7/24", "dev", "eth0")
	sh(t, "ip", "-n", client, "link", "set", "eth0", "up")

	udp := func(first uint32) *kuportv1.PortRange { return &kuportv1.PortRange{First: first, Last: first} }
	program := &kuportv1.NodeProgram{Node: "edge-a", Version: 1, Epoch: 1,
		DnatRules: []*kuportv1.DnatRule{
			{Id: "games/local/dnat/enp1s0", Mapping: "games/local", InInterface: "enp1s0",
				Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: udp(27015), ToAddress: "10.244.17.5", ToPort: 27015, StandIn: "10.244.17.5"},
			{Id: "games/remote/dnat/enp1s0", Mapping: "games/remote", InInterface: "enp1s0",
				Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: udp(3000), ToAddress: "169.254.77.1", ToPort: 3000, StandIn: "169.254.77.1"},
		},
		SnatRules: []*kuportv1.SnatRule{
			{Id: "games/local/snat", Mapping: "games/local", Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
				Address: "10.244.17.5", Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: udp(27015)},
			{Id: "games/remote/snat", Mapping: "games/remote", Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
				Address: "169.254.77.1", Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: udp(3000)},
		},
		Links: []*kuportv1.Link{{Name: "kup-5e30a797", ClassName: "public", PeerNode: "worker-b", Vni: 4242, Port: 4790,
			LocalUnderlay: "100.64.93.143", RemoteUnderlay: "100.64.93.150", LocalAddress: "169.254.77.0", PeerAddress: "169.254.77.1", Mtu: 1370}},
	}
	ctrl, controller := serveOneShot(t, program)
	ns.startAgent(t, append(controller.flags(), "--node-name", "edge-a", "--token-file", "", "--inspect-listen", "", "--epoch-file", "", "--report-interval", "100ms")...)
	s := ctrl.NextSession(t)
	ack := s.NextAck(t)
	require.Empty(t, ack.GetErrors())
	// The far end answers no ARP: a fixed neighbour lets each request leave by the link.
	ns.ip(t, "neigh", "add", "169.254.77.1", "lladdr", "02:00:00:00:00:01", "dev", "kup-5e30a797", "nud", "permanent")

	// Each datagram is a flow of its own, so every NAT rule counts each one.
	const local, remote = 5, 3
	for i := range local {
		sendUDP(t, client, "203.0.113.7", 41000+i, "203.0.113.9", 27015)
	}
	for i := range remote {
		sendUDP(t, client, "203.0.113.7", 42000+i, "203.0.113.9", 3000)
	}

	var report *kuportv1.Report
	deadline := time.Now().Add(30 * time.Second)
	for {
		report = s.NextReport(t)
		got := map[string]uint64{}
		for _, c := range report.GetCounters() {
			got[c.GetId()] = c.GetPackets()
		}
		if got["games/local/dnat/enp1s0"] == local && got["games/remote/dnat/enp1s0"] == remote &&
			len(report.GetLinks()) == 1 && report.GetLinks()[0].GetTxPackets() == remote {
			break
		}
		require.True(t, time.Now().Before(deadline), "no report with the traffic sent: %v", report)
	}
	reported := map[string]traffic{}
	for _, c := range report.GetCounters() {
		reported[c.GetId()] = traffic{c.GetPackets(), c.GetBytes()}
		if in, out := c.GetForwardedIn(), c.GetForwardedOut(); in != nil || out != nil {
			reported[c.GetId()+" in"] = traffic{in.GetPackets(), in.GetBytes()}
			reported[c.GetId()+" out"] = traffic{out.GetPackets(), out.GetBytes()}
		}
	}
	nft := ns.nftCounters(t)
	assert.Equal(t, nft, reported, "the report carries nft's counters, by entry id")
	assert.Equal(t, traffic{remote, nft["games/remote/dnat/enp1s0"].bytes}, nft["games/remote/snat"], "every DNATed request left by the link")
	// kup-steer saw every datagram sent towards the pods; none came back.
	assert.Equal(t, traffic{local, nft["games/local/dnat/enp1s0"].bytes}, nft["games/local/dnat/enp1s0 in"])
	assert.Equal(t, traffic{remote, nft["games/remote/dnat/enp1s0"].bytes}, nft["games/remote/dnat/enp1s0 in"])
	assert.Equal(t, traffic{}, nft["games/remote/dnat/enp1s0 out"])
	assert.Equal(t, ns.linkStats(t, "kup-5e30a797").String(), report.GetLinks()[0].String(), "the report carries the link's statistics")
}
