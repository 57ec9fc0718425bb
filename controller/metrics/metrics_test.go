package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/compile"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// fakeSource is a Source with fixed contents.
type fakeSource struct {
	nodes    []*kuportv1.NodeInfo
	programs map[string]*kuportv1.NodeProgram
	index    map[string]compile.NodeIndex
	counters map[string][]agents.Counter
	links    map[string][]*kuportv1.LinkStats
}

func (f *fakeSource) Nodes() []*kuportv1.NodeInfo { return f.nodes }

func (f *fakeSource) Program(node string) (*kuportv1.NodeProgram, uint64, bool) {
	p, ok := f.programs[node]
	return p, 0, ok
}

func (f *fakeSource) Index(node string) compile.NodeIndex { return f.index[node] }

func (f *fakeSource) Stats(node string) ([]agents.Counter, []*kuportv1.LinkStats) {
	return f.counters[node], f.links[node]
}

// entry is compile's index entry name of mapping m.
func entry(m, name string, kind compile.EntryKind, dir, iface string) compile.Entry {
	return compile.Entry{ID: m + "/" + name, Name: name, Kind: kind, Direction: dir, Interface: iface}
}

func dnat(m, iface string) compile.Entry {
	return entry(m, "dnat/"+iface, compile.KindDNAT, DirectionIn, iface)
}

// linkDnat is the DNAT entry of m on the pod's node matching arrivals over link.
func linkDnat(m, link string) compile.Entry {
	e := dnat(m, link)
	e.OverLink = true
	return e
}

// labSource is the lab's cross-node Single mapping demo/remote-udp (edge-a forwards to
// web-b on worker-b) plus a Multi mapping demo/shared whose pod is on worker-b. The programs
// hold only their links: what the counted entries are comes from the index.
func labSource() *fakeSource {
	const m, s = "demo/remote-udp", "demo/shared"
	remote := types.NamespacedName{Namespace: "demo", Name: "remote-udp"}
	shared := types.NamespacedName{Namespace: "demo", Name: "shared"}
	return &fakeSource{
		nodes: []*kuportv1.NodeInfo{
			{Node: "edge-a", Connected: true, ProgramVersion: 4, AckedVersion: 4},
			{Node: "worker-b", Connected: true, ProgramVersion: 7, AckedVersion: 6},
			{Node: "worker-c", Connected: false},
		},
		programs: map[string]*kuportv1.NodeProgram{
			"edge-a":   {Links: []*kuportv1.Link{{Name: "kup-5e30a797", PeerNode: "worker-b"}}},
			"worker-b": {Links: []*kuportv1.Link{{Name: "kup-dcc4266d", PeerNode: "edge-a"}}},
		},
		index: map[string]compile.NodeIndex{
			"edge-a": {m: {Mapping: remote, ServingNode: "edge-a", Links: []string{"kup-5e30a797"}, Entries: []compile.Entry{
				dnat(m, "enp1s0"), dnat(m, "wt0"), entry(m, "snat", compile.KindSNAT, DirectionIn, ""),
			}}},
			"worker-b": {
				m: {Mapping: remote, ServingNode: "edge-a", Links: []string{"kup-dcc4266d"}, Entries: []compile.Entry{
					linkDnat(m, "kup-dcc4266d"),
					entry(m, "mark", compile.KindMark, DirectionOut, ""),
					entry(m, "snat", compile.KindSNAT, DirectionIn, ""),
					entry(m, "snat-reply", compile.KindSNAT, DirectionOut, ""),
				}},
				s: {Mapping: shared, ServingNode: "edge-a", Links: []string{"kup-1", "kup-2"}, Entries: []compile.Entry{
					entry(s, "ct-restore", compile.KindMark, DirectionOut, ""),
					entry(s, "ct-save/kup-1", compile.KindMark, DirectionIn, ""),
					entry(s, "ct-save/kup-2", compile.KindMark, DirectionIn, ""),
					linkDnat(s, "kup-1"), linkDnat(s, "kup-2"),
				}},
			},
		},
		counters: map[string][]agents.Counter{
			"edge-a": {
				{ID: m + "/dnat/enp1s0", Packets: 3, Bytes: 180,
					ForwardedIn: agents.Traffic{Packets: 503, Bytes: 30180}, HasIn: true, ForwardedOut: agents.Traffic{Packets: 500, Bytes: 30000}, HasOut: true},
				{ID: m + "/dnat/wt0", Packets: 0, ForwardedIn: agents.Traffic{}, HasIn: true, ForwardedOut: agents.Traffic{}, HasOut: true},
				{ID: m + "/snat", Packets: 3, Bytes: 180},
				{ID: "demo/gone/dnat/enp1s0", Packets: 9, Bytes: 9}, // no longer in the program
			},
			"worker-b": {
				{ID: m + "/dnat/kup-dcc4266d", Packets: 3, Bytes: 180,
					ForwardedIn: agents.Traffic{Packets: 503, Bytes: 30180}, HasIn: true, ForwardedOut: agents.Traffic{Packets: 500, Bytes: 30000}, HasOut: true},
				{ID: m + "/snat", Packets: 3, Bytes: 180},
				{ID: m + "/snat-reply", Packets: 0},
				{ID: m + "/mark", Packets: 500, Bytes: 30000},
				{ID: s + "/dnat/kup-1", Packets: 1, Bytes: 60, ForwardedIn: agents.Traffic{Packets: 10, Bytes: 600}, HasIn: true, ForwardedOut: agents.Traffic{Packets: 9, Bytes: 540}, HasOut: true},
				{ID: s + "/dnat/kup-2", Packets: 1, Bytes: 60, ForwardedIn: agents.Traffic{Packets: 5, Bytes: 300}, HasIn: true, ForwardedOut: agents.Traffic{Packets: 6, Bytes: 360}, HasOut: true},
				{ID: s + "/ct-save/kup-1", Packets: 10, Bytes: 600},
				{ID: s + "/ct-save/kup-2", Packets: 5, Bytes: 300},
				{ID: s + "/ct-restore", Packets: 15, Bytes: 900},
			},
		},
		links: map[string][]*kuportv1.LinkStats{
			"edge-a":   {{Name: "kup-5e30a797", TxPackets: 503, RxPackets: 500}},
			"worker-b": {{Name: "kup-dcc4266d", TxPackets: 500, RxPackets: 503, TxErrors: 2}},
		},
	}
}

