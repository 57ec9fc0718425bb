package compile

import (
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// The lab of docs/design/lab.md#topology: class public accepts on edge-a (enp1s0 203.0.113.9,
// wt0 100.64.93.143); worker-b holds eth0 192.0.2.2 and wt0 100.64.93.150, worker-c (the
// lab's second accepting node for Multi, pod CIDR 10.244.19.0/24) eth0 198.18.0.3 and wt0
// 100.64.93.160; every underlay is wt0 at MTU 1420, every eth0 and enp1s0 at 1500. Pod
// local-0 10.244.17.7 on edge-a, pod remote-0 10.244.18.107 on worker-b, TCP 3000.
var now = time.Date(2026, 9, 8, 12, 0, 0, 0, time.UTC)

const (
	tcp       = kuportv1.Protocol_PROTOCOL_TCP
	udp       = kuportv1.Protocol_PROTOCOL_UDP
	ctSave    = kuportv1.MarkKind_MARK_KIND_CT_SAVE
	ctRestore = kuportv1.MarkKind_MARK_KIND_CT_RESTORE
	// Device names, computed independently: printf public/worker-b | sha256sum.
	linkToWorkerB = "kup-5e30a797" // sha256("public/worker-b")
	linkToEdgeA   = "kup-dcc4266d" // sha256("public/edge-a")
	linkToWorkerC = "kup-13ff4a6d" // sha256("public/worker-c")
	intranetToWB  = "kup-1a1f198d" // sha256("intranet/worker-b")
	intranetToEA  = "kup-cfd0305c" // sha256("intranet/edge-a")
	intranetToWC  = "kup-d86d73d7" // sha256("intranet/worker-c")
)

// world is the lab with the given mappings; services demo/local and demo/remote exist.
func world(pms ...*v1alpha1.PortMap) *Snapshot {
	s := &Snapshot{
		Now:           now,
		LinkRetention: 24 * time.Hour,
		Classes: map[string]*v1alpha1.PortMapClass{
			"public": mkClass("public", 0, map[string][]string{"edge-a": {"enp1s0", "wt0"}}),
		},
		PortMaps:       pms,
		Services:       map[types.NamespacedName]*corev1.Service{},
		EndpointSlices: map[types.NamespacedName][]*discoveryv1.EndpointSlice{},
		Namespaces:     map[string]*corev1.Namespace{"demo": {ObjectMeta: metav1.ObjectMeta{Name: "demo"}}},
		Nodes:          map[string]*corev1.Node{},
		Agents: map[string]*AgentState{
			"edge-a":   mkAgent(iface("enp1s0", "203.0.113.9", 1500), iface("wt0", "100.64.93.143", 1420)),
			"worker-b": mkAgent(iface("wt0", "100.64.93.150", 1420), iface("eth0", "192.0.2.2", 1500)),
			"worker-c": mkAgent(iface("wt0", "100.64.93.160", 1420), iface("eth0", "198.18.0.3", 1500)),
		},
	}
	addNodes(s, "edge-a", "worker-b", "worker-c")
	addService(s, "local", 3000, mkEndpoint("local-0", "10.244.17.7", "edge-a"))
	addService(s, "remote", 3000, mkEndpoint("remote-0", "10.244.18.107", "worker-b"))
	return s
}

func addNodes(s *Snapshot, names ...string) {
	for _, n := range names {
		s.Nodes[n] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}
	}
}

// addService adds Service demo/<name> with one IPv4 slice whose port "http" is port.
func addService(s *Snapshot, name string, port int32, eps ...discoveryv1.Endpoint) {
	k := types.NamespacedName{Namespace: "demo", Name: name}
	s.Services[k] = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: name}}
	s.EndpointSlices[k] = []*discoveryv1.EndpointSlice{mkSlice(discoveryv1.AddressTypeIPv4, port, eps...)}
}

func mkSlice(family discoveryv1.AddressType, port int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		AddressType: family,
		// "http" is served on both protocols so one fixture backs TCP and UDP mappings alike (a
		// real Service would name the two apart); an unset protocol is TCP.
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("metrics"), Port: ptr.To[int32](9090)},
			{Name: ptr.To("http"), Port: ptr.To(port)},
			{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(port)}},
		Endpoints: eps,
	}
}

// mkEndpoint is a ready endpoint of a pod.
func mkEndpoint(pod, ip, node string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		NodeName:   ptr.To(node),
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "demo", Name: pod},
	}
}

