package dashboard

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
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

const remote = "demo/remote-udp"

// fakeAgents is the lab's cross-node Single mapping demo/remote-udp: edge-a accepts and
// forwards over its link to web-b on worker-b. Each Stats call of worker-b returns the mark
// counter advanced by step packets, as if a report had come in.
type fakeAgents struct {
	mu   sync.Mutex
	mark uint64
	step uint64
}

func (f *fakeAgents) Nodes() []*kuportv1.NodeInfo {
	return []*kuportv1.NodeInfo{
		{Node: "edge-a", Connected: true, AgentVersion: "v1", ProgramVersion: 3, AckedVersion: 3},
		{Node: "worker-b", Connected: true, AgentVersion: "v1", ProgramVersion: 5, AckedVersion: 4},
	}
}

func (f *fakeAgents) Agents() map[string]*compile.AgentState {
	state := func(underlay string, mtu uint32) *compile.AgentState {
		return &compile.AgentState{State: &kuportv1.NodeState{UnderlayInterface: underlay,
			Interfaces: []*kuportv1.Interface{{Name: "lo", Mtu: 65536}, {Name: underlay, Mtu: mtu}}}}
	}
	return map[string]*compile.AgentState{"edge-a": state("wt0", 1420), "worker-b": state("wt0", 1400)}
}

func (f *fakeAgents) Program(node string) (*kuportv1.NodeProgram, uint64, bool) {
	switch node {
	case "edge-a":
		return &kuportv1.NodeProgram{
			DnatRules: []*kuportv1.DnatRule{{Id: remote + "/dnat/enp1s0", Mapping: remote, InInterface: "enp1s0"}},
			SnatRules: []*kuportv1.SnatRule{{Id: remote + "/snat", Mapping: remote, Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST}},
			Links: []*kuportv1.Link{{Name: "kup-5e30a797", ClassName: "public", PeerNode: "worker-b",
				LocalAddress: "169.254.77.0", PeerAddress: "169.254.77.1", Mtu: 1350}},
		}, 3, true
	case "worker-b":
		return &kuportv1.NodeProgram{
			DnatRules: []*kuportv1.DnatRule{{Id: remote + "/dnat/kup-dcc4266d", Mapping: remote, InInterface: "kup-dcc4266d"}},
			MarkRules: []*kuportv1.MarkRule{{Id: remote + "/mark", Mapping: remote, Kind: kuportv1.MarkKind_MARK_KIND_STATIC}},
			Links: []*kuportv1.Link{{Name: "kup-dcc4266d", ClassName: "public", PeerNode: "edge-a",
				LocalAddress: "169.254.77.1", PeerAddress: "169.254.77.0", Mtu: 1350}},
		}, 4, true
	}
	return nil, 0, false
}

// Index is compile's index of Program's programs.
func (f *fakeAgents) Index(node string) compile.NodeIndex {
	m := types.NamespacedName{Namespace: "demo", Name: "remote-udp"}
	switch node {
	case "edge-a":
		return compile.NodeIndex{remote: {Mapping: m, ServingNode: "edge-a", Links: []string{"kup-5e30a797"}, Entries: []compile.Entry{
			{ID: remote + "/dnat/enp1s0", Name: "dnat/enp1s0", Kind: compile.KindDNAT, Direction: compile.DirectionIn, Interface: "enp1s0"},
			{ID: remote + "/snat", Name: "snat", Kind: compile.KindSNAT, Direction: compile.DirectionIn},
		}}}
	case "worker-b":
		return compile.NodeIndex{remote: {Mapping: m, ServingNode: "edge-a", Links: []string{"kup-dcc4266d"}, Entries: []compile.Entry{
			{ID: remote + "/dnat/kup-dcc4266d", Name: "dnat/kup-dcc4266d", Kind: compile.KindDNAT, Direction: compile.DirectionIn, Interface: "kup-dcc4266d", OverLink: true},
			{ID: remote + "/mark", Name: "mark", Kind: compile.KindMark, Direction: compile.DirectionOut},
		}}}
	}
	return nil
}

func (f *fakeAgents) Stats(node string) ([]agents.Counter, []*kuportv1.LinkStats) {
	switch node {
	case "edge-a":
		return []agents.Counter{{ID: remote + "/dnat/enp1s0", Packets: 1, Bytes: 60}, {ID: remote + "/snat", Packets: 1, Bytes: 60}},
			[]*kuportv1.LinkStats{{Name: "kup-5e30a797", TxPackets: 40, RxPackets: 38}}
	case "worker-b":
		f.mu.Lock()
		defer f.mu.Unlock()
		f.mark += f.step
		return []agents.Counter{{ID: remote + "/dnat/kup-dcc4266d", Packets: 1, Bytes: 60}, {ID: remote + "/mark", Packets: f.mark, Bytes: 60 * f.mark}},
			nil
	}
	return nil, nil
}