// rules is rule for every entry of index, by id.
func rules(index compile.NodeIndex) map[string]Rule {
	out := map[string]Rule{}
	for _, mi := range index {
		for _, e := range mi.Entries {
			out[e.ID] = rule(mi, e)
		}
	}
	return out
}

func TestRules(t *testing.T) {
	remote := types.NamespacedName{Namespace: "demo", Name: "remote-udp"}
	byID := rules(labSource().index["worker-b"])
	// worker-b's DNAT rule matches arrivals over the mapping's link: OverLink.
	assert.Equal(t, Rule{Mapping: remote, Name: "dnat/kup-dcc4266d", Unit: compile.UnitFlows, Direction: DirectionIn, Interface: "kup-dcc4266d", OverLink: true},
		byID["demo/remote-udp/dnat/kup-dcc4266d"])
	assert.Equal(t, Rule{Mapping: remote, Name: "snat-reply", Unit: compile.UnitFlows, Direction: DirectionOut},
		byID["demo/remote-udp/snat-reply"])
	assert.Equal(t, Rule{Mapping: remote, Name: "mark", Unit: compile.UnitPackets, Direction: DirectionOut},
		byID["demo/remote-udp/mark"])
	assert.Equal(t, Rule{Mapping: types.NamespacedName{Namespace: "demo", Name: "shared"}, Name: "ct-save/kup-2", Unit: compile.UnitPackets, Direction: DirectionIn},
		byID["demo/shared/ct-save/kup-2"])
	assert.Len(t, byID, 9)
	// edge-a's accepting interface faces clients.
	assert.Equal(t, Rule{Mapping: remote, Name: "dnat/enp1s0", Unit: compile.UnitFlows, Direction: DirectionIn, Interface: "enp1s0"},
		rules(labSource().index["edge-a"])["demo/remote-udp/dnat/enp1s0"])
	assert.Empty(t, rules(nil))
}