// mkClass is a Vxlan class created age minutes after the epoch of the test, with
// vni 4242, port 4790, subnet 169.254.77.0/24, ports 1024-65535 and 8080 reserved.
func mkClass(name string, age int, nodes map[string][]string) *v1alpha1.PortMapClass {
	cl := &v1alpha1.PortMapClass{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, CreationTimestamp: created(age)},
		Spec: v1alpha1.PortMapClassSpec{
			ServingMode: v1alpha1.ServingModeSingle,
			Nodes:       map[string]v1alpha1.ClassNode{},
			Ports:       v1alpha1.PortPolicy{Min: 1024, Max: 65535, Reserved: []int32{8080}},
			ReturnPath: v1alpha1.ReturnPath{Mode: v1alpha1.ReturnPathVxlan,
				Vxlan: v1alpha1.VxlanConfig{VNI: 4242, Port: 4790, Subnet: "169.254.77.0/24"}},
		},
	}
	for n, ifs := range nodes {
		cl.Spec.Nodes[n] = v1alpha1.ClassNode{Interfaces: ifs}
	}
	return cl
}

func created(age int) metav1.Time {
	return metav1.NewTime(now.Add(-24*time.Hour + time.Duration(age)*time.Minute))
}

// mkPortMap is demo/<name> of class public, TCP <port>, serviceRef {<name>, http}, created
// age minutes after the epoch of the test.
func mkPortMap(name string, age int, port int32, muts ...func(*v1alpha1.PortMap)) *v1alpha1.PortMap {
	pm := &v1alpha1.PortMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: name, Generation: 2, CreationTimestamp: created(age)},
		Spec: v1alpha1.PortMapSpec{ClassName: "public", Protocol: v1alpha1.ProtocolTCP, Port: port,
			ServiceRef: v1alpha1.ServiceRef{Name: name, Port: "http"}},
	}
	for _, m := range muts {
		m(pm)
	}
	return pm
}

func endPort(p int32) func(*v1alpha1.PortMap) {
	return func(pm *v1alpha1.PortMap) { pm.Spec.EndPort = ptr.To(p) }
}

func proto(p v1alpha1.Protocol) func(*v1alpha1.PortMap) {
	return func(pm *v1alpha1.PortMap) { pm.Spec.Protocol = p }
}

func interfaces(ifs ...string) func(*v1alpha1.PortMap) {
	return func(pm *v1alpha1.PortMap) { pm.Spec.Interfaces = ifs }
}

func className(c string) func(*v1alpha1.PortMap) {
	return func(pm *v1alpha1.PortMap) { pm.Spec.ClassName = c }
}

func service(name string) func(*v1alpha1.PortMap) {
	return func(pm *v1alpha1.PortMap) { pm.Spec.ServiceRef.Name = name }
}

func currentEndpoint(node, addr string) func(*v1alpha1.PortMap) {
	return func(pm *v1alpha1.PortMap) { pm.Status.Endpoint = &v1alpha1.EndpointStatus{Node: node, Address: addr} }
}

// mkAgent is a connected agent with ip_forward on and wt0 as underlay.
func mkAgent(ifs ...*kuportv1.Interface) *AgentState {
	return &AgentState{State: &kuportv1.NodeState{Interfaces: ifs, UnderlayInterface: "wt0", IpForward: true}}
}

func iface(name, addr string, mtu uint32) *kuportv1.Interface {
	i := &kuportv1.Interface{Name: name, Mtu: mtu}
	if addr != "" {
		i.Addresses = []string{addr}
	}
	return i
}

func ports(first, last uint32) *kuportv1.PortRange {
	return &kuportv1.PortRange{First: first, Last: last}
}

// The expected programs of the two founding shapes, written out field by field.

func localEdgeA() *kuportv1.NodeProgram {
	return &kuportv1.NodeProgram{
		ReturnMarking: DefaultReturnMarking.wire(),
		Node:          "edge-a",
		DnatRules: []*kuportv1.DnatRule{
			{Id: "demo/local/dnat/enp1s0", Mapping: "demo/local", InInterface: "enp1s0", Protocol: tcp,
				Ports: ports(3000, 3000), ToAddress: "10.244.17.7", ToPort: 3000, StandIn: "10.244.17.7"},
			{Id: "demo/local/dnat/wt0", Mapping: "demo/local", InInterface: "wt0", Protocol: tcp,
				Ports: ports(3000, 3000), ToAddress: "10.244.17.7", ToPort: 3000, StandIn: "10.244.17.7"},
		},
		SnatRules: []*kuportv1.SnatRule{
			{Id: "demo/local/snat", Mapping: "demo/local", Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
				Address: "10.244.17.7", Protocol: tcp, Ports: ports(3000, 3000)},
		},
	}
}

