package dashboard

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/compile"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// flowingAgents is fakeAgents with the forwarded counts of a stream of 50 packets a second
// by its clock: requests on edge-a's enp1s0 and over the link on worker-b and, while
// answering, as many replies. While not answering, the registry judges both unanswered.
type flowingAgents struct {
	*fakeAgents
	mu        sync.Mutex
	start     time.Time
	clock     func() time.Time
	replies   uint64 // when answering stopped
	answering bool
}

func newFlowing(clock func() time.Time) *flowingAgents {
	return &flowingAgents{fakeAgents: &fakeAgents{}, start: clock(), clock: clock, answering: true}
}

// requests is how many requests arrived by now.
func (f *flowingAgents) requests() uint64 { return uint64(50 * f.clock().Sub(f.start) / time.Second) }

func (f *flowingAgents) setAnswering(v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answering, f.replies = v, f.requests()
}

func (f *flowingAgents) Stats(node string) ([]agents.Counter, []*kuportv1.LinkStats) {
	ctrs, links := f.fakeAgents.Stats(node)
	f.mu.Lock()
	defer f.mu.Unlock()
	requests, replies := f.requests(), f.replies
	if f.answering {
		replies = requests
	}
	for i := range ctrs {
		if c := &ctrs[i]; strings.Contains(c.ID, "/dnat/") {
			c.ForwardedIn, c.HasIn = agents.Traffic{Packets: requests, Bytes: 100 * requests}, true
			c.ForwardedOut, c.HasOut = agents.Traffic{Packets: replies, Bytes: 100 * replies}, true
		}
	}
	for _, l := range links {
		l.TxPackets += requests
		l.RxPackets += replies
	}
	return ctrs, links
}

func (f *flowingAgents) Unanswered(node string) map[string][]agents.InterfaceVerdict {
	f.mu.Lock()
	defer f.mu.Unlock()
	iface := map[string]string{"edge-a": "enp1s0", "worker-b": "kup-dcc4266d"}[node]
	return map[string][]agents.InterfaceVerdict{remote: {{Interface: iface,
		Verdict: agents.Verdict{Unanswered: !f.answering, Since: unansweredSince, Requests: 7}}}}
}

// TestPath: the cross-node mapping's path is one branch from edge-a's enp1s0 over the link
// to worker-b, rated from the forwarded counters; it breaks at the pod once the registry
// judges the requests unanswered on both nodes.
func TestPath(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	now := t0
	f := newFlowing(func() time.Time { return now })
	s := New()
	s.SetSource(labSource(f))
	s.State(t0)
	for i := 1; i <= 3; i++ {
		now = t0.Add(time.Duration(i) * time.Second)
		s.sample(now)
	}
	d := s.Mapping(t0.Add(3*time.Second), types.NamespacedName{Namespace: "demo", Name: "remote-udp"})
	require.NotNil(t, d.Mapping)
	require.NotNil(t, d.Path)
	assert.Equal(t, "worker-b", d.Path.PodNode)
	assert.Equal(t, "10.244.18.107", d.Path.Pod)
	require.Len(t, d.Path.Branches, 1)
	b := d.Path.Branches[0]
	assert.Equal(t, "edge-a", b.Node)
	require.Len(t, b.Interfaces, 1)
	assert.Equal(t, "enp1s0", b.Interfaces[0].Interface)
	assert.Equal(t, []string{"203.0.113.9"}, b.Interfaces[0].Addresses)
	require.NotNil(t, b.Interfaces[0].InPerSecond)
	assert.Equal(t, 50.0, *b.Interfaces[0].InPerSecond, "50 requests a report, a report a second")
	assert.Equal(t, 50.0, *b.Interfaces[0].OutPerSecond)
	assert.Equal(t, HealthOK, b.Interfaces[0].Health)
	require.NotNil(t, b.Link)
	assert.Equal(t, "kup-5e30a797", b.Link.Device)
	assert.Equal(t, uint32(1350), b.Link.MTU)
	require.NotNil(t, b.Arrival)
	assert.Equal(t, Hop{Node: "worker-b", Interface: "kup-dcc4266d", Addresses: []string{}, InPerSecond: ptr(50.0),
		OutPerSecond: ptr(50.0), InPackets: 150, OutPackets: 150, Health: HealthOK}, *b.Arrival)
	assert.Empty(t, b.Break)
	assert.Len(t, d.Links, 1)

	f.setAnswering(false)
	d = s.Mapping(t0.Add(4*time.Second), types.NamespacedName{Namespace: "demo", Name: "remote-udp"})
	assert.Equal(t, BreakPod, d.Path.Branches[0].Break)
	assert.Equal(t, HealthUnanswered, d.Path.Branches[0].Interfaces[0].Health)

	assert.Nil(t, s.Mapping(t0, types.NamespacedName{Namespace: "demo", Name: "nope"}).Mapping)
}