func TestAgentCollector(t *testing.T) {
	c := &agentCollector{}
	assert.Zero(t, testutil.CollectAndCount(c), "no source: no series")
	c.set(labSource())
	want := `
# HELP kuport_agents_connected Agents with an open stream to this controller.
# TYPE kuport_agents_connected gauge
kuport_agents_connected 2
# HELP kuport_mapping_flows_total New flows a mapping's DNAT rule translated on a node, by arrival interface (kup-pre counts a flow's first packet only). On the pod's node of a cross-node mapping, a kup-* interface counts the same flows again as they arrive over the link.
# TYPE kuport_mapping_flows_total counter
kuport_mapping_flows_total{interface="enp1s0",name="remote-udp",namespace="demo",node="edge-a"} 3
kuport_mapping_flows_total{interface="wt0",name="remote-udp",namespace="demo",node="edge-a"} 0
kuport_mapping_flows_total{interface="kup-dcc4266d",name="remote-udp",namespace="demo",node="worker-b"} 3
kuport_mapping_flows_total{interface="kup-1",name="shared",namespace="demo",node="worker-b"} 1
kuport_mapping_flows_total{interface="kup-2",name="shared",namespace="demo",node="worker-b"} 1
# HELP kuport_mapping_packets_total Packets of a mapping's flows on a node, every packet, counted by the port the client dialed (kup-steer before the request's DNAT, kup-count-out after the reply's translation back, both ahead of any firewall, which may still drop them): in = arriving on the interface towards the pod, out = leaving by it from the pod. On the pod's node of a cross-node mapping, a kup-* interface counts the same packets again as they cross the link.
# TYPE kuport_mapping_packets_total counter
kuport_mapping_packets_total{direction="in",interface="enp1s0",name="remote-udp",namespace="demo",node="edge-a"} 503
kuport_mapping_packets_total{direction="out",interface="enp1s0",name="remote-udp",namespace="demo",node="edge-a"} 500
kuport_mapping_packets_total{direction="in",interface="wt0",name="remote-udp",namespace="demo",node="edge-a"} 0
kuport_mapping_packets_total{direction="out",interface="wt0",name="remote-udp",namespace="demo",node="edge-a"} 0
kuport_mapping_packets_total{direction="in",interface="kup-dcc4266d",name="remote-udp",namespace="demo",node="worker-b"} 503
kuport_mapping_packets_total{direction="out",interface="kup-dcc4266d",name="remote-udp",namespace="demo",node="worker-b"} 500
kuport_mapping_packets_total{direction="in",interface="kup-1",name="shared",namespace="demo",node="worker-b"} 10
kuport_mapping_packets_total{direction="out",interface="kup-1",name="shared",namespace="demo",node="worker-b"} 9
kuport_mapping_packets_total{direction="in",interface="kup-2",name="shared",namespace="demo",node="worker-b"} 5
kuport_mapping_packets_total{direction="out",interface="kup-2",name="shared",namespace="demo",node="worker-b"} 6
# HELP kuport_mapping_bytes_total Bytes (IP packet lengths) of the packets kuport_mapping_packets_total counts.
# TYPE kuport_mapping_bytes_total counter
kuport_mapping_bytes_total{direction="in",interface="enp1s0",name="remote-udp",namespace="demo",node="edge-a"} 30180
kuport_mapping_bytes_total{direction="out",interface="enp1s0",name="remote-udp",namespace="demo",node="edge-a"} 30000
kuport_mapping_bytes_total{direction="in",interface="wt0",name="remote-udp",namespace="demo",node="edge-a"} 0
kuport_mapping_bytes_total{direction="out",interface="wt0",name="remote-udp",namespace="demo",node="edge-a"} 0
kuport_mapping_bytes_total{direction="in",interface="kup-dcc4266d",name="remote-udp",namespace="demo",node="worker-b"} 30180
kuport_mapping_bytes_total{direction="out",interface="kup-dcc4266d",name="remote-udp",namespace="demo",node="worker-b"} 30000
kuport_mapping_bytes_total{direction="in",interface="kup-1",name="shared",namespace="demo",node="worker-b"} 600
kuport_mapping_bytes_total{direction="out",interface="kup-1",name="shared",namespace="demo",node="worker-b"} 540
kuport_mapping_bytes_total{direction="in",interface="kup-2",name="shared",namespace="demo",node="worker-b"} 300
kuport_mapping_bytes_total{direction="out",interface="kup-2",name="shared",namespace="demo",node="worker-b"} 360
# HELP kuport_link_tx_errors_total Transmit errors of a kup-* vxlan link device (one per reply looped back into the device when the pref 101 rule is missing).
# TYPE kuport_link_tx_errors_total counter
kuport_link_tx_errors_total{link="kup-5e30a797",node="edge-a",peer="worker-b"} 0
kuport_link_tx_errors_total{link="kup-dcc4266d",node="worker-b",peer="edge-a"} 2
# HELP kuport_link_tx_packets_total Packets a kup-* vxlan link device sent, from the node's latest report.
# TYPE kuport_link_tx_packets_total counter
kuport_link_tx_packets_total{link="kup-5e30a797",node="edge-a",peer="worker-b"} 503
kuport_link_tx_packets_total{link="kup-dcc4266d",node="worker-b",peer="edge-a"} 500
# HELP kuport_node_acked_version Program version the node's agent last acknowledged as applied in this leadership term (0: none).
# TYPE kuport_node_acked_version gauge
kuport_node_acked_version{node="edge-a"} 4
kuport_node_acked_version{node="worker-b"} 6
kuport_node_acked_version{node="worker-c"} 0
# HELP kuport_node_program_version Version of the node's current program in this leadership term (0: none yet).
# TYPE kuport_node_program_version gauge
kuport_node_program_version{node="edge-a"} 4
kuport_node_program_version{node="worker-b"} 7
kuport_node_program_version{node="worker-c"} 0
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want),
		"kuport_agents_connected", "kuport_mapping_flows_total", "kuport_mapping_packets_total", "kuport_mapping_bytes_total",
		"kuport_link_tx_errors_total", "kuport_link_tx_packets_total", "kuport_node_acked_version", "kuport_node_program_version"))
	assert.Equal(t, 2, testutil.CollectAndCount(c, "kuport_link_rx_packets_total"))
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// unansweredSource is labSource judging demo/remote-udp unanswered on edge-a.
type unansweredSource struct{ *fakeSource }

func (unansweredSource) UnansweredMappings(node string) map[string]bool {
	if node == "edge-a" {
		return map[string]bool{"demo/remote-udp": true}
	}
	return map[string]bool{}
}

func TestUnansweredGauge(t *testing.T) {
	c := &agentCollector{}
	c.set(labSource())
	assert.Zero(t, testutil.CollectAndCount(c, "kuport_mapping_unanswered"), "a source that does not judge: no series")
	c.set(unansweredSource{labSource()})
	want := `
# HELP kuport_mapping_unanswered ` + unansweredHelp + `
# TYPE kuport_mapping_unanswered gauge
kuport_mapping_unanswered{name="remote-udp",namespace="demo",node="edge-a"} 1
kuport_mapping_unanswered{name="remote-udp",namespace="demo",node="worker-b"} 0
kuport_mapping_unanswered{name="shared",namespace="demo",node="worker-b"} 0
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "kuport_mapping_unanswered"))
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