func remoteEdgeA() *kuportv1.NodeProgram {
	return &kuportv1.NodeProgram{
		ReturnMarking: DefaultReturnMarking.wire(),
		Node:          "edge-a",
		DnatRules: []*kuportv1.DnatRule{
			{Id: "demo/remote/dnat/enp1s0", Mapping: "demo/remote", InInterface: "enp1s0", Protocol: tcp,
				Ports: ports(3000, 3000), ToAddress: "169.254.77.1", ToPort: 3000, StandIn: "169.254.77.1"},
			{Id: "demo/remote/dnat/wt0", Mapping: "demo/remote", InInterface: "wt0", Protocol: tcp,
				Ports: ports(3000, 3000), ToAddress: "169.254.77.1", ToPort: 3000, StandIn: "169.254.77.1"},
		},
		SnatRules: []*kuportv1.SnatRule{
			{Id: "demo/remote/snat", Mapping: "demo/remote", Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
				Address: "169.254.77.1", Protocol: tcp, Ports: ports(3000, 3000)},
		},
		Links: []*kuportv1.Link{
			{Name: linkToWorkerB, ClassName: "public", PeerNode: "worker-b", Vni: 4242, Port: 4790,
				LocalUnderlay: "100.64.93.143", RemoteUnderlay: "100.64.93.150",
				LocalAddress: "169.254.77.0", PeerAddress: "169.254.77.1", Mtu: 1370, Mac: "02:6b:a9:fe:4d:00",
				SourcePortLow: 49152, SourcePortHigh: 65535},
		},
	}
}

func remoteWorkerB() *kuportv1.NodeProgram {
	return &kuportv1.NodeProgram{
		ReturnMarking: DefaultReturnMarking.wire(),
		Node:          "worker-b",
		DnatRules: []*kuportv1.DnatRule{
			{Id: "demo/remote/dnat/" + linkToEdgeA, Mapping: "demo/remote", InInterface: linkToEdgeA,
				MatchDestination: "169.254.77.1", Protocol: tcp, Ports: ports(3000, 3000),
				ToAddress: "10.244.18.107", ToPort: 3000, StandIn: "10.244.18.107"},
		},
		SnatRules: []*kuportv1.SnatRule{
			{Id: "demo/remote/snat", Mapping: "demo/remote", Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
				Address: "10.244.18.107", Protocol: tcp, Ports: ports(3000, 3000)},
			{Id: "demo/remote/snat-reply", Mapping: "demo/remote", Kind: kuportv1.SnatKind_SNAT_KIND_REPLY,
				Address: "10.244.18.107", Protocol: tcp, Ports: ports(3000, 3000)},
		},
		MarkRules: []*kuportv1.MarkRule{
			{Id: "demo/remote/ct-restore", Mapping: "demo/remote", Kind: ctRestore, Address: "10.244.18.107", Protocol: tcp,
				Ports: ports(3000, 3000)},
			{Id: "demo/remote/ct-save/" + linkToEdgeA, Mapping: "demo/remote", Kind: ctSave, InInterface: linkToEdgeA,
				Address: "169.254.77.1", Protocol: tcp, Ports: ports(3000, 3000), Mark: 0x1},
		},
		Links: []*kuportv1.Link{
			{Name: linkToEdgeA, ClassName: "public", PeerNode: "edge-a", Vni: 4242, Port: 4790,
				LocalUnderlay: "100.64.93.150", RemoteUnderlay: "100.64.93.143",
				LocalAddress: "169.254.77.1", PeerAddress: "169.254.77.0", Mtu: 1370, Mac: "02:6b:a9:fe:4d:01",
				SourcePortLow: 49152, SourcePortHigh: 65535},
		},
		ReturnPaths: []*kuportv1.ReturnPath{
			{Id: linkToEdgeA + "/return", Link: linkToEdgeA, Mark: 0x1, Table: 27505,
				PeerUnderlay: "100.64.93.143", PeerLinkAddress: "169.254.77.0"},
		},
	}
}

func empty(node string) *kuportv1.NodeProgram {
	return &kuportv1.NodeProgram{Node: node, ReturnMarking: DefaultReturnMarking.wire()}
}

