package compile

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Row messages of the cases below: what an operator reads, the setting and its change.
const (
	netkitRefusal = `Cilium datapath-mode: "netkit" (cilium-config) puts pods on netkit devices, which always use ` +
		`eBPF host routing: pod replies skip netfilter, so kuport's NAT is never undone; set bpf.datapathMode=veth ` +
		`and bpf.hostLegacyRouting=true (cilium-config datapath-mode: veth, enable-host-legacy-routing: "true") ` +
		`and restart the node's pods`
	hostRoutingWarning = `warning: Cilium is set up for eBPF host routing (kube-proxy-replacement: "true" ` +
		`(cilium-config), BPF or no masquerade, enable-host-legacy-routing not "true"), which sends pod replies past ` +
		`netfilter unless its agent fell back (` + "`cilium status`" + ` on the node shows "Host: Legacy"); set ` +
		`bpf.hostLegacyRouting=true (cilium-config enable-host-legacy-routing: "true")`
)

// cilium is a CNI of Cilium's with these cilium-config keys, on every node.
func cilium(config map[string]string) *CNI { return &CNI{Cilium: &Cilium{Config: config}} }

// calico is a CNI of Calico's of that version with these FelixConfigurations.
func calico(version string, felix map[string]Felix) *CNI {
	return &CNI{Calico: &Calico{Version: version, Felix: felix}}
}

