// Command link measures kuport's link (docs/design/datapath.md#the-link-device) against the
// path without it, in one run: a client dials an accepting node, whose mappings reach a pod on
// that node and one on a serving node across the link; the product's Datapath applies the
// programs compile makes for the two nodes. It prints the ratios of one TCP flow's throughput
// and of the request/response p50 over the link to the same to the accepting node's pod, the
// median of --rounds, for the link as the programs set it up and, with --before, as a program
// without the link's source ports does (an older controller's: the device kuport made before
// them), each set-up's devices made anew. With --routed it also measures the same traffic to
// the pods' own addresses, routed by the same nodes over a plain vxlan device the bench makes
// and translated by nothing: what the second node and the encapsulation cost without kuport.
// Run it as root through bench/link.sh.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/bench/labbench"
	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/datapath"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// The lab's addresses (docs/design/lab.md#topology): edge-a accepts on enp1s0 and reaches
// worker-b over wt0, at the lab's WireGuard MTU.
const (
	clientAddr   = "203.0.113.7"
	acceptAddr   = "203.0.113.9"
	underlayA    = "100.64.93.143"
	underlayB    = "100.64.93.150"
	underlayMTU  = 1420
	podA         = "10.244.17.7"
	podB         = "10.244.18.107"
	podPort      = 3000
	routedPort   = 3002 // the pods' second port, no mapping's: the routed path dials it
	samePort     = 3000 // demo/same: to podA
	crossPort    = 3001 // demo/cross: to podB, over the link
	acceptNode   = "edge-a"
	servingNode  = "worker-b"
	underlayName = "wt0"
	// The routed path's own vxlan device and /31, beside kuport's link (another VNI and port).
	routedName  = "vx0"
	routedVNI   = "4243"
	routedUDP   = "4791"
	routedLocal = "192.168.77.0"
	routedPeer  = "192.168.77.1"
)

// underlay is how wt0 carries the link's datagrams between the nodes.
type underlay int

const (
	// segmenting: the accepting node segments the link's batches before wt0 and the serving
	// node takes each datagram through its whole receive path, as behind a TUN.
	segmenting underlay = iota
	// coalescing: segmented on the way, coalesced on receipt (GRO), as a NIC's driver or
	// the kernel's WireGuard hands them up.
	coalescing
	// batching: wt0 carries the 64 KiB batches whole.
	batching
)

func main() {
	rounds := flag.Int("rounds", 5, "measurements of each figure; the medians are printed")
	traffic := flag.Duration("traffic", 2*time.Second, "each path's share of each figure's measurement in a round (same-node and cross-node in turn)")
	before := flag.Bool("before", true, "also measure the link as a program without source ports sets it up (BENCH link_before)")
	routed := flag.Bool("routed", true, "also measure the same traffic routed to the pods over a plain vxlan device (BENCH link_routed)")
	underlayGSO := flag.Bool("underlay-gso", false, "let the underlay carry the link's datagrams in 64 KiB batches (a veth's offload); by default it carries each one apart, as a TUN (the lab's wireguard-go) does")
	underlayGRO := flag.Bool("underlay-gro", false, "let the serving node coalesce the datagrams it receives (GRO), as a NIC's driver or the kernel's WireGuard does; needs ethtool")
	flag.Parse()
	u := segmenting
	switch {
	case *underlayGSO && *underlayGRO:
		fmt.Fprintln(os.Stderr, "link: --underlay-gso and --underlay-gro are two underlays; give one")
		os.Exit(2)
	case *underlayGSO:
		u = batching
	case *underlayGRO:
		u = coalescing
	}
	if err := run(*rounds, *traffic, *before, *routed, u); err != nil {
		fmt.Fprintln(os.Stderr, "link:", err)
		os.Exit(1)
	}
}

// setup is one way the link is set up: the programs the two nodes apply, and the figures
// measured with them.
type setup struct {
	name        string
	programs    map[string]*kuportv1.NodeProgram
	same, cross string    // the two targets the client dials
	tcp, rr     []float64 // cross over same, per round
}