// subnet6Of are the test classes' subnet6 by their subnet's first three octets: public's is
// the default, intranet's the next /112 (intranet).
var subnet6Of = map[string]string{"169.254.77.": "fd64:f5ac:e961::/112", "169.254.79.": "fd64:f5ac:e962::/112"}

// claimOf is a recorded link claim of pair a/b in slot with its /31 written out, and the
// slot's /127 of the class's subnet6.
func claimOf(a, b string, slot int32, subnet string, unusedSince *time.Time, ends ...v1alpha1.LinkEnd) v1alpha1.LinkStatus {
	ls := v1alpha1.LinkStatus{Key: a + "/" + b, Peers: []string{a, b}, Slot: slot, Subnet: subnet, Ends: ends}
	if i := strings.LastIndexByte(subnet, '.'); i > 0 && subnet6Of[subnet[:i+1]] != "" {
		ls.Subnet6 = netip.PrefixFrom(slotBase6(netip.MustParsePrefix(subnet6Of[subnet[:i+1]]), slot), 127).String()
	}
	if unusedSince != nil {
		ls.UnusedSince = &metav1.Time{Time: *unusedSince}
	}
	return ls
}

// The expected programs of the Multi shape (docs/design/datapath.md#serving-modes): class
// intranet (servingMode Multi, vni 4300, subnet 169.254.79.0/24) accepts on edge-a [enp1s0]
// and worker-c [eth0], and demo/remote reaches remote-0 on worker-b over one link from each.
// Slots follow the accepting nodes' order: edge-a/worker-b takes 0, worker-b/worker-c takes
// 1.

// multiWorld is the world with that class and demo/remote (TCP 3000) in it.
func multiWorld() *Snapshot {
	s := world(mkPortMap("remote", 0, 3000, className("intranet")))
	s.Classes["intranet"] = multiClass(map[string][]string{"edge-a": {"enp1s0"}, "worker-c": {"eth0"}})
	return s
}

// pubEdgeA and pubWorkerC are the published rows of edge-a's enp1s0 and worker-c's eth0.
var (
	pubEdgeA   = v1alpha1.PublishedAddress{Node: "edge-a", Interface: "enp1s0", Address: "203.0.113.9"}
	pubWorkerC = v1alpha1.PublishedAddress{Node: "worker-c", Interface: "eth0", Address: "198.18.0.3"}
)

// multiClass is class intranet with servingMode Multi on the given nodes.
func multiClass(nodes map[string][]string) *v1alpha1.PortMapClass {
	cl := intranet(1, nodes)
	cl.Spec.ServingMode = v1alpha1.ServingModeMulti
	return cl
}

func multiEdgeA() *kuportv1.NodeProgram {
	return &kuportv1.NodeProgram{
		ReturnMarking: DefaultReturnMarking.wire(),
		Node:          "edge-a",
		DnatRules: []*kuportv1.DnatRule{
			{Id: "demo/remote/dnat/enp1s0", Mapping: "demo/remote", InInterface: "enp1s0", Protocol: tcp,
				Ports: ports(3000, 3000), ToAddress: "169.254.79.1", ToPort: 3000, StandIn: "169.254.79.1"},
		},
		SnatRules: []*kuportv1.SnatRule{
			{Id: "demo/remote/snat", Mapping: "demo/remote", Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
				Address: "169.254.79.1", Protocol: tcp, Ports: ports(3000, 3000)},
		},
		Links: []*kuportv1.Link{
			{Name: intranetToWB, ClassName: "intranet", PeerNode: "worker-b", Vni: 4300, Port: 4790,
				LocalUnderlay: "100.64.93.143", RemoteUnderlay: "100.64.93.150",
				LocalAddress: "169.254.79.0", PeerAddress: "169.254.79.1", Mtu: 1370, Mac: "02:6b:a9:fe:4f:00",
				SourcePortLow: 49152, SourcePortHigh: 65535},
		},
	}
}

