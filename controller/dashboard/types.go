package dashboard

import (
	"time"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/compile"
)

// State is everything the page's overview shows: counts and problems over every mapping,
// nodes, links and classes, and the query's page of mappings.
type State struct {
	// Leader is false on a replica that does not lead: it has nothing else to show.
	Leader   bool      `json:"leader"`
	Time     time.Time `json:"time"`
	Overview Overview  `json:"overview"`
	Classes  []Class   `json:"classes"`
	Nodes    []Node    `json:"nodes"`
	Links    []Link    `json:"links"`
	// Query is the query the page answers, its limit defaulted.
	Query Query `json:"query"`
	// Total is how many mappings match the query; Mappings are those from Query.Offset on,
	// at most Query.Limit, sorted by namespace and name.
	Total    int       `json:"total"`
	Mappings []Mapping `json:"mappings"`
}

// Condition is a status condition; Status is "Unknown" when the object has none yet.
type Condition struct {
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Class is one PortMapClass.
type Class struct {
	Name        string    `json:"name"`
	ServingMode string    `json:"servingMode"`
	ReturnPath  string    `json:"returnPath"`
	Ready       Condition `json:"ready"`
	// Nodes are the accepting nodes, sorted.
	Nodes []string `json:"nodes"`
}

// Node is one node as the agent registry knows it.
type Node struct {
	Name              string `json:"name"`
	Connected         bool   `json:"connected"`
	AgentVersion      string `json:"agentVersion"`
	UnderlayInterface string `json:"underlayInterface"`
	// UnderlayMTU in bytes; 0 while the agent has not reported its underlay.
	UnderlayMTU    uint32 `json:"underlayMTU"`
	ProgramVersion uint64 `json:"programVersion"`
	AckedVersion   uint64 `json:"ackedVersion"`
}

// Link is one vxlan link of a class between two nodes.
type Link struct {
	Class string `json:"class"`
	// Ends are the nodes whose programs hold the link, sorted by node: two once both are
	// programmed.
	Ends []LinkEnd `json:"ends"`
}

// LinkEnd is one node's device of a link and its latest reported statistics.
type LinkEnd struct {
	Node     string `json:"node"`
	Device   string `json:"device"`
	PeerNode string `json:"peerNode"`
	Address  string `json:"address"`
	VNI      uint32 `json:"vni"`
	// MTU in bytes.
	MTU uint32 `json:"mtu"`
	// Reported is false while the node's latest report has no statistics for the device.
	Reported  bool   `json:"reported"`
	TxPackets uint64 `json:"txPackets"`
	RxPackets uint64 `json:"rxPackets"`
	TxErrors  uint64 `json:"txErrors"`
	RxErrors  uint64 `json:"rxErrors"`
	// TxPerSecond, RxPerSecond and TxErrorsPerSecond are the rates of Run's samples (nil:
	// not known yet); TxErrorsPerSecond above 0 is a problem.
	TxPerSecond       *float64 `json:"txPerSecond"`
	RxPerSecond       *float64 `json:"rxPerSecond"`
	TxErrorsPerSecond *float64 `json:"txErrorsPerSecond"`
	// History of RxPerSecond (In) and TxPerSecond (Out).
	History *History `json:"history,omitempty"`
}

// Mapping is one PortMap with its counters.
type Mapping struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Class     string `json:"class"`
	Protocol  string `json:"protocol"`
	// Ports is "27015" or "27015-27115".
	Ports    string                   `json:"ports"`
	Endpoint *v1alpha1.EndpointStatus `json:"endpoint,omitempty"`
	// ServingNode is the node status is about (docs/design/api.md#portmap), as compile's
	// index has it; empty while no program carries the mapping.
	ServingNode string `json:"servingNode,omitempty"`
	// Nodes are the nodes whose programs carry the mapping (compile's index), sorted.
	Nodes []string `json:"nodes"`
	// Published are the addresses clients dial, one per interface, as status has them.
	Published []v1alpha1.PublishedAddress `json:"published"`
	Accepted  Condition                   `json:"accepted"`
	// Programmed is the condition as written (True once every carrying node acknowledged).
	Programmed Condition `json:"programmed"`
	// State sums the conditions up: StateProgrammed, StateRefused or StateWaiting.
	State string `json:"state"`
	// Unanswered lists the nodes and interfaces where the mapping's requests arrive and no
	// reply leaves (agents.Judge), sorted; empty while every one is answered or idle.
	Unanswered []Unanswered `json:"unanswered"`
	Counters   []Counter    `json:"counters"`
	// History of the packets/s arriving from clients (In) and leaving to them (Out) at the
	// accepting interfaces.
	History *History `json:"history,omitempty"`
}

// Unanswered is one DNAT entry of a mapping whose requests go unanswered on its node.
type Unanswered struct {
	Node      string `json:"node"`
	Interface string `json:"interface"`
	// Since is when the report that showed the first unanswered request arrived.
	Since time.Time `json:"since"`
	// Requests arrived since the last reply (replies since: 0).
	Requests uint64 `json:"requests"`
}

// Counter is one rule of a mapping on one node: its cumulative values from the node's
// latest report and their rates (see metrics.Rule and metrics.Counted for what each rule counts).
type Counter struct {
	Node      string       `json:"node"`
	Rule      string       `json:"rule"`
	Unit      compile.Unit `json:"unit"`
	Direction string       `json:"direction"`
	Packets   uint64       `json:"packets"`
	Bytes     uint64       `json:"bytes"`
	Rate

	// interfaceName is the interface a forwarded row counts on, forwarded whether it is
	// one, and overLink whether that interface is one of the mapping's links on the node
	// (metrics.Rule.OverLink): else it faces clients.
	interfaceName       string
	forwarded, overLink bool
}
