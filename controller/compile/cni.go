package compile

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// CNI is what the controller read of the CNI's own settings (controller/cni.go): only what
// decides whether a node's CNI carries kuport's reply path through netfilter. kuport's replies
// need the host's conntrack (to undo the DNAT and the identity SNAT) and the mark-based ip
// rules on the pod's node; a datapath that redirects a pod's packets in eBPF straight to the
// egress device skips both (docs/install.md, the CNI support matrix).
type CNI struct {
	// Cilium is nil when kube-system/cilium-config is absent.
	Cilium *Cilium
	// Calico is nil when no FelixConfiguration was read.
	Calico *Calico
}

// Cilium is Cilium's configuration.
type Cilium struct {
	// Config is the data of kube-system/cilium-config.
	Config map[string]string
	// NodeConfigs are the CiliumNodeConfig objects of kube-system, in any order: per-node
	// overrides of Config, applied in name order (a later name wins a key), each to the
	// nodes its selector picks.
	NodeConfigs []CiliumNodeConfig
	// Nodes are the nodes with a CiliumNode object, the nodes Cilium's agent runs on; nil when
	// unknown (CiliumNodes are not served or not yet read), then every node counts.
	Nodes map[string]bool
}

// CiliumNodeConfig is a CiliumNodeConfig's spec.
type CiliumNodeConfig struct {
	Name string
	// Selector picks the nodes; nil picks none, an empty one every node (as Cilium reads it).
	Selector *metav1.LabelSelector
	// Defaults are the keys it sets, as cilium-config's.
	Defaults map[string]string
}

// Calico is Calico's configuration.
type Calico struct {
	// Version is ClusterInformation default's spec.calicoVersion ("v3.28.1"), "" when unknown.
	Version string
	// Felix are the FelixConfigurations by name: "default" for the cluster, "node.<node>"
	// overriding it field by field on one node.
	Felix map[string]Felix
}

// Felix is the part of a FelixConfiguration's spec kuport reads; nil fields are unset.
type Felix struct {
	BPFEnabled             *bool
	BPFHostConntrackBypass *bool
}

// cniView is a snapshot's CNI settings made ready to read per node, once per compile.
type cniView struct {
	cni *CNI
	// cncs are Cilium's node configs in name order, each with its selector parsed (nil: none
	// picked, as an invalid one).
	cncs []parsedCNC
}

type parsedCNC struct {
	name     string
	selector labels.Selector
	defaults map[string]string
}

func newCNIView(cni *CNI) *cniView {
	v := &cniView{cni: cni}
	if cni == nil || cni.Cilium == nil {
		return v
	}
	for _, cnc := range cni.Cilium.NodeConfigs {
		p := parsedCNC{name: cnc.Name, defaults: cnc.Defaults}
		if cnc.Selector != nil {
			if sel, err := metav1.LabelSelectorAsSelector(cnc.Selector); err == nil {
				p.selector = sel
			}
		}
		v.cncs = append(v.cncs, p)
	}
	slices.SortFunc(v.cncs, func(a, b parsedCNC) int { return strings.Compare(a.name, b.name) })
	return v
}

// verdict says, for a node, whether its CNI cannot carry kuport's reply path (refusal: the
// node's rows are not ready and a mapping whose pod runs there is not built) or likely cannot
// (warning: said on the node's rows, the node serves). A setting is a refusal only where it
// holds whatever the CNI's agent decides at runtime; where the CNI may fall back (a kernel too
// old, another feature in the way), the setting shows intent only and is a warning, and the
// unanswered judge (controller/status) names the cause once requests go unanswered.
func (v *cniView) verdict(node *corev1.Node, st *nodeView) (refusal, warning []string) {
	if v.cni == nil || node == nil {
		return nil, nil
	}
	if c := v.cni.Cilium; c != nil && (c.Nodes == nil || c.Nodes[node.Name]) {
		r, w := v.ciliumVerdict(node, st)
		refusal, warning = append(refusal, r...), append(warning, w...)
	}
	if c := v.cni.Calico; c != nil {
		r, w := calicoVerdict(c, node.Name)
		refusal, warning = append(refusal, r...), append(warning, w...)
	}
	return refusal, warning
}

