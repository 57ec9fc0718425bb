package compile

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/testing/protocmp"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// carry makes s the next compilation after r, as the controller sees it after writing r's
// statuses (or after a restart, reading them back): every class and PortMap of s gets the
// status r computed for it, and s is taken at time at.
func carry(s *Snapshot, r *Result, at time.Time) *Snapshot {
	s.Now = at
	for name, cl := range s.Classes {
		if st := r.Classes[name]; st != nil {
			cl.Status = *st.DeepCopy()
		}
	}
	for _, pm := range s.PortMaps {
		if res := r.PortMaps[nsName(pm.Namespace, pm.Name)]; res != nil {
			pm.Status = *res.Status.DeepCopy()
		}
	}
	return s
}

// linkTo returns the program's link to peer of class, or nil.
func linkTo(p *kuportv1.NodeProgram, class, peer string) *kuportv1.Link {
	for _, l := range p.GetLinks() {
		if l.ClassName == class && l.PeerNode == peer {
			return l
		}
	}
	return nil
}

// returnPathOf returns the program's return path over the link device, or nil.
func returnPathOf(p *kuportv1.NodeProgram, dev string) *kuportv1.ReturnPath {
	for _, rp := range p.GetReturnPaths() {
		if rp.Link == dev {
			return rp
		}
	}
	return nil
}

// sameLink fails when a link of class between a and b, or the return path over it on the
// pod's node pod, differs between two results: neither end may move.
func sameLink(t *testing.T, before, after *Result, class, a, b, pod string) {
	t.Helper()
	for _, end := range [][2]string{{a, b}, {b, a}} {
		was, is := linkTo(before.Programs[end[0]], class, end[1]), linkTo(after.Programs[end[0]], class, end[1])
		if was == nil || is == nil {
			t.Errorf("%s's link to %s of class %s: before %v, after %v", end[0], end[1], class, was, is)
			continue
		}
		if d := cmp.Diff(was, is, cmpOpts...); d != "" {
			t.Errorf("%s's link to %s moved (-before +after):\n%s", end[0], end[1], d)
		}
	}
	dev := linkName(class, map[string]string{a: b, b: a}[pod])
	if d := cmp.Diff(returnPathOf(before.Programs[pod], dev), returnPathOf(after.Programs[pod], dev), cmpOpts...); d != "" {
		t.Errorf("%s's return path over %s moved (-before +after):\n%s", pod, dev, d)
	}
}