func labSource(agents Agents) *Source {
	ready := []metav1.Condition{{Type: v1alpha1.ClassConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid}}
	return &Source{
		Agents: agents,
		Classes: func() []*v1alpha1.PortMapClass {
			return []*v1alpha1.PortMapClass{{
				ObjectMeta: metav1.ObjectMeta{Name: "public"},
				Spec:       v1alpha1.PortMapClassSpec{Nodes: map[string]v1alpha1.ClassNode{"edge-a": {Interfaces: []string{"enp1s0", "wt0"}}}},
				Status:     v1alpha1.PortMapClassStatus{Conditions: ready},
			}}
		},
		PortMaps: func() []*v1alpha1.PortMap {
			return []*v1alpha1.PortMap{
				{
					ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "remote-udp"},
					Spec:       v1alpha1.PortMapSpec{ClassName: "public", Protocol: v1alpha1.ProtocolUDP, Port: 27015},
					Status: v1alpha1.PortMapStatus{
						Ports:    "27015",
						Endpoint: &v1alpha1.EndpointStatus{Node: "worker-b", Address: "10.244.18.107"},
						Published: []v1alpha1.PublishedAddress{
							{Node: "edge-a", Interface: "enp1s0", Address: "203.0.113.9"},
							{Node: "edge-a", Interface: "wt0", Address: "100.64.93.143"},
						},
						Conditions: []metav1.Condition{
							{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid},
							{Type: v1alpha1.ConditionProgrammed, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNodeNotReady,
								Message: "node worker-b has not acknowledged program version 5"},
						},
					},
				},
				{
					ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "new"},
					Spec:       v1alpha1.PortMapSpec{ClassName: "public", Protocol: v1alpha1.ProtocolTCP, Port: 4000, EndPort: ptr(int32(4009))},
				},
			}
		},
	}
}

func TestState(t *testing.T) {
	s := New()
	s.SetSource(labSource(&fakeAgents{mark: 100}))
	now := time.Unix(1_800_000_000, 0)
	st := s.State(now)

	assert.True(t, st.Leader)
	assert.Equal(t, []Class{{Name: "public", ServingMode: "Single", ReturnPath: "Vxlan", Nodes: []string{"edge-a"},
		Ready: Condition{Status: "True", Reason: v1alpha1.ReasonValid}}}, st.Classes)
	assert.Equal(t, []Node{
		{Name: "edge-a", Connected: true, AgentVersion: "v1", UnderlayInterface: "wt0", UnderlayMTU: 1420, ProgramVersion: 3, AckedVersion: 3},
		{Name: "worker-b", Connected: true, AgentVersion: "v1", UnderlayInterface: "wt0", UnderlayMTU: 1400, ProgramVersion: 5, AckedVersion: 4},
	}, st.Nodes)
	assert.Equal(t, []Link{{Class: "public", Ends: []LinkEnd{
		{Node: "edge-a", Device: "kup-5e30a797", PeerNode: "worker-b", Address: "169.254.77.0", MTU: 1350, Reported: true, TxPackets: 40, RxPackets: 38,
			TxErrorsPerSecond: ptr(0.0)}, // no error counted yet: none a second, known at once
		{Node: "worker-b", Device: "kup-dcc4266d", PeerNode: "edge-a", Address: "169.254.77.1", MTU: 1350},
	}}}, st.Links)

	require.Len(t, st.Mappings, 2)
	fresh := st.Mappings[0]
	assert.Equal(t, "demo/new", fresh.Namespace+"/"+fresh.Name)
	assert.Equal(t, "4000-4009", fresh.Ports, "ports from spec before the first status")
	assert.Equal(t, Condition{Status: "Unknown"}, fresh.Programmed)
	assert.Empty(t, fresh.Counters)
	assert.NotNil(t, fresh.Counters, "an empty list, not null, for the page")
	assert.Empty(t, fresh.ServingNode, "no program carries it")

	m := st.Mappings[1]
	assert.Equal(t, "edge-a", m.ServingNode)
	assert.Equal(t, "27015", m.Ports)
	assert.Equal(t, Condition{Status: "False", Reason: v1alpha1.ReasonNodeNotReady,
		Message: "node worker-b has not acknowledged program version 5"}, m.Programmed)
	var rules []string
	for _, c := range m.Counters {
		rules = append(rules, c.Node+" "+c.Rule+" "+string(c.Unit)+" "+c.Direction)
		assert.Nil(t, c.PacketsPerSecond, "no rate from one reading")
	}
	assert.Equal(t, []string{
		"edge-a dnat/enp1s0 flows in", "edge-a snat flows in",
		"worker-b dnat/kup-dcc4266d flows in", "worker-b mark packets out",
	}, rules)
	assert.Equal(t, uint64(100), m.Counters[3].Packets)
	assert.NotNil(t, m.Unanswered, "an empty list, not null, for the page")
	assert.Empty(t, m.Unanswered, "agents that do not judge: nothing unanswered")
}