// ciliumSetting returns the value of a cilium-config key on a node, the CiliumNodeConfigs
// that pick it overriding in name order, and where it came from.
func (v *cniView) ciliumSetting(node *corev1.Node, key string) (value, source string) {
	value, ok := v.cni.Cilium.Config[key]
	if ok {
		source = "cilium-config"
	}
	for _, cnc := range v.cncs {
		if val, ok := cnc.defaults[key]; ok && cnc.selector != nil && cnc.selector.Matches(labels.Set(node.Labels)) {
			value, source = val, "CiliumNodeConfig "+cnc.name
		}
	}
	return value, source
}

// ciliumVerdict reads Cilium's settings on a node (the keys and fallbacks of cilium's
// pkg/option/config.go and daemon/cmd/kube_proxy_replacement.go).
func (v *cniView) ciliumVerdict(node *corev1.Node, st *nodeView) (refusal, warning []string) {
	get := func(key string) (string, string) { return v.ciliumSetting(node, key) }
	quote := func(key, value, source string) string {
		return fmt.Sprintf("%s: %q (%s)", key, value, source)
	}
	// netkit devices run eBPF host routing always: Cilium's agent refuses to start with them
	// and enable-host-legacy-routing (cilium's connector config, canUseNetkit). So does a
	// netkit device the agent reports on a node of Cilium's.
	mode, modeSrc := get("datapath-mode")
	netkit := st.netkitDevices()
	switch {
	case mode == "netkit" || mode == "netkit-l2":
		refusal = append(refusal, fmt.Sprintf("Cilium %s puts pods on netkit devices, which always use eBPF host "+
			"routing: pod replies skip netfilter, so kuport's NAT is never undone; set bpf.datapathMode=veth and "+
			"bpf.hostLegacyRouting=true (cilium-config datapath-mode: veth, enable-host-legacy-routing: \"true\") "+
			"and restart the node's pods", quote("datapath-mode", mode, modeSrc)))
	case netkit != "":
		refusal = append(refusal, fmt.Sprintf("Cilium runs pods on netkit devices here (%s), which always use eBPF "+
			"host routing: pod replies skip netfilter, so kuport's NAT is never undone; set bpf.datapathMode=veth "+
			"and bpf.hostLegacyRouting=true (cilium-config datapath-mode: veth, enable-host-legacy-routing: \"true\") "+
			"and restart the node's pods", netkit))
	case mode == "auto":
		// auto takes netkit where the kernel has it (6.7+) and falls back to veth otherwise.
		warning = append(warning, fmt.Sprintf("Cilium %s picks netkit devices on kernels 6.7 and later, which "+
			"always use eBPF host routing and skip netfilter; set bpf.datapathMode=veth (cilium-config "+
			"datapath-mode: veth)", quote("datapath-mode", mode, modeSrc)))
	}
	// The NOTRACK rules keep pod traffic out of conntrack whatever the host routing.
	if v, src := get("install-no-conntrack-iptables-rules"); v == "true" {
		refusal = append(refusal, fmt.Sprintf("Cilium %s keeps pod traffic out of conntrack, so kuport's NAT "+
			"is never undone on replies; set installNoConntrackIptablesRules=false "+
			"(cilium-config install-no-conntrack-iptables-rules: \"false\")",
			quote("install-no-conntrack-iptables-rules", v, src)))
	}
	// eBPF host routing is the default where kube-proxy replacement is on and netfilter does
	// not masquerade, but the agent falls back to legacy routing when the kernel lacks the
	// helpers (before 5.10) or another feature needs the upper stack, and leaves its
	// ConfigMap as it was: only the agent's status ("Host: BPF" or "Host: Legacy" in
	// `cilium status`) knows, so this is a warning.
	legacy, _ := get("enable-host-legacy-routing")
	kpr, kprSrc := get("kube-proxy-replacement")
	bpfMasq, _ := get("enable-bpf-masquerade")
	masq, _ := get("enable-ipv4-masquerade")
	if legacy != "true" && (kpr == "true" || kpr == "strict") && (bpfMasq == "true" || masq == "false") && mode != "netkit" && mode != "netkit-l2" && netkit == "" {
		warning = append(warning, fmt.Sprintf("Cilium is set up for eBPF host routing (%s, BPF or no masquerade, "+
			"enable-host-legacy-routing not \"true\"), which sends pod replies past netfilter unless its agent fell "+
			"back (`cilium status` on the node shows \"Host: Legacy\"); set bpf.hostLegacyRouting=true "+
			"(cilium-config enable-host-legacy-routing: \"true\")", quote("kube-proxy-replacement", kpr, kprSrc)))
	}
	return refusal, warning
}