func run(rounds int, d time.Duration, before, routed bool, u underlay) error {
	compiled, err := programs()
	if err != nil {
		return err
	}
	t, err := newTopology(u, compiled[acceptNode].GetLinks()[0].GetMtu())
	if err != nil {
		return err
	}
	defer t.close()
	for ns, addr := range map[string]string{t.podA: podA, t.podB: podB} {
		for _, port := range []int{podPort, routedPort} {
			stop, err := labbench.ServeIn(ns, addr, port)
			if err != nil {
				return err
			}
			defer stop()
		}
	}
	dps := map[string]*datapath.Datapath{}
	nsOf := map[string]string{acceptNode: t.accept, servingNode: t.serving}
	for node, ns := range nsOf {
		dp, _, closeDP, err := labbench.NodeDatapath(ns, hclog.NewNullLogger())
		if err != nil {
			return err
		}
		defer closeDP()
		dps[node] = dp
	}

	same := net.JoinHostPort(acceptAddr, strconv.Itoa(samePort))
	cross := net.JoinHostPort(acceptAddr, strconv.Itoa(crossPort))
	setups := []*setup{{name: "link", programs: compiled, same: same, cross: cross}}
	if before {
		setups = append(setups, &setup{name: "link_before", programs: withoutSourcePorts(compiled), same: same, cross: cross})
	}
	if routed {
		// kuport's programs stay applied, so each packet meets its table as the link's do.
		setups = append(setups, &setup{name: "link_routed", programs: compiled,
			same: net.JoinHostPort(podA, strconv.Itoa(routedPort)), cross: net.JoinHostPort(podB, strconv.Itoa(routedPort))})
	}
	for r := range rounds {
		order := slices.Clone(setups)
		if r%2 == 1 { // neither set-up always goes first
			slices.Reverse(order)
		}
		for _, s := range order {
			for node, dp := range dps {
				// A link device is made anew for each set-up, as after a reboot: an existing
				// one keeps its source ports under a program without them (datapath/links.go).
				// Before the first Apply there is none to delete.
				_ = exec.Command("ip", "-n", nsOf[node], "link", "del", s.programs[node].GetLinks()[0].GetName()).Run()
				if err := dp.Apply(s.programs[node]); err != nil {
					return fmt.Errorf("%s: apply %s's program: %w", s.name, node, err)
				}
			}
			// Same-node and cross-node traffic in turn, so the ratio holds when the machine's
			// speed drifts (labbench.Interleaved).
			f, err := labbench.Interleaved(t.client, []string{s.same, s.cross}, d)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			s.tcp, s.rr = append(s.tcp, f[1].TCPGbps/f[0].TCPGbps), append(s.rr, f[1].RRP50us/f[0].RRP50us)
			fmt.Fprintf(os.Stderr, "round %d %s (%s): tcp_gbps same=%.2f cross=%.2f rr_p50_us same=%.0f cross=%.0f\n",
				r+1, s.name, t.linkSettings(compiled), f[0].TCPGbps, f[1].TCPGbps, f[0].RRP50us, f[1].RRP50us)
		}
	}
	for _, s := range setups {
		fmt.Printf("BENCH %s cross_over_same_tcp=%.2f cross_over_same_rr=%.2f\n", s.name, labbench.Median(s.tcp), labbench.Median(s.rr))
	}
	return nil
}

// withoutSourcePorts is the programs without their links' source ports, as a controller from
// before them sends them.
func withoutSourcePorts(ps map[string]*kuportv1.NodeProgram) map[string]*kuportv1.NodeProgram {
	out := map[string]*kuportv1.NodeProgram{}
	for node, p := range ps {
		c := proto.CloneOf(p)
		for _, l := range c.GetLinks() {
			l.SourcePortLow, l.SourcePortHigh = 0, 0
		}
		out[node] = c
	}
	return out
}

