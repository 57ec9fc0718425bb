package compile

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// outcome is what a case checks of one PortMap. Message is compared only when the case sets
// it: the Programmed message, or the Accepted message while not accepted.
type outcome struct {
	Accepted, Programmed string
	Message              string
	Endpoint             string // "<node> <address>"
	Nodes                []string
}

// classOutcome is what a case checks of one class.
type classOutcome struct {
	Ready   string
	Message string // compared only when set
	Links   []v1alpha1.LinkStatus
}

func served(ep string, nodes ...string) outcome {
	return outcome{Accepted: v1alpha1.ReasonValid, Programmed: v1alpha1.ReasonAllNodesReady, Endpoint: ep, Nodes: nodes}
}

func refused(reason string) outcome {
	return outcome{Accepted: reason, Programmed: v1alpha1.ReasonNotAccepted}
}

func unprogrammed(reason, ep string, nodes ...string) outcome {
	return outcome{Accepted: v1alpha1.ReasonValid, Programmed: reason, Endpoint: ep, Nodes: nodes}
}

func (o outcome) msg(m string) outcome { o.Message = m; return o }

const (
	epLocal  = "edge-a 10.244.17.7"
	epRemote = "worker-b 10.244.18.107"
)

var cmpOpts = []cmp.Option{protocmp.Transform(), cmpopts.EquateEmpty()}

func intranet(age int, nodes map[string][]string) *v1alpha1.PortMapClass {
	cl := mkClass("intranet", age, nodes)
	cl.Spec.ReturnPath.Vxlan = v1alpha1.VxlanConfig{VNI: 4300, Port: 4790, Subnet: "169.254.79.0/24",
		Subnet6: "fd64:f5ac:e962::/112"}
	return cl
}