func TestPushTracker(t *testing.T) {
	before := histogramCount(t)
	t0 := time.Unix(1000, 0)
	node := func(program, acked uint64) []*kuportv1.NodeInfo {
		return []*kuportv1.NodeInfo{{Node: "edge-a", ProgramVersion: program, AckedVersion: acked}}
	}
	var tr PushTracker
	tr.Observe(node(1, 0), t0)
	tr.Observe(node(2, 0), t0.Add(100*time.Millisecond))
	assert.Equal(t, before, histogramCount(t), "nothing acknowledged yet")
	// The agent skipped version 1: both are live once 2 is acknowledged.
	tr.Observe(node(2, 2), t0.Add(300*time.Millisecond))
	assert.Equal(t, before+2, histogramCount(t))
	tr.Observe(node(2, 2), t0.Add(time.Second))
	assert.Equal(t, before+2, histogramCount(t), "an acknowledgement is observed once")
	// A new term's registry numbers from 1 again.
	tr.Observe(node(1, 0), t0.Add(2*time.Second))
	tr.Observe(node(1, 1), t0.Add(2*time.Second+50*time.Millisecond))
	assert.Equal(t, before+3, histogramCount(t))
	tr.Observe(nil, t0.Add(3*time.Second))
	assert.Empty(t, tr.nodes, "nodes no longer listed are forgotten")
	tr.Acked("edge-a", 1, t0.Add(4*time.Second))
	assert.Equal(t, before+3, histogramCount(t), "an ack of a node not listed is no observation")
}