// programs compiles the lab's class public accepting on edge-a's enp1s0 with two TCP
// mappings: demo/same to a pod on edge-a, demo/cross to a pod on worker-b.
func programs() (map[string]*kuportv1.NodeProgram, error) {
	now := time.Now()
	s := &compile.Snapshot{
		Now: now, LinkRetention: 24 * time.Hour,
		Classes: map[string]*v1alpha1.PortMapClass{"public": {
			ObjectMeta: metav1.ObjectMeta{Name: "public", Generation: 1, CreationTimestamp: metav1.NewTime(now)},
			Spec: v1alpha1.PortMapClassSpec{
				ServingMode: v1alpha1.ServingModeSingle,
				Nodes:       map[string]v1alpha1.ClassNode{acceptNode: {Interfaces: []string{"enp1s0"}}},
				Ports:       v1alpha1.PortPolicy{Min: 1024, Max: 65535},
				ReturnPath: v1alpha1.ReturnPath{Mode: v1alpha1.ReturnPathVxlan,
					Vxlan: v1alpha1.VxlanConfig{VNI: 4242, Port: 4790, Subnet: "169.254.77.0/24"}},
			},
		}},
		Services:       map[types.NamespacedName]*corev1.Service{},
		EndpointSlices: map[types.NamespacedName][]*discoveryv1.EndpointSlice{},
		Namespaces:     map[string]*corev1.Namespace{"demo": {ObjectMeta: metav1.ObjectMeta{Name: "demo"}}},
		Nodes:          map[string]*corev1.Node{},
		Agents: map[string]*compile.AgentState{
			acceptNode: {State: &kuportv1.NodeState{UnderlayInterface: underlayName, IpForward: true, Interfaces: []*kuportv1.Interface{
				{Name: "enp1s0", Addresses: []string{acceptAddr}, Mtu: 1500}, {Name: underlayName, Addresses: []string{underlayA}, Mtu: underlayMTU}}}},
			servingNode: {State: &kuportv1.NodeState{UnderlayInterface: underlayName, IpForward: true, Interfaces: []*kuportv1.Interface{
				{Name: underlayName, Addresses: []string{underlayB}, Mtu: underlayMTU}}}},
		},
	}
	for _, n := range []string{acceptNode, servingNode} {
		s.Nodes[n] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}
	}
	for i, m := range []struct {
		name, pod, node string
		port            int32
	}{{"same", podA, acceptNode, samePort}, {"cross", podB, servingNode, crossPort}} {
		key := types.NamespacedName{Namespace: "demo", Name: m.name}
		s.Services[key] = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: m.name}}
		s.EndpointSlices[key] = []*discoveryv1.EndpointSlice{{
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](podPort)}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{m.pod}, NodeName: ptr.To(m.node),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "demo", Name: m.name + "-0"}}},
		}}
		s.PortMaps = append(s.PortMaps, &v1alpha1.PortMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: m.name, Generation: 1,
				CreationTimestamp: metav1.NewTime(now.Add(time.Duration(i) * time.Second))},
			Spec: v1alpha1.PortMapSpec{ClassName: "public", Protocol: v1alpha1.ProtocolTCP, Port: m.port,
				ServiceRef: v1alpha1.ServiceRef{Name: m.name, Port: "http"}},
		})
	}
	r := compile.Compile(s)
	ps := map[string]*kuportv1.NodeProgram{acceptNode: r.Programs[acceptNode], servingNode: r.Programs[servingNode]}
	if len(ps[acceptNode].GetLinks()) != 1 || len(ps[servingNode].GetLinks()) != 1 || len(ps[acceptNode].GetDnatRules()) != 2 {
		return nil, fmt.Errorf("compile made no link or not both mappings: %v", ps)
	}
	return ps, nil
}

// topology is the two nodes with the client and a pod each: client eth0 - enp1s0 edge-a
// (accepting) wt0 - wt0 worker-b (serving), each node's cilium_host to its pod's eth0,
// worker-b's eth0 (a veth leading nowhere) holding its default route, and the routed path's
// vx0 on each node over wt0.
type topology struct{ client, accept, serving, podA, podB string }