// judgingAgents is fakeAgents judging demo/remote-udp's requests unanswered on edge-a's
// enp1s0 since t0 (agents.Registry.Unanswered).
type judgingAgents struct{ *fakeAgents }

var unansweredSince = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

func (judgingAgents) Unanswered(node string) map[string][]agents.InterfaceVerdict {
	switch node {
	case "edge-a":
		return map[string][]agents.InterfaceVerdict{remote: {{Interface: "enp1s0",
			Verdict: agents.Verdict{Unanswered: true, Since: unansweredSince, Requests: 7}}}}
	case "worker-b":
		return map[string][]agents.InterfaceVerdict{remote: {{Interface: "kup-dcc4266d"}}}
	}
	return nil
}

func TestStateUnanswered(t *testing.T) {
	s := New()
	s.SetSource(labSource(judgingAgents{&fakeAgents{}}))
	st := s.State(time.Unix(1_800_000_000, 0))
	require.Len(t, st.Mappings, 2)
	assert.Empty(t, st.Mappings[0].Unanswered)
	assert.Equal(t, []Unanswered{{Node: "edge-a", Interface: "enp1s0", Since: unansweredSince, Requests: 7}}, st.Mappings[1].Unanswered)
}

// TestSampling: State reports the rates of Run's samples, taken every second while the
// state is being read, every historyStep otherwise.
func TestSampling(t *testing.T) {
	agents := &fakeAgents{}
	s := New()
	s.SetSource(labSource(agents))
	t0 := time.Unix(1_800_000_000, 0)
	markRate := func(now time.Time) *float64 {
		for _, m := range s.State(now).Mappings {
			for _, c := range m.Counters {
				if c.Node == "worker-b" && c.Rule == "mark" {
					return c.PacketsPerSecond
				}
			}
		}
		t.Fatal("no mark counter")
		return nil
	}

	s.State(t0)
	agents.step = 50 // each sample sees a new report: 50 packets a second
	for i := 1; i <= 3; i++ {
		s.sample(t0.Add(time.Duration(i) * time.Second))
	}
	rate := markRate(t0.Add(3 * time.Second))
	require.NotNil(t, rate)
	assert.Equal(t, 50.0, *rate)

	// Nobody reads for longer than idleAfter: sampling slows to one every historyStep.
	idle := t0.Add(3*time.Second + idleAfter + time.Second)
	s.sample(idle)
	s.mu.Lock()
	last := s.lastSample
	s.mu.Unlock()
	s.sample(idle.Add(time.Second))
	s.mu.Lock()
	assert.Equal(t, last, s.lastSample, "no sample a second after the last while nobody reads")
	s.mu.Unlock()
	s.sample(idle.Add(historyStep))
	s.mu.Lock()
	assert.Equal(t, idle.Add(historyStep), s.lastSample, "one a history step later")
	s.mu.Unlock()
}