// multiAgents is a Multi mapping demo/multi: edge-a and edge-c accept on enp1s0, each over
// its own link to worker-b, where web-b is; no counter has been reported yet.
type multiAgents struct{ *fakeAgents }

func (multiAgents) Nodes() []*kuportv1.NodeInfo {
	return []*kuportv1.NodeInfo{{Node: "edge-a", Connected: true}, {Node: "edge-c", Connected: true}, {Node: "worker-b", Connected: true}}
}

func (multiAgents) Program(node string) (*kuportv1.NodeProgram, uint64, bool) {
	link := func(name, peer string) *kuportv1.Link {
		return &kuportv1.Link{Name: name, ClassName: "public", PeerNode: peer, Vni: 4242, Mtu: 1370}
	}
	links := map[string][]*kuportv1.Link{
		"edge-a":   {link("kup-a-to-b", "worker-b")},
		"edge-c":   {link("kup-c-to-b", "worker-b")},
		"worker-b": {link("kup-b-to-a", "edge-a"), link("kup-b-to-c", "edge-c")},
	}
	return &kuportv1.NodeProgram{Links: links[node]}, 1, true
}

func (multiAgents) Index(node string) compile.NodeIndex {
	m := types.NamespacedName{Namespace: "demo", Name: "multi"}
	dnat := func(iface string) compile.Entry {
		return compile.Entry{ID: "demo/multi/dnat/" + iface, Name: "dnat/" + iface, Kind: compile.KindDNAT, Direction: compile.DirectionIn, Interface: iface}
	}
	overLink := func(link string) compile.Entry {
		e := dnat(link)
		e.OverLink = true
		return e
	}
	switch node {
	case "edge-a":
		return compile.NodeIndex{"demo/multi": {Mapping: m, ServingNode: "edge-a", Links: []string{"kup-a-to-b"}, Entries: []compile.Entry{dnat("enp1s0")}}}
	case "edge-c":
		return compile.NodeIndex{"demo/multi": {Mapping: m, ServingNode: "edge-a", Links: []string{"kup-c-to-b"}, Entries: []compile.Entry{dnat("enp1s0")}}}
	case "worker-b":
		return compile.NodeIndex{"demo/multi": {Mapping: m, ServingNode: "edge-a", Links: []string{"kup-b-to-a", "kup-b-to-c"},
			Entries: []compile.Entry{overLink("kup-b-to-a"), overLink("kup-b-to-c")}}}
	}
	return nil
}

func (multiAgents) Stats(string) ([]agents.Counter, []*kuportv1.LinkStats) { return nil, nil }

