package compile

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	gproto "google.golang.org/protobuf/proto"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

const (
	vxlan  = kuportv1.TunnelKind_TUNNEL_KIND_VXLAN
	geneve = kuportv1.TunnelKind_TUNNEL_KIND_GENEVE
)

// tunnel is a tunnel device as an agent reports it, with no address.
func tunnel(name string, kind kuportv1.TunnelKind, port uint32) *kuportv1.Interface {
	return &kuportv1.Interface{Name: name, Mtu: 1450, Tunnel: kind, UdpPort: port}
}

// withTunnel replaces node's agent state by one that also reports the devices, as a new
// Report does (the previous state is not mutated).
func withTunnel(s *Snapshot, node string, devs ...*kuportv1.Interface) {
	a := *s.Agents[node]
	a.State = gproto.CloneOf(a.State)
	a.State.Interfaces = append(a.State.Interfaces, devs...)
	s.Agents[node] = &a
}

// TestTunnelPortConflict: a Vxlan class whose port a tunnel device of another program uses
// on a node (the CNI's: Flannel's flannel.1 on Talos's 4789, Cilium's geneve on 6081) builds
// no link to or from that node, says so in its Ready condition and the node's row, and
// refuses the mappings that need such a link with ReturnPathUnavailable naming the node and
// the device; its other nodes and mappings keep serving. No port is special by itself, and
// kuport's own kup-* devices never conflict.
func TestTunnelPortConflict(t *testing.T) {
	wc := func(s *Snapshot) {
		addService(s, "wc", 3000, mkEndpoint("wc-0", "10.244.19.7", "worker-c"))
	}
	cases := []struct {
		name     string
		snap     func() *Snapshot
		want     map[string]outcome
		class    string
		ready    classOutcome
		rows     []v1alpha1.ClassNodeStatus
		programs map[string]*kuportv1.NodeProgram
		// links are the nodes that hold a link of the class, each to the given peers.
		links map[string][]string
	}{
		{
			name: "flannel.1 on 4789 on a pod's node refuses the class's link there only",
			snap: func() *Snapshot {
				s := world(mkPortMap("local", 0, 3000), mkPortMap("remote", 1, 3001), mkPortMap("wc", 2, 3002))
				wc(s)
				s.Classes["public"].Spec.ReturnPath.Vxlan.Port = 4789
				withTunnel(s, "worker-b", tunnel("flannel.1", vxlan, 4789))
				return s
			},
			want: map[string]outcome{
				"demo/local": served(epLocal, "edge-a"),
				"demo/remote": unprogrammed(v1alpha1.ReasonReturnPathUnavailable, epRemote).msg(
					`node worker-b: vxlan port 4789 of class "public" is used by flannel.1 (vxlan)`),
				"demo/wc": served("worker-c 10.244.19.7", "edge-a", "worker-c"),
			},
			class: "public",
			ready: classOutcome{Ready: v1alpha1.ReasonVxlanPortConflict,
				Message: "vxlan port 4789 is used by flannel.1 (vxlan) on worker-b: no link of the class is built to or from those nodes"},
			rows:     []v1alpha1.ClassNodeStatus{{Name: "edge-a", Ready: true}},
			programs: map[string]*kuportv1.NodeProgram{"worker-b": empty("worker-b")},
			links:    map[string][]string{"edge-a": {"worker-c"}, "worker-c": {"edge-a"}},
		},
		{
			name: "8472 is no port of its own: a class on it builds links where no device uses it",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000))
				s.Classes["public"].Spec.ReturnPath.Vxlan.Port = 8472
				withTunnel(s, "worker-c", tunnel("cilium_vxlan", vxlan, 8472))
				return s
			},
			want:  map[string]outcome{"demo/remote": served(epRemote, "edge-a", "worker-b")},
			class: "public",
			ready: classOutcome{Ready: v1alpha1.ReasonValid},
			links: map[string][]string{"edge-a": {"worker-b"}, "worker-b": {"edge-a"}},
		},
		{
			name: "geneve on 6081 on a Multi accepting node: its row says so, the other node still serves",
			snap: func() *Snapshot {
				s := multiWorld()
				s.Classes["intranet"].Spec.ReturnPath.Vxlan.Port = 6081
				withTunnel(s, "worker-c", tunnel("cilium_geneve", geneve, 6081))
				return s
			},
			want: map[string]outcome{"demo/remote": unprogrammed(v1alpha1.ReasonReturnPathUnavailable, epRemote, "edge-a", "worker-b").msg(
				`node worker-c: vxlan port 6081 of class "intranet" is used by cilium_geneve (geneve)`)},
			class: "intranet",
			ready: classOutcome{Ready: v1alpha1.ReasonVxlanPortConflict,
				Message: "vxlan port 6081 is used by cilium_geneve (geneve) on worker-c: no link of the class is built to or from those nodes"},
			rows: []v1alpha1.ClassNodeStatus{{Name: "edge-a", Ready: true}, {Name: "worker-c",
				Message: "VxlanPortConflict: UDP port 6081 is used by cilium_geneve (geneve) on this node"}},
			programs: map[string]*kuportv1.NodeProgram{"worker-c": empty("worker-c")},
			links:    map[string][]string{"edge-a": {"worker-b"}, "worker-b": {"edge-a"}},
		},
		{
			name: "a conflicting pod's node under Multi: the accepting nodes keep their local pods, the links to it are refused",
			snap: func() *Snapshot {
				s := multiWorld()
				addService(s, "local", 3000, mkEndpoint("local-0", "10.244.17.7", "edge-a"))
				s.PortMaps = append(s.PortMaps, mkPortMap("local", 1, 3001, className("intranet")))
				s.Classes["intranet"].Spec.ReturnPath.Vxlan.Port = 4789
				withTunnel(s, "edge-a", tunnel("flannel.1", vxlan, 4789))
				return s
			},
			want: map[string]outcome{
				"demo/remote": unprogrammed(v1alpha1.ReasonReturnPathUnavailable, epRemote, "worker-b", "worker-c").msg(
					`node edge-a: vxlan port 4789 of class "intranet" is used by flannel.1 (vxlan)`),
				"demo/local": unprogrammed(v1alpha1.ReasonReturnPathUnavailable, epLocal, "edge-a").msg(
					`node edge-a: vxlan port 4789 of class "intranet" is used by flannel.1 (vxlan)`),
			},
			class: "intranet",
			ready: classOutcome{Ready: v1alpha1.ReasonVxlanPortConflict,
				Message: "vxlan port 4789 is used by flannel.1 (vxlan) on edge-a: no link of the class is built to or from those nodes"},
			rows: []v1alpha1.ClassNodeStatus{{Name: "edge-a",
				Message: "VxlanPortConflict: UDP port 4789 is used by flannel.1 (vxlan) on this node"}, {Name: "worker-c", Ready: true}},
			links: map[string][]string{"worker-b": {"worker-c"}, "worker-c": {"worker-b"}},
		},
		{
			name: "kuport's own kup-* device on the class's port is no conflict",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000))
				withTunnel(s, "worker-b", tunnel("kup-0badc0de", vxlan, 4790))
				withTunnel(s, "edge-a", tunnel(linkToWorkerB, vxlan, 4790))
				return s
			},
			want:     map[string]outcome{"demo/remote": served(epRemote, "edge-a", "worker-b")},
			class:    "public",
			ready:    classOutcome{Ready: v1alpha1.ReasonValid},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": remoteEdgeA(), "worker-b": remoteWorkerB()},
		},
		{
			name: "a device on another port, or a class with returnPath None, is no conflict",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000), mkPortMap("local", 1, 3001, className("direct")))
				direct := mkClass("direct", 1, map[string][]string{"edge-a": {"wt0"}})
				direct.Spec.ReturnPath.Mode = v1alpha1.ReturnPathNone
				direct.Spec.ReturnPath.Vxlan.Port = 4789
				s.Classes["direct"] = direct
				withTunnel(s, "worker-b", tunnel("flannel.1", vxlan, 4789))
				withTunnel(s, "edge-a", tunnel("flannel.1", vxlan, 4789))
				return s
			},
			want:     map[string]outcome{"demo/remote": served(epRemote, "edge-a", "worker-b"), "demo/local": served(epLocal, "edge-a")},
			class:    "direct",
			ready:    classOutcome{Ready: v1alpha1.ReasonValid},
			programs: map[string]*kuportv1.NodeProgram{"worker-b": remoteWorkerB()},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Compile(tc.snap())
			if d := cmp.Diff(tc.want, outcomes(r, tc.want), cmpopts.EquateEmpty()); d != "" {
				t.Errorf("portmaps (-want +got):\n%s", d)
			}
			st := r.Classes[tc.class]
			got := classOutcome{Ready: st.Conditions[0].Reason, Message: st.Conditions[0].Message}
			if tc.ready.Message == "" {
				got.Message = ""
			}
			if d := cmp.Diff(tc.ready, got, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("class %s Ready (-want +got):\n%s", tc.class, d)
			}
			if tc.rows != nil {
				var rows []v1alpha1.ClassNodeStatus
				for _, row := range st.Nodes {
					rows = append(rows, v1alpha1.ClassNodeStatus{Name: row.Name, Ready: row.Ready, Message: row.Message})
				}
				if d := cmp.Diff(tc.rows, rows); d != "" {
					t.Errorf("class %s node rows (-want +got):\n%s", tc.class, d)
				}
			}
			for node, want := range tc.programs {
				if d := cmp.Diff(want, r.Programs[node], cmpOpts...); d != "" {
					t.Errorf("program of %s (-want +got):\n%s", node, d)
				}
			}
			if tc.links != nil {
				got := map[string][]string{}
				for node, p := range r.Programs {
					for _, l := range p.GetLinks() {
						if l.GetClassName() == tc.class {
							got[node] = append(got[node], l.GetPeerNode())
						}
					}
				}
				if d := cmp.Diff(tc.links, got); d != "" {
					t.Errorf("links of class %s by node (-want +got):\n%s", tc.class, d)
				}
			}
		})
	}
}

