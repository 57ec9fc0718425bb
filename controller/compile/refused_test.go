package compile

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// samePortWorld has three pods wanting one port: class public (Single, Vxlan) accepts on
// edge-a's enp1s0 and wt0; pods pod-b (10.244.18.107) and pod-b2 (10.244.18.108) on worker-b
// and pod-a (10.244.17.7) on edge-a, each behind its own Service, on port 3300.
func samePortWorld(pms ...*v1alpha1.PortMap) *Snapshot {
	s := world(pms...)
	addService(s, "pod-b", 3300, mkEndpoint("pod-b", "10.244.18.107", "worker-b"))
	addService(s, "pod-b2", 3300, mkEndpoint("pod-b2", "10.244.18.108", "worker-b"))
	addService(s, "pod-a", 3300, mkEndpoint("pod-a", "10.244.17.7", "edge-a"))
	return s
}

// TestLateRefusalHoldsNothing: xb, refused because its port would cross the link that already
// carries it for xa, holds nothing, so xc (the same port on the same interface, to a pod on
// the accepting node) is accepted. The next compilation, reading the statuses back, keeps
// every verdict; xc now holds wt0's port, which is what refuses xb.
func TestLateRefusalHoldsNothing(t *testing.T) {
	pms := func() *Snapshot {
		return samePortWorld(mkPortMap("xa", 0, 3300, service("pod-b"), interfaces("enp1s0")),
			mkPortMap("xb", 1, 3300, service("pod-b2"), interfaces("wt0")),
			mkPortMap("xc", 2, 3300, service("pod-a"), interfaces("wt0")))
	}
	want0 := map[string]outcome{
		"demo/xa": served("worker-b 10.244.18.107", "edge-a", "worker-b"),
		"demo/xb": {Accepted: v1alpha1.ReasonPortConflict, Programmed: v1alpha1.ReasonNotAccepted, Endpoint: "worker-b 10.244.18.108",
			Message: `TCP ports 3300 cross link edge-a/worker-b of class "public", which already carries them for demo/xa`},
		"demo/xc": served(epLocal, "edge-a"),
	}
	want1 := maps.Clone(want0)
	want1["demo/xb"] = refused(v1alpha1.ReasonPortConflict).msg("TCP ports 3300 on edge-a interface wt0 are held by demo/xc")
	links := []v1alpha1.LinkStatus{
		claimOf("edge-a", "worker-b", 0, "169.254.77.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
	}
	r := Compile(pms())
	r1 := Compile(carry(pms(), r, now.Add(time.Minute)))
	for i, c := range []struct {
		res  *Result
		want map[string]outcome
	}{{r, want0}, {r1, want1}} {
		if d := cmp.Diff(c.want, outcomes(c.res, c.want), cmpopts.EquateEmpty()); d != "" {
			t.Errorf("compilation %d: portmaps (-want +got):\n%s", i, d)
		}
		if d := cmp.Diff(links, c.res.Classes["public"].Links); d != "" {
			t.Errorf("compilation %d: public links (-want +got):\n%s", i, d)
		}
		for node, p := range c.res.Programs {
			if v := mappingView(p, "demo/xb"); len(v.DnatRules)+len(v.SnatRules)+len(v.MarkRules) > 0 {
				t.Errorf("compilation %d: the refused demo/xb has entries on %s: %v", i, node, v)
			}
		}
	}
}

// TestRefusedMappingHoldsNothing refuses demo/bad for each reason of the Accepted condition
// (docs/design/api.md#status-and-conditions), PortConflict in each of its forms, beside
// mappings that want what bad would have held: the same port on the same node, interface and
// protocol, the link bad would cross, the slot bad would have claimed (in a subnet with no
// slot to spare), the pod port whose replies bad would have returned. Every other mapping is
// served, and the result is exactly the one compiled without bad: its refusal holds no port,
// link, slot, table or mark.
func TestRefusedMappingHoldsNothing(t *testing.T) {
	// bad is created between older (age 0) and later (age 2) mappings.
	bad := func(port int32, muts ...func(*v1alpha1.PortMap)) *v1alpha1.PortMap {
		return mkPortMap("bad", 1, port, append([]func(*v1alpha1.PortMap){service("pod-b2")}, muts...)...)
	}
	// later wants TCP 3300 on every interface of public, to pod-b over edge-a/worker-b.
	later := func() *v1alpha1.PortMap { return mkPortMap("later", 2, 3300, service("pod-b")) }
	// podC is a pod on worker-c, behind Service pod-c.
	podC := func(s *Snapshot) *Snapshot {
		addService(s, "pod-c", 3300, mkEndpoint("pod-c", "10.244.19.7", "worker-c"))
		return s
	}
	// multi is class intranet, Multi, on the given nodes, in a subnet of the given bits.
	multi := func(s *Snapshot, bits string, nodes map[string][]string) *Snapshot {
		cl := multiClass(nodes)
		cl.Spec.ReturnPath.Vxlan.Subnet = "169.254.79.0/" + bits
		s.Classes["intranet"] = cl
		return s
	}
	cases := []struct {
		name string
		snap func() *Snapshot
		// reason and message of bad's Accepted condition (message compared when set).
		reason, message string
	}{
		{name: "ClassNotFound", reason: v1alpha1.ReasonClassNotFound,
			snap: func() *Snapshot { return samePortWorld(bad(3300, className("nope")), later()) }},
		{name: "NamespaceNotSelected", reason: v1alpha1.ReasonNamespaceNotSelected, snap: func() *Snapshot {
			s := samePortWorld(bad(3300, className("picky")), later())
			picky := mkClass("picky", 1, map[string][]string{"edge-a": {"enp1s0", "wt0"}})
			picky.Spec.ReturnPath.Mode = v1alpha1.ReturnPathNone
			picky.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
			s.Classes["picky"] = picky
			return s
		}},
		{name: "InvalidPortRange", reason: v1alpha1.ReasonInvalidPortRange,
			snap: func() *Snapshot { return samePortWorld(bad(3300, endPort(3299)), later()) }},
		{name: "PortOutOfRange", reason: v1alpha1.ReasonPortOutOfRange,
			snap: func() *Snapshot { return samePortWorld(bad(3300, endPort(65536)), later()) }},
		{name: "PortReserved", reason: v1alpha1.ReasonPortReserved,
			snap: func() *Snapshot { return samePortWorld(bad(3300, endPort(8080)), later()) }},
		{name: "PortConflict: an older mapping holds the port on one of its interfaces",
			reason: v1alpha1.ReasonPortConflict, message: "TCP ports 3300 on edge-a interface wt0 are held by demo/older",
			snap: func() *Snapshot {
				return samePortWorld(mkPortMap("older", 0, 3300, service("pod-a"), interfaces("wt0")), bad(3300),
					mkPortMap("later", 2, 3300, service("pod-b"), interfaces("enp1s0")))
			}},
		{name: "InterfaceNotInClass", reason: v1alpha1.ReasonInterfaceNotInClass,
			snap: func() *Snapshot { return samePortWorld(bad(3300, interfaces("wt0", "eth9")), later()) }},
		{name: "PortConflict: its port would cross a link that carries it for another mapping",
			reason: v1alpha1.ReasonPortConflict, message: `TCP ports 3300 cross link edge-a/worker-b of class "public", which already carries them for demo/xa`,
			snap: func() *Snapshot {
				return samePortWorld(mkPortMap("xa", 0, 3300, service("pod-b"), interfaces("enp1s0")),
					mkPortMap("bad", 1, 3300, service("pod-b2"), interfaces("wt0")),
					mkPortMap("xc", 2, 3300, service("pod-a"), interfaces("wt0")))
			}},
		{name: "PortConflict: one of its links would carry the port for another mapping, the other is new",
			reason: v1alpha1.ReasonPortConflict, message: `TCP ports 3300 cross link edge-a/worker-b of class "intranet", which already carries them for demo/older`,
			snap: func() *Snapshot {
				// bad would cross edge-a/worker-b beside older, hold 3300 on edge-a's wt0 (which
				// same wants) and claim worker-b/worker-c, the last slot of a /30 (which later's
				// edge-a/worker-c needs).
				s := podC(samePortWorld(mkPortMap("older", 0, 3300, className("intranet"), service("pod-b"), interfaces("enp1s0")),
					bad(3300, className("intranet"), interfaces("wt0", "eth0")),
					mkPortMap("later", 2, 3301, className("intranet"), service("pod-c"), interfaces("wt0", "eth0")),
					mkPortMap("same", 3, 3300, className("intranet"), service("pod-a"), interfaces("wt0"))))
				return multi(s, "30", map[string][]string{"edge-a": {"enp1s0", "wt0"}, "worker-c": {"eth0"}})
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Compile(tc.snap())
			without := tc.snap()
			without.PortMaps = slices.DeleteFunc(without.PortMaps, func(pm *v1alpha1.PortMap) bool { return pm.Name == "bad" })
			r0 := Compile(without)

			got := outcomes(r, map[string]outcome{"demo/bad": {Message: tc.message}})
			if b := got["demo/bad"]; b.Accepted != tc.reason || tc.message != "" && b.Message != tc.message {
				t.Errorf("demo/bad: Accepted %s %q, want %s %q", b.Accepted, b.Message, tc.reason, tc.message)
			}
			delete(got, "demo/bad")
			for k, o := range got {
				if o.Programmed != v1alpha1.ReasonAllNodesReady {
					t.Errorf("%s: Accepted %s, Programmed %s; want it served", k, o.Accepted, o.Programmed)
				}
			}
			for k, res := range r0.PortMaps {
				if d := cmp.Diff(res, r.PortMaps[k]); d != "" {
					t.Errorf("%s's result (-without bad +beside it):\n%s", k, d)
				}
			}
			if d := cmp.Diff(r0.Programs, r.Programs, cmpOpts...); d != "" {
				t.Errorf("programs (-without bad +beside it):\n%s", d)
			}
			if d := cmp.Diff(r0.Classes, r.Classes); d != "" {
				t.Errorf("class statuses (-without bad +beside it):\n%s", d)
			}
		})
	}
}

// An accepted mapping that finds no free link slot still holds its ports and its link's
// crossing, so a newer mapping over the same pair cannot take the link when a slot frees up.
func TestAcceptedMappingWithoutSlotHoldsItsLink(t *testing.T) {
	s := world(mkPortMap("remote", 0, 3000), mkPortMap("web", 1, 3001, interfaces("enp1s0")),
		mkPortMap("other", 2, 3001, interfaces("wt0")))
	s.Classes["public"].Spec.ReturnPath.Vxlan.Subnet = "169.254.77.0/31"
	addService(s, "web", 3001, mkEndpoint("web-0", "10.244.19.7", "worker-c"))
	addService(s, "other", 3001, mkEndpoint("other-0", "10.244.19.8", "worker-c"))
	want := map[string]outcome{
		"demo/remote": served(epRemote, "edge-a", "worker-b"),
		"demo/web":    unprogrammed(v1alpha1.ReasonReturnPathUnavailable, "worker-c 10.244.19.7"),
		"demo/other": {Accepted: v1alpha1.ReasonPortConflict, Programmed: v1alpha1.ReasonNotAccepted, Endpoint: "worker-c 10.244.19.8",
			Message: `TCP ports 3001 cross link edge-a/worker-c of class "public", which already carries them for demo/web`},
	}
	if d := cmp.Diff(want, outcomes(Compile(s), want), cmpopts.EquateEmpty()); d != "" {
		t.Errorf("portmaps (-want +got):\n%s", d)
	}
}
