// Package compile is kuport's brain: a pure function from a snapshot of the cluster (and the
// allocations recorded in class status) to one fully resolved NodeProgram per node and the
// status of every PortMap and PortMapClass. It takes no clock, no client and no kernel: the
// caller passes the time as a value. Every rule it emits comes from docs/design/datapath.md;
// every condition and reason from docs/design/api.md.
package compile

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
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
	// ReturnMarking is the return paths' marks, tables and rule prefs (DefaultReturnMarking
	// when zero); the caller has checked it (ReturnMarking.Check).
	ReturnMarking ReturnMarking

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
	// CNI is what the controller read of the CNI's settings; nil when it read none. Compared
	// by identity between snapshots: the controller makes a new one on every change.
	CNI *CNI
}

// AgentState is what the controller knows about one node's agent. Whether its stream is open
// is no input: a disconnected agent's last state still builds the programs, and the status
// writer gates Programmed on the connection (controller/programmed).
type AgentState struct {
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
	// Index by node name, one per program: what each node's program holds for each mapping.
	// The registry, metrics and dashboard read it rather than re-deriving it from the
	// program's ids, interface names, addresses and marks. Incremental shares a mapping's
	// *MappingIndex with the previous result only while the mapping's entries are the same.
	Index map[string]NodeIndex
	// Keys by MappingKey: the namespace/name of every PortMap in PortMaps, so what names a
	// mapping by the key its programs' ids and Index use finds its PortMap without cutting
	// names again.
	Keys map[string]types.NamespacedName
}

// NodeIndex is one node's index: by MappingKey, what the node's program holds for the
// mapping. A mapping with no entry in the program (refused, or carried elsewhere) is absent.
type NodeIndex map[string]*MappingIndex

// Entry returns the entry of ix whose id is id, and its mapping's key; nil when ix has none.
// An entry's id is its mapping's key, "/" and its name, and every key is
// "<namespace>/<name>" (Key, cut past its "/" when long): the key is the id up to its
// second "/", and one lookup finds the entry without an index of ix by id.
func (ix NodeIndex) Entry(id string) (string, *Entry) {
	i := strings.IndexByte(id, '/')
	if i < 0 {
		return "", nil
	}
	j := strings.IndexByte(id[i+1:], '/')
	if j < 0 {
		return "", nil
	}
	if mi := ix[id[:i+1+j]]; mi != nil {
		for k := range mi.Entries {
			if e := &mi.Entries[k]; e.ID == id {
				return e.ID[:i+1+j], e
			}
		}
	}
	return "", nil
}

// MappingIndex is what one node's program holds for one mapping, by the ids compile gave.
type MappingIndex struct {
	Mapping types.NamespacedName
	// ServingNode is the mapping's serving node (docs/design/api.md#portmap): the
	// endpoint's node when it accepts, else the class's first accepting node by name.
	ServingNode string
	// Entries are the mapping's DNAT, SNAT and mark rules in the program, sorted by id. Each
	// is counted under its id (Counter.id).
	Entries []Entry
	// Links are the names of the link devices the entries use, sorted.
	Links []string
	// ReturnPaths are the ids of the return paths its replies take, sorted.
	ReturnPaths []string
}

// EntryKind is the list of the program an entry is in. A byte, so Entry's Kind and OverLink
// share a word: the index holds an Entry per rule of every program.
type EntryKind uint8

const (
	// KindDNAT is a DnatRule, in kup-pre.
	KindDNAT EntryKind = iota + 1
	// KindSNAT is a SnatRule, in kup-post.
	KindSNAT
	// KindMark is a MarkRule, in kup-mangle.
	KindMark
)

// Family is an entry's address family: 4 or 6, the IP version.
type Family uint8

const (
	FamilyIPv4 Family = 4
	FamilyIPv6 Family = 6
)

// Unit says what a counter counts.
type Unit string

const (
	// UnitFlows: the rule sits in a NAT chain (kup-pre, kup-post). Netfilter consults NAT
	// only for a flow's first packet and replays the decision from conntrack for the rest
	// (docs/design/datapath.md#kup-count-out-counting-every-packet), so the counter's
	// packets are new flows and its bytes those of their first packets.
	UnitFlows Unit = "flows"
	// UnitPackets: the rule sits in a filter chain (kup-mangle, or kup-steer and
	// kup-count-out for a DNAT entry's forwarded counts): it counts every packet.
	UnitPackets Unit = "packets"
)

// Unit is what the counter of an entry of kind k counts: a mark rule's every packet, a DNAT
// or SNAT rule's new flows.
func (k EntryKind) Unit() Unit {
	if k == KindMark {
		return UnitPackets
	}
	return UnitFlows
}

// Directions of an entry's traffic relative to the pod.
const (
	// DirectionIn is the request side: towards the pod.
	DirectionIn = "in"
	// DirectionOut is the reply side, or a flow the pod opened: from the pod.
	DirectionOut = "out"
)

// Entry is one counted entry of a mapping in a node's program.
type Entry struct {
	// ID is the entry's id in the program and its Counter's id.
	ID string
	// Name is the entry within the mapping: "dnat/<interface>", "snat", "snat-reply",
	// "mark", "ct-save/<link>" or "ct-restore"; an IPv6 entry's kind word ends in "6":
	// "dnat6/<interface>", "snat6", "snat6-reply", "ct-save6/<link>", "ct-restore6".
	Name string
	Kind EntryKind
	// OverLink: a DNAT entry on the pod's node matching what arrives over one of the mapping's
	// links, so it counts traffic an accepting node already counted; else it faces clients.
	OverLink bool
	// Family is the address family of the entry's addresses: FamilyIPv4 or FamilyIPv6.
	Family Family
	// Direction is DirectionIn or DirectionOut.
	Direction string
	// Interface is the interface a DNAT entry matches arrivals on (an accepting interface or,
	// on the pod's node, a link); empty for other entries.
	Interface string
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

// maxKeyLen is the longest MappingKey: an entry's id is the key, "/" and the entry's name
// (Entry.Name: at most 21 bytes, "dnat6/" or "ct-save6/" and a device name), and the
// datapath refuses an id longer than an nftables comment (127 bytes), which would refuse
// the node's whole program.
const maxKeyLen = 127 - 22

// MappingKey is the "<namespace>/<name>" id programs use for a PortMap's entries. When the
// two are longer than maxKeyLen bytes together (a name may have 253), the key is cut to
// leave room for "~" and the first 8 hex digits of the sha256 of "<namespace>/<name>", so
// every id of the mapping fits and two long names still differ.
func MappingKey(pm *v1alpha1.PortMap) string { return Key(pm.Namespace, pm.Name) }

// Key is MappingKey of the PortMap namespace/name.
func Key(namespace, name string) string {
	k := namespace + "/" + name
	if len(k) <= maxKeyLen {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return k[:maxKeyLen-9] + "~" + hex.EncodeToString(sum[:4])
}