// newTopology builds the namespaces, the routed path's vxlan device at the link's MTU.
func newTopology(u underlay, linkMTU uint32) (*topology, error) {
	suffix := strconv.Itoa(os.Getpid())
	t := &topology{client: "kuplink-client-" + suffix, accept: "kuplink-accept-" + suffix, serving: "kuplink-serve-" + suffix,
		podA: "kuplink-poda-" + suffix, podB: "kuplink-podb-" + suffix}
	in := labbench.In
	var steps [][]string
	for _, ns := range t.all() {
		steps = append(steps, []string{"ip", "netns", "add", ns}, in(ns, "ip", "link", "set", "lo", "up"))
	}
	steps = append(steps,
		in(t.accept, "ip", "link", "add", "enp1s0", "type", "veth", "peer", "name", "eth0", "netns", t.client),
		in(t.accept, "ip", "addr", "add", acceptAddr+"/24", "dev", "enp1s0"),
		in(t.accept, "ip", "link", "set", "enp1s0", "up"),
		in(t.client, "ip", "addr", "add", clientAddr+"/24", "dev", "eth0"),
		in(t.client, "ip", "link", "set", "eth0", "up"),
		in(t.accept, "ip", "link", "add", underlayName, "mtu", strconv.Itoa(underlayMTU), "type", "veth",
			"peer", "name", underlayName, "mtu", strconv.Itoa(underlayMTU), "netns", t.serving),
	)
	// worker-b's uplink, as the lab's: its default route is what the loose reverse-path
	// check finds for the client's address (docs/design/datapath.md#the-link-device).
	steps = append(steps,
		in(t.serving, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "uplink"),
		in(t.serving, "ip", "addr", "add", "192.0.2.2/24", "dev", "eth0"),
		in(t.serving, "ip", "link", "set", "uplink", "up"),
		in(t.serving, "ip", "link", "set", "eth0", "up"),
		in(t.serving, "ip", "route", "add", "default", "via", "192.0.2.1"),
	)
	for _, n := range []struct{ ns, underlay, remote, hostAddr, pod, podNS, routedAddr, routedVia, routedTo string }{
		{t.accept, underlayA, underlayB, "10.244.17.1", podA, t.podA, routedLocal, routedPeer, podB},
		{t.serving, underlayB, underlayA, "10.244.18.1", podB, t.podB, routedPeer, routedLocal, clientAddr},
	} {
		steps = append(steps,
			in(n.ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"),
			in(n.ns, "ip", "addr", "add", n.underlay+"/24", "dev", underlayName),
			in(n.ns, "ip", "link", "set", underlayName, "up"),
			in(n.ns, "ip", "link", "add", "cilium_host", "type", "veth", "peer", "name", "eth0", "netns", n.podNS),
			in(n.ns, "ip", "addr", "add", n.hostAddr+"/24", "dev", "cilium_host"),
			in(n.ns, "ip", "link", "set", "cilium_host", "up"),
			in(n.podNS, "ip", "addr", "add", n.pod+"/24", "dev", "eth0"),
			in(n.podNS, "ip", "link", "set", "eth0", "up"),
			in(n.podNS, "ip", "route", "add", "default", "via", n.hostAddr),
		)
		// The routed path: a vxlan device set up as kuport's link is (datapath/links.go),
		// the route to the other node's end of the path through it.
		steps = append(steps,
			in(n.ns, "ip", "link", "add", routedName, "mtu", strconv.Itoa(int(linkMTU)), "type", "vxlan", "id", routedVNI,
				"dstport", routedUDP, "local", n.underlay, "remote", n.remote, "ttl", "64",
				"srcport", "49152", "65535", "udpcsum"),
			in(n.ns, "ip", "addr", "add", n.routedAddr+"/31", "dev", routedName),
			in(n.ns, "ip", "link", "set", routedName, "up"),
			in(n.ns, "ip", "route", "add", n.routedTo+"/32", "via", n.routedVia, "dev", routedName),
		)
		if u != batching {
			// One segment per batch: the kernel segments the link's datagrams before the
			// underlay, which hands them to the peer one by one.
			steps = append(steps, in(n.ns, "ip", "link", "set", underlayName, "gso_max_segs", "1"))
		}
	}
	if u == coalescing {
		// A veth coalesces what it receives only with GRO on, set while both ends are up, and
		// only from a peer without TSO: the veth driver's rule.
		for _, ns := range []string{t.accept, t.serving} {
			steps = append(steps, in(ns, "ethtool", "-K", underlayName, "tso", "off", "gro", "on"))
		}
	}
	// The client reaches the pods' own addresses through edge-a, for the routed path.
	steps = append(steps, in(t.client, "ip", "route", "add", "10.244.0.0/16", "via", acceptAddr))
	if err := labbench.Run(steps...); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

func (t *topology) all() []string { return []string{t.client, t.accept, t.serving, t.podA, t.podB} }

func (t *topology) close() { labbench.DeleteNS(t.all()...) }

// linkSettings is the accepting node's link device as `ip -d link show` prints its source
// ports and checksum, to show which set-up a round measured.
func (t *topology) linkSettings(ps map[string]*kuportv1.NodeProgram) string {
	name := ps[acceptNode].GetLinks()[0].GetName()
	out, err := exec.Command("ip", "-n", t.accept, "-d", "link", "show", "dev", name).Output()
	if err != nil {
		return err.Error()
	}
	return regexp.MustCompile(`srcport \d+ \d+`).FindString(string(out))
}