// TestTunnelPortConflictHeals: once the node stops reporting the device, the next compilation
// serves the mapping over the link in the slot claimed while it was refused, and the class is
// Valid again.
func TestTunnelPortConflictHeals(t *testing.T) {
	snap := func(flannel bool) *Snapshot {
		s := world(mkPortMap("remote", 0, 3000))
		s.Classes["public"].Spec.ReturnPath.Vxlan.Port = 4789
		if flannel {
			withTunnel(s, "worker-b", tunnel("flannel.1", vxlan, 4789))
		}
		return s
	}
	refused := Compile(snap(true))
	if c := refused.Classes["public"].Conditions[0]; c.Reason != v1alpha1.ReasonVxlanPortConflict {
		t.Fatalf("with flannel.1: class Ready %s (%s)", c.Reason, c.Message)
	}
	healed := Compile(carry(snap(false), refused, now.Add(time.Minute)))
	if d := cmp.Diff(map[string]outcome{"demo/remote": served(epRemote, "edge-a", "worker-b")}, outcomes(healed, nil)); d != "" {
		t.Errorf("portmaps (-want +got):\n%s", d)
	}
	if c := healed.Classes["public"].Conditions[0]; c.Reason != v1alpha1.ReasonValid {
		t.Errorf("without flannel.1: class Ready %s (%s)", c.Reason, c.Message)
	}
	want := remoteWorkerB()
	want.Links[0].Port = 4789
	if d := cmp.Diff(want, healed.Programs["worker-b"], cmpOpts...); d != "" {
		t.Errorf("program of worker-b (-want +got):\n%s", d)
	}
	if d := cmp.Diff(refused.Classes["public"].Links, healed.Classes["public"].Links); d != "" {
		t.Errorf("the claim moved (-refused +healed):\n%s", d)
	}
}
