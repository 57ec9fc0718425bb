package v1alpha1

import (
	"cmp"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServingMode decides how many nodes carry a mapping's rules.
// +kubebuilder:validation:Enum=Single;Multi
type ServingMode string

const (
	// ServingModeSingle: only the serving node holds DNAT rules.
	ServingModeSingle ServingMode = "Single"
	// ServingModeMulti: every accepting node holds DNAT rules.
	ServingModeMulti ServingMode = "Multi"
)

// OrDefault is m, or Single when unset: the CRD's default, for an object read before the
// API server applied it.
func (m ServingMode) OrDefault() ServingMode { return cmp.Or(m, ServingModeSingle) }

// ReturnPathMode selects how replies from a pod on another node get back.
// +kubebuilder:validation:Enum=Vxlan;None
type ReturnPathMode string

const (
	// ReturnPathVxlan builds a vxlan link per node pair that needs one.
	ReturnPathVxlan ReturnPathMode = "Vxlan"
	// ReturnPathNone builds no link and refuses any mapping that would need one.
	ReturnPathNone ReturnPathMode = "None"
)

// OrDefault is m, or Vxlan when unset: the CRD's default, for an object read before the API
// server applied it.
func (m ReturnPathMode) OrDefault() ReturnPathMode { return cmp.Or(m, ReturnPathVxlan) }

// PortMapClassSpec is the admin's description of which nodes accept traffic, on which
// interfaces and ports, and how replies return.
type PortMapClassSpec struct {
	// servingMode: Single (default) or Multi.
	// +kubebuilder:default=Single
	// +optional
	ServingMode ServingMode `json:"servingMode,omitempty"`

	// nodes maps an accepting node's name to its interfaces. A name with no Node object is skipped.
	// +kubebuilder:validation:MinProperties=1
	Nodes map[string]ClassNode `json:"nodes"`

	// ports limits which ports mappings of this class may use.
	// +kubebuilder:default={min:1,max:65535}
	// +optional
	Ports PortPolicy `json:"ports,omitempty"`

	// namespaceSelector selects the namespaces whose PortMaps may use the class; empty selects all.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// returnPath says how replies from a pod on another node return.
	// +kubebuilder:default={}
	// +optional
	ReturnPath ReturnPath `json:"returnPath,omitempty"`
}

// InterfaceName is a Linux network interface name: 1-15 bytes, no whitespace, quote, slash,
// backslash or "*" (nftables reads "*" in an interface match as a wildcard).
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=15
// +kubebuilder:validation:Pattern=`^[^\s"*/\\]+$`
type InterfaceName = string

// ClassNode lists the interfaces of one accepting node.
type ClassNode struct {
	// interfaces are interface names on that node; one DNAT rule per interface.
	// +kubebuilder:validation:MinItems=1
	// +listType=set
	Interfaces []InterfaceName `json:"interfaces"`
}

// PortPolicy is the inclusive range of ports a class allows, less its reserved ports.
// +kubebuilder:validation:XValidation:rule="self.min <= self.max",message="ports.min must not exceed ports.max"
type PortPolicy struct {
	// min is the lowest allowed port.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Min int32 `json:"min,omitempty"`
	// max is the highest allowed port, inclusive.
	// +kubebuilder:default=65535
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Max int32 `json:"max,omitempty"`
	// reserved ports inside [min, max] that no mapping may use.
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=65535
	// +optional
	Reserved []int32 `json:"reserved,omitempty"`
}

// ReturnPath configures the return path of a class.
type ReturnPath struct {
	// mode: Vxlan (default) or None.
	// +kubebuilder:default=Vxlan
	// +optional
	Mode ReturnPathMode `json:"mode,omitempty"`
	// vxlan configures the links when mode is Vxlan.
	// +kubebuilder:default={}
	// +optional
	Vxlan VxlanConfig `json:"vxlan,omitempty"`
}

// VxlanConfig numbers a class's links: slot s uses VNI vni+s, the /31 at subnet base + 2s and
// the /127 at subnet6 base + 2s.
type VxlanConfig struct {
	// vni is the base VXLAN network identifier.
	// +kubebuilder:default=4242
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16777215
	// +optional
	VNI int32 `json:"vni,omitempty"`
	// port is the UDP port of the encapsulation. It is checked against the tunnel devices
	// (vxlan, geneve) each node's agent reports: no link is built to or from a node where a
	// device other than kuport's own kup-* uses it, and the class's Ready condition and that
	// node's row say VxlanPortConflict (Flannel and Calico use 4789, Cilium 8472 or 6081).
	// +kubebuilder:default=4790
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
	// subnet is an IPv4 CIDR split into /31 slots, one per node pair.
	// +kubebuilder:default="169.254.77.0/24"
	// +optional
	Subnet string `json:"subnet,omitempty"`
	// subnet6 is an IPv6 CIDR split into /127 slots, one per node pair: the links carry a
	// mapping's IPv6 side inside the same device. A pair finds a slot only where both its /31
	// and its /127 fit. A subnet6 overlapping any older class's leaves this class's links
	// without IPv6, and its node rows say so (ipv6Unavailable): give each class its own.
	// +kubebuilder:default="fd64:f5ac:e961::/112"
	// +optional
	Subnet6 string `json:"subnet6,omitempty"`
}

// Reasons of the PortMapClass Ready condition (docs/design/api.md, PortMapClass).
const (
	ClassConditionReady = "Ready"

	ReasonValid             = "Valid"
	ReasonVxlanPortConflict = "VxlanPortConflict"
	ReasonSubnetExhausted   = "SubnetExhausted"
	ReasonInvalidSubnet     = "InvalidSubnet"
	ReasonSubnetOverlap     = "SubnetOverlap"
)

// The NodePortsReserved condition of a PortMapClass: whether every well-known port of
// the accepting nodes' own listeners inside the class's window is reserved (kubelet 10250,
// kube-apiserver 6443, etcd 2379-2380, the class's link port, the UDP ports of the tunnel
// devices the accepting nodes' agents report). False only warns: mappings are accepted as
// before, and one on such a port takes it over on the class's interfaces.
const (
	ClassConditionNodePortsReserved = "NodePortsReserved"

	ReasonAllReserved         = "AllReserved"
	ReasonNodePortsUnreserved = "NodePortsUnreserved"
)

// PortMapClassStatus is written by the controller.
type PortMapClassStatus struct {
	// observedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// conditions: Ready, NodePortsReserved.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// nodes and links are atomic lists: only the controller writes status, always whole, so
	// the API server tracks each list as one field in managedFields instead of every row's
	// every field (a class of 1,000 nodes carried more managedFields than status, and every
	// write of the class, its spec's too, decoded and encoded them; BENCHMARKS.md,
	// "Acknowledged within 1 s of a class change").

	// nodes has one row per accepting node.
	// +listType=atomic
	// +optional
	Nodes []ClassNodeStatus `json:"nodes,omitempty"`
	// links has one row per node pair that has, or recently had, a link: the slot claims.
	// +listType=atomic
	// +optional
	Links []LinkStatus `json:"links,omitempty"`
}

// ClassNodeStatus is one accepting node as its agent reports it.
type ClassNodeStatus struct {
	// name of the node.
	Name string `json:"name"`
	// ready is true when every interface the class gives the node resolves to an address there.
	Ready bool `json:"ready"`
	// underlayMTU is the node's underlay interface MTU in bytes.
	// +optional
	UnderlayMTU int32 `json:"underlayMTU,omitempty"`
	// linkMTU is underlayMTU - 50 bytes (the vxlan encapsulation).
	// +optional
	LinkMTU int32 `json:"linkMTU,omitempty"`
	// addresses maps each of the class's interfaces on the node to its IPv4 address.
	// +optional
	Addresses map[string]string `json:"addresses,omitempty"`
	// message says what is missing when not ready.
	// +optional
	Message string `json:"message,omitempty"`
	// addresses6 maps each of the class's interfaces on the node to its first global IPv6
	// address.
	// +optional
	Addresses6 map[string]string `json:"addresses6,omitempty"`
	// ipv6Unavailable says why the node serves no IPv6 on some of the class's interfaces
	// (an interface without a global IPv6 address, net.ipv6.conf.all.forwarding 0, links
	// without IPv6); empty when it serves IPv6 on all of them. It never makes the node not
	// ready: the node keeps serving IPv4.
	// +optional
	IPv6Unavailable string `json:"ipv6Unavailable,omitempty"`
}

// LinkStatus is the recorded claim of one slot by a node pair.
type LinkStatus struct {
	// key is "<first node>/<second node>", sorted.
	Key string `json:"key"`
	// peers are the two node names, sorted.
	// +kubebuilder:validation:MinItems=2
	// +kubebuilder:validation:MaxItems=2
	Peers []string `json:"peers"`
	// subnet is the pair's /31.
	Subnet string `json:"subnet"`
	// subnet6 is the pair's /127, its link's IPv6 ends while both nodes forward IPv6; empty
	// while the class's subnet6 overlaps an older class's and its links carry no IPv6.
	// +optional
	Subnet6 string `json:"subnet6,omitempty"`
	// slot numbers the pair's /31 and VNI within the class, from 0.
	// +kubebuilder:validation:Minimum=0
	Slot int32 `json:"slot"`
	// unusedSince is set when no mapping needs the pair; the claim is dropped after 24 h.
	// +optional
	UnusedSince *metav1.Time `json:"unusedSince,omitempty"`
	// ends records, per node of the pair, the routing table its return path uses.
	// Tables are unique per node across classes, within the controller's return tables
	// (--return-tables, 27505-27631 by default); the mark is derived from the table. Recorded
	// so they are never renumbered under live traffic; a table outside the range is
	// reallocated.
	// +listType=map
	// +listMapKey=node
	// +optional
	Ends []LinkEnd `json:"ends,omitempty"`
}

// LinkEnd is one node's return-path allocation on a link.
type LinkEnd struct {
	// node is the node name.
	Node string `json:"node"`
	// table is the routing table number, unique on the node across classes.
	// +kubebuilder:validation:Minimum=1
	Table int32 `json:"table"`
}

// PortMapClass says which nodes accept traffic for PortMaps, on which interfaces and ports.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=pmc
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="MODE",type=string,JSONPath=`.spec.servingMode`
// +kubebuilder:printcolumn:name="RETURNPATH",type=string,JSONPath=`.spec.returnPath.mode`
// +kubebuilder:printcolumn:name="READY",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="AGE",type=date,JSONPath=`.metadata.creationTimestamp`
type PortMapClass struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PortMapClassSpec   `json:"spec"`
	Status PortMapClassStatus `json:"status,omitempty"`
}

// PortMapClassList is a list of PortMapClass.
//
// +kubebuilder:object:root=true
type PortMapClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PortMapClass `json:"items"`
}
