package dashboard

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/dashboard/dashboardtest"
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

func (f *flowingAgents) Stats(node string) ([]*kuportv1.Counter, []*kuportv1.LinkStats) {
	ctrs, links := f.fakeAgents.Stats(node)
	f.mu.Lock()
	defer f.mu.Unlock()
	requests, replies := f.requests(), f.replies
	if f.answering {
		replies = requests
	}
	for _, c := range ctrs {
		if strings.Contains(c.Id, "/dnat/") {
			c.ForwardedIn = &kuportv1.Traffic{Packets: requests, Bytes: 100 * requests}
			c.ForwardedOut = &kuportv1.Traffic{Packets: replies, Bytes: 100 * replies}
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

// manyMappings is labSource with n more mappings demo/bulk-NNNN, every tenth refused for a
// port conflict.
func manyMappings(a Agents, n int) *Source {
	src := labSource(a)
	base := src.PortMaps()
	bulk := make([]*v1alpha1.PortMap, 0, n)
	for i := range n {
		pm := &v1alpha1.PortMap{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: fmt.Sprintf("bulk-%04d", i)},
			Spec: v1alpha1.PortMapSpec{ClassName: "public", Protocol: v1alpha1.ProtocolTCP, Port: int32(10000 + i)}}
		programmed := metav1.Condition{Type: v1alpha1.ConditionProgrammed, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAllNodesReady}
		if i%10 == 0 {
			programmed = metav1.Condition{Type: v1alpha1.ConditionProgrammed, Status: metav1.ConditionFalse,
				Reason: v1alpha1.ReasonPortConflict, Message: fmt.Sprintf("port %d is taken by demo/other", 10000+i)}
		}
		pm.Status.Conditions = []metav1.Condition{
			{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid}, programmed}
		bulk = append(bulk, pm)
	}
	src.PortMaps = func() []*v1alpha1.PortMap { return append(append([]*v1alpha1.PortMap(nil), base...), bulk...) }
	return src
}

// TestQuery: filters and paging of /api/state, and the overview's counts over all.
func TestQuery(t *testing.T) {
	s := New()
	s.SetSource(manyMappings(judgingAgents{&fakeAgents{}}, 1000))
	now := time.Unix(1_800_000_000, 0)
	parse := func(raw string) Query {
		v, err := url.ParseQuery(raw)
		require.NoError(t, err)
		q, err := ParseQuery(v)
		require.NoError(t, err)
		return q
	}

	st := s.Query(now, Query{})
	assert.Equal(t, 1002, st.Total)
	assert.Len(t, st.Mappings, defaultLimit)
	assert.Equal(t, 1002, st.Overview.Mappings)
	assert.Equal(t, map[string]int{v1alpha1.ReasonPortConflict: 100}, st.Overview.Refused)
	assert.Equal(t, 900, st.Overview.Programmed)
	assert.Equal(t, 2, st.Overview.Waiting, "demo/remote-udp waits for worker-b, demo/new has no status")
	assert.Equal(t, 1, st.Overview.Unanswered)
	assert.Equal(t, 2, st.Overview.Connected)
	assert.Equal(t, 1, st.Overview.Acknowledged, "worker-b acknowledged 4 of 5")
	require.NotEmpty(t, st.Overview.Problems)
	assert.Equal(t, Problem{Kind: ProblemNodeNotAcked, Node: "worker-b", Message: "acknowledged program version 4, current is 5"},
		st.Overview.Problems[0], "nodes first")
	assert.Equal(t, ProblemUnanswered, st.Overview.Problems[1].Kind)
	assert.Equal(t, Problem{Kind: ProblemRefused, Namespace: "demo", Name: "bulk-0000", Reason: v1alpha1.ReasonPortConflict,
		Message: "port 10000 is taken by demo/other"}, st.Overview.Problems[2])
	assert.Equal(t, 102, st.Overview.ProblemsTotal)

	st = s.Query(now, parse("q=BULK-0421"))
	require.Equal(t, 1, st.Total)
	assert.Equal(t, "bulk-0421", st.Mappings[0].Name)
	st = s.Query(now, parse("state=refused&offset=90&limit=20"))
	assert.Equal(t, 100, st.Total)
	require.Len(t, st.Mappings, 10)
	assert.Equal(t, "bulk-0900", st.Mappings[0].Name)
	st = s.Query(now, parse("node=worker-b"))
	assert.Equal(t, 1, st.Total, "worker-b carries demo/remote-udp only")
	st = s.Query(now, parse("state=unanswered"))
	require.Equal(t, 1, st.Total)
	assert.Equal(t, "remote-udp", st.Mappings[0].Name)
	st = s.Query(now, parse("state=problem&namespace=demo&class=public"))
	assert.Equal(t, 101, st.Total)
	assert.Equal(t, 0, s.Query(now, parse("class=other")).Total)

	for _, bad := range []string{"state=broken", "offset=-1", "limit=501", "limit=x"} {
		v, _ := url.ParseQuery(bad)
		_, err := ParseQuery(v)
		assert.Error(t, err, bad)
	}
}

// TestHistory: the history keeps historyLen slots, unknown until recorded, drops a series
// whose key is gone and opens skipped slots as unknown.
func TestHistory(t *testing.T) {
	var h history
	t0 := time.Unix(1_800_000_000, 0)
	for i := range historyLen + 10 {
		h.record(map[string]float64{"a": float64(i)}, t0.Add(time.Duration(i)*historyStep))
	}
	got, end := h.get("a", "b")
	assert.Equal(t, t0.Add((historyLen+9)*historyStep), end)
	require.Len(t, got[0], historyLen)
	assert.Equal(t, float32(10), got[0][0], "the oldest kept")
	assert.Equal(t, float32(historyLen+9), got[0][historyLen-1], "the newest last")
	assert.Nil(t, got[1])

	h.record(map[string]float64{"a": 1, "b": 2}, end.Add(3*historyStep))
	got, _ = h.get("a", "b")
	assert.True(t, isNaN(got[0][historyLen-2]) && isNaN(got[0][historyLen-3]), "skipped slots are unknown")
	assert.True(t, isNaN(got[1][0]), "a new series is unknown before it began")
	assert.Equal(t, float32(2), got[1][historyLen-1])
	b, err := got[1][historyLen-3:].MarshalJSON()
	require.NoError(t, err)
	assert.Equal(t, "[null,null,2]", string(b))

	h.record(map[string]float64{"b": 3}, end.Add(4*historyStep))
	got, _ = h.get("a")
	assert.Nil(t, got[0], "a is gone")
}

func isNaN(f float32) bool { return f != f }

// page is a dashboard served with its sampler running and a headless chromium, closed at
// the end of the test.
func page(t *testing.T, src *Source) (string, *dashboardtest.Browser) {
	t.Helper()
	chromium, err := dashboardtest.Chromium()
	if err != nil {
		t.Skip(err)
	}
	s := New()
	s.SetSource(src)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	go s.Run(ctx)
	b, err := dashboardtest.Start(ctx, chromium)
	require.NoError(t, err)
	t.Cleanup(b.Close)
	return srv.URL, b
}

// TestPageInChromium loads the page in headless Chromium: it draws the overview with the
// problems first, the mapping with its dial address, link and unanswered interface, and a
// later read shows the counters moved.
func TestPageInChromium(t *testing.T) {
	base, b := page(t, labSource(judgingAgents{&fakeAgents{step: 25}}))
	const row = "worker-b " + remote + "/mark out"
	dom, err := b.DumpDOM(base+"/", `tr[data-mapping="demo/remote-udp"]`, 30*time.Second)
	require.NoError(t, err)
	for _, want := range []string{`<div id="status" class="muted">leader`, `data-mapping="demo/remote-udp"`,
		"203.0.113.9:27015", `data-link="kup-dcc4266d"`, `data-unanswered="edge-a/enp1s0"`, "unanswered on edge-a/enp1s0",
		`data-problem="NodeNotAcknowledged" data-node="worker-b"`, `data-problem="RequestsUnanswered" data-mapping="demo/remote-udp"`} {
		assert.True(t, strings.Contains(dom, want), "the page lacks %s", want)
	}
	assert.Less(t, strings.Index(dom, "data-problem"), strings.Index(dom, `<tr data-mapping=`), "problems before the mappings")
	first := dashboardtest.Counters(dom)
	require.Contains(t, first, row, "counter rows: %v", first)
	time.Sleep(2 * time.Second) // the page redraws every second
	dom, err = b.DOM(10 * time.Second)
	require.NoError(t, err)
	assert.Greater(t, dashboardtest.Counters(dom)[row], first[row], "a later read shows the counter moved")
}

// TestPageSearch: with 1,000 more mappings the overview lists the refused ones as problems
// with their reason, pages the mappings, and typing a name into the search leaves one row.
// Screenshots of both are kept.
func TestPageSearch(t *testing.T) {
	base, b := page(t, manyMappings(judgingAgents{&fakeAgents{}}, 1000))
	dir := dashboardtest.ArtifactDir(t)
	start := time.Now()
	dom, err := b.DumpDOM(base+"/", `tr[data-mapping]`, 30*time.Second)
	require.NoError(t, err)
	t.Logf("first screen with 1,002 mappings drawn in %s", time.Since(start))
	for _, want := range []string{`data-problem="Refused" data-mapping="demo/bulk-0000"`,
		"<strong> " + v1alpha1.ReasonPortConflict + "</strong>", `data-total="1002"`, "refused: PortConflict 100"} {
		assert.True(t, strings.Contains(dom, want), "the page lacks %s", want)
	}
	assert.Equal(t, defaultLimit, strings.Count(dom, `<tr data-mapping=`), "one page of mappings")
	require.NoError(t, b.Screenshot(filepath.Join(dir, "overview-1000.png"), 30*time.Second))

	require.NoError(t, b.Do(30*time.Second,
		chromedp.SendKeys(chromedp.CSS(`#filters input[name="q"]`), "bulk-0421"),
		chromedp.WaitVisible(chromedp.CSS(`.pager[data-total="1"]`))))
	rows, err := dashboardtest.Get(b, 10*time.Second,
		chromedp.Evaluate[int](`document.querySelectorAll("#view tr[data-mapping]").length`))
	require.NoError(t, err)
	assert.Equal(t, 1, rows)
	dom, err = b.DOM(10 * time.Second)
	require.NoError(t, err)
	assert.True(t, strings.Contains(dom, `<tr data-mapping="demo/bulk-0421"`), "the row found")
	hash, err := dashboardtest.Get(b, 10*time.Second, chromedp.Evaluate[string](`location.hash`))
	require.NoError(t, err)
	assert.Equal(t, "#/?q=bulk-0421", hash, "the search is in the address, to share")
	require.NoError(t, b.Screenshot(filepath.Join(dir, "search-1000.png"), 30*time.Second))
}

// TestPageMappingPath: following a mapping's link from the overview draws its path: both
// nodes, the link and the rates; when the pod stops answering, the break.
func TestPageMappingPath(t *testing.T) {
	f := newFlowing(time.Now)
	base, b := page(t, labSource(f))
	dir := dashboardtest.ArtifactDir(t)
	require.NoError(t, b.Do(30*time.Second, chromedp.Navigate(base+"/"),
		chromedp.Click(chromedp.CSS(`tr[data-mapping="demo/remote-udp"] a`)),
		chromedp.WaitVisible(chromedp.CSS(`svg[data-path="demo/remote-udp"]`))))
	pathText := func() string {
		text, err := dashboardtest.Get(b, 10*time.Second, chromedp.TextContent(chromedp.CSS(`svg[data-path]`)))
		require.NoError(t, err)
		return text
	}
	_, err := dashboardtest.Get(b, 30*time.Second,
		chromedp.Poll[bool](`document.querySelector("svg[data-path]").textContent.includes("kup-dcc4266d  ✓ ok")`))
	require.NoError(t, err, "the path shows the pod's node receiving")
	text := pathText()
	for _, want := range []string{"accepting node edge-a", "enp1s0 203.0.113.9", "link kup-5e30a797 → worker-b", "MTU 1350",
		"pod's node worker-b", "kup-dcc4266d", "10.244.18.107", "✓ ok"} {
		assert.Contains(t, text, want)
	}
	rates := regexp.MustCompile(`in (\d+\.\d) pkt/s · out (\d+\.\d) pkt/s`).FindAllStringSubmatch(text, -1)
	require.Len(t, rates, 2, "edge-a's enp1s0 and worker-b's link: %s", text)
	for _, r := range rates {
		for _, v := range r[1:] {
			pps, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			assert.InDelta(t, 50, pps, 15, "the stream's 50 packets a second: %s", r[0])
		}
	}
	assert.NotContains(t, text, "breaks here")
	require.NoError(t, b.Screenshot(filepath.Join(dir, "mapping-1.png"), 30*time.Second))

	f.setAnswering(false)
	require.NoError(t, b.Do(30*time.Second, chromedp.WaitReady(chromedp.CSS(`svg text[data-break="pod"]`))))
	text = pathText()
	assert.Contains(t, text, "breaks here: the pod does not answer")
	assert.Contains(t, text, "✗ no replies", "said in words, not colour alone")
	require.NoError(t, b.Screenshot(filepath.Join(dir, "mapping-1-broken.png"), 30*time.Second))
}

// erringAgents is fakeAgents whose edge-a link counts 3 more tx_errors every report, until
// stopped.
type erringAgents struct {
	*fakeAgents
	mu      sync.Mutex
	errors  uint64
	stopped bool
}

func (e *erringAgents) Stats(node string) ([]*kuportv1.Counter, []*kuportv1.LinkStats) {
	ctrs, links := e.fakeAgents.Stats(node)
	e.mu.Lock()
	defer e.mu.Unlock()
	if node == "edge-a" {
		if !e.stopped {
			e.errors += 3
		}
		for _, l := range links {
			l.TxErrors = e.errors
		}
	}
	return ctrs, links
}

// TestLinkErrorsProblem: a link whose tx_errors rise is counted and listed as a problem of
// its node, with the device and the rate; once they stop rising, it is not.
func TestLinkErrorsProblem(t *testing.T) {
	e := &erringAgents{fakeAgents: &fakeAgents{}}
	s := New()
	s.SetSource(labSource(e))
	t0 := time.Unix(1_800_000_000, 0)
	s.State(t0)
	for i := 1; i <= 3; i++ {
		s.sample(t0.Add(time.Duration(i) * time.Second))
	}
	st := s.State(t0.Add(3 * time.Second))
	assert.Equal(t, 1, st.Overview.LinksErrorsRising)
	var found *Problem
	for i, p := range st.Overview.Problems {
		if p.Kind == ProblemLinkTxErrors {
			found = &st.Overview.Problems[i]
		}
	}
	require.NotNil(t, found, "problems: %v", st.Overview.Problems)
	assert.Equal(t, "edge-a", found.Node)
	assert.Equal(t, "kup-5e30a797", found.Link)
	assert.Contains(t, found.Message, "rising 3.0/s")

	e.mu.Lock()
	e.stopped = true // the errors stay where they are
	e.mu.Unlock()
	for i := 4; i <= 4+int(rateWindow.Seconds())+1; i++ {
		s.sample(t0.Add(time.Duration(i) * time.Second))
	}
	assert.Equal(t, 0, s.State(t0.Add(40*time.Second)).Overview.LinksErrorsRising)
}