// TestStableNumbering follows link numbering across a controller restart, a new class and a
// new node (docs/design/api.md#links-and-slots: a slot is a recorded claim, never renumbered
// while a link uses it, across restarts and failovers) and through the unusedSince lifecycle:
// stamped when no mapping needs the pair, the slot kept for LinkRetention and free only once
// the claim is dropped.
func TestStableNumbering(t *testing.T) {
	web := func(s *Snapshot) *Snapshot {
		addService(s, "web", 3000, mkEndpoint("web-0", "10.244.19.7", "worker-c"))
		return s
	}
	r0 := Compile(web(world(mkPortMap("remote", 0, 3000), mkPortMap("web", 1, 3001))))
	want0 := []v1alpha1.LinkStatus{
		claimOf("edge-a", "worker-b", 0, "169.254.77.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
		claimOf("edge-a", "worker-c", 1, "169.254.77.2/31", nil, v1alpha1.LinkEnd{Node: "worker-c", Table: 27505}),
	}
	if d := cmp.Diff(want0, r0.Classes["public"].Links); d != "" {
		t.Fatalf("first claims (-want +got):\n%s", d)
	}

	// A restart reads the statuses back: the same world compiles to the same result.
	r1 := Compile(carry(web(world(mkPortMap("remote", 0, 3000), mkPortMap("web", 1, 3001))), r0, now.Add(time.Minute)))
	if d := cmp.Diff(r0, r1, cmpOpts...); d != "" {
		t.Errorf("a restart changed the result (-before +after):\n%s", d)
	}

	// demo/remote was deleted while no controller ran: web keeps slot 1 rather than taking
	// the smallest slot, and the unused pair is stamped.
	t2 := now.Add(2 * time.Minute)
	r2 := Compile(carry(web(world(mkPortMap("web", 1, 3001))), r1, t2))
	want2 := []v1alpha1.LinkStatus{
		claimOf("edge-a", "worker-b", 0, "169.254.77.0/31", &t2, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
		want0[1],
	}
	if d := cmp.Diff(want2, r2.Classes["public"].Links); d != "" {
		t.Errorf("claims after the restart (-want +got):\n%s", d)
	}
	sameLink(t, r0, r2, "public", "edge-a", "worker-c", "worker-c")
	if l := linkTo(r2.Programs["edge-a"], "public", "worker-b"); l != nil {
		t.Errorf("edge-a still holds the unused link %s", l.Name)
	}

	// A new class over the same nodes and a new node joining move nothing: the new pair takes
	// slot 2 (slot 0 is still claimed), the new class's end on worker-c the next free table.
	joined := func(at time.Time, prev *Result) *Snapshot {
		s := web(world(mkPortMap("web", 1, 3001), mkPortMap("i-web", 2, 4000, className("intranet")),
			mkPortMap("far", 3, 3002)))
		s.Classes["intranet"] = intranet(1, map[string][]string{"edge-a": {"wt0"}})
		// web's pod on another pod port: the replies of web's own are marked into public's link.
		addService(s, "i-web", 4000, mkEndpoint("web-0", "10.244.19.7", "worker-c"))
		addNodes(s, "worker-d", "worker-e")
		s.Agents["worker-d"] = mkAgent(iface("wt0", "100.64.93.170", 1420))
		s.Agents["worker-e"] = mkAgent(iface("wt0", "100.64.93.180", 1420))
		addService(s, "far", 3000, mkEndpoint("far-0", "10.244.20.7", "worker-d"))
		return carry(s, prev, at)
	}
	r3 := Compile(joined(now.Add(3*time.Minute), r2))
	for k, o := range outcomes(r3, nil) {
		if o.Programmed != v1alpha1.ReasonAllNodesReady {
			t.Errorf("%s: Accepted %s, Programmed %s; want it served", k, o.Accepted, o.Programmed)
		}
	}
	want3 := append(want2[:2:2],
		claimOf("edge-a", "worker-d", 2, "169.254.77.4/31", nil, v1alpha1.LinkEnd{Node: "worker-d", Table: 27505}))
	if d := cmp.Diff(want3, r3.Classes["public"].Links); d != "" {
		t.Errorf("public claims after a class and a node joined (-want +got):\n%s", d)
	}
	wantIntranet := []v1alpha1.LinkStatus{
		claimOf("edge-a", "worker-c", 0, "169.254.79.0/31", nil, v1alpha1.LinkEnd{Node: "worker-c", Table: 27506}),
	}
	if d := cmp.Diff(wantIntranet, r3.Classes["intranet"].Links); d != "" {
		t.Errorf("intranet claims (-want +got):\n%s", d)
	}
	sameLink(t, r0, r3, "public", "edge-a", "worker-c", "worker-c")

	// Until LinkRetention has passed the unused slot stays taken; then the claim is dropped
	// and a new pair takes it.
	moved := func(at time.Time, prev *Result) *Snapshot {
		s := joined(at, prev)
		addService(s, "far", 3000, mkEndpoint("far-1", "10.244.21.7", "worker-e"))
		return s
	}
	r4 := Compile(moved(t2.Add(24*time.Hour), r3))
	if got := r4.Classes["public"].Links; len(got) != 4 || got[3].Key != "edge-a/worker-e" || got[3].Slot != 3 {
		t.Errorf("within the retention a new pair took %+v; want edge-a/worker-e in slot 3", got)
	}
	t5 := t2.Add(24*time.Hour + time.Second)
	r5 := Compile(moved(t5, r3))
	want5 := []v1alpha1.LinkStatus{
		want0[1],
		claimOf("edge-a", "worker-d", 2, "169.254.77.4/31", &t5, v1alpha1.LinkEnd{Node: "worker-d", Table: 27505}),
		claimOf("edge-a", "worker-e", 0, "169.254.77.0/31", nil, v1alpha1.LinkEnd{Node: "worker-e", Table: 27505}),
	}
	if d := cmp.Diff(want5, r5.Classes["public"].Links); d != "" {
		t.Errorf("claims past the retention (-want +got):\n%s", d)
	}
	sameLink(t, r0, r5, "public", "edge-a", "worker-c", "worker-c")
}

// TestLinkMTUFollowsTheUnderlay: each link runs at the smaller of its ends' underlay MTUs
// less 50 (docs/design/datapath.md#mtu), and a node reporting a new underlay MTU changes that
// link at both ends and nothing else.
func TestLinkMTUFollowsTheUnderlay(t *testing.T) {
	r0 := Compile(multiWorld())
	s := carry(multiWorld(), r0, now.Add(time.Minute))
	s.Agents["worker-c"].State.Interfaces[0].Mtu = 1300
	r1 := Compile(s)
	want := map[[2]string]uint32{
		{"edge-a", "worker-b"}: 1370, {"worker-b", "edge-a"}: 1370,
		{"worker-c", "worker-b"}: 1250, {"worker-b", "worker-c"}: 1250,
	}
	for end, mtu := range want {
		before := linkTo(r0.Programs[end[0]], "intranet", end[1])
		after := linkTo(r1.Programs[end[0]], "intranet", end[1])
		if before.GetMtu() != 1370 || after.GetMtu() != mtu {
			t.Errorf("%s's link to %s: MTU %d then %d, want 1370 then %d", end[0], end[1], before.GetMtu(), after.GetMtu(), mtu)
		}
		// Only the MTU changes.
		if d := cmp.Diff(before, after, append(cmpOpts, protocmp.IgnoreFields(&kuportv1.Link{}, "mtu"))...); d != "" {
			t.Errorf("%s's link to %s changed beyond its MTU (-before +after):\n%s", end[0], end[1], d)
		}
	}
	rows := r1.Classes["intranet"].Nodes
	if rows[1].Name != "worker-c" || rows[1].UnderlayMTU != 1300 || rows[1].LinkMTU != 1250 {
		t.Errorf("worker-c's class row %+v, want underlayMTU 1300, linkMTU 1250", rows[1])
	}
}

// TestEndpointMoves follows a Single mapping's pod from node to node
// (docs/design/api.md#portmap: the serving node is the endpoint's node when it accepts the
// class, else the first accepting node): the status says where the pod is and where the port
// answers, and links come and go with it.
func TestEndpointMoves(t *testing.T) {
	step := func(at time.Time, prev *Result, pod, ip, node string) *Snapshot {
		s := world(mkPortMap("web", 0, 3000))
		s.Classes["public"].Spec.Nodes["worker-c"] = v1alpha1.ClassNode{Interfaces: []string{"eth0"}}
		addService(s, "web", 3000, mkEndpoint(pod, ip, node))
		return carry(s, prev, at)
	}
	edgeA := []v1alpha1.PublishedAddress{
		pubEdgeA,
		{Node: "edge-a", Interface: "wt0", Address: "100.64.93.143"},
	}
	t1 := now.Add(time.Minute)
	claimInUse := claimOf("edge-a", "worker-b", 0, "169.254.77.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505})
	claimUnused := claimOf("edge-a", "worker-b", 0, "169.254.77.0/31", &t1, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505})
	steps := []struct {
		name          string
		pod, ip, node string
		nodes         []string
		published     []v1alpha1.PublishedAddress
		linked        bool // edge-a and worker-b hold the link
		claims        []v1alpha1.LinkStatus
		emptyPrograms []string
	}{
		{name: "on worker-b, outside the class: edge-a serves over a link", pod: "web-b", ip: "10.244.18.50", node: "worker-b",
			nodes: []string{"edge-a", "worker-b"}, published: edgeA, linked: true, claims: []v1alpha1.LinkStatus{claimInUse}},
		{name: "moved to edge-a: served locally, the link goes, its claim is stamped", pod: "web-a", ip: "10.244.17.50", node: "edge-a",
			nodes: []string{"edge-a"}, published: edgeA, claims: []v1alpha1.LinkStatus{claimUnused}, emptyPrograms: []string{"worker-b", "worker-c"}},
		{name: "moved to worker-c, an accepting node: worker-c serves and publishes", pod: "web-c", ip: "10.244.19.50", node: "worker-c",
			nodes: []string{"worker-c"}, published: []v1alpha1.PublishedAddress{pubWorkerC},
			claims: []v1alpha1.LinkStatus{claimUnused}, emptyPrograms: []string{"edge-a", "worker-b"}},
		{name: "back on worker-b: the claim is used again, same slot and table", pod: "web-b2", ip: "10.244.18.51", node: "worker-b",
			nodes: []string{"edge-a", "worker-b"}, published: edgeA, linked: true, claims: []v1alpha1.LinkStatus{claimInUse}},
	}
	prev := &Result{}
	for i, st := range steps {
		r := Compile(step(now.Add(time.Duration(i)*time.Minute), prev, st.pod, st.ip, st.node))
		prev = r
		res := r.PortMaps[nsName("demo", "web")]
		got := outcomes(r, nil)["demo/web"]
		if d := cmp.Diff(served(st.node+" "+st.ip, st.nodes...), got, cmpopts.EquateEmpty()); d != "" {
			t.Errorf("%s: outcome (-want +got):\n%s", st.name, d)
		}
		if d := cmp.Diff(st.published, res.Status.Published); d != "" {
			t.Errorf("%s: published (-want +got):\n%s", st.name, d)
		}
		if d := cmp.Diff(st.claims, r.Classes["public"].Links); d != "" {
			t.Errorf("%s: claims (-want +got):\n%s", st.name, d)
		}
		for _, n := range []string{"edge-a", "worker-b"} {
			if has := len(r.Programs[n].Links) == 1; has != st.linked {
				t.Errorf("%s: %s holds %d links, want linked=%v", st.name, n, len(r.Programs[n].Links), st.linked)
			}
		}
		for _, n := range st.emptyPrograms {
			if !cmp.Equal(empty(n), r.Programs[n], cmpOpts...) {
				t.Errorf("%s: %s still carries %v", st.name, n, r.Programs[n])
			}
		}
		if to := dnatOf(r.Programs["worker-b"], "demo/web/dnat/"+linkToEdgeA).GetToAddress(); st.linked && to != st.ip {
			t.Errorf("%s: worker-b translates to %s, want %s", st.name, to, st.ip)
		}
	}
}

// TestSeveralClassesOnOnePair runs four Vxlan classes over edge-a and worker-b, three
// forwarding from edge-a and one from worker-b: each gets its own device, VNI and /31, and
// each node numbers its return paths' tables and marks across every class
// (docs/design/datapath.md#the-return-path-ip-rules-101-and-102).
func TestSeveralClassesOnOnePair(t *testing.T) {
	s := world(mkPortMap("remote", 0, 3000),
		mkPortMap("i-remote", 1, 4000, className("intranet"), service("i-remote")),
		mkPortMap("t-remote", 2, 5000, className("third"), service("t-remote")),
		mkPortMap("back", 3, 6000, className("back"), service("local")))
	s.Classes["intranet"] = intranet(1, map[string][]string{"edge-a": {"wt0"}})
	s.Classes["third"] = mkClass("third", 2, map[string][]string{"edge-a": {"wt0"}})
	s.Classes["third"].Spec.ReturnPath.Vxlan = v1alpha1.VxlanConfig{VNI: 4400, Port: 4790, Subnet: "169.254.80.0/24"}
	s.Classes["back"] = mkClass("back", 3, map[string][]string{"worker-b": {"wt0"}})
	s.Classes["back"].Spec.ReturnPath.Vxlan = v1alpha1.VxlanConfig{VNI: 4500, Port: 4790, Subnet: "169.254.81.0/24"}
	addService(s, "i-remote", 4000, mkEndpoint("i-remote-0", "10.244.18.108", "worker-b"))
	addService(s, "t-remote", 5000, mkEndpoint("t-remote-0", "10.244.18.109", "worker-b"))
	r := Compile(s)
	for _, k := range []string{"demo/remote", "demo/i-remote", "demo/t-remote", "demo/back"} {
		if o := outcomes(r, nil)[k]; o.Programmed != v1alpha1.ReasonAllNodesReady {
			t.Errorf("%s: %+v", k, o)
		}
	}
	wantClaims := map[string]v1alpha1.LinkStatus{
		"public":   claimOf("edge-a", "worker-b", 0, "169.254.77.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
		"intranet": claimOf("edge-a", "worker-b", 0, "169.254.79.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27506}),
		"third":    claimOf("edge-a", "worker-b", 0, "169.254.80.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27507}),
		"back":     claimOf("edge-a", "worker-b", 0, "169.254.81.0/31", nil, v1alpha1.LinkEnd{Node: "edge-a", Table: 27505}),
	}
	for class, want := range wantClaims {
		if d := cmp.Diff([]v1alpha1.LinkStatus{want}, r.Classes[class].Links); d != "" {
			t.Errorf("class %s claims (-want +got):\n%s", class, d)
		}
	}
	for _, node := range []string{"edge-a", "worker-b"} {
		p := r.Programs[node]
		if len(p.Links) != 4 {
			t.Errorf("%s holds %d links, want 4", node, len(p.Links))
		}
		seen := map[string]bool{}
		for _, l := range p.Links {
			for _, v := range []string{"device " + l.Name, fmt.Sprint("vni ", l.Vni), "address " + l.LocalAddress} {
				if seen[v] {
					t.Errorf("%s: two links share %s", node, v)
				}
				seen[v] = true
			}
		}
		for _, rp := range p.ReturnPaths {
			for _, v := range []string{fmt.Sprint("table ", rp.Table), fmt.Sprint("mark ", rp.Mark)} {
				if seen[v] {
					t.Errorf("%s: two return paths share %s", node, v)
				}
				seen[v] = true
			}
			if rp.Mark != DefaultReturnMarking.Mark(int32(rp.Table)) {
				t.Errorf("%s: return path %s has mark %#x for table %d", node, rp.Id, rp.Mark, rp.Table)
			}
		}
	}
	if n := len(r.Programs["worker-b"].ReturnPaths); n != 3 {
		t.Errorf("worker-b has %d return paths, want 3", n)
	}
	if rps := r.Programs["edge-a"].ReturnPaths; len(rps) != 1 || rps[0].Table != 27505 || rps[0].Mark != 0x1 {
		t.Errorf("edge-a return paths %v, want one in table 27505 with mark 0x1", rps)
	}
}