func TestRates(t *testing.T) {
	var r rates
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	read := func(packets uint64) map[string]reading {
		return map[string]reading{"k": {packets: packets, bytes: 100 * packets}}
	}
	obs := func(packets uint64, now time.Time) Rate {
		r.observe(read(packets), now)
		return r.rate("k", read(packets)["k"])
	}
	pps := func(rt Rate) any {
		if rt.PacketsPerSecond == nil {
			return nil
		}
		return *rt.PacketsPerSecond
	}

	// A counter at 0 has counted nothing since its rule was made: 0 at once, and no series.
	assert.Equal(t, 0.0, pps(obs(0, at(0))), "a counter at 0")
	assert.Empty(t, r.series, "a counter at 0 keeps no series")
	assert.Nil(t, pps(r.rate("other", reading{packets: 3})), "a counter the sample did not see above 0")

	assert.Nil(t, pps(obs(10, at(0))), "first reading")
	assert.Nil(t, pps(obs(10, at(1))), "unchanged")
	// The first change is timed by when it appeared, but the reading before it was taken at
	// an unknown time after its own report: no rate until a second change.
	assert.Nil(t, pps(obs(30, at(2))))
	assert.Nil(t, pps(obs(30, at(3))), "the page polls faster than the agent reports")
	got := obs(70, at(4))
	assert.Equal(t, 20.0, pps(got), "40 packets between changes 2 s apart")
	assert.Equal(t, 2000.0, *got.BytesPerSecond)
	assert.Equal(t, 20.0, pps(obs(70, at(5))), "between reports the rate holds")
	assert.Equal(t, 17.5, pps(obs(100, at(6))), "(100-30)/(6-2): over every change in the window")

	// Traffic stops: the changes age out of the window and the rate falls to 0.
	assert.Equal(t, 0.0, pps(obs(100, at(6+rateWindow.Seconds()+1))))

	// A counter that went down was re-created: it starts over.
	assert.Nil(t, pps(obs(5, at(100))))
	assert.Equal(t, 0.0, pps(obs(0, at(100.5))), "re-created and not counted since")
	assert.Empty(t, r.series)
	// A counter no longer read is forgotten.
	r.observe(map[string]reading{}, at(101))
	assert.Empty(t, r.series)
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

func TestHTTP(t *testing.T) {
	s := New()
	srv := httptest.NewServer(s)
	defer srv.Close()

	resp, page := get(t, srv.URL+"/")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	assert.Contains(t, page, `"state?"`)
	assert.Contains(t, page, `"mapping?"`)
	// The SVG namespace is a name, not something loaded.
	local := strings.ReplaceAll(page, `"http://www.w3.org/2000/svg"`, "")
	assert.NotContains(t, local, "http://", "the page loads nothing from elsewhere")
	assert.NotContains(t, local, "https://", "the page loads nothing from elsewhere")

	resp, body := get(t, srv.URL+"/state")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var st State
	require.NoError(t, json.Unmarshal([]byte(body), &st))
	assert.False(t, st.Leader, "no source: a follower")
	assert.Contains(t, body, `"mappings": []`, "empty lists, not null")

	s.SetSource(labSource(&fakeAgents{mark: 7}))
	_, body = get(t, srv.URL+"/state")
	require.NoError(t, json.Unmarshal([]byte(body), &st))
	assert.True(t, st.Leader)
	assert.Contains(t, body, `"packetsPerSecond": null`)
	assert.Contains(t, body, `"servingNode": "edge-a"`)

	resp, body = get(t, srv.URL+"/state?state=broken")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, body, `state "broken": want one of`)
	resp, body = get(t, srv.URL+"/state?q=remote&limit=1")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `"total": 1`)
	resp, body = get(t, srv.URL+"/mapping?namespace=demo&name=remote-udp")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `"branches": [`)
	resp, body = get(t, srv.URL+"/mapping?namespace=demo&name=nope")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, body, "no PortMap demo/nope")

	resp, _ = get(t, srv.URL+"/nope")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	resp, err := http.Post(srv.URL+"/state", "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

// longAgents is fakeAgents whose edge-a program holds one PortMap with a name long enough
// that compile cuts its key (compile.Key), judged unanswered there.
type longAgents struct{ *fakeAgents }

var longMapping = types.NamespacedName{Namespace: "demo", Name: strings.Repeat("long", 30)}

func (longAgents) Index(node string) compile.NodeIndex {
	if node != "edge-a" {
		return nil
	}
	return compile.NodeIndex{compile.Key(longMapping.Namespace, longMapping.Name): {Mapping: longMapping, ServingNode: "worker-b"}}
}

func (longAgents) Unanswered(node string) map[string][]agents.InterfaceVerdict {
	if node != "edge-a" {
		return nil
	}
	return map[string][]agents.InterfaceVerdict{compile.Key(longMapping.Namespace, longMapping.Name): {{Interface: "enp1s0",
		Verdict: agents.Verdict{Unanswered: true, Since: unansweredSince, Requests: 7}}}}
}

// TestSnapshotLongName: the verdicts of a PortMap whose key compile cut reach it by name.
func TestSnapshotLongName(t *testing.T) {
	require.NotEqual(t, longMapping.String(), compile.Key(longMapping.Namespace, longMapping.Name), "the key is cut")
	snap := readSnapshot(longAgents{&fakeAgents{}})
	assert.Equal(t, []Unanswered{{Node: "edge-a", Interface: "enp1s0", Since: unansweredSince, Requests: 7}}, snap.unanswered[longMapping])
}
