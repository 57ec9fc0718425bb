package compile

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// The dual-stack lab: edge-a's enp1s0 has 2001:db8:a::9 (its wt0 no global IPv6 address),
// worker-b's eth0 2001:db8:b::2; pods local-0 fd00:17::7 on edge-a and remote-0
// fd00:18::107 on worker-b.

// serve6 gives a node's interfaces their global IPv6 addresses (name, address pairs) and
// turns its IPv6 forwarding on.
func serve6(s *Snapshot, node string, pairs ...string) {
	st := s.Agents[node].State
	st.Ipv6Forward = true
	for i := 0; i+1 < len(pairs); i += 2 {
		for _, ifc := range st.Interfaces {
			if ifc.Name == pairs[i] {
				ifc.Addresses6 = append(ifc.Addresses6, pairs[i+1])
			}
		}
	}
}

// addSlice6 adds an IPv6 slice to Service demo/<name>.
func addSlice6(s *Snapshot, name string, port int32, eps ...discoveryv1.Endpoint) {
	k := types.NamespacedName{Namespace: "demo", Name: name}
	s.EndpointSlices[k] = append(s.EndpointSlices[k], mkSlice(discoveryv1.AddressTypeIPv6, port, eps...))
}

// dualWorld is the world with both nodes serving IPv6 and both pods dual-stack.
func dualWorld(pms ...*v1alpha1.PortMap) *Snapshot {
	s := world(pms...)
	serve6(s, "edge-a", "enp1s0", "2001:db8:a::9")
	serve6(s, "worker-b", "eth0", "2001:db8:b::2")
	addSlice6(s, "local", 3000, mkEndpoint("local-0", "fd00:17::7", "edge-a"))
	addSlice6(s, "remote", 3000, mkEndpoint("remote-0", "fd00:18::107", "worker-b"))
	return s
}

func entry(m, name string, kind EntryKind, dir string, f Family, iface string, overLink bool) Entry {
	return Entry{ID: m + "/" + name, Name: name, Kind: kind, Direction: dir, Family: f, Interface: iface, OverLink: overLink}
}

func TestDualStackSameNode(t *testing.T) {
	r := Compile(dualWorld(mkPortMap("local", 0, 3000)))
	want := localEdgeA()
	want.DnatRules = append(want.DnatRules, &kuportv1.DnatRule{Id: "demo/local/dnat6/enp1s0", Mapping: "demo/local",
		InInterface: "enp1s0", Protocol: tcp, Ports: ports(3000, 3000), ToAddress: "fd00:17::7", ToPort: 3000,
		StandIn: "fd00:17::7"})
	want.SnatRules = append(want.SnatRules, &kuportv1.SnatRule{Id: "demo/local/snat6", Mapping: "demo/local",
		Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST, Address: "fd00:17::7", Protocol: tcp, Ports: ports(3000, 3000)})
	if d := cmp.Diff(want, r.Programs["edge-a"], cmpOpts...); d != "" {
		t.Errorf("edge-a (-want +got):\n%s", d)
	}
	st := r.PortMaps[types.NamespacedName{Namespace: "demo", Name: "local"}].Status
	if d := cmp.Diff(&v1alpha1.EndpointStatus{Node: "edge-a", Address: "10.244.17.7", Address6: "fd00:17::7"}, st.Endpoint); d != "" {
		t.Errorf("endpoint (-want +got):\n%s", d)
	}
	wantPub := []v1alpha1.PublishedAddress{
		{Node: "edge-a", Interface: "enp1s0", Address: "203.0.113.9", Address6: "2001:db8:a::9"},
		{Node: "edge-a", Interface: "wt0", Address: "100.64.93.143"},
	}
	if d := cmp.Diff(wantPub, st.Published); d != "" {
		t.Errorf("published (-want +got):\n%s", d)
	}
	if st.PublishedAddresses != "203.0.113.9,2001:db8:a::9,100.64.93.143" {
		t.Errorf("publishedAddresses %q", st.PublishedAddresses)
	}
	m := "demo/local"
	wantIx := []Entry{
		entry(m, "dnat/enp1s0", KindDNAT, DirectionIn, FamilyIPv4, "enp1s0", false),
		entry(m, "dnat/wt0", KindDNAT, DirectionIn, FamilyIPv4, "wt0", false),
		entry(m, "dnat6/enp1s0", KindDNAT, DirectionIn, FamilyIPv6, "enp1s0", false),
		entry(m, "snat", KindSNAT, DirectionIn, FamilyIPv4, "", false),
		entry(m, "snat6", KindSNAT, DirectionIn, FamilyIPv6, "", false),
	}
	if d := cmp.Diff(wantIx, r.Index["edge-a"]["demo/local"].Entries); d != "" {
		t.Errorf("index (-want +got):\n%s", d)
	}
	row := r.Classes["public"].Nodes[0]
	if d := cmp.Diff(map[string]string{"enp1s0": "2001:db8:a::9"}, row.Addresses6); d != "" || !row.Ready ||
		row.IPv6Unavailable != "interface wt0 has no global IPv6 address" {
		t.Errorf("edge-a row %+v", row)
	}
}

