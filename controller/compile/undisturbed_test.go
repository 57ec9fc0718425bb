package compile

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// mappingView is everything compile emitted for one mapping on one node: its rules, the
// links they name and the return paths their marks or links select (what the agents'
// registry groups by mapping).
func mappingView(p *kuportv1.NodeProgram, mapping string) *kuportv1.NodeProgram {
	v := &kuportv1.NodeProgram{Node: p.Node}
	devs := map[string]bool{}
	marks := map[uint32]bool{}
	targets := map[string]bool{}
	for _, d := range p.DnatRules {
		if d.Mapping == mapping {
			v.DnatRules = append(v.DnatRules, d)
			devs[d.InInterface] = true
			targets[d.ToAddress] = true
		}
	}
	for _, s := range p.SnatRules {
		if s.Mapping == mapping {
			v.SnatRules = append(v.SnatRules, s)
		}
	}
	// A link the mapping leaves by is the one whose far end its DNAT translates to.
	for _, l := range p.Links {
		if targets[l.PeerAddress] {
			devs[l.Name] = true
		}
	}
	for _, m := range p.MarkRules {
		if m.Mapping == mapping {
			v.MarkRules = append(v.MarkRules, m)
			marks[m.Mark] = true
		}
	}
	for _, l := range p.Links {
		if devs[l.Name] {
			v.Links = append(v.Links, l)
		}
	}
	for _, rp := range p.ReturnPaths {
		if devs[rp.Link] || marks[rp.Mark] {
			v.ReturnPaths = append(v.ReturnPaths, rp)
		}
	}
	return v
}