// TestPathMulti: a Multi mapping's path has one branch per forwarder, each over its own
// link to the pod's node and arriving there on that link's peer device.
func TestPathMulti(t *testing.T) {
	src := labSource(multiAgents{&fakeAgents{}})
	src.PortMaps = func() []*v1alpha1.PortMap {
		return []*v1alpha1.PortMap{{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "multi"},
			Spec:   v1alpha1.PortMapSpec{ClassName: "public", Protocol: v1alpha1.ProtocolUDP, Port: 27015},
			Status: v1alpha1.PortMapStatus{Endpoint: &v1alpha1.EndpointStatus{Node: "worker-b", Address: "10.244.18.107"}}}}
	}
	s := New()
	s.SetSource(src)
	d := s.Mapping(time.Unix(1_800_000_000, 0), types.NamespacedName{Namespace: "demo", Name: "multi"})
	require.NotNil(t, d.Path)
	require.Len(t, d.Path.Branches, 2)
	for i, want := range []struct{ node, link, arrival string }{{"edge-a", "kup-a-to-b", "kup-b-to-a"}, {"edge-c", "kup-c-to-b", "kup-b-to-c"}} {
		b := d.Path.Branches[i]
		assert.Equal(t, want.node, b.Node)
		require.Len(t, b.Interfaces, 1)
		assert.Equal(t, HealthUnknown, b.Interfaces[0].Health, "no counter reported")
		require.NotNil(t, b.Link, want.node)
		assert.Equal(t, want.link, b.Link.Device)
		assert.Equal(t, uint32(4242), b.Link.VNI)
		require.NotNil(t, b.Arrival, want.node)
		assert.Equal(t, "worker-b", b.Arrival.Node)
		assert.Equal(t, want.arrival, b.Arrival.Interface)
		assert.Empty(t, b.Break, "nothing received: no break")
	}
	assert.Len(t, d.Links, 2)
}

// TestPathDualStack: an interface serving both families is one hop, with both addresses and
// the sum of its IPv4 and IPv6 entries' forwarded rates and packets.
func TestPathDualStack(t *testing.T) {
	key := types.NamespacedName{Namespace: "demo", Name: "local"}
	m := Mapping{Namespace: "demo", Name: "local",
		Endpoint: &v1alpha1.EndpointStatus{Node: "edge-a", Address: "10.244.17.7", Address6: "fd00:17::7"},
		Published: []v1alpha1.PublishedAddress{
			{Node: "edge-a", Interface: "enp1s0", Address: "203.0.113.9", Address6: "2001:db8:a::9"},
		},
		Counters: []Counter{
			{Node: "edge-a", Rule: "forwarded/enp1s0", Direction: compile.DirectionIn, Packets: 30, Rate: Rate{PacketsPerSecond: ptr(3.0)},
				interfaceName: "enp1s0", forwarded: true},
			{Node: "edge-a", Rule: "forwarded6/enp1s0", Direction: compile.DirectionIn, Packets: 20, Rate: Rate{PacketsPerSecond: ptr(2.0)},
				interfaceName: "enp1s0", forwarded: true},
			{Node: "edge-a", Rule: "forwarded6/enp1s0", Direction: compile.DirectionOut, Packets: 20, Rate: Rate{PacketsPerSecond: ptr(2.0)},
				interfaceName: "enp1s0", forwarded: true},
		},
	}
	dnat := func(name string, f compile.Family) compile.Entry {
		return compile.Entry{ID: "demo/local/" + name, Name: name, Kind: compile.KindDNAT, Direction: compile.DirectionIn,
			Interface: "enp1s0", Family: f}
	}
	index := map[string]*compile.MappingIndex{"edge-a": {Mapping: key, ServingNode: "edge-a",
		Entries: []compile.Entry{dnat("dnat/enp1s0", compile.FamilyIPv4), dnat("dnat6/enp1s0", compile.FamilyIPv6)}}}
	p := path(m, index, nil)
	require.Len(t, p.Branches, 1)
	assert.Equal(t, []Hop{{Node: "edge-a", Interface: "enp1s0", Addresses: []string{"203.0.113.9", "2001:db8:a::9"},
		InPerSecond: ptr(5.0), OutPerSecond: ptr(2.0), InPackets: 50, OutPackets: 20, Health: HealthOK}}, p.Branches[0].Interfaces)
}
