package compile

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/datapath"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestTraceLab compiles the lab's shapes and traces a flow through one node's program
// (datapath.Trace: the rules and elements Apply would write, the ip rules and routes of its
// return paths): what the request is translated to, where the identity SNAT claims it, the
// mark its reply gets and the return path that routes the reply. A client at
// 198.51.100.7:40000 dials; a translated request toward a pod on the node leaves by
// cilium_host.
func TestTraceLab(t *testing.T) {
	client := netip.MustParseAddrPort("198.51.100.7:40000")
	game := func() *Snapshot {
		s := world(mkPortMap("game", 0, 27015, endPort(27115), proto(v1alpha1.ProtocolUDP)),
			mkPortMap("shifted", 1, 40000, endPort(40009)))
		addService(s, "game", 27015, mkEndpoint("game-0", "10.244.18.107", "worker-b"))
		addService(s, "shifted", 7000, mkEndpoint("shifted-0", "10.244.17.8", "edge-a"))
		return s
	}
	// refusal is a port crossing a link already taken: demo/xb (wt0 to pod-b2 on
	// worker-b) is refused, its port crossing the link that carries it for demo/xa
	// (enp1s0 to pod-b); demo/xc (wt0 to pod-a on edge-a) is served.
	refusal := func() *Snapshot {
		return samePortWorld(mkPortMap("xa", 0, 3300, service("pod-b"), interfaces("enp1s0")),
			mkPortMap("xb", 1, 3300, service("pod-b2"), interfaces("wt0")),
			mkPortMap("xc", 2, 3300, service("pod-a"), interfaces("wt0")))
	}
	// twoWays is one pod port reached two ways
	// (docs/design/datapath.md#kup-mangle-return-marking): pod remote-0's port 3000
	// exposed publicly (class public, Single, over edge-a's link) and on the intranet
	// (class intranet, Multi, forwarders edge-a and worker-c) at once; each reply returns
	// over the link its request came by.
	twoWays := func() *Snapshot {
		s := world(mkPortMap("remote", 0, 3000), mkPortMap("i-remote", 1, 3001, className("intranet"), service("remote")))
		s.Classes["intranet"] = multiClass(map[string][]string{"edge-a": {"enp1s0"}, "worker-c": {"eth0"}})
		return s
	}
	cases := []struct {
		name string
		snap func() *Snapshot
		node string
		in   string
		prot kuportv1.Protocol
		dst  string
		want string
	}{
		{name: "same node", snap: func() *Snapshot { return world(mkPortMap("local", 0, 3000)) },
			node: "edge-a", in: "enp1s0", prot: tcp, dst: "203.0.113.9:3000",
			want: "dnat 10.244.17.7:3000 by demo/local/dnat/enp1s0, snat on cilium_host"},
		{name: "same node, the other protocol", snap: func() *Snapshot { return world(mkPortMap("local", 0, 3000)) },
			node: "edge-a", in: "enp1s0", prot: udp, dst: "203.0.113.9:3000", want: "none"},
		{name: "cross node Single, accepting node", snap: func() *Snapshot { return world(mkPortMap("remote", 0, 3000)) },
			node: "edge-a", in: "wt0", prot: tcp, dst: "100.64.93.143:3000",
			want: "dnat 169.254.77.1:3000 by demo/remote/dnat/wt0, snat on " + linkToWorkerB},
		{name: "cross node Single, pod's node", snap: func() *Snapshot { return world(mkPortMap("remote", 0, 3000)) },
			node: "worker-b", in: linkToEdgeA, prot: tcp, dst: "169.254.77.1:3000",
			want: "dnat 10.244.18.107:3000 by demo/remote/dnat/" + linkToEdgeA + ", snat on cilium_host, ct mark 0x1, reply mark 0x1, " +
				"reply by table 27505 via 169.254.77.0 dev " + linkToEdgeA},
		{name: "a range keeps the port, accepting node", snap: game,
			node: "edge-a", in: "enp1s0", prot: udp, dst: "203.0.113.9:27100",
			want: "dnat 169.254.77.1:27100 by demo/game/dnat/enp1s0, snat on " + linkToWorkerB},
		{name: "a range keeps the port, pod's node", snap: game,
			node: "worker-b", in: linkToEdgeA, prot: udp, dst: "169.254.77.1:27115",
			want: "dnat 10.244.18.107:27115 by demo/game/dnat/" + linkToEdgeA + ", snat on cilium_host, ct mark 0x1, reply mark 0x1, " +
				"reply by table 27505 via 169.254.77.0 dev " + linkToEdgeA},
		{name: "a shifted range maps port by port", snap: game,
			node: "edge-a", in: "wt0", prot: tcp, dst: "100.64.93.143:40003",
			want: "dnat 10.244.17.8:7003 by demo/shifted/dnat/wt0, snat on cilium_host"},
		{name: "past a shifted range", snap: game,
			node: "edge-a", in: "wt0", prot: tcp, dst: "100.64.93.143:40010", want: "none"},
		{name: "Multi, accepting edge-a", snap: multiWorld,
			node: "edge-a", in: "enp1s0", prot: tcp, dst: "203.0.113.9:3000",
			want: "dnat 169.254.79.1:3000 by demo/remote/dnat/enp1s0, snat on " + intranetToWB},
		{name: "Multi, accepting worker-c", snap: multiWorld,
			node: "worker-c", in: "eth0", prot: tcp, dst: "198.18.0.3:3000",
			want: "dnat 169.254.79.2:3000 by demo/remote/dnat/eth0, snat on " + intranetToWB},
		{name: "Multi, pod's node through edge-a", snap: multiWorld,
			node: "worker-b", in: intranetToEA, prot: tcp, dst: "169.254.79.1:3000",
			want: "dnat 10.244.18.107:3000 by demo/remote/dnat/" + intranetToEA + ", snat on cilium_host, ct mark 0x1, " +
				"reply mark 0x1, reply by table 27505 via 169.254.79.0 dev " + intranetToEA},
		{name: "Multi, pod's node through worker-c", snap: multiWorld,
			node: "worker-b", in: intranetToWC, prot: tcp, dst: "169.254.79.2:3000",
			want: "dnat 10.244.18.107:3000 by demo/remote/dnat/" + intranetToWC + ", snat on cilium_host, ct mark 0x2, " +
				"reply mark 0x2, reply by table 27506 via 169.254.79.3 dev " + intranetToWC},
		{name: "Multi, a request for the other link's address", snap: multiWorld,
			node: "worker-b", in: intranetToWC, prot: tcp, dst: "169.254.79.1:3000", want: "none"},
		{name: "a refused mapping: its interface goes to the served one", snap: refusal,
			node: "edge-a", in: "wt0", prot: tcp, dst: "100.64.93.143:3300",
			want: "dnat 10.244.17.7:3300 by demo/xc/dnat/wt0, snat on cilium_host"},
		{name: "a refused mapping: its pod is not reached", snap: refusal,
			node: "worker-b", in: linkToEdgeA, prot: tcp, dst: "169.254.77.1:3300",
			want: "dnat 10.244.18.107:3300 by demo/xa/dnat/" + linkToEdgeA + ", snat on cilium_host, ct mark 0x1, reply mark 0x1, " +
				"reply by table 27505 via 169.254.77.0 dev " + linkToEdgeA},
		{name: "one pod port, two ways: public, over public's link", snap: twoWays,
			node: "worker-b", in: linkToEdgeA, prot: tcp, dst: "169.254.77.1:3000",
			want: "dnat 10.244.18.107:3000 by demo/remote/dnat/" + linkToEdgeA + ", snat on cilium_host, ct mark 0x1, " +
				"reply mark 0x1, reply by table 27505 via 169.254.77.0 dev " + linkToEdgeA},
		{name: "one pod port, two ways: intranet through edge-a", snap: twoWays,
			node: "worker-b", in: intranetToEA, prot: tcp, dst: "169.254.79.1:3001",
			want: "dnat 10.244.18.107:3000 by demo/i-remote/dnat/" + intranetToEA + ", snat on cilium_host, ct mark 0x2, " +
				"reply mark 0x2, reply by table 27506 via 169.254.79.0 dev " + intranetToEA},
		{name: "one pod port, two ways: intranet through worker-c", snap: twoWays,
			node: "worker-b", in: intranetToWC, prot: tcp, dst: "169.254.79.2:3001",
			want: "dnat 10.244.18.107:3000 by demo/i-remote/dnat/" + intranetToWC + ", snat on cilium_host, ct mark 0x3, " +
				"reply mark 0x3, reply by table 27507 via 169.254.79.3 dev " + intranetToWC},
		{name: "a refused mapping alone holds nothing",
			snap: func() *Snapshot { return world(mkPortMap("bad", 0, 8080)) },
			node: "edge-a", in: "enp1s0", prot: tcp, dst: "203.0.113.9:8080", want: "none"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := Compile(c.snap()).Programs[c.node]
			v, err := datapath.Trace(p, datapath.Packet{In: c.in, Proto: c.prot, Src: client,
				Dst: netip.MustParseAddrPort(c.dst), Out: "cilium_host"})
			if err != nil {
				t.Fatal(err)
			}
			if got := traceText(v); got != c.want {
				t.Errorf("%s, %s %v %s:\n got %s\nwant %s", c.node, c.in, c.prot, c.dst, got, c.want)
			}
		})
	}
}

// traceText is what a trace says of the flow, as one line.
func traceText(v *datapath.Verdict) string {
	var parts []string
	if v.DNAT.IsValid() {
		by := ""
		for _, e := range v.Elements {
			if f := strings.SplitN(e, " ", 3); f[0] == "kup-pre" {
				by = " by " + f[2]
			}
		}
		parts = append(parts, fmt.Sprintf("dnat %s%s", v.DNAT, by))
	}
	if v.SNAT != "" {
		parts = append(parts, "snat on "+v.SNAT)
	}
	if v.CtMark != 0 {
		parts = append(parts, fmt.Sprintf("ct mark %#x", v.CtMark))
	}
	if v.Mark != 0 {
		parts = append(parts, fmt.Sprintf("reply mark %#x", v.Mark))
	}
	if r := v.Route; r != nil {
		parts = append(parts, fmt.Sprintf("reply by table %d via %s dev %s", r.Table, r.Via, r.Link))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