func multiWorkerC() *kuportv1.NodeProgram {
	return &kuportv1.NodeProgram{
		ReturnMarking: DefaultReturnMarking.wire(),
		Node:          "worker-c",
		DnatRules: []*kuportv1.DnatRule{
			{Id: "demo/remote/dnat/eth0", Mapping: "demo/remote", InInterface: "eth0", Protocol: tcp,
				Ports: ports(3000, 3000), ToAddress: "169.254.79.2", ToPort: 3000, StandIn: "169.254.79.2"},
		},
		SnatRules: []*kuportv1.SnatRule{
			{Id: "demo/remote/snat", Mapping: "demo/remote", Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
				Address: "169.254.79.2", Protocol: tcp, Ports: ports(3000, 3000)},
		},
		Links: []*kuportv1.Link{
			{Name: intranetToWB, ClassName: "intranet", PeerNode: "worker-b", Vni: 4301, Port: 4790,
				LocalUnderlay: "100.64.93.160", RemoteUnderlay: "100.64.93.150",
				LocalAddress: "169.254.79.3", PeerAddress: "169.254.79.2", Mtu: 1370, Mac: "02:6b:a9:fe:4f:03",
				SourcePortLow: 49152, SourcePortHigh: 65535},
		},
	}
}

// multiWorkerB is the pod's node: a link-side DNAT and a ct-mark save per link, the request
// and reply identity SNATs once, one ct-mark restore, and a return path per link.
func multiWorkerB() *kuportv1.NodeProgram {
	return &kuportv1.NodeProgram{
		ReturnMarking: DefaultReturnMarking.wire(),
		Node:          "worker-b",
		DnatRules: []*kuportv1.DnatRule{
			{Id: "demo/remote/dnat/" + intranetToEA, Mapping: "demo/remote", InInterface: intranetToEA,
				MatchDestination: "169.254.79.1", Protocol: tcp, Ports: ports(3000, 3000),
				ToAddress: "10.244.18.107", ToPort: 3000, StandIn: "10.244.18.107"},
			{Id: "demo/remote/dnat/" + intranetToWC, Mapping: "demo/remote", InInterface: intranetToWC,
				MatchDestination: "169.254.79.2", Protocol: tcp, Ports: ports(3000, 3000),
				ToAddress: "10.244.18.107", ToPort: 3000, StandIn: "10.244.18.107"},
		},
		SnatRules: []*kuportv1.SnatRule{
			{Id: "demo/remote/snat", Mapping: "demo/remote", Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
				Address: "10.244.18.107", Protocol: tcp, Ports: ports(3000, 3000)},
			{Id: "demo/remote/snat-reply", Mapping: "demo/remote", Kind: kuportv1.SnatKind_SNAT_KIND_REPLY,
				Address: "10.244.18.107", Protocol: tcp, Ports: ports(3000, 3000)},
		},
		MarkRules: []*kuportv1.MarkRule{
			{Id: "demo/remote/ct-restore", Mapping: "demo/remote", Kind: ctRestore, Address: "10.244.18.107",
				Protocol: tcp, Ports: ports(3000, 3000)},
			{Id: "demo/remote/ct-save/" + intranetToEA, Mapping: "demo/remote", Kind: ctSave, InInterface: intranetToEA,
				Address: "169.254.79.1", Protocol: tcp, Ports: ports(3000, 3000), Mark: 0x1},
			{Id: "demo/remote/ct-save/" + intranetToWC, Mapping: "demo/remote", Kind: ctSave, InInterface: intranetToWC,
				Address: "169.254.79.2", Protocol: tcp, Ports: ports(3000, 3000), Mark: 0x2},
		},
		Links: []*kuportv1.Link{
			{Name: intranetToEA, ClassName: "intranet", PeerNode: "edge-a", Vni: 4300, Port: 4790,
				LocalUnderlay: "100.64.93.150", RemoteUnderlay: "100.64.93.143",
				LocalAddress: "169.254.79.1", PeerAddress: "169.254.79.0", Mtu: 1370, Mac: "02:6b:a9:fe:4f:01",
				SourcePortLow: 49152, SourcePortHigh: 65535},
			{Name: intranetToWC, ClassName: "intranet", PeerNode: "worker-c", Vni: 4301, Port: 4790,
				LocalUnderlay: "100.64.93.150", RemoteUnderlay: "100.64.93.160",
				LocalAddress: "169.254.79.2", PeerAddress: "169.254.79.3", Mtu: 1370, Mac: "02:6b:a9:fe:4f:02",
				SourcePortLow: 49152, SourcePortHigh: 65535},
		},
		ReturnPaths: []*kuportv1.ReturnPath{
			{Id: intranetToEA + "/return", Link: intranetToEA, Mark: 0x1, Table: 27505,
				PeerUnderlay: "100.64.93.143", PeerLinkAddress: "169.254.79.0"},
			{Id: intranetToWC + "/return", Link: intranetToWC, Mark: 0x2, Table: 27506,
				PeerUnderlay: "100.64.93.160", PeerLinkAddress: "169.254.79.3"},
		},
	}
}