// TestFailuresLeaveOthersUndisturbed adds, beside two serving mappings (demo/by-local on
// edge-a and demo/by-remote over the edge-a/worker-b link), one failing mapping or class per
// reason of docs/design/api.md#status-and-conditions, and checks the reason and that the
// bystanders' statuses, entries, links, return paths and link claim are exactly what they are
// without it.
func TestFailuresLeaveOthersUndisturbed(t *testing.T) {
	bystanders := func() *Snapshot {
		return world(mkPortMap("by-local", 0, 5000, service("local")), mkPortMap("by-remote", 1, 5001, service("remote")))
	}
	// with adds the failing mapping bad (newer than the bystanders) and whatever it needs.
	with := func(bad *v1alpha1.PortMap, classes ...*v1alpha1.PortMapClass) *Snapshot {
		s := bystanders()
		s.PortMaps = append(s.PortMaps, bad)
		for _, cl := range classes {
			s.Classes[cl.Name] = cl
		}
		return s
	}
	bad := func(port int32, muts ...func(*v1alpha1.PortMap)) *v1alpha1.PortMap {
		return mkPortMap("bad", 2, port, append([]func(*v1alpha1.PortMap){service("remote")}, muts...)...)
	}
	// noneClass is a class with returnPath None on edge-a's wt0, so it never overlaps public.
	noneClass := func(name string) *v1alpha1.PortMapClass {
		cl := mkClass(name, 1, map[string][]string{"edge-a": {"wt0"}})
		cl.Spec.ReturnPath.Mode = v1alpha1.ReturnPathNone
		return cl
	}
	vxlanClass := func(name string, mut func(*v1alpha1.VxlanConfig)) *v1alpha1.PortMapClass {
		cl := mkClass(name, 1, map[string][]string{"edge-a": {"wt0"}})
		cl.Spec.ReturnPath.Vxlan = v1alpha1.VxlanConfig{VNI: 4400, Port: 4790, Subnet: "169.254.80.0/24"}
		mut(&cl.Spec.ReturnPath.Vxlan)
		return cl
	}
	cases := []struct {
		name string
		snap func() *Snapshot
		// accepted and programmed are demo/bad's reasons; class and ready a class's Ready reason.
		accepted, programmed string
		class, ready         string
	}{
		{name: "ClassNotFound", snap: func() *Snapshot { return with(bad(3000, className("nope"))) },
			accepted: v1alpha1.ReasonClassNotFound},
		{name: "NamespaceNotSelected", snap: func() *Snapshot {
			picky := noneClass("picky")
			picky.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
			return with(bad(3000, className("picky")), picky)
		}, accepted: v1alpha1.ReasonNamespaceNotSelected},
		{name: "InvalidPortRange", snap: func() *Snapshot { return with(bad(3000, endPort(2999))) },
			accepted: v1alpha1.ReasonInvalidPortRange},
		{name: "PortOutOfRange", snap: func() *Snapshot { return with(bad(80)) },
			accepted: v1alpha1.ReasonPortOutOfRange},
		{name: "PortReserved", snap: func() *Snapshot { return with(bad(8080)) },
			accepted: v1alpha1.ReasonPortReserved},
		{name: "PortConflict: the earlier mapping keeps the port", snap: func() *Snapshot { return with(bad(5001, service("local"))) },
			accepted: v1alpha1.ReasonPortConflict},
		{name: "PortConflict across classes sharing node, interface and protocol", snap: func() *Snapshot {
			return with(bad(5000, className("other")), noneClass("other"))
		}, accepted: v1alpha1.ReasonPortConflict},
		{name: "InterfaceNotInClass", snap: func() *Snapshot { return with(bad(3000, interfaces("eth9"))) },
			accepted: v1alpha1.ReasonInterfaceNotInClass},
		{name: "NoReadyEndpoint", snap: func() *Snapshot { return with(bad(3000, service("gone"))) },
			programmed: v1alpha1.ReasonNoReadyEndpoint},
		{name: "ReturnPathUnavailable", snap: func() *Snapshot { return with(bad(3000, className("none")), noneClass("none")) },
			programmed: v1alpha1.ReasonReturnPathUnavailable},
		{name: "NodeNotReady: the pod's node has no agent", snap: func() *Snapshot {
			s := with(bad(3000, service("far")))
			addNodes(s, "worker-d")
			addService(s, "far", 3000, mkEndpoint("far-0", "10.244.20.7", "worker-d"))
			return s
		}, programmed: v1alpha1.ReasonNodeNotReady},
		{name: "NodeNotReady: a Multi forwarder has no agent", snap: func() *Snapshot {
			// Its own pod port: replies from remote's are statically marked into public's link.
			s := with(bad(3000, className("intranet"), service("multi")), multiClass(map[string][]string{"edge-a": {"wt0"}, "worker-d": {"wt0"}}))
			addService(s, "multi", 3001, mkEndpoint("web-b", "10.244.18.107", "worker-b"))
			addNodes(s, "worker-d")
			return s
		}, programmed: v1alpha1.ReasonNodeNotReady},
		{name: "NoInterfaceOnNode", snap: func() *Snapshot {
			narrow := mkClass("narrow", 1, map[string][]string{"edge-a": {"wt0"}, "worker-c": {"eth0"}})
			narrow.Spec.ReturnPath.Mode = v1alpha1.ReturnPathNone
			s := with(bad(3000, className("narrow"), service("wc"), interfaces("wt0")), narrow)
			addService(s, "wc", 3000, mkEndpoint("wc-0", "10.244.19.7", "worker-c"))
			return s
		}, programmed: v1alpha1.ReasonNoInterfaceOnNode},
		{name: "VxlanPortConflict", snap: func() *Snapshot {
			s := with(bad(3000, className("clash")), vxlanClass("clash", func(v *v1alpha1.VxlanConfig) { v.Port = 4789 }))
			withTunnel(s, "worker-b", tunnel("flannel.1", vxlan, 4789))
			return s
		}, programmed: v1alpha1.ReasonReturnPathUnavailable, class: "clash", ready: v1alpha1.ReasonVxlanPortConflict},
		{name: "InvalidSubnet", snap: func() *Snapshot {
			return with(bad(3000, className("junk")), vxlanClass("junk", func(v *v1alpha1.VxlanConfig) { v.Subnet = "nonsense" }))
		}, programmed: v1alpha1.ReasonReturnPathUnavailable, class: "junk", ready: v1alpha1.ReasonInvalidSubnet},
		{name: "SubnetOverlap", snap: func() *Snapshot {
			return with(bad(3000, className("overlap")), vxlanClass("overlap", func(v *v1alpha1.VxlanConfig) { v.Subnet = "169.254.77.128/25" }))
		}, programmed: v1alpha1.ReasonReturnPathUnavailable, class: "overlap", ready: v1alpha1.ReasonSubnetOverlap},
		{name: "SubnetExhausted", snap: func() *Snapshot {
			s := with(mkPortMap("bad", 3, 3000, className("tiny"), service("wc")),
				vxlanClass("tiny", func(v *v1alpha1.VxlanConfig) { v.Subnet = "169.254.80.0/31" }))
			// first takes tiny's one slot; its pod is not by-remote's, whose replies go back by
			// public's link.
			s.PortMaps = append(s.PortMaps, mkPortMap("first", 2, 3001, className("tiny"), service("wb")))
			addService(s, "wb", 3000, mkEndpoint("wb-0", "10.244.18.200", "worker-b"))
			addService(s, "wc", 3000, mkEndpoint("wc-0", "10.244.19.7", "worker-c"))
			return s
		}, programmed: v1alpha1.ReasonReturnPathUnavailable, class: "tiny", ready: v1alpha1.ReasonSubnetExhausted},
	}
	base := Compile(bystanders())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Compile(tc.snap())
			got := outcomes(r, nil)["demo/bad"]
			want := tc.accepted
			if want == "" {
				want = v1alpha1.ReasonValid
			}
			if got.Accepted != want || tc.programmed != "" && got.Programmed != tc.programmed {
				t.Errorf("demo/bad: Accepted %s, Programmed %s; want %s, %s", got.Accepted, got.Programmed, want, tc.programmed)
			}
			if tc.class != "" {
				if c := r.Classes[tc.class].Conditions[0]; c.Reason != tc.ready {
					t.Errorf("class %s Ready %s (%s), want %s", tc.class, c.Reason, c.Message, tc.ready)
				}
			}
			for _, k := range []string{"by-local", "by-remote"} {
				key := nsName("demo", k)
				if d := cmp.Diff(base.PortMaps[key], r.PortMaps[key]); d != "" {
					t.Errorf("%s's result changed (-alone +beside the failure):\n%s", k, d)
				}
				for node, p := range base.Programs {
					if d := cmp.Diff(mappingView(p, key.String()), mappingView(r.Programs[node], key.String()), cmpOpts...); d != "" {
						t.Errorf("%s's entries on %s changed (-alone +beside the failure):\n%s", k, node, d)
					}
				}
			}
			byRemoteClaim := base.Classes["public"].Links[0]
			if !slices.ContainsFunc(r.Classes["public"].Links, func(l v1alpha1.LinkStatus) bool { return cmp.Equal(l, byRemoteClaim) }) {
				t.Errorf("public claims %+v lost or moved %+v", r.Classes["public"].Links, byRemoteClaim)
			}
		})
	}
}
