package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Protocol is a PortMap's transport protocol.
// +kubebuilder:validation:Enum=TCP;UDP
type Protocol string

const (
	ProtocolTCP Protocol = "TCP"
	ProtocolUDP Protocol = "UDP"
)

// PortMapSpec maps a port (or range) on a class's accepting nodes to a Service's pod.
// +kubebuilder:validation:XValidation:rule="!has(self.endPort) || self.endPort >= self.port",message="endPort must be >= port"
// +kubebuilder:validation:XValidation:rule="has(self.endPort) == has(oldSelf.endPort)",message="endPort is immutable"
type PortMapSpec struct {
	// className names the PortMapClass. Immutable.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="className is immutable"
	ClassName string `json:"className"`
	// protocol: TCP or UDP. Immutable.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="protocol is immutable"
	Protocol Protocol `json:"protocol"`
	// port is the port clients dial. The pod receives on the port its EndpointSlice gives for
	// serviceRef.port (usually equal; a range then starts there, each dialed port reaching its
	// own pod port, and may span at most 512 ports when shifted). Immutable.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="port is immutable"
	Port int32 `json:"port"`
	// endPort, when set, makes the mapping the inclusive range port..endPort. Immutable.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="endPort is immutable"
	// +optional
	EndPort *int32 `json:"endPort,omitempty"`
	// interfaces narrows the class's interfaces per node; empty uses all of them.
	// +listType=set
	// +optional
	Interfaces []InterfaceName `json:"interfaces,omitempty"`
	// serviceRef names the Service whose endpoint receives the traffic.
	ServiceRef ServiceRef `json:"serviceRef"`
}

// ServiceRef names a Service in the PortMap's namespace and one of its named ports.
type ServiceRef struct {
	// name of the Service.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// port is the name of the Service's port (a name, not a number): its EndpointSlice port of
	// that name and the mapping's protocol gives the pod's port.
	// +kubebuilder:validation:MinLength=1
	Port string `json:"port"`
}

// Condition types and reasons of a PortMap (docs/design/api.md, Status and conditions).
const (
	ConditionAccepted   = "Accepted"
	ConditionProgrammed = "Programmed"

	ReasonClassNotFound         = "ClassNotFound"
	ReasonNamespaceNotSelected  = "NamespaceNotSelected"
	ReasonInvalidPortRange      = "InvalidPortRange"
	ReasonPortOutOfRange        = "PortOutOfRange"
	ReasonPortReserved          = "PortReserved"
	ReasonPortConflict          = "PortConflict"
	ReasonInterfaceNotInClass   = "InterfaceNotInClass"
	ReasonAllNodesReady         = "AllNodesReady"
	ReasonNoReadyEndpoint       = "NoReadyEndpoint"
	ReasonReturnPathUnavailable = "ReturnPathUnavailable"
	ReasonNodeNotReady          = "NodeNotReady"
	ReasonNoInterfaceOnNode     = "NoInterfaceOnNode"
	// ReasonNotAccepted is Programmed's reason while Accepted is False.
	ReasonNotAccepted = "NotAccepted"
)

// PortMapStatus is written by the controller.
type PortMapStatus struct {
	// observedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// ports is the mapping's port or range as text, "27015" or "27015-27115", shown in the
	// PORT printer column.
	// +optional
	Ports string `json:"ports,omitempty"`
	// endpoint is the chosen pod.
	// +optional
	Endpoint *EndpointStatus `json:"endpoint,omitempty"`
	// published lists the addresses the port answers on now, one row per interface.
	// +optional
	Published []PublishedAddress `json:"published,omitempty"`
	// publishedAddresses joins the published rows' addresses (each row's address, then its
	// address6) with commas, shown in the PUBLISHED printer column.
	// +optional
	PublishedAddresses string `json:"publishedAddresses,omitempty"`
	// unanswered lists the nodes that forward the mapping's requests and see no reply:
	// requests without a reply for the controller's window (kuport-controller
	// --unanswered-reports, --unanswered-window), as the Warning Event RequestsUnanswered
	// says; a node's row goes once replies flow again (Normal Event RequestsAnswered).
	// Programmed=True says the rules are in the kernels, this says whether anything answers.
	// +listType=map
	// +listMapKey=node
	// +optional
	Unanswered []UnansweredNode `json:"unanswered,omitempty"`
	// unansweredOn joins the unanswered rows as "<node> since <since>" with commas, for the
	// UNANSWERED printer column; empty while every node's requests are answered or none arrive.
	// +optional
	UnansweredOn string `json:"unansweredOn,omitempty"`
	// conditions: Accepted, Programmed.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// EndpointStatus is the chosen pod: its node and its addresses, one of each family it has.
type EndpointStatus struct {
	Node string `json:"node"`
	// address is the pod's IPv4 address; empty for a pod with an IPv6 address only.
	Address string `json:"address"`
	// address6 is the pod's IPv6 address, when it has one: the mapping is served on each
	// family both the pod and an accepting interface have.
	// +optional
	Address6 string `json:"address6,omitempty"`
}

// PublishedAddress is one interface the port answers on.
type PublishedAddress struct {
	Node      string `json:"node"`
	Interface string `json:"interface"`
	// address is the interface's IPv4 address; empty while the agent has not reported it,
	// or when the mapping is not served on IPv4 (its pod has no IPv4 address).
	// +optional
	Address string `json:"address,omitempty"`
	// address6 is the interface's global IPv6 address when the mapping is served on IPv6
	// there: the pod has an IPv6 address and the node serves IPv6 on the interface (the
	// class's node row says ipv6Unavailable when it does not).
	// +optional
	Address6 string `json:"address6,omitempty"`
}

// UnansweredNode is a node whose requests of the mapping go unanswered.
type UnansweredNode struct {
	// node is the node's name.
	Node string `json:"node"`
	// interfaces are the node's interfaces whose requests go unanswered.
	// +listType=set
	Interfaces []string `json:"interfaces"`
	// since is when the controller received the agent's report that showed the first of the
	// unanswered requests.
	Since metav1.Time `json:"since"`
}

// PortMap exposes a Service's pod on a port of its class's accepting nodes.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=pm
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="CLASS",type=string,JSONPath=`.spec.className`
// +kubebuilder:printcolumn:name="PROTOCOL",type=string,JSONPath=`.spec.protocol`
// +kubebuilder:printcolumn:name="PORT",type=string,JSONPath=`.status.ports`
// +kubebuilder:printcolumn:name="ENDPOINT",type=string,JSONPath=`.status.endpoint.address`
// +kubebuilder:printcolumn:name="PROGRAMMED",type=string,JSONPath=`.status.conditions[?(@.type=="Programmed")].status`
// +kubebuilder:printcolumn:name="UNANSWERED",type=string,JSONPath=`.status.unansweredOn`
// +kubebuilder:printcolumn:name="NODE",type=string,JSONPath=`.status.endpoint.node`,priority=1
// +kubebuilder:printcolumn:name="ENDPOINT6",type=string,JSONPath=`.status.endpoint.address6`,priority=1
// +kubebuilder:printcolumn:name="PUBLISHED",type=string,JSONPath=`.status.publishedAddresses`,priority=1
type PortMap struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PortMapSpec   `json:"spec"`
	Status PortMapStatus `json:"status,omitempty"`
}

// PortMapList is a list of PortMap.
//
// +kubebuilder:object:root=true
type PortMapList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PortMap `json:"items"`
}