func TestDualStackCrossNode(t *testing.T) {
	r := Compile(dualWorld(mkPortMap("remote", 0, 3000)))
	if o := outcomes(r, nil)["demo/remote"]; o.Programmed != v1alpha1.ReasonAllNodesReady {
		t.Fatalf("demo/remote %+v", o)
	}
	edge := remoteEdgeA()
	edge.DnatRules = append(edge.DnatRules, &kuportv1.DnatRule{Id: "demo/remote/dnat6/enp1s0", Mapping: "demo/remote",
		InInterface: "enp1s0", Protocol: tcp, Ports: ports(3000, 3000), ToAddress: "fd64:f5ac:e961::1", ToPort: 3000,
		StandIn: "fd64:f5ac:e961::1"})
	edge.SnatRules = append(edge.SnatRules, &kuportv1.SnatRule{Id: "demo/remote/snat6", Mapping: "demo/remote",
		Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST, Address: "fd64:f5ac:e961::1", Protocol: tcp, Ports: ports(3000, 3000)})
	edge.Links[0].LocalAddress6, edge.Links[0].PeerAddress6 = "fd64:f5ac:e961::", "fd64:f5ac:e961::1"
	if d := cmp.Diff(edge, r.Programs["edge-a"], cmpOpts...); d != "" {
		t.Errorf("edge-a (-want +got):\n%s", d)
	}
	worker := remoteWorkerB()
	worker.DnatRules = append(worker.DnatRules, &kuportv1.DnatRule{Id: "demo/remote/dnat6/" + linkToEdgeA,
		Mapping: "demo/remote", InInterface: linkToEdgeA, MatchDestination: "fd64:f5ac:e961::1", Protocol: tcp,
		Ports: ports(3000, 3000), ToAddress: "fd00:18::107", ToPort: 3000, StandIn: "fd00:18::107"})
	worker.SnatRules = append(worker.SnatRules,
		&kuportv1.SnatRule{Id: "demo/remote/snat6", Mapping: "demo/remote", Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
			Address: "fd00:18::107", Protocol: tcp, Ports: ports(3000, 3000)},
		&kuportv1.SnatRule{Id: "demo/remote/snat6-reply", Mapping: "demo/remote", Kind: kuportv1.SnatKind_SNAT_KIND_REPLY,
			Address: "fd00:18::107", Protocol: tcp, Ports: ports(3000, 3000)})
	worker.MarkRules = append(worker.MarkRules,
		&kuportv1.MarkRule{Id: "demo/remote/ct-restore6", Mapping: "demo/remote", Kind: ctRestore,
			Address: "fd00:18::107", Protocol: tcp, Ports: ports(3000, 3000)},
		&kuportv1.MarkRule{Id: "demo/remote/ct-save6/" + linkToEdgeA, Mapping: "demo/remote", Kind: ctSave,
			InInterface: linkToEdgeA, Address: "fd64:f5ac:e961::1", Protocol: tcp, Ports: ports(3000, 3000), Mark: 0x1})
	worker.Links[0].LocalAddress6, worker.Links[0].PeerAddress6 = "fd64:f5ac:e961::1", "fd64:f5ac:e961::"
	worker.ReturnPaths[0].PeerLinkAddress6 = "fd64:f5ac:e961::"
	if d := cmp.Diff(program(worker), r.Programs["worker-b"], cmpOpts...); d != "" {
		t.Errorf("worker-b (-want +got):\n%s", d)
	}
	wantLinks := []v1alpha1.LinkStatus{claimOf("edge-a", "worker-b", 0, "169.254.77.0/31", nil,
		v1alpha1.LinkEnd{Node: "worker-b", Table: 27505})}
	if d := cmp.Diff(wantLinks, r.Classes["public"].Links); d != "" || wantLinks[0].Subnet6 != "fd64:f5ac:e961::/127" {
		t.Errorf("links (-want +got):\n%s", d)
	}
	m := "demo/remote"
	wantIx := []Entry{
		entry(m, "ct-restore", KindMark, DirectionOut, FamilyIPv4, "", false),
		entry(m, "ct-restore6", KindMark, DirectionOut, FamilyIPv6, "", false),
		entry(m, "ct-save/"+linkToEdgeA, KindMark, DirectionIn, FamilyIPv4, "", false),
		entry(m, "ct-save6/"+linkToEdgeA, KindMark, DirectionIn, FamilyIPv6, "", false),
		entry(m, "dnat/"+linkToEdgeA, KindDNAT, DirectionIn, FamilyIPv4, linkToEdgeA, true),
		entry(m, "dnat6/"+linkToEdgeA, KindDNAT, DirectionIn, FamilyIPv6, linkToEdgeA, true),
		entry(m, "snat", KindSNAT, DirectionIn, FamilyIPv4, "", false),
		entry(m, "snat-reply", KindSNAT, DirectionOut, FamilyIPv4, "", false),
		entry(m, "snat6", KindSNAT, DirectionIn, FamilyIPv6, "", false),
		entry(m, "snat6-reply", KindSNAT, DirectionOut, FamilyIPv6, "", false),
	}
	mi := r.Index["worker-b"][m]
	if d := cmp.Diff(wantIx, mi.Entries); d != "" {
		t.Errorf("worker-b index (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{linkToEdgeA}, mi.Links); d != "" {
		t.Errorf("worker-b index links (-want +got):\n%s", d)
	}
}

// program sorts a hand-written program's lists by id, as compile does.
func program(p *kuportv1.NodeProgram) *kuportv1.NodeProgram {
	b := &programBuilder{p: p}
	return b.program()
}

// A node that does not forward IPv6 keeps serving IPv4, ready, with no IPv6 entry and links
// of the IPv4 form; its row says why, and the mapping is Programmed.
func TestNodeWithoutIPv6ServesIPv4(t *testing.T) {
	s := dualWorld(mkPortMap("remote", 0, 3000))
	s.Agents["edge-a"].State.Ipv6Forward = false
	r := Compile(s)
	if o := outcomes(r, nil)["demo/remote"]; o.Programmed != v1alpha1.ReasonAllNodesReady {
		t.Errorf("demo/remote %+v", o)
	}
	if d := cmp.Diff(remoteEdgeA(), r.Programs["edge-a"], cmpOpts...); d != "" {
		t.Errorf("edge-a (-want +got):\n%s", d)
	}
	if d := cmp.Diff(remoteWorkerB(), r.Programs["worker-b"], cmpOpts...); d != "" {
		t.Errorf("worker-b (-want +got):\n%s", d)
	}
	row := r.Classes["public"].Nodes[0]
	if !row.Ready || row.Message != "" ||
		row.IPv6Unavailable != "interface wt0 has no global IPv6 address, net.ipv6.conf.all.forwarding is 0" {
		t.Errorf("edge-a row %+v", row)
	}
	st := r.PortMaps[types.NamespacedName{Namespace: "demo", Name: "remote"}].Status
	if st.Endpoint.Address6 != "fd00:18::107" || st.PublishedAddresses != "203.0.113.9,100.64.93.143" {
		t.Errorf("status %+v", st)
	}
}

// A pod with an IPv6 address only is the endpoint when no IPv4 one is: the mapping is
// served on IPv6 alone, and an interface without IPv6 is missing as one without IPv4 is for
// an IPv4 pod.
func TestIPv6OnlyPod(t *testing.T) {
	s := dualWorld(mkPortMap("remote", 0, 3000))
	k := types.NamespacedName{Namespace: "demo", Name: "remote"}
	s.EndpointSlices[k] = s.EndpointSlices[k][1:]
	want := unprogrammed(v1alpha1.ReasonNodeNotReady, "worker-b ", "edge-a", "worker-b").msg(
		"node edge-a: interface wt0 has no global IPv6 address")
	if d := cmp.Diff(want, outcomes(Compile(s), map[string]outcome{"demo/remote": want})["demo/remote"]); d != "" {
		t.Errorf("demo/remote (-want +got):\n%s", d)
	}

	s = dualWorld(mkPortMap("remote", 0, 3000, interfaces("enp1s0")))
	s.EndpointSlices[k] = s.EndpointSlices[k][1:]
	r := Compile(s)
	if o := outcomes(r, nil)["demo/remote"]; o.Programmed != v1alpha1.ReasonAllNodesReady {
		t.Errorf("demo/remote %+v", o)
	}
	edge := &kuportv1.NodeProgram{Node: "edge-a", ReturnMarking: DefaultReturnMarking.wire(),
		DnatRules: []*kuportv1.DnatRule{{Id: "demo/remote/dnat6/enp1s0", Mapping: "demo/remote", InInterface: "enp1s0",
			Protocol: tcp, Ports: ports(3000, 3000), ToAddress: "fd64:f5ac:e961::1", ToPort: 3000, StandIn: "fd64:f5ac:e961::1"}},
		SnatRules: []*kuportv1.SnatRule{{Id: "demo/remote/snat6", Mapping: "demo/remote",
			Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST, Address: "fd64:f5ac:e961::1", Protocol: tcp, Ports: ports(3000, 3000)}},
		Links: remoteEdgeA().Links,
	}
	edge.Links[0].LocalAddress6, edge.Links[0].PeerAddress6 = "fd64:f5ac:e961::", "fd64:f5ac:e961::1"
	if d := cmp.Diff(edge, r.Programs["edge-a"], cmpOpts...); d != "" {
		t.Errorf("edge-a (-want +got):\n%s", d)
	}
	worker := r.Programs["worker-b"]
	var ids []string
	for _, x := range worker.DnatRules {
		ids = append(ids, x.Id)
	}
	for _, x := range worker.SnatRules {
		ids = append(ids, x.Id)
	}
	for _, x := range worker.MarkRules {
		ids = append(ids, x.Id)
	}
	wantIDs := []string{"demo/remote/dnat6/" + linkToEdgeA, "demo/remote/snat6", "demo/remote/snat6-reply",
		"demo/remote/ct-restore6", "demo/remote/ct-save6/" + linkToEdgeA}
	if d := cmp.Diff(wantIDs, ids); d != "" {
		t.Errorf("worker-b ids (-want +got):\n%s", d)
	}
	st := r.PortMaps[k].Status
	if d := cmp.Diff(&v1alpha1.EndpointStatus{Node: "worker-b", Address6: "fd00:18::107"}, st.Endpoint); d != "" {
		t.Errorf("endpoint (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]v1alpha1.PublishedAddress{{Node: "edge-a", Interface: "enp1s0", Address6: "2001:db8:a::9"}},
		st.Published); d != "" {
		t.Errorf("published (-want +got):\n%s", d)
	}

	// Without IPv6 on edge-a it is served nowhere, and says so.
	s.Agents["edge-a"].State.Ipv6Forward = false
	r = Compile(s)
	want = unprogrammed(v1alpha1.ReasonNodeNotReady, "worker-b ").msg("node edge-a: net.ipv6.conf.all.forwarding is 0")
	if d := cmp.Diff(want, outcomes(r, map[string]outcome{"demo/remote": want})["demo/remote"]); d != "" {
		t.Errorf("demo/remote (-want +got):\n%s", d)
	}
	for n, p := range r.Programs {
		if len(p.DnatRules)+len(p.SnatRules)+len(p.MarkRules)+len(p.Links) > 0 {
			t.Errorf("%s carries %v", n, p)
		}
	}
}

// The pod is chosen as for an IPv4-only Service, whatever order the IPv6 slice lists the pods
// in, and takes its own IPv6 address; a pod the IPv6 slice lacks has none.
func TestEndpointChoiceAcrossFamilies(t *testing.T) {
	s := dualWorld(mkPortMap("web", 0, 3000))
	addService(s, "web", 3000,
		mkEndpoint("web-b", "10.244.18.2", "worker-b"), mkEndpoint("web-a", "10.244.18.1", "worker-b"))
	addSlice6(s, "web", 3000, mkEndpoint("web-c", "fd00:18::3", "worker-b"),
		mkEndpoint("web-b", "fd00:18::2", "worker-b"), mkEndpoint("web-a", "fd00:18::1", "worker-b"))
	k := types.NamespacedName{Namespace: "demo", Name: "web"}
	ep := Compile(s).PortMaps[k].Status.Endpoint
	if d := cmp.Diff(&v1alpha1.EndpointStatus{Node: "worker-b", Address: "10.244.18.1", Address6: "fd00:18::1"}, ep); d != "" {
		t.Errorf("endpoint (-want +got):\n%s", d)
	}

	// The current endpoint stays; the pod's IPv6 endpoint on another node is another pod's.
	s.PortMaps[0].Status.Endpoint = &v1alpha1.EndpointStatus{Node: "worker-b", Address: "10.244.18.2"}
	s.EndpointSlices[k][1].Endpoints[1].NodeName = ptrTo("worker-c")
	ep = Compile(s).PortMaps[k].Status.Endpoint
	if d := cmp.Diff(&v1alpha1.EndpointStatus{Node: "worker-b", Address: "10.244.18.2"}, ep); d != "" {
		t.Errorf("endpoint (-want +got):\n%s", d)
	}
}

func ptrTo(s string) *string { return &s }

func TestSubnet6(t *testing.T) {
	ready := func(r *Result, class string) (string, string) {
		c := r.Classes[class].Conditions[0]
		return c.Reason, c.Message
	}
	for _, bad := range []string{"169.254.1.0/24", "fd00::/128", "fd00::", "::ffff:10.0.0.0/120"} {
		s := dualWorld(mkPortMap("local", 0, 3000))
		s.Classes["public"].Spec.ReturnPath.Vxlan.Subnet6 = bad
		if reason, _ := ready(Compile(s), "public"); reason != v1alpha1.ReasonInvalidSubnet {
			t.Errorf("subnet6 %q: Ready reason %s", bad, reason)
		}
	}

	// An overlapping subnet6 keeps the newer class valid, its links IPv4 only.
	s := dualWorld(mkPortMap("remote", 0, 3000), mkPortMap("i-remote", 1, 4000, className("intranet"), service("remote")))
	s.Classes["intranet"] = intranet(1, map[string][]string{"edge-a": {"enp1s0"}})
	s.Classes["intranet"].Spec.ReturnPath.Vxlan.Subnet6 = "fd64:f5ac:e961::100/120"
	r := Compile(s)
	if reason, _ := ready(r, "intranet"); reason != v1alpha1.ReasonValid {
		t.Errorf("intranet Ready reason %s", reason)
	}
	for _, l := range r.Programs["edge-a"].Links {
		if six := l.LocalAddress6 != ""; six != (l.ClassName == "public") {
			t.Errorf("link %s of %s: local_address6 %q", l.Name, l.ClassName, l.LocalAddress6)
		}
	}
	if got := r.Classes["intranet"].Links[0].Subnet6; got != "" {
		t.Errorf("intranet claim subnet6 %q, want none", got)
	}
	want := `links carry no IPv6: subnet6 fd64:f5ac:e961::100/120 overlaps subnet6 fd64:f5ac:e961::/112 of class "public"`
	if got := r.Classes["intranet"].Nodes[0].IPv6Unavailable; got != "interface wt0 has no global IPv6 address, "+want &&
		got != want {
		t.Errorf("intranet row ipv6Unavailable %q", got)
	}
	for _, k := range []string{"demo/remote", "demo/i-remote"} {
		if o := outcomes(r, nil)[k]; o.Programmed != v1alpha1.ReasonAllNodesReady {
			t.Errorf("%s %+v", k, o)
		}
	}

	// A /127 holds one pair: the next pair finds no slot, and the class says subnet6 ran out.
	s = dualWorld(mkPortMap("remote", 0, 3000))
	s.Classes["public"].Spec.ServingMode = v1alpha1.ServingModeMulti
	s.Classes["public"].Spec.Nodes["worker-c"] = v1alpha1.ClassNode{Interfaces: []string{"eth0"}}
	s.Classes["public"].Spec.ReturnPath.Vxlan.Subnet6 = "fd64:f5ac:e961::/127"
	r = Compile(s)
	reason, msg := ready(r, "public")
	if reason != v1alpha1.ReasonSubnetExhausted || msg != "subnet6 fd64:f5ac:e961::/127 has no free /127 for worker-b/worker-c" {
		t.Errorf("Ready %s: %s", reason, msg)
	}
}