func TestCompile(t *testing.T) {
	cases := []struct {
		name     string
		snap     func() *Snapshot
		want     map[string]outcome
		programs map[string]*kuportv1.NodeProgram
		classes  map[string]classOutcome
		check    func(t *testing.T, r *Result)
	}{
		{
			name:     "local pod: DNAT per interface and identity SNAT to cilium_host on edge-a only",
			snap:     func() *Snapshot { return world(mkPortMap("local", 0, 3000)) },
			want:     map[string]outcome{"demo/local": served(epLocal, "edge-a")},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": localEdgeA(), "worker-b": empty("worker-b")},
			classes:  map[string]classOutcome{"public": {Ready: v1alpha1.ReasonValid}},
		},
		{
			name: "remote pod: a link, DNAT to the far /31 on edge-a, DNAT, SNATs, ct-mark save and restore and return path on worker-b",
			snap: func() *Snapshot { return world(mkPortMap("remote", 0, 3000)) },
			want: map[string]outcome{"demo/remote": served(epRemote, "edge-a", "worker-b")},
			programs: map[string]*kuportv1.NodeProgram{
				"edge-a": remoteEdgeA(), "worker-b": remoteWorkerB(),
			},
			classes: map[string]classOutcome{"public": {Ready: v1alpha1.ReasonValid, Links: []v1alpha1.LinkStatus{
				claimOf("edge-a", "worker-b", 0, "169.254.77.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
			}}},
		},
		{
			name: "returnPath None refuses a pod on another node and programs nothing anywhere",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000))
				s.Classes["public"].Spec.ReturnPath.Mode = v1alpha1.ReturnPathNone
				return s
			},
			want: map[string]outcome{"demo/remote": unprogrammed(v1alpha1.ReasonReturnPathUnavailable, epRemote).msg(
				`the pod is on worker-b, not on edge-a which holds the mapping, and class "public" has returnPath None`)},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": empty("edge-a"), "worker-b": empty("worker-b")},
			classes:  map[string]classOutcome{"public": {Ready: v1alpha1.ReasonValid}},
		},
		{
			name: "returnPath None serves a pod on the serving node",
			snap: func() *Snapshot {
				s := world(mkPortMap("local", 0, 3000))
				s.Classes["public"].Spec.ReturnPath.Mode = v1alpha1.ReturnPathNone
				return s
			},
			want:     map[string]outcome{"demo/local": served(epLocal, "edge-a")},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": localEdgeA()},
		},

		// Accepted, in the order of docs/design/api.md#status-and-conditions.
		{
			name: "ClassNotFound",
			snap: func() *Snapshot { return world(mkPortMap("local", 0, 3000, className("nope"))) },
			want: map[string]outcome{"demo/local": refused(v1alpha1.ReasonClassNotFound).msg(`PortMapClass "nope" not found`)},
		},
		{
			name: "NamespaceNotSelected: the namespace lacks the selector's label",
			snap: func() *Snapshot {
				s := world(mkPortMap("local", 0, 3000))
				s.Classes["public"].Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"kuport.wlz.li/public": "allowed"}}
				return s
			},
			want: map[string]outcome{"demo/local": refused(v1alpha1.ReasonNamespaceNotSelected)},
		},
		{
			name: "a namespace carrying the selector's label is accepted",
			snap: func() *Snapshot {
				s := world(mkPortMap("local", 0, 3000))
				s.Classes["public"].Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"kuport.wlz.li/public": "allowed"}}
				s.Namespaces["demo"].Labels = map[string]string{"kuport.wlz.li/public": "allowed"}
				return s
			},
			want: map[string]outcome{"demo/local": served(epLocal, "edge-a")},
		},
		{
			name: "InvalidPortRange: endPort below port",
			snap: func() *Snapshot { return world(mkPortMap("local", 0, 3000, endPort(2999))) },
			want: map[string]outcome{"demo/local": refused(v1alpha1.ReasonInvalidPortRange).msg("endPort 2999 is below port 3000")},
		},
		{
			name: "PortOutOfRange: below the class minimum, and a range past the maximum",
			snap: func() *Snapshot {
				s := world(mkPortMap("local", 0, 80), mkPortMap("remote", 1, 3000, endPort(3006)))
				s.Classes["public"].Spec.Ports.Max = 3005
				return s
			},
			want: map[string]outcome{
				"demo/local":  refused(v1alpha1.ReasonPortOutOfRange).msg(`ports 80 are outside class "public"'s range 1024-3005`),
				"demo/remote": refused(v1alpha1.ReasonPortOutOfRange),
			},
		},
		{
			name: "PortOutOfRange applies the defaults 1-65535 when the class leaves them zero",
			snap: func() *Snapshot {
				s := world(mkPortMap("local", 0, 80))
				s.Classes["public"].Spec.Ports = v1alpha1.PortPolicy{}
				return s
			},
			want: map[string]outcome{"demo/local": served(epLocal, "edge-a")},
		},
		{
			name: "PortReserved: a reserved port inside the range",
			snap: func() *Snapshot { return world(mkPortMap("local", 0, 8000, endPort(8100))) },
			want: map[string]outcome{"demo/local": refused(v1alpha1.ReasonPortReserved).msg(`port 8080 is reserved by class "public"`)},
		},
		{
			name: "PortConflict: the older mapping holds an overlapping range, whatever the names",
			snap: func() *Snapshot {
				return world(
					mkPortMap("z-older", 0, 3000, endPort(3010), service("local")),
					mkPortMap("a-newer", 1, 3010, service("remote")))
			},
			want: map[string]outcome{
				"demo/z-older": served(epLocal, "edge-a"),
				"demo/a-newer": refused(v1alpha1.ReasonPortConflict).msg("TCP ports 3000-3010 on edge-a interface enp1s0 are held by demo/z-older"),
			},
		},
		{
			name: "PortConflict across classes sharing node, interface and protocol",
			snap: func() *Snapshot {
				s := world(
					mkPortMap("older", 0, 3000, service("local")),
					mkPortMap("newer", 1, 3000, service("remote"), className("intranet")))
				s.Classes["intranet"] = intranet(1, map[string][]string{"edge-a": {"wt0"}})
				return s
			},
			want: map[string]outcome{
				"demo/older": served(epLocal, "edge-a"),
				"demo/newer": refused(v1alpha1.ReasonPortConflict).msg("TCP ports 3000 on edge-a interface wt0 are held by demo/older"),
			},
		},
		{
			name: "no conflict on another protocol",
			snap: func() *Snapshot {
				s := world(
					mkPortMap("older", 0, 3000, service("local")),
					mkPortMap("newer", 1, 3000, service("local"), className("intranet"), proto(v1alpha1.ProtocolUDP)))
				s.Classes["intranet"] = intranet(1, map[string][]string{"edge-a": {"wt0"}})
				return s
			},
			want: map[string]outcome{
				"demo/older": served(epLocal, "edge-a"),
				"demo/newer": served(epLocal, "edge-a"),
			},
		},
		{
			name: "no conflict on another interface of the same node",
			snap: func() *Snapshot {
				s := world(
					mkPortMap("older", 0, 3000, service("local"), interfaces("enp1s0")),
					mkPortMap("newer", 1, 3000, service("local"), className("intranet")))
				s.Classes["intranet"] = intranet(1, map[string][]string{"edge-a": {"wt0"}})
				return s
			},
			want: map[string]outcome{
				"demo/older": served(epLocal, "edge-a"),
				"demo/newer": served(epLocal, "edge-a"),
			},
		},
		{
			name: "a mapping that is not accepted holds no port",
			snap: func() *Snapshot {
				return world(
					mkPortMap("older", 0, 3000, service("local"), interfaces("eth9")),
					mkPortMap("newer", 1, 3000, service("local")))
			},
			want: map[string]outcome{
				"demo/older": refused(v1alpha1.ReasonInterfaceNotInClass).msg(
					`interface eth9 is not an interface of any accepting node of class "public"`),
				"demo/newer": served(epLocal, "edge-a"),
			},
		},
		{
			name: "two failures at once report the first in API order",
			snap: func() *Snapshot {
				s := world(
					mkPortMap("ns-and-range", 0, 3000, endPort(2000)),
					mkPortMap("range-and-reserved", 1, 80, endPort(8080)),
					mkPortMap("holder", 2, 9000, service("local")),
					mkPortMap("reserved-and-conflict", 3, 8080, endPort(9000)),
					mkPortMap("conflict-and-iface", 4, 9000, interfaces("wt0", "eth9")))
				s.Classes["public"].Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
				s.Namespaces["demo"].Labels = map[string]string{"team": "a"}
				s.PortMaps[0].Namespace = "other"
				return s
			},
			want: map[string]outcome{
				"other/ns-and-range":         refused(v1alpha1.ReasonNamespaceNotSelected),
				"demo/range-and-reserved":    refused(v1alpha1.ReasonPortOutOfRange),
				"demo/holder":                served(epLocal, "edge-a"),
				"demo/reserved-and-conflict": refused(v1alpha1.ReasonPortReserved),
				"demo/conflict-and-iface":    refused(v1alpha1.ReasonPortConflict),
			},
		},
		{
			name: "InterfaceNotInClass and an interface some accepting node has",
			snap: func() *Snapshot {
				return world(mkPortMap("local", 0, 3000, interfaces("eth9")), mkPortMap("remote", 1, 3000, interfaces("wt0")))
			},
			want: map[string]outcome{
				"demo/local":  refused(v1alpha1.ReasonInterfaceNotInClass),
				"demo/remote": served(epRemote, "edge-a", "worker-b"),
			},
			check: func(t *testing.T, r *Result) {
				got := r.PortMaps[types.NamespacedName{Namespace: "demo", Name: "remote"}].Status.Published
				want := []v1alpha1.PublishedAddress{{Node: "edge-a", Interface: "wt0", Address: "100.64.93.143"}}
				if d := cmp.Diff(want, got); d != "" {
					t.Errorf("published (-want +got):\n%s", d)
				}
				if n := len(r.Programs["edge-a"].DnatRules); n != 1 {
					t.Errorf("edge-a has %d DNAT rules, want 1 (wt0 only)", n)
				}
			},
		},

		// Endpoints.
		{
			name: "NoReadyEndpoint: not ready, terminating, without a node, another port name",
			snap: func() *Snapshot {
				s := world(mkPortMap("web", 0, 3000))
				notReady := mkEndpoint("a", "10.244.18.1", "worker-b")
				notReady.Conditions.Ready = ptr.To(false)
				terminating := mkEndpoint("b", "10.244.18.2", "worker-b")
				terminating.Conditions.Terminating = ptr.To(true)
				noNode := mkEndpoint("c", "10.244.18.3", "")
				noNode.NodeName = nil
				addService(s, "web", 3000, notReady, terminating, noNode)
				k := types.NamespacedName{Namespace: "demo", Name: "web"}
				s.EndpointSlices[k] = append(s.EndpointSlices[k],
					mkSlice(discoveryv1.AddressTypeFQDN, 3000, mkEndpoint("d", "web.example", "worker-b")),
					&discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
						Ports:     []discoveryv1.EndpointPort{{Name: ptr.To("other"), Port: ptr.To[int32](3000)}},
						Endpoints: []discoveryv1.Endpoint{mkEndpoint("e", "10.244.18.5", "worker-b")}})
				return s
			},
			want: map[string]outcome{"demo/web": unprogrammed(v1alpha1.ReasonNoReadyEndpoint, "").msg(
				`service demo/web has no ready, non-terminating IPv4 or IPv6 endpoint with a node for TCP port "http"`)},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": empty("edge-a"), "worker-b": empty("worker-b")},
		},
		{
			name: "NoReadyEndpoint: the Service does not exist",
			snap: func() *Snapshot { return world(mkPortMap("gone", 0, 3000)) },
			want: map[string]outcome{"demo/gone": unprogrammed(v1alpha1.ReasonNoReadyEndpoint, "").msg("service demo/gone not found")},
		},
		{
			name: "an endpoint whose ready condition is unset counts as ready",
			snap: func() *Snapshot {
				s := world(mkPortMap("web", 0, 3000))
				e := mkEndpoint("a", "10.244.17.9", "edge-a")
				e.Conditions.Ready = nil
				addService(s, "web", 3000, e)
				return s
			},
			want: map[string]outcome{"demo/web": served("edge-a 10.244.17.9", "edge-a")},
		},
		{
			name: "a pod on an accepting node ranks before a smaller pod name elsewhere",
			snap: func() *Snapshot {
				s := world(mkPortMap("web", 0, 3000))
				addService(s, "web", 3000, mkEndpoint("a-pod", "10.244.18.1", "worker-b"), mkEndpoint("z-pod", "10.244.17.1", "edge-a"))
				return s
			},
			want: map[string]outcome{"demo/web": served("edge-a 10.244.17.1", "edge-a")},
		},
		{
			name: "accepting candidates order by node name, then pod name",
			snap: func() *Snapshot {
				s := world(mkPortMap("web", 0, 3000))
				s.Classes["public"].Spec.Nodes["edge-b"] = v1alpha1.ClassNode{Interfaces: []string{"wt0"}}
				addNodes(s, "edge-b")
				s.Agents["edge-b"] = mkAgent(iface("wt0", "100.64.93.144", 1420))
				addService(s, "web", 3000, mkEndpoint("a", "10.244.19.1", "edge-b"),
					mkEndpoint("c", "10.244.17.3", "edge-a"), mkEndpoint("b", "10.244.17.2", "edge-a"))
				return s
			},
			want: map[string]outcome{"demo/web": served("edge-a 10.244.17.2", "edge-a")},
		},
		{
			name: "with no pod on an accepting node the smallest pod name wins",
			snap: func() *Snapshot {
				s := world(mkPortMap("web", 0, 3000))
				addService(s, "web", 3000, mkEndpoint("pod-2", "10.244.18.2", "worker-b"), mkEndpoint("pod-1", "10.244.19.1", "worker-c"))
				return s
			},
			want: map[string]outcome{"demo/web": served("worker-c 10.244.19.1", "edge-a", "worker-c")},
		},
		{
			name: "the current endpoint is kept while it stays a candidate",
			snap: func() *Snapshot {
				s := world(mkPortMap("web", 0, 3000, currentEndpoint("worker-b", "10.244.18.107")))
				addService(s, "web", 3000, mkEndpoint("z-new", "10.244.17.1", "edge-a"), mkEndpoint("remote-0", "10.244.18.107", "worker-b"))
				return s
			},
			want: map[string]outcome{"demo/web": served(epRemote, "edge-a", "worker-b")},
		},
		{
			name: "a current endpoint that is no longer a candidate is replaced",
			snap: func() *Snapshot {
				s := world(mkPortMap("web", 0, 3000, currentEndpoint("worker-b", "10.244.18.99")))
				addService(s, "web", 3000, mkEndpoint("z-new", "10.244.17.1", "edge-a"), mkEndpoint("remote-0", "10.244.18.107", "worker-b"))
				return s
			},
			want: map[string]outcome{"demo/web": served("edge-a 10.244.17.1", "edge-a")},
		},

		// Serving node and interfaces.
		{
			name: "serving node: the pod's node when it accepts, else the first accepting node by name",
			snap: func() *Snapshot {
				s := world(mkPortMap("on-b", 0, 3000, service("web")), mkPortMap("remote", 1, 3001))
				s.Classes["public"].Spec.Nodes["edge-b"] = v1alpha1.ClassNode{Interfaces: []string{"wt0"}}
				addNodes(s, "edge-b")
				s.Agents["edge-b"] = mkAgent(iface("wt0", "100.64.93.144", 1420))
				addService(s, "web", 3000, mkEndpoint("web-0", "10.244.19.5", "edge-b"))
				return s
			},
			want: map[string]outcome{
				"demo/on-b":   served("edge-b 10.244.19.5", "edge-b"),
				"demo/remote": served(epRemote, "edge-a", "worker-b"),
			},
		},
		{
			name: "NoInterfaceOnNode: the narrowing leaves the serving node no interface",
			snap: func() *Snapshot {
				s := world(mkPortMap("web", 0, 3000, interfaces("wt0")))
				s.Classes["public"].Spec.Nodes["edge-b"] = v1alpha1.ClassNode{Interfaces: []string{"eth0"}}
				addNodes(s, "edge-b")
				s.Agents["edge-b"] = mkAgent(iface("eth0", "192.0.2.4", 1500), iface("wt0", "100.64.93.144", 1420))
				addService(s, "web", 3000, mkEndpoint("web-0", "10.244.19.5", "edge-b"))
				return s
			},
			want: map[string]outcome{"demo/web": unprogrammed(v1alpha1.ReasonNoInterfaceOnNode, "edge-b 10.244.19.5").msg(
				"node edge-b has none of the interfaces wt0")},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": empty("edge-a"), "edge-b": empty("edge-b")},
		},
		{
			name: "a class node without a Node object is skipped",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000))
				s.Classes["public"].Spec.Nodes["a-ghost"] = v1alpha1.ClassNode{Interfaces: []string{"wt0"}}
				return s
			},
			want:     map[string]outcome{"demo/remote": served(epRemote, "edge-a", "worker-b")},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": remoteEdgeA(), "worker-b": remoteWorkerB()},
		},

		// Node readiness.
		{
			name: "NodeNotReady: the pod's node has no agent, so nothing is emitted on any node",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000))
				delete(s.Agents, "worker-b")
				return s
			},
			want: map[string]outcome{"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote).msg(
				"node worker-b: no agent has connected")},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": empty("edge-a"), "worker-b": empty("worker-b")},
			classes: map[string]classOutcome{"public": {Ready: v1alpha1.ReasonValid, Links: []v1alpha1.LinkStatus{
				claimOf("edge-a", "worker-b", 0, "169.254.77.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
			}}},
		},
		{
			name: "NodeNotReady: an agent that never reported state",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000))
				s.Agents["worker-b"] = &AgentState{}
				return s
			},
			want: map[string]outcome{"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote).msg(
				"node worker-b: no agent has connected")},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": empty("edge-a"), "worker-b": empty("worker-b")},
		},
		{
			name: "NodeNotReady: an interface that is not there yet still gets its rules (nft matches by name)",
			snap: func() *Snapshot {
				s := world(mkPortMap("local", 0, 3000))
				st := s.Agents["edge-a"].State
				st.Interfaces = slices.DeleteFunc(slices.Clone(st.Interfaces), func(i *kuportv1.Interface) bool { return i.Name == "wt0" })
				return s
			},
			want: map[string]outcome{"demo/local": unprogrammed(v1alpha1.ReasonNodeNotReady, epLocal, "edge-a").msg(
				"node edge-a: interface wt0 not present")},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": localEdgeA()},
		},
		{
			name: "NodeNotReady: a serving interface without an address still gets its rules",
			snap: func() *Snapshot {
				s := world(mkPortMap("local", 0, 3000))
				s.Agents["edge-a"].State.Interfaces[1].Addresses = nil
				return s
			},
			want: map[string]outcome{"demo/local": unprogrammed(v1alpha1.ReasonNodeNotReady, epLocal, "edge-a").msg(
				"node edge-a: interface wt0 has no IPv4 address")},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": localEdgeA()},
			check: func(t *testing.T, r *Result) {
				got := r.PortMaps[types.NamespacedName{Namespace: "demo", Name: "local"}].Status.Published
				want := []v1alpha1.PublishedAddress{
					pubEdgeA,
					{Node: "edge-a", Interface: "wt0"},
				}
				if d := cmp.Diff(want, got); d != "" {
					t.Errorf("published (-want +got):\n%s", d)
				}
				// The PUBLISHED printer column lists only the addresses known.
				if got := r.PortMaps[types.NamespacedName{Namespace: "demo", Name: "local"}].Status.PublishedAddresses; got != "203.0.113.9" {
					t.Errorf("publishedAddresses = %q, want %q", got, "203.0.113.9")
				}
			},
		},
		{
			name: "NodeNotReady: ip_forward off on the pod's node",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000))
				s.Agents["worker-b"].State.IpForward = false
				return s
			},
			want: map[string]outcome{"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote, "edge-a", "worker-b").msg(
				"node worker-b: net.ipv4.ip_forward is 0")},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": remoteEdgeA(), "worker-b": remoteWorkerB()},
		},
		{
			name: "NodeNotReady: a link end without an underlay address blocks the mapping everywhere",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000))
				s.Agents["worker-b"].State.Interfaces[0].Addresses = []string{"fd00::1"}
				return s
			},
			want: map[string]outcome{"demo/remote": unprogrammed(v1alpha1.ReasonNodeNotReady, epRemote).msg(
				`node worker-b: underlay interface "wt0" has no IPv4 address`)},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": empty("edge-a"), "worker-b": empty("worker-b")},
		},
		{
			name: "NodeNotReady: the pod's node has no Node object",
			snap: func() *Snapshot {
				s := world(mkPortMap("web", 0, 3000))
				addService(s, "web", 3000, mkEndpoint("web-0", "10.244.30.1", "worker-z"))
				return s
			},
			want: map[string]outcome{"demo/web": unprogrammed(v1alpha1.ReasonNodeNotReady, "worker-z 10.244.30.1").msg(
				"node worker-z: no Node object")},
			programs: map[string]*kuportv1.NodeProgram{"edge-a": empty("edge-a")},
		},

		// Class readiness.
		{
			name: "InvalidSubnet: a /32, an IPv6 prefix and nonsense",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000))
				s.Classes["public"].Spec.ReturnPath.Vxlan.Subnet = "169.254.77.0/32"
				s.Classes["v6"] = mkClass("v6", 1, map[string][]string{"edge-a": {"wt0"}})
				s.Classes["v6"].Spec.ReturnPath.Vxlan.Subnet = "fd00::/64"
				s.Classes["junk"] = mkClass("junk", 2, map[string][]string{"edge-a": {"wt0"}})
				s.Classes["junk"].Spec.ReturnPath.Vxlan.Subnet = "nonsense"
				return s
			},
			want: map[string]outcome{"demo/remote": unprogrammed(v1alpha1.ReasonReturnPathUnavailable, epRemote)},
			classes: map[string]classOutcome{
				"public": {Ready: v1alpha1.ReasonInvalidSubnet},
				"v6":     {Ready: v1alpha1.ReasonInvalidSubnet},
				"junk":   {Ready: v1alpha1.ReasonInvalidSubnet},
			},
		},
		{
			name: "SubnetOverlap: the newer class sharing an accepting node is refused; its local mappings work",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000),
					mkPortMap("i-remote", 1, 4000, className("intranet"), service("remote")),
					mkPortMap("i-local", 2, 4001, className("intranet"), service("local")))
				s.Classes["intranet"] = intranet(1, map[string][]string{"edge-a": {"wt0"}})
				s.Classes["intranet"].Spec.ReturnPath.Vxlan.Subnet = "169.254.77.128/25"
				return s
			},
			want: map[string]outcome{
				"demo/remote":   served(epRemote, "edge-a", "worker-b"),
				"demo/i-remote": unprogrammed(v1alpha1.ReasonReturnPathUnavailable, epRemote),
				"demo/i-local":  served(epLocal, "edge-a"),
			},
			classes: map[string]classOutcome{
				"public": {Ready: v1alpha1.ReasonValid, Links: []v1alpha1.LinkStatus{
					claimOf("edge-a", "worker-b", 0, "169.254.77.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
				}},
				"intranet": {Ready: v1alpha1.ReasonSubnetOverlap,
					Message: `subnet 169.254.77.128/25 overlaps subnet 169.254.77.0/24 of class "public", which shares node edge-a`},
			},
		},
		{
			name: "VxlanPortConflict: a newer class on a shared node with the same port and base VNI",
			snap: func() *Snapshot {
				s := world()
				s.Classes["intranet"] = intranet(1, map[string][]string{"edge-a": {"wt0"}})
				s.Classes["intranet"].Spec.ReturnPath.Vxlan.VNI = 4242
				return s
			},
			classes: map[string]classOutcome{
				"public":   {Ready: v1alpha1.ReasonValid},
				"intranet": {Ready: v1alpha1.ReasonVxlanPortConflict},
			},
		},
		{
			name: "no overlap: a None class, or a class sharing no accepting node",
			snap: func() *Snapshot {
				s := world()
				s.Classes["none"] = mkClass("none", 1, map[string][]string{"edge-a": {"wt0"}})
				s.Classes["none"].Spec.ReturnPath.Mode = v1alpha1.ReturnPathNone
				s.Classes["apart"] = mkClass("apart", 2, map[string][]string{"worker-b": {"wt0"}})
				return s
			},
			classes: map[string]classOutcome{
				"public": {Ready: v1alpha1.ReasonValid},
				"none":   {Ready: v1alpha1.ReasonValid},
				"apart":  {Ready: v1alpha1.ReasonValid},
			},
		},
		{
			name: "SubnetExhausted: a /31 holds one pair; the next mapping's pair gets no slot",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000), mkPortMap("web", 1, 3001))
				s.Classes["public"].Spec.ReturnPath.Vxlan.Subnet = "169.254.77.0/31"
				addService(s, "web", 3000, mkEndpoint("web-0", "10.244.19.1", "worker-c"))
				return s
			},
			want: map[string]outcome{
				"demo/remote": served(epRemote, "edge-a", "worker-b"),
				"demo/web": unprogrammed(v1alpha1.ReasonReturnPathUnavailable, "worker-c 10.244.19.1").msg(
					`class "public" has no free link slot in subnet 169.254.77.0/31 for nodes edge-a and worker-c`),
			},
			programs: map[string]*kuportv1.NodeProgram{"worker-c": empty("worker-c"), "worker-b": remoteWorkerB()},
			classes: map[string]classOutcome{"public": {Ready: v1alpha1.ReasonSubnetExhausted,
				Message: "subnet 169.254.77.0/31 has no free /31 for edge-a/worker-c",
				Links: []v1alpha1.LinkStatus{
					claimOf("edge-a", "worker-b", 0, "169.254.77.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
				}}},
		},

		// Links, tables, marks, MTU.
		{
			name: "tables and marks are unique per node across two classes",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000), mkPortMap("i-remote", 1, 4000, className("intranet"), service("i-remote")))
				s.Classes["intranet"] = intranet(1, map[string][]string{"edge-a": {"wt0"}})
				// The same pod on another port: one pod port's replies go back by one link.
				addService(s, "i-remote", 4000, mkEndpoint("web-b", "10.244.18.107", "worker-b"))
				return s
			},
			want: map[string]outcome{
				"demo/remote":   served(epRemote, "edge-a", "worker-b"),
				"demo/i-remote": served(epRemote, "edge-a", "worker-b"),
			},
			classes: map[string]classOutcome{
				"public": {Ready: v1alpha1.ReasonValid, Links: []v1alpha1.LinkStatus{
					claimOf("edge-a", "worker-b", 0, "169.254.77.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
				}},
				"intranet": {Ready: v1alpha1.ReasonValid, Links: []v1alpha1.LinkStatus{
					claimOf("edge-a", "worker-b", 0, "169.254.79.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27506}),
				}},
			},
			check: func(t *testing.T, r *Result) {
				want := []*kuportv1.ReturnPath{
					{Id: intranetToEA + "/return", Link: intranetToEA, Mark: 0x2, Table: 27506, PeerUnderlay: "100.64.93.143", PeerLinkAddress: "169.254.79.0"},
					{Id: linkToEdgeA + "/return", Link: linkToEdgeA, Mark: 0x1, Table: 27505, PeerUnderlay: "100.64.93.143", PeerLinkAddress: "169.254.77.0"},
				}
				if d := cmp.Diff(want, r.Programs["worker-b"].ReturnPaths, cmpOpts...); d != "" {
					t.Errorf("worker-b return paths (-want +got):\n%s", d)
				}
				var marks []uint32
				for _, m := range r.Programs["worker-b"].MarkRules {
					if m.Kind == ctSave {
						marks = append(marks, m.Mark)
					}
				}
				if d := cmp.Diff([]uint32{0x2, 0x1}, marks); d != "" {
					t.Errorf("worker-b marks (-want +got):\n%s", d)
				}
				var vnis []uint32
				for _, l := range r.Programs["edge-a"].Links {
					vnis = append(vnis, l.Vni)
				}
				if d := cmp.Diff([]uint32{4300, 4242}, vnis); d != "" {
					t.Errorf("edge-a link VNIs, ordered %s, %s (-want +got):\n%s", intranetToWB, linkToWorkerB, d)
				}
			},
		},
		{
			name: "two mappings over one pair share one link and one return path",
			snap: func() *Snapshot {
				return world(mkPortMap("remote", 0, 3000), mkPortMap("remote-udp", 1, 3000, proto(v1alpha1.ProtocolUDP), service("remote")))
			},
			want: map[string]outcome{
				"demo/remote":     served(epRemote, "edge-a", "worker-b"),
				"demo/remote-udp": served(epRemote, "edge-a", "worker-b"),
			},
			check: func(t *testing.T, r *Result) {
				wb := r.Programs["worker-b"]
				if len(wb.Links) != 1 || len(wb.ReturnPaths) != 1 || len(r.Programs["edge-a"].Links) != 1 {
					t.Errorf("links edge-a %d, worker-b %d, return paths %d; want one each",
						len(r.Programs["edge-a"].Links), len(wb.Links), len(wb.ReturnPaths))
				}
				want := []*kuportv1.MarkRule{
					{Id: "demo/remote-udp/ct-restore", Mapping: "demo/remote-udp", Kind: ctRestore, Address: "10.244.18.107", Protocol: udp, Ports: ports(3000, 3000)},
					{Id: "demo/remote-udp/ct-save/" + linkToEdgeA, Mapping: "demo/remote-udp", Kind: ctSave, InInterface: linkToEdgeA, Address: "169.254.77.1", Protocol: udp, Ports: ports(3000, 3000), Mark: 0x1},
					{Id: "demo/remote/ct-restore", Mapping: "demo/remote", Kind: ctRestore, Address: "10.244.18.107", Protocol: tcp, Ports: ports(3000, 3000)},
					{Id: "demo/remote/ct-save/" + linkToEdgeA, Mapping: "demo/remote", Kind: ctSave, InInterface: linkToEdgeA, Address: "169.254.77.1", Protocol: tcp, Ports: ports(3000, 3000), Mark: 0x1},
				}
				if d := cmp.Diff(want, wb.MarkRules, cmpOpts...); d != "" {
					t.Errorf("worker-b marks (-want +got):\n%s", d)
				}
			},
		},
		{
			name: "a UDP range keeps each port; a shifted range translates to the pod's ports",
			snap: func() *Snapshot {
				s := world(mkPortMap("game", 0, 27015, endPort(27115), proto(v1alpha1.ProtocolUDP)),
					mkPortMap("shifted", 1, 40000, endPort(40009)))
				addService(s, "game", 27015, mkEndpoint("game-0", "10.244.18.107", "worker-b"))
				addService(s, "shifted", 7000, mkEndpoint("shifted-0", "10.244.17.8", "edge-a"))
				return s
			},
			want: map[string]outcome{
				"demo/game":    served(epRemote, "edge-a", "worker-b"),
				"demo/shifted": served("edge-a 10.244.17.8", "edge-a"),
			},
			check: func(t *testing.T, r *Result) {
				if got := r.PortMaps[types.NamespacedName{Namespace: "demo", Name: "game"}].Status.Ports; got != "27015-27115" {
					t.Errorf("status ports %q, want 27015-27115", got)
				}
				wantEA := []*kuportv1.DnatRule{
					{Id: "demo/game/dnat/enp1s0", Mapping: "demo/game", InInterface: "enp1s0", Protocol: udp, Ports: ports(27015, 27115), ToAddress: "169.254.77.1", ToPort: 27015, StandIn: "169.254.77.1"},
					{Id: "demo/game/dnat/wt0", Mapping: "demo/game", InInterface: "wt0", Protocol: udp, Ports: ports(27015, 27115), ToAddress: "169.254.77.1", ToPort: 27015, StandIn: "169.254.77.1"},
					{Id: "demo/shifted/dnat/enp1s0", Mapping: "demo/shifted", InInterface: "enp1s0", Protocol: tcp, Ports: ports(40000, 40009), ToAddress: "10.244.17.8", ToPort: 7000, StandIn: "10.244.17.8"},
					{Id: "demo/shifted/dnat/wt0", Mapping: "demo/shifted", InInterface: "wt0", Protocol: tcp, Ports: ports(40000, 40009), ToAddress: "10.244.17.8", ToPort: 7000, StandIn: "10.244.17.8"},
				}
				if d := cmp.Diff(wantEA, r.Programs["edge-a"].DnatRules, cmpOpts...); d != "" {
					t.Errorf("edge-a DNAT (-want +got):\n%s", d)
				}
				wantSnat := &kuportv1.SnatRule{Id: "demo/shifted/snat", Mapping: "demo/shifted", Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
					Address: "10.244.17.8", Protocol: tcp, Ports: ports(7000, 7009)}
				if d := cmp.Diff(wantSnat, r.Programs["edge-a"].SnatRules[1], cmpOpts...); d != "" {
					t.Errorf("edge-a shifted SNAT (-want +got):\n%s", d)
				}
				wantWB := []*kuportv1.DnatRule{{Id: "demo/game/dnat/" + linkToEdgeA, Mapping: "demo/game", InInterface: linkToEdgeA,
					MatchDestination: "169.254.77.1", Protocol: udp, Ports: ports(27015, 27115), ToAddress: "10.244.18.107", ToPort: 27015, StandIn: "10.244.18.107"}}
				if d := cmp.Diff(wantWB, r.Programs["worker-b"].DnatRules, cmpOpts...); d != "" {
					t.Errorf("worker-b DNAT (-want +got):\n%s", d)
				}
			},
		},
		{
			name: "a new slot skips a VNI another class's link uses on a node of the pair",
			snap: func() *Snapshot {
				s := world(mkPortMap("i-remote", 0, 4000, className("intranet"), service("remote")))
				addNodes(s, "worker-d")
				s.Classes["public"].Status.Links = []v1alpha1.LinkStatus{claimOf("edge-a", "worker-c", 0, "169.254.77.0/31", nil)}
				s.Classes["intranet"] = intranet(1, map[string][]string{"edge-a": {"wt0"}})
				s.Classes["intranet"].Spec.ReturnPath.Vxlan.VNI = 4241
				s.Classes["intranet"].Status.Links = []v1alpha1.LinkStatus{claimOf("edge-a", "worker-d", 0, "169.254.79.0/31", nil)}
				return s
			},
			want: map[string]outcome{"demo/i-remote": served(epRemote, "edge-a", "worker-b")},
			classes: map[string]classOutcome{
				"public": {Ready: v1alpha1.ReasonValid, Links: []v1alpha1.LinkStatus{
					claimOf("edge-a", "worker-c", 0, "169.254.77.0/31", &now),
				}},
				"intranet": {Ready: v1alpha1.ReasonValid, Links: []v1alpha1.LinkStatus{
					claimOf("edge-a", "worker-b", 2, "169.254.79.4/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
					claimOf("edge-a", "worker-d", 0, "169.254.79.0/31", &now),
				}},
			},
			check: func(t *testing.T, r *Result) {
				if l := r.Programs["worker-b"].Links[0]; l.Vni != 4243 || l.LocalAddress != "169.254.79.5" || l.PeerAddress != "169.254.79.4" {
					t.Errorf("worker-b link vni %d, local %s, peer %s; want 4243, 169.254.79.5, 169.254.79.4", l.Vni, l.LocalAddress, l.PeerAddress)
				}
			},
		},
		{
			name: "link MTU is the smaller underlay less 50 on both ends",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000))
				s.Agents["worker-b"].State.Interfaces[0].Mtu = 1380
				return s
			},
			want: map[string]outcome{"demo/remote": served(epRemote, "edge-a", "worker-b")},
			check: func(t *testing.T, r *Result) {
				for _, n := range []string{"edge-a", "worker-b"} {
					if m := r.Programs[n].Links[0].Mtu; m != 1330 {
						t.Errorf("%s link MTU %d, want 1330", n, m)
					}
				}
			},
		},
		{
			name: "an end that reports no MTU leaves the link at the other end's figure",
			snap: func() *Snapshot {
				s := world(mkPortMap("remote", 0, 3000))
				s.Agents["worker-b"].State.Interfaces[0].Mtu = 0
				return s
			},
			want: map[string]outcome{"demo/remote": served(epRemote, "edge-a", "worker-b")},
			check: func(t *testing.T, r *Result) {
				for _, n := range []string{"edge-a", "worker-b"} {
					if m := r.Programs[n].Links[0].Mtu; m != 1370 {
						t.Errorf("%s link MTU %d, want 1370", n, m)
					}
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.snap()
			r := Compile(s)
			if tc.want != nil {
				if d := cmp.Diff(tc.want, outcomes(r, tc.want), cmpopts.EquateEmpty()); d != "" {
					t.Errorf("portmaps (-want +got):\n%s", d)
				}
			}
			for node, want := range tc.programs {
				if d := cmp.Diff(want, r.Programs[node], cmpOpts...); d != "" {
					t.Errorf("program of %s (-want +got):\n%s", node, d)
				}
			}
			for name, want := range tc.classes {
				st := r.Classes[name]
				if st == nil {
					t.Fatalf("no status for class %s", name)
				}
				ready := st.Conditions[0]
				got := classOutcome{Ready: ready.Reason, Links: st.Links}
				if want.Message != "" {
					got.Message = ready.Message
				}
				if (ready.Status == metav1.ConditionTrue) != (ready.Reason == v1alpha1.ReasonValid) {
					t.Errorf("class %s Ready status %s with reason %s", name, ready.Status, ready.Reason)
				}
				if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
					t.Errorf("class %s (-want +got):\n%s", name, d)
				}
			}
			if len(r.Programs) != len(s.Nodes) {
				t.Errorf("%d programs for %d nodes", len(r.Programs), len(s.Nodes))
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

// outcomes summarises every PortMap of a result; messages only where the case wants them.
func outcomes(r *Result, want map[string]outcome) map[string]outcome {
	out := map[string]outcome{}
	for k, pm := range r.PortMaps {
		var o outcome
		accepted, programmed := pm.Status.Conditions[0], pm.Status.Conditions[1]
		o.Accepted, o.Programmed = accepted.Reason, programmed.Reason
		if want[k.String()].Message != "" {
			o.Message = programmed.Message
			if accepted.Status != metav1.ConditionTrue {
				o.Message = accepted.Message
			}
		}
		if ep := pm.Status.Endpoint; ep != nil {
			o.Endpoint = ep.Node + " " + ep.Address
		}
		o.Nodes = pm.Nodes
		out[k.String()] = o
	}
	return out
}

func TestClassNodeRows(t *testing.T) {
	s := world()
	s.Classes["public"].Spec.Nodes = map[string]v1alpha1.ClassNode{
		"edge-a":  {Interfaces: []string{"wt0", "enp1s0"}},
		"edge-c":  {Interfaces: []string{"wt0", "eth0"}},
		"edge-d":  {Interfaces: []string{"wt0"}},
		"edge-e":  {Interfaces: []string{"wt0"}},
		"no-node": {Interfaces: []string{"wt0"}},
	}
	addNodes(s, "edge-c", "edge-d", "edge-e")
	s.Agents["edge-c"] = mkAgent(iface("eth0", "192.0.2.7", 1500))
	s.Agents["edge-c"].State.UnderlayInterface = "eth0"
	s.Agents["edge-e"] = mkAgent(iface("wt0", "", 1420))
	s.Agents["edge-e"].State.IpForward = false

	got := Compile(s).Classes["public"].Nodes
	want := []v1alpha1.ClassNodeStatus{
		{Name: "edge-a", Ready: true, UnderlayMTU: 1420, LinkMTU: 1370,
			Addresses: map[string]string{"enp1s0": "203.0.113.9", "wt0": "100.64.93.143"},
			IPv6Unavailable: "interface enp1s0 has no global IPv6 address, interface wt0 has no global IPv6 address, " +
				"net.ipv6.conf.all.forwarding is 0"},
		{Name: "edge-c", UnderlayMTU: 1500, LinkMTU: 1450, Addresses: map[string]string{"eth0": "192.0.2.7"},
			Message:         "interface wt0 not present",
			IPv6Unavailable: "interface eth0 has no global IPv6 address, net.ipv6.conf.all.forwarding is 0"},
		{Name: "edge-d", Message: "no agent has connected"},
		{Name: "edge-e", UnderlayMTU: 1420, LinkMTU: 1370,
			Message:         "interface wt0 has no IPv4 address, net.ipv4.ip_forward is 0",
			IPv6Unavailable: "interface wt0 has no global IPv6 address, net.ipv6.conf.all.forwarding is 0"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("node rows (-want +got):\n%s", d)
	}
}

// TestLinkClaims covers slot stability and the unusedSince lifecycle: a used claim keeps its
// slot and table and has unusedSince cleared, an unused one is stamped (or keeps its stamp),
// one unused past the retention is dropped and its slot is the smallest free for a new pair.
func TestLinkClaims(t *testing.T) {
	hourAgo, dayAndHourAgo := now.Add(-time.Hour), now.Add(-25*time.Hour)
	s := world(mkPortMap("remote", 0, 3000), mkPortMap("web", 1, 3001))
	addNodes(s, "worker-f")
	s.Agents["worker-f"] = mkAgent(iface("wt0", "100.64.93.160", 1420))
	addService(s, "web", 3000, mkEndpoint("web-0", "10.244.21.1", "worker-f"))
	s.Classes["public"].Status.Links = []v1alpha1.LinkStatus{
		claimOf("edge-a", "worker-b", 1, "169.254.77.2/31", &hourAgo, v1alpha1.LinkEnd{Node: "worker-b", Table: 27507}),
		claimOf("edge-a", "worker-c", 0, "169.254.77.0/31", &dayAndHourAgo, v1alpha1.LinkEnd{Node: "worker-c", Table: 27505}),
		claimOf("edge-a", "worker-d", 2, "169.254.77.4/31", &hourAgo),
		claimOf("edge-a", "worker-e", 3, "169.254.77.6/31", nil, v1alpha1.LinkEnd{Node: "worker-e", Table: 27505}),
	}
	r := Compile(s)
	want := []v1alpha1.LinkStatus{
		claimOf("edge-a", "worker-b", 1, "169.254.77.2/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27507}),
		claimOf("edge-a", "worker-d", 2, "169.254.77.4/31", &hourAgo),
		claimOf("edge-a", "worker-e", 3, "169.254.77.6/31", &now, v1alpha1.LinkEnd{Node: "worker-e", Table: 27505}),
		claimOf("edge-a", "worker-f", 0, "169.254.77.0/31", nil, v1alpha1.LinkEnd{Node: "worker-f", Table: 27505}),
	}
	if d := cmp.Diff(want, r.Classes["public"].Links); d != "" {
		t.Errorf("links (-want +got):\n%s", d)
	}
	wb := r.Programs["worker-b"]
	if rp := wb.ReturnPaths[0]; rp.Table != 27507 || rp.Mark != 0x3 || rp.PeerLinkAddress != "169.254.77.2" {
		t.Errorf("worker-b return path table %d mark %#x peer %s; want 27507, 0x3, 169.254.77.2", rp.Table, rp.Mark, rp.PeerLinkAddress)
	}
	if l := wb.Links[0]; l.Vni != 4243 || l.LocalAddress != "169.254.77.3" {
		t.Errorf("worker-b link vni %d local %s; want 4243, 169.254.77.3", l.Vni, l.LocalAddress)
	}

	// A second class on the same nodes, compiled with the first one's claims, moves nothing.
	next := world(mkPortMap("remote", 0, 3000), mkPortMap("i-remote", 1, 4000, className("intranet")))
	next.Classes["public"].Status.Links = r.Classes["public"].Links
	next.Classes["intranet"] = intranet(1, map[string][]string{"edge-a": {"wt0"}})
	// remote's pod on another pod port: the replies of remote's own are marked into public's link.
	addService(next, "i-remote", 4000, mkEndpoint("remote-0", "10.244.18.107", "worker-b"))
	r2 := Compile(next)
	for k, o := range outcomes(r2, nil) {
		if o.Programmed != v1alpha1.ReasonAllNodesReady {
			t.Errorf("%s: Accepted %s, Programmed %s; want it served", k, o.Accepted, o.Programmed)
		}
	}
	if d := cmp.Diff(r.Classes["public"].Links[0], r2.Classes["public"].Links[0]); d != "" {
		t.Errorf("edge-a/worker-b claim moved (-before +after):\n%s", d)
	}
	// worker-b's table 27507 belongs to public, so intranet's end takes 201.
	wantIntranet := []v1alpha1.LinkStatus{
		claimOf("edge-a", "worker-b", 0, "169.254.79.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
	}
	if d := cmp.Diff(wantIntranet, r2.Classes["intranet"].Links); d != "" {
		t.Errorf("intranet links (-want +got):\n%s", d)
	}
}

// TestConditionTransitions checks LastTransitionTime moves only when a condition's status does.
func TestConditionTransitions(t *testing.T) {
	key := types.NamespacedName{Namespace: "demo", Name: "remote"}
	first := Compile(world(mkPortMap("remote", 0, 3000)))

	later := world(mkPortMap("remote", 0, 3000))
	later.Now = now.Add(time.Hour)
	later.PortMaps[0].Status = first.PortMaps[key].Status
	later.Classes["public"].Status = *first.Classes["public"]
	delete(later.Agents, "worker-b")
	second := Compile(later)

	accepted, programmed := second.PortMaps[key].Status.Conditions[0], second.PortMaps[key].Status.Conditions[1]
	if !accepted.LastTransitionTime.Equal(&metav1.Time{Time: now}) {
		t.Errorf("Accepted moved to %v although it stayed True", accepted.LastTransitionTime)
	}
	if programmed.Status != metav1.ConditionFalse || !programmed.LastTransitionTime.Equal(&metav1.Time{Time: now.Add(time.Hour)}) {
		t.Errorf("Programmed %s at %v, want False at %v", programmed.Status, programmed.LastTransitionTime, now.Add(time.Hour))
	}
	ready := second.Classes["public"].Conditions[0]
	if !ready.LastTransitionTime.Equal(&metav1.Time{Time: now}) || ready.ObservedGeneration != 1 {
		t.Errorf("class Ready at %v generation %d, want %v and 1", ready.LastTransitionTime, ready.ObservedGeneration, now)
	}
	if got := second.PortMaps[key].Status.ObservedGeneration; got != 2 {
		t.Errorf("observedGeneration %d, want 2", got)
	}
}

// busyWorld has two classes, local and remote mappings, a range and a refused mapping.
func busyWorld() *Snapshot {
	s := world(mkPortMap("local", 0, 3000), mkPortMap("remote", 1, 3001),
		mkPortMap("game", 2, 27015, endPort(27115), proto(v1alpha1.ProtocolUDP), service("remote")),
		mkPortMap("i-remote", 3, 4000, className("intranet"), service("remote")),
		mkPortMap("clash", 4, 3000, service("local")))
	s.Classes["intranet"] = intranet(1, map[string][]string{"edge-a": {"wt0"}})
	return s
}

func TestDeterministic(t *testing.T) {
	a := Compile(busyWorld())
	s := busyWorld()
	slices.Reverse(s.PortMaps)
	b := Compile(s)
	if d := cmp.Diff(a, b, cmpOpts...); d != "" {
		t.Errorf("two compilations differ (-first +second):\n%s", d)
	}
}

func TestDoesNotMutateSnapshot(t *testing.T) {
	s := busyWorld()
	s.Classes["public"].Status.Links = []v1alpha1.LinkStatus{claimOf("edge-a", "worker-c", 0, "169.254.77.0/31", nil)}
	before := map[string]*v1alpha1.PortMapClass{}
	for k, v := range s.Classes {
		before[k] = v.DeepCopy()
	}
	pms := make([]*v1alpha1.PortMap, len(s.PortMaps))
	for i, pm := range s.PortMaps {
		pms[i] = pm.DeepCopy()
	}
	Compile(s)
	if d := cmp.Diff(before, s.Classes); d != "" {
		t.Errorf("classes mutated:\n%s", d)
	}
	if d := cmp.Diff(pms, s.PortMaps); d != "" {
		t.Errorf("portmaps mutated:\n%s", d)
	}
}

func TestNilAndEmptyInputs(t *testing.T) {
	r := Compile(nil)
	if len(r.Programs)+len(r.PortMaps)+len(r.Classes) != 0 {
		t.Errorf("nil snapshot compiled to %+v", r)
	}
	s := world(nil, mkPortMap("remote", 0, 3000))
	s.Classes["nil"] = nil
	s.Agents["worker-z"] = nil
	s.EndpointSlices[types.NamespacedName{Namespace: "demo", Name: "remote"}] = append(
		s.EndpointSlices[types.NamespacedName{Namespace: "demo", Name: "remote"}], nil,
		&discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{}}})
	s.Nodes["ghost"] = nil
	s.Namespaces["demo"] = nil
	s.Classes["public"].Spec.NamespaceSelector = &metav1.LabelSelector{}
	if got := Compile(s).PortMaps[types.NamespacedName{Namespace: "demo", Name: "remote"}]; got.Status.Conditions[1].Reason != v1alpha1.ReasonAllNodesReady {
		t.Errorf("remote: %+v", got.Status.Conditions)
	}
	s.Services = map[types.NamespacedName]*corev1.Service{}
	if got := Compile(s).PortMaps[types.NamespacedName{Namespace: "demo", Name: "remote"}]; got.Status.Conditions[1].Reason != v1alpha1.ReasonNoReadyEndpoint {
		t.Errorf("remote without service: %+v", got.Status.Conditions)
	}
}

// dnatOf returns the program's DNAT rule with id, or nil.
func dnatOf(p *kuportv1.NodeProgram, id string) *kuportv1.DnatRule {
	for _, r := range p.GetDnatRules() {
		if r.Id == id {
			return r
		}
	}
	return nil
}

// Over a link the dialed port is kept and the pod's node translates it: two mappings that
// reach pods on one node at the same pod port stay apart on the link (a link-side DNAT on
// the pod port alone would send both to whichever rule came first).
func TestLinkCarriesTheDialedPort(t *testing.T) {
	s := world(mkPortMap("remote", 0, 3000), mkPortMap("other", 1, 5000))
	addService(s, "other", 3000, mkEndpoint("other-0", "10.244.18.200", "worker-b"))
	r := Compile(s)
	for _, name := range []string{"remote", "other"} {
		st := r.PortMaps[types.NamespacedName{Namespace: "demo", Name: name}].Status
		if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionProgrammed); c.Status != metav1.ConditionTrue {
			t.Fatalf("%s not programmed: %s %s", name, c.Reason, c.Message)
		}
	}
	want := map[string]struct {
		node, id string
		first    uint32
		to       string
		toPort   uint32
	}{
		"accepting node, remote": {"edge-a", "demo/remote/dnat/enp1s0", 3000, "169.254.77.1", 3000},
		"accepting node, other":  {"edge-a", "demo/other/dnat/enp1s0", 5000, "169.254.77.1", 5000},
		"pod node, remote":       {"worker-b", "demo/remote/dnat/" + linkToEdgeA, 3000, "10.244.18.107", 3000},
		"pod node, other":        {"worker-b", "demo/other/dnat/" + linkToEdgeA, 5000, "10.244.18.200", 3000},
	}
	for name, w := range want {
		d := dnatOf(r.Programs[w.node], w.id)
		if d == nil {
			t.Errorf("%s: no rule %s", name, w.id)
			continue
		}
		if d.Ports.First != w.first || d.ToAddress != w.to || d.ToPort != w.toPort {
			t.Errorf("%s: dport %d dnat to %s:%d, want dport %d dnat to %s:%d",
				name, d.Ports.First, d.ToAddress, d.ToPort, w.first, w.to, w.toPort)
		}
	}
	// The pod's node claims and marks by the pod's port.
	for _, sn := range r.Programs["worker-b"].SnatRules {
		if sn.Mapping == "demo/other" && sn.Ports.First != 3000 {
			t.Errorf("%s matches port %d, want the pod's 3000", sn.Id, sn.Ports.First)
		}
	}
}

// One port on two interfaces of a node may belong to two mappings (PortConflict is per
// interface, docs/design/api.md#portmap), but not when both cross the same link: the newer is
// refused.
func TestSamePortOnTwoInterfacesCannotShareALink(t *testing.T) {
	s := world(mkPortMap("remote", 0, 3000, interfaces("enp1s0")), mkPortMap("other", 1, 3000, interfaces("wt0")))
	addService(s, "other", 3000, mkEndpoint("other-0", "10.244.18.200", "worker-b"))
	r := Compile(s)
	other := r.PortMaps[types.NamespacedName{Namespace: "demo", Name: "other"}].Status
	acc := meta.FindStatusCondition(other.Conditions, v1alpha1.ConditionAccepted)
	if acc.Reason != v1alpha1.ReasonPortConflict || !strings.Contains(acc.Message, "demo/remote") {
		t.Errorf("other: Accepted %s %q, want PortConflict naming demo/remote", acc.Reason, acc.Message)
	}
	if dnatOf(r.Programs["worker-b"], "demo/other/dnat/"+linkToEdgeA) != nil || dnatOf(r.Programs["edge-a"], "demo/other/dnat/wt0") != nil {
		t.Error("the refused mapping reached a program")
	}
	if dnatOf(r.Programs["worker-b"], "demo/remote/dnat/"+linkToEdgeA) == nil {
		t.Error("the older mapping lost its rule")
	}
}

// A mapping that holds its port keeps it when an older one becomes valid later (its class
// appears): live traffic is not taken away.
func TestHeldPortIsNotTakenByAnOlderMappingThatBecomesValid(t *testing.T) {
	held := func(pm *v1alpha1.PortMap) {
		pm.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid}}
	}
	older := mkPortMap("local", 0, 3000)        // was ClassNotFound until now: no Accepted=True
	newer := mkPortMap("remote", 5, 3000, held) // accepted, serving
	r := Compile(world(older, newer))
	for name, want := range map[string]string{"remote": v1alpha1.ReasonValid, "local": v1alpha1.ReasonPortConflict} {
		c := meta.FindStatusCondition(r.PortMaps[types.NamespacedName{Namespace: "demo", Name: name}].Status.Conditions, v1alpha1.ConditionAccepted)
		if c.Reason != want {
			t.Errorf("%s: Accepted reason %s (%s), want %s", name, c.Reason, c.Message, want)
		}
	}
}

// A UDP mapping never binds a Service port served over TCP: no endpoint, not a dead rule.
func TestProtocolMustMatchTheServicePort(t *testing.T) {
	s := world(mkPortMap("web", 0, 3000, proto(v1alpha1.ProtocolUDP)))
	k := types.NamespacedName{Namespace: "demo", Name: "web"}
	s.Services[k] = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web"}}
	sl := mkSlice(discoveryv1.AddressTypeIPv4, 3000, mkEndpoint("web-0", "10.244.17.7", "edge-a"))
	sl.Ports = sl.Ports[:2] // "http" over TCP only
	s.EndpointSlices[k] = []*discoveryv1.EndpointSlice{sl}
	r := Compile(s)
	c := meta.FindStatusCondition(r.PortMaps[k].Status.Conditions, v1alpha1.ConditionProgrammed)
	if c.Reason != v1alpha1.ReasonNoReadyEndpoint || !strings.Contains(c.Message, `UDP port "http"`) {
		t.Errorf("Programmed %s %q, want NoReadyEndpoint naming UDP port \"http\"", c.Reason, c.Message)
	}
}

// A class that loses its usable subnet (returnPath None, or an invalid subnet) keeps its
// claims whole, /31 included, so switching back reuses them.
func TestClaimKeepsItsSubnetWhileTheClassHasNone(t *testing.T) {
	first := Compile(world(mkPortMap("remote", 0, 3000)))
	claims := first.Classes["public"].Links
	if len(claims) != 1 || claims[0].Subnet != "169.254.77.0/31" {
		t.Fatalf("claims %+v, want one for 169.254.77.0/31", claims)
	}
	for name, mutate := range map[string]func(*v1alpha1.PortMapClass){
		"None":           func(c *v1alpha1.PortMapClass) { c.Spec.ReturnPath.Mode = v1alpha1.ReturnPathNone },
		"invalid subnet": func(c *v1alpha1.PortMapClass) { c.Spec.ReturnPath.Vxlan.Subnet = "169.254.88.0/32" },
	} {
		s := world(mkPortMap("remote", 0, 3000))
		s.Classes["public"].Status = *first.Classes["public"]
		mutate(s.Classes["public"])
		got := Compile(s).Classes["public"].Links
		if len(got) != 1 || got[0].Subnet != "169.254.77.0/31" || got[0].Slot != 0 {
			t.Errorf("%s: claims %+v, want slot 0 keeping 169.254.77.0/31", name, got)
		}
	}
}

// A recorded claim whose VNI no longer fits once the class's base VNI is raised is dropped,
// and the pair takes a slot whose VNI does.
func TestClaimDroppedWhenItsVNIPassesTheMaximum(t *testing.T) {
	s := world(mkPortMap("remote", 0, 3000))
	s.Classes["public"].Spec.ReturnPath.Vxlan.VNI = maxVNI
	s.Classes["public"].Status.Links = []v1alpha1.LinkStatus{
		claimOf("edge-a", "worker-b", 1, "169.254.77.2/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
	}
	r := Compile(s)
	want := []v1alpha1.LinkStatus{
		claimOf("edge-a", "worker-b", 0, "169.254.77.0/31", nil, v1alpha1.LinkEnd{Node: "worker-b", Table: 27505}),
	}
	if d := cmp.Diff(want, r.Classes["public"].Links); d != "" {
		t.Errorf("links (-want +got):\n%s", d)
	}
	if l := r.Programs["worker-b"].Links[0]; l.Vni != maxVNI {
		t.Errorf("worker-b link vni %d, want %d", l.Vni, maxVNI)
	}
}

// A slice port that cannot serve the mapping says why in NoReadyEndpoint's message: a pod
// range past 65535, a shift wider than MaxShiftedRange (the datapath's per-port map), or the
// named port being of the other protocol.
func TestNoReadyEndpointSaysWhy(t *testing.T) {
	s := world(
		mkPortMap("wide", 0, 40000, endPort(40000+MaxShiftedRange)),
		mkPortMap("fits", 1, 50000, endPort(50000+MaxShiftedRange-1), service("wide")),
		mkPortMap("high", 2, 9100, endPort(9110)),
		mkPortMap("udp", 3, 5005, proto(v1alpha1.ProtocolUDP)),
	)
	addService(s, "wide", 7000, mkEndpoint("web-b", "10.244.18.107", "worker-b"))
	addService(s, "high", 65530, mkEndpoint("web-b", "10.244.18.107", "worker-b"))
	addService(s, "udp", 5005, mkEndpoint("web-b", "10.244.18.107", "worker-b"))
	s.EndpointSlices[nsName("demo", "udp")][0].Ports = []discoveryv1.EndpointPort{
		{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](5005)}}
	r := Compile(s)
	for name, want := range map[string]string{
		"wide": fmt.Sprintf("pod port 7000 shifts the %d-port range, and a shifted range spans at most %d ports", MaxShiftedRange+1, MaxShiftedRange),
		"high": "pod ports 65530-65540 pass 65535",
		"udp":  `port "http" is TCP, the mapping UDP`,
	} {
		c := r.PortMaps[nsName("demo", name)].Status.Conditions[1]
		if c.Reason != v1alpha1.ReasonNoReadyEndpoint || !strings.HasSuffix(c.Message, ": "+want) {
			t.Errorf("%s: %s %q, want NoReadyEndpoint ending in %q", name, c.Reason, c.Message, want)
		}
	}
	if c := r.PortMaps[nsName("demo", "fits")].Status.Conditions[1]; c.Reason != v1alpha1.ReasonAllNodesReady {
		t.Errorf("a shifted range of %d ports: %s %q", MaxShiftedRange, c.Reason, c.Message)
	}
}