// TestCNIDatapath: where a node's CNI cannot carry kuport's reply path for certain (Cilium's
// netkit devices, by its config or as the agent reports them; its no-conntrack rules; Calico
// eBPF bypassing conntrack before v3.29), the class's row of that node is not ready naming
// the setting and its change, and a mapping whose pod runs there is NodeNotReady with nothing
// built; a mapping whose pod runs elsewhere still serves through it. Where it likely cannot
// (Cilium's eBPF host routing by config, datapath-mode auto, Calico eBPF otherwise), the row
// stays ready and warns, and the mappings serve.
func TestCNIDatapath(t *testing.T) {
	both := func(cni *CNI) *Snapshot {
		s := world(mkPortMap("local", 0, 3000), mkPortMap("remote", 1, 3001))
		s.CNI = cni
		return s
	}
	servedBoth := map[string]outcome{
		"demo/local":  served(epLocal, "edge-a"),
		"demo/remote": served(epRemote, "edge-a", "worker-b"),
	}
	cases := []struct {
		name string
		snap func() *Snapshot
		want map[string]outcome
		// row is edge-a's row of class public.
		row v1alpha1.ClassNodeStatus
		// emptyOn are the nodes whose programs must be empty.
		emptyOn []string
	}{
		{
			name: "no CNI read: nothing said",
			snap: func() *Snapshot { return both(nil) },
			want: servedBoth,
			row:  v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true},
		},
		{
			name: "Cilium with legacy host routing (a default Helm install): nothing said",
			snap: func() *Snapshot {
				return both(cilium(map[string]string{"kube-proxy-replacement": "false", "enable-bpf-masquerade": "false",
					"datapath-mode": "veth"}))
			},
			want: servedBoth,
			row:  v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true},
		},
		{
			name: "Cilium kube-proxy-free with enable-host-legacy-routing true: nothing said",
			snap: func() *Snapshot {
				return both(cilium(map[string]string{"kube-proxy-replacement": "true", "enable-bpf-masquerade": "true",
					"enable-host-legacy-routing": "true"}))
			},
			want: servedBoth,
			row:  v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true},
		},
		{
			name: "Cilium datapath-mode netkit refuses the pods on every node of Cilium's",
			snap: func() *Snapshot { return both(cilium(map[string]string{"datapath-mode": "netkit"})) },
			want: map[string]outcome{
				"demo/local":  unprogrammed(v1alpha1.ReasonNodeNotReady, epLocal).msg("node edge-a: " + netkitRefusal),
				"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote).msg("node worker-b: " + netkitRefusal),
			},
			row:     v1alpha1.ClassNodeStatus{Name: "edge-a", Message: netkitRefusal},
			emptyOn: []string{"edge-a", "worker-b"},
		},
		{
			name: "a CiliumNodeConfig picking worker-b by label refuses its pods only",
			snap: func() *Snapshot {
				s := both(cilium(map[string]string{"datapath-mode": "veth"}))
				s.CNI.Cilium.NodeConfigs = []CiliumNodeConfig{
					{Name: "b-netkit", Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"cni": "netkit"}},
						Defaults: map[string]string{"datapath-mode": "netkit"}},
					// No selector picks no node (as Cilium reads it).
					{Name: "a-none", Defaults: map[string]string{"datapath-mode": "netkit"}},
				}
				s.Nodes["worker-b"].Labels = map[string]string{"cni": "netkit"}
				return s
			},
			want: map[string]outcome{
				"demo/local": served(epLocal, "edge-a"),
				"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote).msg("node worker-b: " +
					strings.Replace(netkitRefusal, "(cilium-config)", "(CiliumNodeConfig b-netkit)", 1)),
			},
			row:     v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true},
			emptyOn: []string{"worker-b"},
		},
		{
			name: "a later CiliumNodeConfig overrides an earlier one and cilium-config",
			snap: func() *Snapshot {
				s := both(cilium(map[string]string{"datapath-mode": "netkit"}))
				s.CNI.Cilium.NodeConfigs = []CiliumNodeConfig{
					{Name: "z-veth", Selector: &metav1.LabelSelector{}, Defaults: map[string]string{"datapath-mode": "veth"}},
					{Name: "a-netkit", Selector: &metav1.LabelSelector{}, Defaults: map[string]string{"datapath-mode": "netkit"}},
				}
				return s
			},
			want: servedBoth,
			row:  v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true},
		},
		{
			name: "a node without a CiliumNode is no node of Cilium's",
			snap: func() *Snapshot {
				s := both(cilium(map[string]string{"datapath-mode": "netkit"}))
				s.CNI.Cilium.Nodes = map[string]bool{"worker-b": true}
				return s
			},
			want: map[string]outcome{
				"demo/local":  served(epLocal, "edge-a"),
				"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote).msg("node worker-b: " + netkitRefusal),
			},
			row: v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true},
		},
		{
			name: "netkit devices the agent reports on a node of Cilium's refuse its pods",
			snap: func() *Snapshot {
				s := both(cilium(map[string]string{}))
				withTunnel(s, "edge-a", &kuportv1.Interface{Name: "lxc1234", Netkit: true},
					&kuportv1.Interface{Name: "lxc5678", Netkit: true}, &kuportv1.Interface{Name: "lxc9abc", Netkit: true},
					&kuportv1.Interface{Name: "lxcdef0", Netkit: true})
				return s
			},
			want: map[string]outcome{
				"demo/local": unprogrammed(v1alpha1.ReasonNodeNotReady, epLocal).msg("node edge-a: Cilium runs pods on " +
					"netkit devices here (lxc1234, lxc5678, lxc9abc, 1 more), which always use eBPF host routing: pod " +
					"replies skip netfilter, so kuport's NAT is never undone; set bpf.datapathMode=veth and " +
					`bpf.hostLegacyRouting=true (cilium-config datapath-mode: veth, enable-host-legacy-routing: "true") ` +
					"and restart the node's pods"),
				"demo/remote": served(epRemote, "edge-a", "worker-b"),
			},
			row: v1alpha1.ClassNodeStatus{Name: "edge-a"},
		},
		{
			name: "netkit devices without Cilium say nothing: with no program attached they forward to the host",
			snap: func() *Snapshot {
				s := both(nil)
				withTunnel(s, "edge-a", &kuportv1.Interface{Name: "nk0", Netkit: true})
				return s
			},
			want: servedBoth,
			row:  v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true},
		},
		{
			name: "Cilium's no-conntrack rules refuse",
			snap: func() *Snapshot {
				return both(cilium(map[string]string{"install-no-conntrack-iptables-rules": "true"}))
			},
			want: map[string]outcome{
				"demo/local":  unprogrammed(v1alpha1.ReasonNodeNotReady, epLocal),
				"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote),
			},
			row: v1alpha1.ClassNodeStatus{Name: "edge-a", Message: `Cilium install-no-conntrack-iptables-rules: "true" ` +
				`(cilium-config) keeps pod traffic out of conntrack, so kuport's NAT is never undone on replies; set ` +
				`installNoConntrackIptablesRules=false (cilium-config install-no-conntrack-iptables-rules: "false")`},
			emptyOn: []string{"edge-a", "worker-b"},
		},
		{
			name: "Cilium set up for eBPF host routing warns and serves: its agent may have fallen back",
			snap: func() *Snapshot {
				return both(cilium(map[string]string{"kube-proxy-replacement": "true", "enable-bpf-masquerade": "true"}))
			},
			want: servedBoth,
			row:  v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true, Message: hostRoutingWarning},
		},
		{
			name: "Cilium kube-proxy-free masquerading with iptables runs legacy routing: nothing said",
			snap: func() *Snapshot {
				return both(cilium(map[string]string{"kube-proxy-replacement": "true", "enable-bpf-masquerade": "false"}))
			},
			want: servedBoth,
			row:  v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true},
		},
		{
			name: "Cilium datapath-mode auto warns",
			snap: func() *Snapshot { return both(cilium(map[string]string{"datapath-mode": "auto"})) },
			want: servedBoth,
			row: v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true, Message: `warning: Cilium datapath-mode: "auto" ` +
				`(cilium-config) picks netkit devices on kernels 6.7 and later, which always use eBPF host routing and ` +
				`skip netfilter; set bpf.datapathMode=veth (cilium-config datapath-mode: veth)`},
		},
		{
			name: "Calico eBPF before v3.29 with the default conntrack bypass refuses",
			snap: func() *Snapshot {
				return both(calico("v3.28.2", map[string]Felix{"default": {BPFEnabled: ptr.To(true)}}))
			},
			want: map[string]outcome{
				"demo/local":  unprogrammed(v1alpha1.ReasonNodeNotReady, epLocal),
				"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote),
			},
			row: v1alpha1.ClassNodeStatus{Name: "edge-a", Message: "Calico v3.28.2 eBPF (FelixConfiguration default " +
				"bpfEnabled: true) with bpfHostConntrackBypass unset (true before v3.30) sends workload replies past " +
				"the host's conntrack, so kuport's NAT is never undone; set bpfHostConntrackBypass: false in " +
				"FelixConfiguration default (or upgrade Calico to v3.29 or later)"},
			emptyOn: []string{"edge-a", "worker-b"},
		},
		{
			name: "Calico eBPF on one node by its node.<name> FelixConfiguration refuses that node's pods only",
			snap: func() *Snapshot {
				return both(calico("v3.27.0", map[string]Felix{
					"default":         {BPFEnabled: ptr.To(false)},
					"node.worker-b":   {BPFEnabled: ptr.To(true), BPFHostConntrackBypass: ptr.To(true)},
					"node.not-a-node": {BPFEnabled: ptr.To(true)},
				}))
			},
			want: map[string]outcome{
				"demo/local": served(epLocal, "edge-a"),
				"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote).msg("node worker-b: Calico v3.27.0 eBPF " +
					"(FelixConfiguration node.worker-b bpfEnabled: true) with FelixConfiguration node.worker-b " +
					"bpfHostConntrackBypass: true sends workload replies past the host's conntrack, so kuport's NAT is " +
					"never undone; set bpfHostConntrackBypass: false in FelixConfiguration default (or upgrade Calico to " +
					"v3.29 or later)"),
			},
			row:     v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true},
			emptyOn: []string{"worker-b"},
		},
		{
			name: "Calico eBPF of an unknown version warns",
			snap: func() *Snapshot {
				return both(calico("", map[string]Felix{"default": {BPFEnabled: ptr.To(true)}}))
			},
			want: servedBoth,
			row: v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true, Message: "warning: Calico eBPF (FelixConfiguration " +
				"default bpfEnabled: true) of an unknown version: before v3.29, bpfHostConntrackBypass (true unless set " +
				"to false) sends workload replies past the host's conntrack; set bpfHostConntrackBypass: false in " +
				"FelixConfiguration default"},
		},
		{
			name: "Calico eBPF from v3.29 warns it is untested, bypass or not",
			snap: func() *Snapshot {
				return both(calico("v3.31.1", map[string]Felix{"default": {BPFEnabled: ptr.To(true), BPFHostConntrackBypass: ptr.To(true)}}))
			},
			want: servedBoth,
			row: v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true, Message: "warning: Calico v3.31.1 eBPF " +
				"(FelixConfiguration default bpfEnabled: true) is untested with kuport: its workload replies to flows " +
				"from the host are meant to return through the host's conntrack"},
		},
		{
			name: "Calico eBPF before v3.29 without the bypass warns",
			snap: func() *Snapshot {
				return both(calico("v3.28.0", map[string]Felix{"default": {BPFEnabled: ptr.To(true), BPFHostConntrackBypass: ptr.To(false)}}))
			},
			want: servedBoth,
			row: v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true, Message: "warning: Calico v3.28.0 eBPF " +
				"(FelixConfiguration default bpfEnabled: true) is untested with kuport: before v3.29 its workload " +
				"replies may be routed in eBPF past the host's conntrack (calico PR #9192 changed that)"},
		},
		{
			name: "Calico with iptables or nftables: nothing said",
			snap: func() *Snapshot {
				return both(calico("v3.28.0", map[string]Felix{"default": {BPFHostConntrackBypass: ptr.To(true)}}))
			},
			want: servedBoth,
			row:  v1alpha1.ClassNodeStatus{Name: "edge-a", Ready: true},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Compile(tc.snap())
			if d := cmp.Diff(tc.want, outcomes(r, tc.want), cmpopts.EquateEmpty()); d != "" {
				t.Errorf("portmaps (-want +got):\n%s", d)
			}
			rows := r.Classes["public"].Nodes
			if len(rows) != 1 {
				t.Fatalf("rows of class public: %+v", rows)
			}
			got := v1alpha1.ClassNodeStatus{Name: rows[0].Name, Ready: rows[0].Ready, Message: rows[0].Message}
			if tc.row.Message == "" && !tc.row.Ready {
				got.Message = ""
			}
			if d := cmp.Diff(tc.row, got); d != "" {
				t.Errorf("edge-a's row (-want +got):\n%s", d)
			}
			if c := r.Classes["public"].Conditions[0]; c.Reason != v1alpha1.ReasonValid {
				t.Errorf("class Ready %s (%s): a CNI refuses nodes, not the class", c.Reason, c.Message)
			}
			for _, n := range tc.emptyOn {
				if d := cmp.Diff(empty(n), r.Programs[n], cmpOpts...); d != "" {
					t.Errorf("program of %s (-want +got):\n%s", n, d)
				}
			}
		})
	}
}
