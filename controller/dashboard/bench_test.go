package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/dashboard/dashboardtest"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// scaleAgents is a registry of n cross-node mappings bench/NNNNN like demo/remote-udp:
// edge-a accepts on enp1s0 and forwards over its link to worker-b, each report of a node
// counting more packets.
type scaleAgents struct {
	*fakeAgents
	index    map[string]compile.NodeIndex
	counters map[string][]agents.Counter
}

func newScaleAgents(n int) *scaleAgents {
	s := &scaleAgents{fakeAgents: &fakeAgents{}, index: map[string]compile.NodeIndex{"edge-a": {}, "worker-b": {}},
		counters: map[string][]agents.Counter{}}
	for i := range n {
		key := fmt.Sprintf("bench/m%05d", i)
		m := types.NamespacedName{Namespace: "bench", Name: fmt.Sprintf("m%05d", i)}
		s.index["edge-a"][key] = &compile.MappingIndex{Mapping: m, ServingNode: "edge-a", Links: []string{"kup-5e30a797"},
			Entries: []compile.Entry{
				{ID: key + "/dnat/enp1s0", Name: "dnat/enp1s0", Kind: compile.KindDNAT, Direction: compile.DirectionIn, Interface: "enp1s0"},
				{ID: key + "/snat", Name: "snat", Kind: compile.KindSNAT, Direction: compile.DirectionIn}}}
		s.index["worker-b"][key] = &compile.MappingIndex{Mapping: m, ServingNode: "edge-a", Links: []string{"kup-dcc4266d"},
			Entries: []compile.Entry{
				{ID: key + "/dnat/kup-dcc4266d", Name: "dnat/kup-dcc4266d", Kind: compile.KindDNAT, Direction: compile.DirectionIn, Interface: "kup-dcc4266d", OverLink: true},
				{ID: key + "/mark", Name: "mark", Kind: compile.KindMark, Direction: compile.DirectionOut}}}
		s.counters["edge-a"] = append(s.counters["edge-a"],
			agents.Counter{ID: key + "/dnat/enp1s0", Packets: 1,
				ForwardedIn: agents.Traffic{Packets: 10, Bytes: 1000}, HasIn: true, ForwardedOut: agents.Traffic{Packets: 10, Bytes: 1000}, HasOut: true},
			agents.Counter{ID: key + "/snat", Packets: 1})
		s.counters["worker-b"] = append(s.counters["worker-b"],
			agents.Counter{ID: key + "/dnat/kup-dcc4266d", Packets: 1,
				ForwardedIn: agents.Traffic{Packets: 10, Bytes: 1000}, HasIn: true, ForwardedOut: agents.Traffic{Packets: 10, Bytes: 1000}, HasOut: true},
			agents.Counter{ID: key + "/mark", Packets: 10})
	}
	return s
}

func (s *scaleAgents) Index(node string) compile.NodeIndex { return s.index[node] }

// Stats is a new report each call: every counter moved on.
func (s *scaleAgents) Stats(node string) ([]agents.Counter, []*kuportv1.LinkStats) {
	_, links := s.fakeAgents.Stats(node)
	for i := range s.counters[node] {
		c := &s.counters[node][i]
		c.Packets += 10
		if c.HasIn {
			c.ForwardedIn.Packets += 10
			c.ForwardedOut.Packets += 10
		}
	}
	return s.counters[node], links
}

func scaleSource(n int) *Source {
	a := newScaleAgents(n)
	src := labSource(a)
	pms := make([]*v1alpha1.PortMap, 0, n)
	for i := range n {
		pms = append(pms, &v1alpha1.PortMap{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("m%05d", i)},
			Spec: v1alpha1.PortMapSpec{ClassName: "public", Protocol: v1alpha1.ProtocolUDP, Port: int32(20000 + i)},
			Status: v1alpha1.PortMapStatus{Endpoint: &v1alpha1.EndpointStatus{Node: "worker-b", Address: "10.244.18.107"},
				Published: []v1alpha1.PublishedAddress{{Node: "edge-a", Interface: "enp1s0", Address: "203.0.113.9"}},
				Conditions: []metav1.Condition{
					{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid},
					{Type: v1alpha1.ConditionProgrammed, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAllNodesReady}}}})
	}
	src.PortMaps = func() []*v1alpha1.PortMap { return pms }
	return src
}

