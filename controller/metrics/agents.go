package metrics

import (
	"iter"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/compile"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Source is what the agent-side metrics are read from at scrape time; *agents.Registry
// satisfies it.
type Source interface {
	// Nodes lists every known node with its connection and program versions.
	Nodes() []*kuportv1.NodeInfo
	// Program returns a node's current program (nil if none) and its acknowledged version.
	Program(node string) (program *kuportv1.NodeProgram, acked uint64, ok bool)
	// Index returns compile's index of a node's current program: which entries are whose and
	// what each counts.
	Index(node string) compile.NodeIndex
	// Stats returns the rule counters and link statistics of a node's latest Report.
	Stats(node string) ([]agents.Counter, []*kuportv1.LinkStats)
}

// UnansweredSource is a Source that also judges, per node, whether each mapping's requests go
// unanswered (*agents.Registry does): by mapping key, whether any of its DNAT entries on the
// node is unanswered. A Source without it exports no kuport_mapping_unanswered.
type UnansweredSource interface {
	UnansweredMappings(node string) map[string]bool
}

// Directions of a rule's traffic relative to the pod, as compile gives them.
const (
	// DirectionIn is the request side: towards the pod.
	DirectionIn = compile.DirectionIn
	// DirectionOut is the reply side, or a flow the pod opened: from the pod.
	DirectionOut = compile.DirectionOut
)

// Rule is what a counted program entry measures.
type Rule struct {
	// Mapping is the PortMap the entry belongs to.
	Mapping types.NamespacedName
	// Name is the entry's name within the mapping (compile.Entry.Name): "dnat/<interface>",
	// "snat", "snat-reply", "mark", "ct-save/<link>" or "ct-restore", and the IPv6 entries'
	// "dnat6/<interface>", "snat6", ...; for Forwarded rows "forwarded/<interface>", or
	// "forwarded6/<interface>" of an IPv6 DNAT entry.
	Name      string
	Unit      compile.Unit
	Direction string
	// Interface is the interface a DNAT rule matches arrivals on (an accepting interface, or
	// on the pod's node a kup-* link); empty for other rules.
	Interface string
	// Forwarded marks the kup-steer/kup-count-out rows of a DNAT entry (Counter.forwarded_in and
	// forwarded_out): every packet of its flows on the node, in = arriving on
	// Interface towards the pod, out = leaving by it from the pod.
	Forwarded bool
	// OverLink: Interface is one of the mapping's links on the node (compile.Entry.OverLink),
	// so the rule counts traffic that crossed a link; else it faces clients.
	OverLink bool
	// Family is the entry's address family (compile.Entry.Family). The metrics sum an
	// interface's families into one series; the dashboard's path sums them per hop.
	Family compile.Family
}

// Count is a counter's cumulative packets and bytes (IP lengths).
type Count struct{ Packets, Bytes uint64 }

// rule is what entry e of mapping mi (compile's index of a node's program) measures:
//
//	dnat/<if>      kup-pre    flows   in   a new flow arriving on <if> translated
//	snat           kup-post   flows   in   the same flow leaving towards the pod or the link
//	snat-reply     kup-post   flows   out  a flow the pod opened, exempted from the masquerade
//	mark           kup-mangle packets out  a reply packet marked for the link (Single)
//	ct-restore     kup-mangle packets out  a reply packet given its flow's mark (Multi)
//	ct-save/<link> kup-mangle packets in   a request packet arriving over <link> (Multi)
//
// Counted adds each DNAT entry's Forwarded rows from its Counter:
//
//	forwarded/<if> kup-steer      packets in   a packet of its flows arriving on <if>, by dialed port
//	forwarded/<if> kup-count-out  packets out  a packet of its flows leaving by <if>, by dialed port
//
// An IPv6 entry's names carry a "6" on the kind word (dnat6/<if>, snat6, snat6-reply,
// ct-save6/<link>, ct-restore6, forwarded6/<if>) and count the same, for its family.
func rule(mi *compile.MappingIndex, e compile.Entry) Rule {
	return Rule{Mapping: mi.Mapping, Name: e.Name, Unit: e.Kind.Unit(), Direction: e.Direction, Interface: e.Interface,
		OverLink: e.OverLink, Family: e.Family}
}

// Counted pairs each of a node's reported counters with the Rule of index (compile's index
// of the node's current program) it measures, and a DNAT entry's forwarded counts with their
// Forwarded rows, in report order. A counter of an entry the index no longer holds belongs to
// a rule the agent is about to remove: it is left out. It finds each counter's entry in the
// index (compile.NodeIndex.Entry) and builds no map: a map of a node's Rules was most of
// what a sample of the dashboard allocated (BENCHMARKS.md, "Figures moved out of code comments").
func Counted(index compile.NodeIndex, counters []agents.Counter) iter.Seq2[Rule, Count] {
	return func(yield func(Rule, Count) bool) {
		for i := range counters {
			c := &counters[i]
			key, e := index.Entry(c.ID)
			if e == nil {
				continue
			}
			r := rule(index[key], *e)
			if !yield(r, Count{c.Packets, c.Bytes}) {
				return
			}
			for _, f := range []struct {
				dir string
				t   agents.Traffic
				has bool
			}{{DirectionIn, c.ForwardedIn, c.HasIn}, {DirectionOut, c.ForwardedOut, c.HasOut}} {
				fwd := Rule{Mapping: r.Mapping, Name: forwardedPrefix(r.Family) + r.Interface, Unit: compile.UnitPackets,
					Direction: f.dir, Interface: r.Interface, Forwarded: true, OverLink: r.OverLink, Family: r.Family}
				if f.has && !yield(fwd, Count{f.t.Packets, f.t.Bytes}) {
					return
				}
			}
		}
	}
}

// forwardedPrefix begins the name of a DNAT entry's Forwarded rows: an interface's IPv4 and
// IPv6 entries count apart, and their rows stay apart too.
func forwardedPrefix(f compile.Family) string {
	if f == compile.FamilyIPv6 {
		return "forwarded6/"
	}
	return "forwarded/"
}

// unansweredHelp is kuport_mapping_unanswered's help.
const unansweredHelp = "1 while a node forwards a mapping's requests and sees no reply (kuport_mapping_packets_total in rising, out not, on some interface, for the controller's --unanswered-reports consecutive reports spanning --unanswered-window), until a reply arrives; else 0. Another table's forward drop, a CNI bypassing netfilter on the reply path and a pod that does not answer all look like this. One series per node that receives the mapping's requests."

var (
	flowsDesc = prometheus.NewDesc("kuport_mapping_flows_total",
		"New flows a mapping's DNAT rule translated on a node, by arrival interface (kup-pre counts a flow's first packet only). On the pod's node of a cross-node mapping, a kup-* interface counts the same flows again as they arrive over the link.",
		[]string{"namespace", "name", "node", "interface"}, nil)
	packetsDesc = prometheus.NewDesc("kuport_mapping_packets_total",
		"Packets of a mapping's flows on a node, every packet, counted by the port the client dialed (kup-steer before the request's DNAT, kup-count-out after the reply's translation back, both ahead of any firewall, which may still drop them): in = arriving on the interface towards the pod, out = leaving by it from the pod. On the pod's node of a cross-node mapping, a kup-* interface counts the same packets again as they cross the link.",
		[]string{"namespace", "name", "node", "interface", "direction"}, nil)
	bytesDesc = prometheus.NewDesc("kuport_mapping_bytes_total",
		"Bytes (IP packet lengths) of the packets kuport_mapping_packets_total counts.",
		[]string{"namespace", "name", "node", "interface", "direction"}, nil)
	linkTxPacketsDesc = prometheus.NewDesc("kuport_link_tx_packets_total",
		"Packets a kup-* vxlan link device sent, from the node's latest report.", []string{"node", "link", "peer"}, nil)
	linkRxPacketsDesc = prometheus.NewDesc("kuport_link_rx_packets_total",
		"Packets a kup-* vxlan link device received, from the node's latest report.", []string{"node", "link", "peer"}, nil)
	linkTxErrorsDesc = prometheus.NewDesc("kuport_link_tx_errors_total",
		"Transmit errors of a kup-* vxlan link device (one per reply looped back into the device when the pref 101 rule is missing).", []string{"node", "link", "peer"}, nil)
	linkRxErrorsDesc = prometheus.NewDesc("kuport_link_rx_errors_total",
		"Receive errors of a kup-* vxlan link device.", []string{"node", "link", "peer"}, nil)
	unansweredDesc = prometheus.NewDesc("kuport_mapping_unanswered", unansweredHelp,
		[]string{"namespace", "name", "node"}, nil)
	connectedDesc = prometheus.NewDesc("kuport_agents_connected",
		"Agents with an open stream to this controller.", nil, nil)
	programVersionDesc = prometheus.NewDesc("kuport_node_program_version",
		"Version of the node's current program in this leadership term (0: none yet).", []string{"node"}, nil)
	ackedVersionDesc = prometheus.NewDesc("kuport_node_acked_version",
		"Program version the node's agent last acknowledged as applied in this leadership term (0: none).", []string{"node"}, nil)
)

// agentCollector produces the agent-side series from its Source at scrape time.
type agentCollector struct {
	mu  sync.Mutex
	src Source
}

func (c *agentCollector) set(src Source) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.src = src
}