// TestPushTrackerAcked: an acknowledgement taken alone observes the versions stored up to it,
// once, and leaves later ones pending.
func TestPushTrackerAcked(t *testing.T) {
	before := histogramCount(t)
	t0 := time.Unix(1000, 0)
	var tr PushTracker
	tr.Observe([]*kuportv1.NodeInfo{{Node: "edge-a", ProgramVersion: 1}}, t0)
	tr.Observe([]*kuportv1.NodeInfo{{Node: "edge-a", ProgramVersion: 2}}, t0.Add(time.Second))
	tr.Acked("edge-a", 1, t0.Add(2*time.Second))
	assert.Equal(t, before+1, histogramCount(t))
	tr.Acked("edge-a", 1, t0.Add(3*time.Second))
	assert.Equal(t, before+1, histogramCount(t), "an acknowledgement is observed once")
	tr.Acked("edge-a", 2, t0.Add(3*time.Second))
	assert.Equal(t, before+2, histogramCount(t))
	// Observe after the acks finds nothing left to observe.
	tr.Observe([]*kuportv1.NodeInfo{{Node: "edge-a", ProgramVersion: 2, AckedVersion: 2}}, t0.Add(4*time.Second))
	assert.Equal(t, before+2, histogramCount(t))
}

// histogramCount is the number of push-to-ack observations so far.
func histogramCount(t *testing.T) uint64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	pushToAckSeconds.Collect(ch)
	var m dto.Metric
	require.NoError(t, (<-ch).Write(&m))
	return m.GetHistogram().GetSampleCount()
}

func TestSetRefusals(t *testing.T) {
	cond := func(typ string, ok bool, reason string) metav1.Condition {
		st := metav1.ConditionFalse
		if ok {
			st = metav1.ConditionTrue
		}
		return metav1.Condition{Type: typ, Status: st, Reason: reason}
	}
	res := func(conds ...metav1.Condition) *compile.PortMapResult {
		return &compile.PortMapResult{Status: v1alpha1.PortMapStatus{Conditions: conds}}
	}
	SetRefusals(map[types.NamespacedName]*compile.PortMapResult{
		{Namespace: "demo", Name: "a"}: res(cond(v1alpha1.ConditionAccepted, true, v1alpha1.ReasonValid),
			cond(v1alpha1.ConditionProgrammed, true, v1alpha1.ReasonAllNodesReady)),
		{Namespace: "demo", Name: "b"}: res(cond(v1alpha1.ConditionAccepted, false, v1alpha1.ReasonPortConflict),
			cond(v1alpha1.ConditionProgrammed, false, v1alpha1.ReasonNotAccepted)),
		{Namespace: "demo", Name: "c"}: res(cond(v1alpha1.ConditionAccepted, true, v1alpha1.ReasonValid),
			cond(v1alpha1.ConditionProgrammed, false, v1alpha1.ReasonReturnPathUnavailable)),
		{Namespace: "demo", Name: "d"}: res(cond(v1alpha1.ConditionAccepted, true, v1alpha1.ReasonValid),
			cond(v1alpha1.ConditionProgrammed, false, v1alpha1.ReasonReturnPathUnavailable)),
	})
	assert.Equal(t, 1.0, testutil.ToFloat64(refusals.WithLabelValues(v1alpha1.ReasonPortConflict)))
	assert.Equal(t, 2.0, testutil.ToFloat64(refusals.WithLabelValues(v1alpha1.ReasonReturnPathUnavailable)))
	assert.Equal(t, 0.0, testutil.ToFloat64(refusals.WithLabelValues(v1alpha1.ReasonNoReadyEndpoint)))
	assert.Equal(t, len(refusalReasons), testutil.CollectAndCount(refusals), "every reason has a series")

	SetRefusals(nil)
	assert.Equal(t, 0.0, testutil.ToFloat64(refusals.WithLabelValues(v1alpha1.ReasonReturnPathUnavailable)), "a cleared refusal reads 0")
}