// BenchmarkDashboard measures, at 1, 1,000 and 10,000 mappings, the first screen's state
// (Query of the first page, encoded as /state sends it), a sample of every counter,
// the history's memory once its 15 minutes are full, and, with chromium, the time from
// loading the page to its first mapping row drawn. Each size prints one BENCH line
// (bench/dashboard.sh, BENCHMARKS.md).
func BenchmarkDashboard(b *testing.B) {
	for _, n := range []int{1, 1000, 10000} {
		b.Run(fmt.Sprintf("mappings=%d", n), func(b *testing.B) {
			src := scaleSource(n)
			s := New()
			s.SetSource(src)
			t0 := time.Unix(1_800_000_000, 0)

			// The sampler's memory (rates and history) once the history is full: historyLen
			// steps of samples, the heap measured around them.
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for i := range historyLen {
				s.sample(t0.Add(time.Duration(i) * historyStep))
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			samplerBytes := after.HeapAlloc - min(before.HeapAlloc, after.HeapAlloc)
			now := t0.Add(historyLen * historyStep)
			// The history alone: the same series in a history of their own.
			values := readSampleRows(src.Agents, map[string]reading{}).historyValues(s.series.rate)
			var h history
			runtime.GC()
			runtime.ReadMemStats(&before)
			for i := range historyLen {
				h.record(values, t0.Add(time.Duration(i)*historyStep))
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			historyBytes := after.HeapAlloc - min(before.HeapAlloc, after.HeapAlloc)
			runtime.KeepAlive(&h)

			sampleStart := time.Now()
			s.sample(now)
			sampleTime := time.Since(sampleStart)

			var size int
			b.ResetTimer()
			for b.Loop() {
				st := s.Query(now, Query{})
				out, err := json.Marshal(st)
				if err != nil {
					b.Fatal(err)
				}
				size = len(out)
			}
			b.StopTimer()
			stateTime := b.Elapsed() / time.Duration(b.N)

			browser := "n/a"
			if ms, err := firstScreen(s); err == nil {
				browser = fmt.Sprintf("%.0f", ms)
			} else {
				b.Log(err)
			}
			b.ReportMetric(float64(historyBytes)/(1<<20), "history_MB")
			fmt.Printf("BENCH dashboard mappings=%d series=%d first_screen_state_ms=%.1f state_kb=%d first_screen_browser_ms=%s sample_ms=%.1f history_mb=%.1f sampler_mb=%.1f\n",
				n, len(values), float64(stateTime.Microseconds())/1000, size/1024, browser, float64(sampleTime.Microseconds())/1000,
				float64(historyBytes)/(1<<20), float64(samplerBytes)/(1<<20))
		})
	}
}

// firstScreen loads the page served by s in headless chromium and returns the milliseconds
// from the navigation's start until its first mapping row is drawn.
func firstScreen(s *Server) (float64, error) {
	chromium, err := dashboardtest.Chromium()
	if err != nil {
		return 0, err
	}
	srv := httptest.NewServer(s)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	br, err := dashboardtest.Start(ctx, chromium)
	if err != nil {
		return 0, err
	}
	defer br.Close()
	if err := br.Do(30*time.Second, chromedp.Navigate("about:blank")); err != nil {
		return 0, err
	}
	if err := br.Do(30*time.Second, chromedp.Navigate(srv.URL+"/"), chromedp.WaitReady(chromedp.CSS("tr[data-mapping]"))); err != nil {
		return 0, err
	}
	// The page marks its first draw, in milliseconds since the navigation started.
	return dashboardtest.Get(br, 10*time.Second,
		chromedp.Evaluate[float64](`performance.getEntriesByName("kuport:first-draw")[0].startTime`))
}

// BenchmarkSample measures one sample of every counter at 10,000 mappings: what it
// allocates (B/op: the collector's work and the heap it needs room for every historyStep)
// and its time, with every counter moving and with every counter at 0 (an idle cluster).
func BenchmarkSample(b *testing.B) {
	for _, idle := range []bool{false, true} {
		b.Run(fmt.Sprintf("idle=%t", idle), func(b *testing.B) {
			src := scaleSource(10000)
			if idle {
				a := src.Agents.(*scaleAgents)
				for _, cs := range a.counters {
					for i, c := range cs {
						cs[i] = agents.Counter{ID: c.ID, HasIn: c.HasIn, HasOut: c.HasOut}
					}
				}
				src.Agents = idleAgents{a}
			}
			s := New()
			s.SetSource(src)
			now := time.Unix(1_800_000_000, 0)
			b.ReportAllocs()
			for b.Loop() {
				s.sample(now)
				now = now.Add(historyStep)
			}
		})
	}
}

// idleAgents reports scaleAgents' counters without moving them.
type idleAgents struct{ *scaleAgents }

func (a idleAgents) Stats(node string) ([]agents.Counter, []*kuportv1.LinkStats) {
	_, links := a.fakeAgents.Stats(node)
	return a.counters[node], links
}