// calicoReturnsHostFlows is the first Calico release whose eBPF data plane sends the reply
// of a flow that reached a workload from the host back through the host, conntrack included
// (calico PR #9192, in v3.29.0); before it, bpfHostConntrackBypass (default true until
// v3.30.0) sent the reply past conntrack.
var calicoReturnsHostFlows = [2]int{3, 29}

// calicoVerdict reads Felix's settings on a node: its node.<name> FelixConfiguration over
// the default one, field by field (Felix's own precedence; environment variables on
// calico-node override both and are not read).
func calicoVerdict(c *Calico, node string) (refusal, warning []string) {
	eff, src := c.Felix["default"], map[string]string{}
	if eff.BPFEnabled != nil {
		src["bpfEnabled"] = "default"
	}
	if eff.BPFHostConntrackBypass != nil {
		src["bpfHostConntrackBypass"] = "default"
	}
	if n, ok := c.Felix["node."+node]; ok {
		if n.BPFEnabled != nil {
			eff.BPFEnabled, src["bpfEnabled"] = n.BPFEnabled, "node."+node
		}
		if n.BPFHostConntrackBypass != nil {
			eff.BPFHostConntrackBypass, src["bpfHostConntrackBypass"] = n.BPFHostConntrackBypass, "node."+node
		}
	}
	if eff.BPFEnabled == nil || !*eff.BPFEnabled {
		return nil, nil
	}
	where := fmt.Sprintf("FelixConfiguration %s bpfEnabled: true", src["bpfEnabled"])
	old, known := calicoBefore(c.Version, calicoReturnsHostFlows)
	bypass := eff.BPFHostConntrackBypass
	switch {
	case known && old && (bypass == nil || *bypass):
		// Before v3.29 an unset bypass is the default, true.
		setting := "bpfHostConntrackBypass unset (true before v3.30)"
		if bypass != nil {
			setting = fmt.Sprintf("FelixConfiguration %s bpfHostConntrackBypass: true", src["bpfHostConntrackBypass"])
		}
		refusal = append(refusal, fmt.Sprintf("Calico %s eBPF (%s) with %s sends workload replies past the "+
			"host's conntrack, so kuport's NAT is never undone; set bpfHostConntrackBypass: false in "+
			"FelixConfiguration default (or upgrade Calico to v3.29 or later)", c.Version, where, setting))
	case known && old:
		// Without the bypass, conntrack sees the flow, but the eBPF program on the workload's
		// device still routed its replies past the host before v3.29 (calico PR #9192).
		warning = append(warning, fmt.Sprintf("Calico %s eBPF (%s) is untested with kuport: before v3.29 its "+
			"workload replies may be routed in eBPF past the host's conntrack (calico PR #9192 changed that)",
			c.Version, where))
	case !known:
		warning = append(warning, fmt.Sprintf("Calico eBPF (%s) of an unknown version: before v3.29, "+
			"bpfHostConntrackBypass (true unless set to false) sends workload replies past the host's conntrack; "+
			"set bpfHostConntrackBypass: false in FelixConfiguration default", where))
	default:
		// v3.29 and later return such flows through the host (calico PR #9192): meant to
		// work, not yet proven with kuport.
		warning = append(warning, fmt.Sprintf("Calico %s eBPF (%s) is untested with kuport: its workload "+
			"replies to flows from the host are meant to return through the host's conntrack", c.Version, where))
	}
	return refusal, warning
}

// calicoBefore reports whether a Calico version ("v3.28.1") is older than release major.minor,
// and whether it could be read at all.
func calicoBefore(version string, release [2]int) (before, known bool) {
	parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3)
	if len(parts) < 2 {
		return false, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false, false
	}
	return major < release[0] || major == release[0] && minor < release[1], true
}