func (c *agentCollector) source() Source {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.src
}

// Describe implements prometheus.Collector.
func (c *agentCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{flowsDesc, packetsDesc, bytesDesc, linkTxPacketsDesc,
		linkRxPacketsDesc, linkTxErrorsDesc, linkRxErrorsDesc, unansweredDesc, connectedDesc, programVersionDesc, ackedVersionDesc} {
		ch <- d
	}
}

// sums adds up counters that share one series' labels.
type sums[L comparable] map[L]*[2]uint64

func (s sums[L]) add(labels L, packets, bytes uint64) {
	v := s[labels]
	if v == nil {
		v = new([2]uint64)
		s[labels] = v
	}
	v[0] += packets
	v[1] += bytes
}

// Collect implements prometheus.Collector.
func (c *agentCollector) Collect(ch chan<- prometheus.Metric) {
	src := c.source()
	if src == nil {
		return
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	var connected uint64
	flows, packets := sums[[4]string]{}, sums[[5]string]{}
	for _, n := range src.Nodes() {
		if n.Connected {
			connected++
		}
		gauge(programVersionDesc, n.ProgramVersion, n.Node)
		gauge(ackedVersionDesc, n.AckedVersion, n.Node)

		program, _, _ := src.Program(n.Node)
		counters, links := src.Stats(n.Node)
		index := src.Index(n.Node)
		if us, ok := src.(UnansweredSource); ok {
			unanswered := us.UnansweredMappings(n.Node)
			for key, mi := range index {
				if !hasDNAT(mi) {
					continue
				}
				var v uint64
				if unanswered[key] {
					v = 1
				}
				gauge(unansweredDesc, v, mi.Mapping.Namespace, mi.Mapping.Name, n.Node)
			}
		}
		for r, ctr := range Counted(index, counters) {
			ns, name := r.Mapping.Namespace, r.Mapping.Name
			switch {
			case r.Forwarded:
				packets.add([5]string{ns, name, n.Node, r.Interface, r.Direction}, ctr.Packets, ctr.Bytes)
			case r.Unit == compile.UnitFlows && r.Interface != "":
				flows.add([4]string{ns, name, n.Node, r.Interface}, ctr.Packets, 0)
			}
		}
		peers := map[string]string{}
		for _, l := range program.GetLinks() {
			peers[l.Name] = l.PeerNode
		}
		for _, l := range links {
			peer := peers[l.Name]
			counter(linkTxPacketsDesc, l.TxPackets, n.Node, l.Name, peer)
			counter(linkRxPacketsDesc, l.RxPackets, n.Node, l.Name, peer)
			counter(linkTxErrorsDesc, l.TxErrors, n.Node, l.Name, peer)
			counter(linkRxErrorsDesc, l.RxErrors, n.Node, l.Name, peer)
		}
	}
	gauge(connectedDesc, connected)
	for k, v := range flows {
		counter(flowsDesc, v[0], k[:]...)
	}
	for k, v := range packets {
		counter(packetsDesc, v[0], k[:]...)
		counter(bytesDesc, v[1], k[:]...)
	}
}

// hasDNAT reports whether mi holds a DNAT entry: a node where the mapping's requests arrive.
func hasDNAT(mi *compile.MappingIndex) bool {
	for _, e := range mi.Entries {
		if e.Kind == compile.KindDNAT {
			return true
		}
	}
	return false
}
