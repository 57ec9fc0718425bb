// Package compile is kuport's brain: a pure function from a snapshot of the cluster (and the
// allocations recorded in class status) to one fully resolved NodeProgram per node and the
// status of every PortMap and PortMapClass. It takes no clock, no client and no kernel: the
// caller passes the time as a value. Every rule it emits comes from the founding document
// (spec/seed-datapath.md) as corrected by DESIGN.md; every condition and reason from API.md.
package compile

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Snapshot is everything compile reads. The caller copies it out of informer caches and
// the agent registry; compile never mutates it.
type Snapshot struct {
	// Now is the time the snapshot was taken: it stamps and ages links' unusedSince.
	Now time.Time
	// LinkRetention is how long an unused slot claim is kept before it is dropped (24 h).
	LinkRetention time.Duration

	// Classes by name. Their status.links are the recorded slot claims (the previous allocations).
	Classes map[string]*v1alpha1.PortMapClass
	// PortMaps in any order; compile orders them by creationTimestamp, then namespace/name,
	// to decide which one holds a contested port.
	PortMaps []*v1alpha1.PortMap
	// Services by namespace/name.
	Services map[types.NamespacedName]*corev1.Service
	// EndpointSlices by the namespace/name of their Service (label kubernetes.io/service-name).
	EndpointSlices map[types.NamespacedName][]*discoveryv1.EndpointSlice
	// Namespaces by name (their labels feed namespaceSelector).
	Namespaces map[string]*corev1.Namespace
	// Nodes by name: a class node with no Node object is skipped.
	Nodes map[string]*corev1.Node
	// Agents by node name: what each node's agent last reported (kept after a disconnect).
	Agents map[string]*AgentState
}

// AgentState is what the controller knows about one node's agent.
type AgentState struct {
	// Connected is true while the agent's stream is open.
	Connected bool
	// State is the node state from the agent's latest Hello or Report.
	State *kuportv1.NodeState
}

// Result is compile's output.
type Result struct {
	// Programs by node name: the content of each node's program (version and epoch zero; the
	// program store numbers them). Every node in Snapshot.Nodes has an entry, empty when the
	// node carries nothing.
	Programs map[string]*kuportv1.NodeProgram
	// PortMaps by namespace/name.
	PortMaps map[types.NamespacedName]*PortMapResult
	// Classes by name: the full status to write (conditions, node rows, link claims).
	Classes map[string]*v1alpha1.PortMapClassStatus
}

// PortMapResult is the compiled state of one PortMap.
type PortMapResult struct {
	// Status to write. When compile finds nothing wrong, Programmed is True with reason
	// AllNodesReady; the status writer downgrades it to False/NodeNotReady until every node
	// in Nodes has acknowledged a program version that contains the mapping's entries.
	Status v1alpha1.PortMapStatus
	// Nodes whose programs carry entries of this mapping, sorted.
	Nodes []string
}

// MappingKey is the "<namespace>/<name>" id programs use for a PortMap's entries.
func MappingKey(pm *v1alpha1.PortMap) string { return pm.Namespace + "/" + pm.Name }