func TestHandler(t *testing.T) {
	ObserveCompile(3 * time.Millisecond)
	SetLeader(labSource())
	t.Cleanup(func() { SetLeader(nil) })

	body := scrape(t)
	for _, want := range []string{
		"kuport_leader 1",
		"kuport_compile_duration_seconds_count",
		"kuport_program_push_to_ack_seconds_bucket",
		`kuport_refusals{reason="PortConflict"}`,
		`kuport_mapping_packets_total{direction="out",interface="enp1s0",name="remote-udp",namespace="demo",node="edge-a"} 500`,
		"go_goroutines",
	} {
		assert.Contains(t, body, want)
	}

	problems, err := testutil.GatherAndLint(registry)
	require.NoError(t, err)
	assert.Empty(t, problems, "metric names, help and units follow Prometheus conventions")

	SetLeader(nil)
	body = scrape(t)
	assert.Contains(t, body, "kuport_leader 0")
	assert.NotContains(t, body, "kuport_agents_connected", "a follower has no agent-side series")
}

func scrape(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// An interface's IPv6 DNAT entry counts apart from its IPv4 one: its Forwarded rows are
// named forwarded6/<if>, and the series, by interface, sum both families.
func TestIPv6EntriesSumIntoTheInterfaceSeries(t *testing.T) {
	const m = "demo/remote-udp"
	src := labSource()
	v6 := entry(m, "dnat6/enp1s0", compile.KindDNAT, DirectionIn, "enp1s0")
	v6.Family = compile.FamilyIPv6
	mi := src.index["edge-a"][m]
	mi.Entries = append(mi.Entries, v6)
	src.counters["edge-a"] = append(src.counters["edge-a"], agents.Counter{ID: m + "/dnat6/enp1s0", Packets: 2, Bytes: 160,
		ForwardedIn: agents.Traffic{Packets: 7, Bytes: 700}, HasIn: true, ForwardedOut: agents.Traffic{Packets: 4, Bytes: 400}, HasOut: true})
	var names []string
	for r := range Counted(src.index["edge-a"], src.counters["edge-a"]) {
		if r.Interface == "enp1s0" {
			names = append(names, r.Name)
		}
	}
	assert.Equal(t, []string{"dnat/enp1s0", "forwarded/enp1s0", "forwarded/enp1s0", "dnat6/enp1s0", "forwarded6/enp1s0",
		"forwarded6/enp1s0"}, names)
	c := &agentCollector{}
	c.set(src)
	want := `
# HELP kuport_mapping_flows_total New flows a mapping's DNAT rule translated on a node, by arrival interface (kup-pre counts a flow's first packet only). On the pod's node of a cross-node mapping, a kup-* interface counts the same flows again as they arrive over the link.
# TYPE kuport_mapping_flows_total counter
kuport_mapping_flows_total{interface="enp1s0",name="remote-udp",namespace="demo",node="edge-a"} 5
kuport_mapping_flows_total{interface="wt0",name="remote-udp",namespace="demo",node="edge-a"} 0
kuport_mapping_flows_total{interface="kup-dcc4266d",name="remote-udp",namespace="demo",node="worker-b"} 3
kuport_mapping_flows_total{interface="kup-1",name="shared",namespace="demo",node="worker-b"} 1
kuport_mapping_flows_total{interface="kup-2",name="shared",namespace="demo",node="worker-b"} 1
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "kuport_mapping_flows_total"))
}
