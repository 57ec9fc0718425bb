package compile

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

var remoteKey = types.NamespacedName{Namespace: "demo", Name: "remote"}

// TestMulti covers servingMode Multi (docs/design/datapath.md#serving-modes and
// docs/design/datapath.md#kup-mangle-return-marking): every accepting node programs the
// mapping, the pod's node gets a link per accepting node that lacks the pod and marks replies
// from the flow's conntrack entry.
func TestMulti(t *testing.T) {
	cases := []struct {
		name      string
		snap      func() *Snapshot
		want      map[string]outcome
		programs  map[string]*kuportv1.NodeProgram
		published []v1alpha1.PublishedAddress
		links     []v1alpha1.LinkStatus // class intranet's claims
		check     func(t *testing.T, r *Result)
	}{
		{
			name:      "two accepting nodes, pod on neither: a link from each, ct-mark save per link, one restore",
			snap:      multiWorld,
			want:      map[string]outcome{"demo/remote": served(epRemote, "edge-a", "worker-b", "worker-c")},
			programs:  map[string]*kuportv1.NodeProgram{"edge-a": multiEdgeA(), "worker-b": multiWorkerB(), "worker-c": multiWorkerC()},
			published: []v1alpha1.PublishedAddress{pubEdgeA, pubWorkerC},
			links: []v1alpha1.LinkStatus{
				claimOf("edge-a", "worker-b", 0, "169.254.79.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
				claimOf("worker-b", "worker-c", 1, "169.254.79.2/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27506}),
			},
		},
		{
			name: "the pod's node accepts: it DNATs locally and on the link from the other node, SNATs once",
			snap: func() *Snapshot {
				s := multiWorld()
				addService(s, "remote", 3000, mkEndpoint("wc-0", "10.244.19.7", "worker-c"))
				return s
			},
			want: map[string]outcome{"demo/remote": served("worker-c 10.244.19.7", "edge-a", "worker-c")},
			programs: map[string]*kuportv1.NodeProgram{
				"worker-b": empty("worker-b"),
				"worker-c": {
					Node:          "worker-c",
					ReturnMarking: DefaultReturnMarking.wire(),
					DnatRules: []*kuportv1.DnatRule{
						{Id: "demo/remote/dnat/eth0", Mapping: "demo/remote", InInterface: "eth0", Protocol: tcp,
							Ports: ports(3000, 3000), ToAddress: "10.244.19.7", ToPort: 3000, StandIn: "10.244.19.7"},
						{Id: "demo/remote/dnat/" + intranetToEA, Mapping: "demo/remote", InInterface: intranetToEA,
							MatchDestination: "169.254.79.1", Protocol: tcp, Ports: ports(3000, 3000),
							ToAddress: "10.244.19.7", ToPort: 3000, StandIn: "10.244.19.7"},
					},
					SnatRules: []*kuportv1.SnatRule{
						{Id: "demo/remote/snat", Mapping: "demo/remote", Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
							Address: "10.244.19.7", Protocol: tcp, Ports: ports(3000, 3000)},
						{Id: "demo/remote/snat-reply", Mapping: "demo/remote", Kind: kuportv1.SnatKind_SNAT_KIND_REPLY,
							Address: "10.244.19.7", Protocol: tcp, Ports: ports(3000, 3000)},
					},
					MarkRules: []*kuportv1.MarkRule{
						{Id: "demo/remote/ct-restore", Mapping: "demo/remote", Kind: ctRestore, Address: "10.244.19.7",
							Protocol: tcp, Ports: ports(3000, 3000)},
						{Id: "demo/remote/ct-save/" + intranetToEA, Mapping: "demo/remote", Kind: ctSave, InInterface: intranetToEA,
							Address: "169.254.79.1", Protocol: tcp, Ports: ports(3000, 3000), Mark: 0x1},
					},
					Links: []*kuportv1.Link{
						{Name: intranetToEA, ClassName: "intranet", PeerNode: "edge-a", Vni: 4300, Port: 4790,
							LocalUnderlay: "100.64.93.160", RemoteUnderlay: "100.64.93.143",
							LocalAddress: "169.254.79.1", PeerAddress: "169.254.79.0", Mtu: 1370, Mac: "02:6b:a9:fe:4f:01",
							SourcePortLow: 49152, SourcePortHigh: 65535},
					},
					ReturnPaths: []*kuportv1.ReturnPath{
						{Id: intranetToEA + "/return", Link: intranetToEA, Mark: 0x1, Table: 27505,
							PeerUnderlay: "100.64.93.143", PeerLinkAddress: "169.254.79.0"},
					},
				},
			},
			published: []v1alpha1.PublishedAddress{pubEdgeA, pubWorkerC},
			links: []v1alpha1.LinkStatus{
				claimOf("edge-a", "worker-c", 0, "169.254.79.0/31", nil, v1alpha1.LinkEnd{Node: "worker-c", Table: 27505}),
			},
		},
		{
			name: "one accepting node with the pod: served locally with no link, no mark, no return path",
			snap: func() *Snapshot {
				s := world(mkPortMap("local", 0, 3000))
				s.Classes["public"].Spec.ServingMode = v1alpha1.ServingModeMulti
				return s
			},
			want:     map[string]outcome{"demo/local": served(epLocal, "edge-a")},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": localEdgeA(), "worker-b": empty("worker-b")},
		},
		{
			name: "one accepting node, pod elsewhere: one link, marked through conntrack",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000))
				s.Classes["public"].Spec.ServingMode = v1alpha1.ServingModeMulti
				return s
			},
			want: map[string]outcome{"demo/remote": served(epRemote, "edge-a", "worker-b")},
			check: func(t *testing.T, r *Result) {
				want := []*kuportv1.MarkRule{
					{Id: "demo/remote/ct-restore", Mapping: "demo/remote", Kind: ctRestore, Address: "10.244.18.107",
						Protocol: tcp, Ports: ports(3000, 3000)},
					{Id: "demo/remote/ct-save/" + linkToEdgeA, Mapping: "demo/remote", Kind: ctSave, InInterface: linkToEdgeA,
						Address: "169.254.77.1", Protocol: tcp, Ports: ports(3000, 3000), Mark: 0x1},
				}
				if d := cmp.Diff(want, r.Programs["worker-b"].MarkRules, cmpOpts...); d != "" {
					t.Errorf("worker-b marks (-want +got):\n%s", d)
				}
				if d := cmp.Diff(remoteEdgeA(), r.Programs["edge-a"], cmpOpts...); d != "" {
					t.Errorf("edge-a is programmed as under Single (-want +got):\n%s", d)
				}
			},
		},
		{
			name: "a shifted range: ct-save matches the dialed ports on the link, restore the pod's",
			snap: func() *Snapshot {
				s := world(mkPortMap("shifted", 0, 40000, endPort(40009), className("intranet")))
				s.Classes["intranet"] = multiClass(map[string][]string{"edge-a": {"enp1s0"}})
				addService(s, "shifted", 7000, mkEndpoint("shifted-0", "10.244.18.8", "worker-b"))
				return s
			},
			want: map[string]outcome{"demo/shifted": served("worker-b 10.244.18.8", "edge-a", "worker-b")},
			check: func(t *testing.T, r *Result) {
				want := []*kuportv1.MarkRule{
					{Id: "demo/shifted/ct-restore", Mapping: "demo/shifted", Kind: ctRestore, Address: "10.244.18.8",
						Protocol: tcp, Ports: ports(7000, 7009)},
					{Id: "demo/shifted/ct-save/" + intranetToEA, Mapping: "demo/shifted", Kind: ctSave, InInterface: intranetToEA,
						Address: "169.254.79.1", Protocol: tcp, Ports: ports(40000, 40009), Mark: 0x1},
				}
				if d := cmp.Diff(want, r.Programs["worker-b"].MarkRules, cmpOpts...); d != "" {
					t.Errorf("worker-b marks (-want +got):\n%s", d)
				}
			},
		},

		// Per-mapping interfaces narrow per node (the worker-1/worker-2 example of
		// docs/design/api.md#portmap, with edge-a {enp1s0, wt0} and worker-c {eth0,
		// wt0}).
		{
			name: "interfaces narrow per node: enp1s0 binds edge-a alone, nothing names everything",
			snap: func() *Snapshot {
				s := world(mkPortMap("narrow", 0, 3000, className("intranet"), service("remote"), interfaces("enp1s0")),
					mkPortMap("all", 1, 4000, className("intranet"), service("remote")))
				s.Classes["intranet"] = multiClass(map[string][]string{"edge-a": {"enp1s0", "wt0"}, "worker-c": {"eth0", "wt0"}})
				return s
			},
			want: map[string]outcome{
				"demo/narrow": served(epRemote, "edge-a", "worker-b"),
				"demo/all":    served(epRemote, "edge-a", "worker-b", "worker-c"),
			},
			check: func(t *testing.T, r *Result) {
				want := map[string][]v1alpha1.PublishedAddress{
					"narrow": {pubEdgeA},
					"all": {
						pubEdgeA,
						{Node: "edge-a", Interface: "wt0", Address: "100.64.93.143"},
						pubWorkerC,
						{Node: "worker-c", Interface: "wt0", Address: "100.64.93.160"},
					},
				}
				for name, w := range want {
					got := r.PortMaps[types.NamespacedName{Namespace: "demo", Name: name}].Status.Published
					if d := cmp.Diff(w, got); d != "" {
						t.Errorf("%s published (-want +got):\n%s", name, d)
					}
				}
				for _, id := range []string{"demo/narrow/dnat/eth0", "demo/narrow/dnat/wt0"} {
					if dnatOf(r.Programs["worker-c"], id) != nil || dnatOf(r.Programs["edge-a"], id) != nil {
						t.Errorf("%s exists; the mapping binds edge-a's enp1s0 only", id)
					}
				}
			},
		},
		{
			name: "an interface only the pod's node has: that node alone programs, no link, even under None",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000, className("intranet"), interfaces("eth0")))
				s.Classes["intranet"] = multiClass(map[string][]string{"edge-a": {"enp1s0"}, "worker-c": {"eth0"}})
				s.Classes["intranet"].Spec.ReturnPath.Mode = v1alpha1.ReturnPathNone
				addService(s, "remote", 3000, mkEndpoint("wc-0", "10.244.19.7", "worker-c"))
				return s
			},
			want:      map[string]outcome{"demo/remote": served("worker-c 10.244.19.7", "worker-c")},
			programs:  map[string]*kuportv1.NodeProgram{"edge-a": empty("edge-a"), "worker-b": empty("worker-b")},
			published: []v1alpha1.PublishedAddress{pubWorkerC},
		},

		// Partial availability: a forwarder that cannot be built is left out, the rest serve.
		{
			name: "a forwarder with no agent: the other nodes are programmed, NodeNotReady names it",
			snap: func() *Snapshot {
				s := multiWorld()
				delete(s.Agents, "worker-c")
				return s
			},
			want: map[string]outcome{"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote, "edge-a", "worker-b").msg(
				"node worker-c: no agent has connected")},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": multiEdgeA(), "worker-c": empty("worker-c"), "worker-b": func() *kuportv1.NodeProgram {
				p := multiWorkerB()
				p.DnatRules, p.MarkRules = p.DnatRules[:1], p.MarkRules[:2]
				p.Links, p.ReturnPaths = p.Links[:1], p.ReturnPaths[:1]
				return p
			}()},
			published: []v1alpha1.PublishedAddress{pubEdgeA},
			// The claim stays, so the node's link takes the same slot when its agent arrives.
			links: []v1alpha1.LinkStatus{
				claimOf("edge-a", "worker-b", 0, "169.254.79.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
				claimOf("worker-b", "worker-c", 1, "169.254.79.2/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27506}),
			},
		},
		{
			name: "a forwarder without an underlay address is left out the same way",
			snap: func() *Snapshot {
				s := multiWorld()
				s.Agents["edge-a"].State.Interfaces[1].Addresses = nil
				return s
			},
			want: map[string]outcome{"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote, "worker-b", "worker-c").msg(
				`node edge-a: underlay interface "wt0" has no IPv4 address`)},
			programs:  map[string]*kuportv1.NodeProgram{"edge-a": empty("edge-a"), "worker-c": multiWorkerC()},
			published: []v1alpha1.PublishedAddress{pubWorkerC},
		},
		{
			name: "a forwarder whose interface lacks an address is still programmed; the status says so",
			snap: func() *Snapshot {
				s := multiWorld()
				s.Agents["worker-c"].State.Interfaces[1].Addresses = nil
				return s
			},
			want: map[string]outcome{"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote, "edge-a", "worker-b", "worker-c").msg(
				"node worker-c: interface eth0 has no IPv4 address")},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": multiEdgeA(), "worker-b": multiWorkerB(), "worker-c": multiWorkerC()},
		},
		{
			name: "the pod's node cannot be built: nothing is programmed anywhere",
			snap: func() *Snapshot {
				s := multiWorld()
				delete(s.Agents, "worker-b")
				delete(s.Agents, "worker-c")
				return s
			},
			want: map[string]outcome{"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote).msg(
				"node worker-b: no agent has connected; node worker-c: no agent has connected")},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": empty("edge-a"), "worker-b": empty("worker-b"), "worker-c": empty("worker-c")},
		},
		{
			name: "the pod's accepting node without an underlay address blocks its local rules too",
			snap: func() *Snapshot {
				s := multiWorld()
				addService(s, "remote", 3000, mkEndpoint("wc-0", "10.244.19.7", "worker-c"))
				s.Agents["worker-c"].State.Interfaces[0].Addresses = nil
				return s
			},
			want: map[string]outcome{"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, "worker-c 10.244.19.7").msg(
				`node worker-c: underlay interface "wt0" has no IPv4 address`)},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": empty("edge-a"), "worker-c": empty("worker-c")},
		},

		// Link crossings are checked on every link of a plan.
		{
			name: "a newer mapping whose second link already carries its port for another pod is refused",
			snap: func() *Snapshot {
				s := world(mkPortMap("older", 0, 3000, className("intranet"), service("remote"), interfaces("eth0")),
					mkPortMap("newer", 1, 3000, className("intranet"), service("other"), interfaces("wt0")))
				s.Classes["intranet"] = multiClass(map[string][]string{"edge-a": {"enp1s0", "wt0"}, "worker-c": {"eth0", "wt0"}})
				addService(s, "other", 3000, mkEndpoint("other-0", "10.244.18.200", "worker-b"))
				return s
			},
			want: map[string]outcome{
				"demo/older": served(epRemote, "worker-b", "worker-c"),
				// The crossing is found after the endpoint is chosen, so the status still shows it.
				"demo/newer": {Accepted: v1alpha1.ReasonPortConflict, Programmed: v1alpha1.ReasonNotAccepted,
					Endpoint: "worker-b 10.244.18.200", Message: `TCP ports 3000 cross link worker-b/worker-c of class "intranet", which already carries them for demo/older`},
			},
			check: func(t *testing.T, r *Result) {
				if dnatOf(r.Programs["edge-a"], "demo/newer/dnat/wt0") != nil {
					t.Error("the refused mapping reached edge-a")
				}
			},
		},
		{
			name: "a link whose forwarder is not ready yet still belongs to the older mapping",
			snap: func() *Snapshot {
				s := world(mkPortMap("older", 0, 3000, className("intranet"), service("remote"), interfaces("eth0")),
					mkPortMap("newer", 1, 3000, className("intranet"), service("other"), interfaces("wt0")))
				s.Classes["intranet"] = multiClass(map[string][]string{"edge-a": {"enp1s0", "wt0"}, "worker-c": {"eth0", "wt0"}})
				addService(s, "other", 3000, mkEndpoint("other-0", "10.244.18.200", "worker-b"))
				delete(s.Agents, "worker-c")
				return s
			},
			want: map[string]outcome{
				"demo/older": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote).msg("node worker-c: no agent has connected"),
				"demo/newer": {Accepted: v1alpha1.ReasonPortConflict, Programmed: v1alpha1.ReasonNotAccepted, Endpoint: "worker-b 10.244.18.200"},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.snap()
			r := Compile(s)
			if d := cmp.Diff(tc.want, outcomes(r, tc.want), cmpopts.EquateEmpty()); d != "" {
				t.Errorf("portmaps (-want +got):\n%s", d)
			}
			for node, want := range tc.programs {
				if d := cmp.Diff(want, r.Programs[node], cmpOpts...); d != "" {
					t.Errorf("program of %s (-want +got):\n%s", node, d)
				}
			}
			if tc.published != nil {
				if d := cmp.Diff(tc.published, r.PortMaps[remoteKey].Status.Published); d != "" {
					t.Errorf("published (-want +got):\n%s", d)
				}
			}
			if tc.links != nil {
				if d := cmp.Diff(tc.links, r.Classes["intranet"].Links); d != "" {
					t.Errorf("intranet links (-want +got):\n%s", d)
				}
			}
			for name, cl := range r.Classes {
				if c := cl.Conditions[0]; c.Message != "the class is valid" && c.Reason == v1alpha1.ReasonValid {
					t.Errorf("class %s Ready message %q", name, c.Message)
				}
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

// TestRefusalMatrix walks the refusal matrix of
// docs/design/datapath.md#return-path-modes-and-the-refusal-matrix (servingMode × where the
// chosen pod sits × returnPath): which nodes carry the mapping and which links it builds, or
// the refusal with nothing programmed on any node.
func TestRefusalMatrix(t *testing.T) {
	// Two accepting nodes: edge-a [enp1s0] and worker-c [eth0]; worker-b accepts nothing.
	type row struct {
		mode      v1alpha1.ServingMode
		accepting []string
		podOn     string
	}
	pods := map[string]string{"edge-a": "10.244.17.50", "worker-b": "10.244.18.50", "worker-c": "10.244.19.50"}
	ifaces := map[string][]string{"edge-a": {"enp1s0"}, "worker-c": {"eth0"}}
	type want struct {
		nodes []string // nil: refused with ReturnPathUnavailable
		links []string
	}
	cases := []struct {
		name        string
		row         row
		vxlan, none want
	}{
		{"Single, on the serving node",
			row{v1alpha1.ServingModeSingle, []string{"edge-a"}, "edge-a"},
			want{nodes: []string{"edge-a"}}, want{nodes: []string{"edge-a"}}},
		{"Single, on the serving node that is not the first accepting node",
			row{v1alpha1.ServingModeSingle, []string{"edge-a", "worker-c"}, "worker-c"},
			want{nodes: []string{"worker-c"}}, want{nodes: []string{"worker-c"}}},
		{"Single, outside the accepting nodes",
			row{v1alpha1.ServingModeSingle, []string{"edge-a", "worker-c"}, "worker-b"},
			want{nodes: []string{"edge-a", "worker-b"}, links: []string{"edge-a/worker-b"}}, want{}},
		{"Multi, one accepting node, on it",
			row{v1alpha1.ServingModeMulti, []string{"edge-a"}, "edge-a"},
			want{nodes: []string{"edge-a"}}, want{nodes: []string{"edge-a"}}},
		{"Multi, one accepting node, elsewhere",
			row{v1alpha1.ServingModeMulti, []string{"edge-a"}, "worker-b"},
			want{nodes: []string{"edge-a", "worker-b"}, links: []string{"edge-a/worker-b"}}, want{}},
		{"Multi, several accepting nodes, on the first of them",
			row{v1alpha1.ServingModeMulti, []string{"edge-a", "worker-c"}, "edge-a"},
			want{nodes: []string{"edge-a", "worker-c"}, links: []string{"edge-a/worker-c"}}, want{}},
		{"Multi, several accepting nodes, on another of them",
			row{v1alpha1.ServingModeMulti, []string{"edge-a", "worker-c"}, "worker-c"},
			want{nodes: []string{"edge-a", "worker-c"}, links: []string{"edge-a/worker-c"}}, want{}},
		{"Multi, several accepting nodes, on none of them",
			row{v1alpha1.ServingModeMulti, []string{"edge-a", "worker-c"}, "worker-b"},
			want{nodes: []string{"edge-a", "worker-b", "worker-c"}, links: []string{"edge-a/worker-b", "worker-b/worker-c"}}, want{}},
	}
	for _, tc := range cases {
		for mode, w := range map[v1alpha1.ReturnPathMode]want{v1alpha1.ReturnPathVxlan: tc.vxlan, v1alpha1.ReturnPathNone: tc.none} {
			t.Run(tc.name+", "+string(mode), func(t *testing.T) {
				nodes := map[string][]string{}
				for _, n := range tc.row.accepting {
					nodes[n] = ifaces[n]
				}
				s := world(mkPortMap("web", 0, 3000))
				s.Classes["public"] = mkClass("public", 0, nodes)
				s.Classes["public"].Spec.ServingMode = tc.row.mode
				s.Classes["public"].Spec.ReturnPath.Mode = mode
				ep := tc.row.podOn + " " + pods[tc.row.podOn]
				addService(s, "web", 3000, mkEndpoint("web-0", pods[tc.row.podOn], tc.row.podOn))
				r := Compile(s)

				wantOutcome := served(ep, w.nodes...)
				if w.nodes == nil {
					wantOutcome = unprogrammed(v1alpha1.ReasonReturnPathUnavailable, ep)
				}
				got := outcomes(r, nil)["demo/web"]
				if d := cmp.Diff(wantOutcome, got, cmpopts.EquateEmpty()); d != "" {
					t.Errorf("outcome (-want +got):\n%s", d)
				}
				var links []string
				for _, l := range r.Classes["public"].Links {
					links = append(links, l.Key)
				}
				if d := cmp.Diff(w.links, links, cmpopts.EquateEmpty()); d != "" {
					t.Errorf("links (-want +got):\n%s", d)
				}
				// One published row per interface of every node carrying the rules, by node.
				var published []string
				for _, a := range r.PortMaps[nsName("demo", "web")].Status.Published {
					published = append(published, a.Node)
				}
				wantPublished := slices.DeleteFunc(slices.Clone(w.nodes), func(n string) bool { return ifaces[n] == nil })
				if d := cmp.Diff(wantPublished, published, cmpopts.EquateEmpty()); d != "" {
					t.Errorf("published nodes (-want +got):\n%s", d)
				}
				for node, p := range r.Programs {
					if w.nodes == nil && !cmp.Equal(empty(node), p, cmpOpts...) {
						t.Errorf("refused, yet %s's program is %v", node, p)
					}
				}
			})
		}
	}
}

// Under None a Multi class with several accepting nodes refuses every mapping, naming each
// node that lacks the pod.
func TestMultiNoneNamesEveryNodeLackingThePod(t *testing.T) {
	s := multiWorld()
	s.Classes["intranet"].Spec.ReturnPath.Mode = v1alpha1.ReturnPathNone
	got := outcomes(Compile(s), map[string]outcome{"demo/remote": {Message: "x"}})["demo/remote"]
	want := unprogrammed(v1alpha1.ReasonReturnPathUnavailable, epRemote).msg(
		`the pod is on worker-b, not on edge-a, worker-c which hold the mapping, and class "intranet" has returnPath None`)
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("outcome (-want +got):\n%s", d)
	}
}
