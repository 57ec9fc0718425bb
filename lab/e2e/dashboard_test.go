package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/dashboard"
	"kuport.wlz.li/kuport/controller/dashboard/dashboardtest"
	"kuport.wlz.li/kuport/controller/metrics"
	"kuport.wlz.li/kuport/lab"
)

// TestPrivilegedE2EDashboard loads the controller's dashboard in headless Chromium (driven
// with chromedp) while a UDP stream crosses from edge-a to web-b on worker-b: the overview
// lists a refused mapping as a problem with its reason; the mapping's reply counter (every
// packet edge-a forwards back to the client) moves between two reads and has the stream's
// rate; /metrics shows the same counter rising, the leader, the agents, compile and
// push-to-ack observations and the refusal; the mapping's path shows edge-a, the link and
// worker-b with the stream's rates, and the break at the pod once web-b stops answering.
// Then 1,000 more mappings: a search narrows them to one. Screenshots of the overview and the
// path at 1 mapping and of the overview and the search at 1,000 are kept as artifacts.
func TestPrivilegedE2EDashboard(t *testing.T) {
	l := startLab(t)
	chromium, err := dashboardtest.Chromium()
	require.NoError(t, err, "make deps installs chromium")
	ctx := context.Background()
	b, err := dashboardtest.Start(ctx, chromium)
	require.NoError(t, err)
	t.Cleanup(b.Close)
	dir := dashboardtest.ArtifactDir(t)
	shot := func(name string) {
		path := filepath.Join(dir, name)
		require.NoError(t, b.Screenshot(path, 30*time.Second))
		t.Logf("screenshot: %s", path)
	}

	const name, port = "dash-udp", 27300
	server, err := l.Net.Serve(lab.PodB.Name, "udp", port)
	require.NoError(t, err)
	mapTo(t, l, name, "public", corev1.ProtocolUDP, port, 0, port, lab.PodB)
	// And one the controller refuses: web-b is on worker-b, the class builds no link.
	const refused = "dash-refused"
	createMapping(t, l, refused, "public-none", corev1.ProtocolTCP, 3001, 0, 3001, lab.PodB)
	waitCondition(t, l, lab.DemoNamespace, refused, v1alpha1.ConditionProgrammed, "False:"+v1alpha1.ReasonReturnPathUnavailable, 30*time.Second)
	s, err := l.Net.StartStream("udp", fmt.Sprintf("%s:%d", lab.PublicAddr, port), 20*time.Millisecond, 120*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() {
		res, err := s.Wait(ctx)
		assert.NoError(t, err)
		t.Logf("udp stream: %s", res)
	})

	base := "http://" + lab.ControllerHTTPAddr
	metricsURL := base + "/metrics"
	// The overview: the refused mapping is a problem, with its reason, before the mappings.
	problem := fmt.Sprintf(`li[data-problem="Refused"][data-mapping="%s/%s"]`, lab.DemoNamespace, refused)
	dom, err := b.DumpDOM(base+"/", problem, 30*time.Second)
	require.NoError(t, err, "the overview lists %s as a problem", refused)
	text, err := dashboardtest.Get(b, 10*time.Second, chromedp.TextContent(chromedp.CSS(problem)))
	require.NoError(t, err)
	assert.Contains(t, text, v1alpha1.ReasonReturnPathUnavailable, "the problem gives the reason")
	assert.Less(t, strings.Index(dom, "data-problem"), strings.Index(dom, "<tr data-mapping="), "problems before the mappings")

	// The reply of every datagram is counted where edge-a forwards it back out of enp1s0
	// (kup-count-out, every packet); the agents report every 2 s in the lab. The page
	// redraws every second.
	row := "edge-a " + lab.DemoNamespace + "/" + name + "/forwarded/enp1s0 out"
	pageCount := func() (uint64, string) {
		dom, err := b.DOM(10 * time.Second)
		require.NoError(t, err)
		return dashboardtest.Counters(dom)[row], dom
	}
	var first uint64
	for deadline := time.Now().Add(20 * time.Second); first == 0 && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		first, _ = pageCount()
	}
	require.Positive(t, first, "the page never showed counter row %q", row)
	replies := map[string]string{"namespace": lab.DemoNamespace, "name": name, "node": "edge-a", "interface": "enp1s0", "direction": "out"}
	metric := promSample(t, metricsURL, "kuport_mapping_packets_total", replies)

	time.Sleep(5 * time.Second)
	second, dom := pageCount()
	assert.Greater(t, second, first, "the page's %s counter did not move", row)
	for _, want := range []string{
		`data-mapping="demo/dash-udp"`,
		`data-mapping="demo/dash-refused"`, v1alpha1.ReasonReturnPathUnavailable,
		fmt.Sprintf("%s:%d", lab.PublicAddr, port), // the dial address
		`data-link="` + linkOnWorkerB + `"`,
	} {
		assert.True(t, strings.Contains(dom, want), "the page lacks %s", want)
	}
	assert.Greater(t, promSample(t, metricsURL, "kuport_mapping_packets_total", replies), metric,
		"/metrics: the mapping's reply packets did not rise")
	assert.Positive(t, promSample(t, metricsURL, "kuport_mapping_flows_total", map[string]string{
		"namespace": lab.DemoNamespace, "name": name, "node": "edge-a", "interface": "enp1s0"}),
		"/metrics: the stream's flow DNATed on edge-a")

	assert.Equal(t, 1.0, promSample(t, metricsURL, "kuport_leader", nil))
	assert.Equal(t, 3.0, promSample(t, metricsURL, "kuport_agents_connected", nil), "edge-a, worker-b and worker-c")
	assert.Positive(t, promSample(t, metricsURL, "kuport_compile_duration_seconds", nil))
	assert.Positive(t, promSample(t, metricsURL, "kuport_program_push_to_ack_seconds", nil),
		"programs were stored and acknowledged")
	assert.Equal(t, 1.0, promSample(t, metricsURL, "kuport_refusals", map[string]string{"reason": v1alpha1.ReasonReturnPathUnavailable}))
	assert.Equal(t, 0.0, promSample(t, metricsURL, "kuport_refusals", map[string]string{"reason": v1alpha1.ReasonPortConflict}))

	// The page's rate of the reply counter is the stream's: one reply every 20 ms. Reading
	// the state keeps the controller sampling; a rate needs two reports seen.
	var rate float64
	for deadline := time.Now().Add(15 * time.Second); rate == 0 && time.Now().Before(deadline); time.Sleep(time.Second) {
		rate = replyRate(t, base+"/state", lab.DemoNamespace, name)
	}
	t.Logf("the page's packet rate of %s: %.1f/s", row, rate)
	assert.InDelta(t, 50, rate, 15, "the page's packet rate of %s", row)
	shot("overview-1.png")

	// The mapping's path, from its link on the overview: edge-a's enp1s0 with the public
	// address, the link, worker-b receiving over it, each with the stream's rates in and out.
	require.NoError(t, b.Do(30*time.Second,
		chromedp.Click(chromedp.CSS(`#view tr[data-mapping="demo/dash-udp"] a`)),
		chromedp.WaitVisible(chromedp.CSS(`svg[data-path="demo/dash-udp"]`))))
	pathText := func() string {
		text, err := dashboardtest.Get(b, 10*time.Second, chromedp.TextContent(chromedp.CSS(`svg[data-path]`)))
		require.NoError(t, err)
		return text
	}
	hopRates := regexp.MustCompile(`in (\d+\.\d) pkt/s · out (\d+\.\d) pkt/s`)
	// The stream's two hops (enp1s0, the link on worker-b) at its rate; edge-a's other
	// interface, wt0, idle at 0 (a counter at 0 has a rate of 0 from the start).
	streaming := func(text string) bool {
		busy := 0
		for _, r := range hopRates.FindAllStringSubmatch(text, -1) {
			in, inErr := strconv.ParseFloat(r[1], 64)
			out, outErr := strconv.ParseFloat(r[2], 64)
			switch {
			case inErr != nil || outErr != nil:
				return false
			case in >= 30 && in <= 70 && out >= 30 && out <= 70:
				busy++
			case in != 0 || out != 0:
				return false
			}
		}
		return busy == 2
	}
	text = pathText()
	for deadline := time.Now().Add(30 * time.Second); !streaming(text) && time.Now().Before(deadline); time.Sleep(time.Second) {
		text = pathText()
	}
	assert.True(t, streaming(text), "both hops at the stream's 50 packets a second in and out, wt0 idle: %s", text)
	for _, want := range []string{"accepting node edge-a", "enp1s0 " + lab.PublicAddr, "link " + linkOnEdgeA + " → worker-b",
		"pod's node worker-b", linkOnWorkerB + "  ✓ ok", "on worker-b"} {
		assert.Contains(t, text, want)
	}
	assert.NotContains(t, text, "breaks here")
	shot("mapping-1.png")

	// web-b stops answering: the requests still cross, no reply comes back; once the
	// registry judges them unanswered the path says it breaks at the pod.
	require.NoError(t, server.Stop())
	require.NoError(t, b.Do(60*time.Second, chromedp.WaitReady(chromedp.CSS(`svg text[data-break="pod"]`))),
		"the path never showed the break at the pod: %s", pathText())
	text = pathText()
	assert.Contains(t, text, "breaks here: the pod does not answer")
	assert.Contains(t, text, "✗ no replies")
	shot("mapping-1-broken.png")

	// 1,000 more mappings, of one Service: the overview pages them, a search finds one.
	require.NoError(t, l.Expose(ctx, lab.DemoNamespace, "dash-bulk", "app", corev1.ProtocolTCP, 3100, lab.Backend{Pod: lab.PodA, Ready: true}))
	const bulk = 1000
	createBulk(t, l, bulk, func(i int) *v1alpha1.PortMap {
		return &v1alpha1.PortMap{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "PortMap"},
			ObjectMeta: metav1.ObjectMeta{Namespace: lab.DemoNamespace, Name: fmt.Sprintf("dash-bulk-%04d", i)},
			Spec: v1alpha1.PortMapSpec{ClassName: "public", Protocol: v1alpha1.ProtocolTCP, Port: int32(30000 + i),
				ServiceRef: v1alpha1.ServiceRef{Name: "dash-bulk", Port: "app"}}}
	})
	total := func() string {
		v, err := dashboardtest.Get(b, 10*time.Second, chromedp.Evaluate[string](`document.querySelector(".pager") ? document.querySelector(".pager").dataset.total : ""`))
		require.NoError(t, err)
		return v
	}
	require.NoError(t, b.Do(30*time.Second, chromedp.Navigate(base+"/"), chromedp.WaitReady(chromedp.CSS(".pager"))))
	for deadline := time.Now().Add(60 * time.Second); total() != "1002" && time.Now().Before(deadline); time.Sleep(time.Second) {
	}
	require.Equal(t, "1002", total(), "the overview counts every mapping")
	shot("overview-1000.png")
	require.NoError(t, b.Do(30*time.Second,
		chromedp.SendKeys(chromedp.CSS(`#filters input[name="q"]`), "dash-bulk-0421"),
		chromedp.WaitVisible(chromedp.CSS(`.pager[data-total="1"]`))))
	rows, err := dashboardtest.Get(b, 10*time.Second,
		chromedp.Evaluate[[]string](`[...document.querySelectorAll("#view tr[data-mapping]")].map(r => r.dataset.mapping)`))
	require.NoError(t, err)
	assert.Equal(t, []string{lab.DemoNamespace + "/dash-bulk-0421"}, rows)
	shot("search-1000.png")
}

// createBulk creates n PortMaps, 8 at a time, with a client of its own that the default
// client-side rate limit (5 a second) does not hold back.
func createBulk(t *testing.T, l *lab.Lab, n int, portMap func(i int) *v1alpha1.PortMap) {
	t.Helper()
	cfg := l.Cluster.RESTConfig()
	cfg.QPS, cfg.Burst = 500, 500
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	work := make(chan int)
	errs := make(chan error, n)
	for range 8 {
		go func() {
			for i := range work {
				m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(portMap(i))
				if err == nil {
					_, err = dyn.Resource(v1alpha1.PortMapsResource).Namespace(lab.DemoNamespace).Create(
						context.Background(), &unstructured.Unstructured{Object: m}, metav1.CreateOptions{})
				}
				errs <- err
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	for range n {
		require.NoError(t, <-errs)
	}
}

// promSample scrapes url and returns the value of the series of metric name whose labels
// include labels: a counter's or gauge's value, a histogram's sample count. The test fails
// when there is none.
func promSample(t *testing.T, url, name string, labels map[string]string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	f := families[name]
	require.NotNil(t, f, "%s has no %s", url, name)
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		default:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	require.Failf(t, "no series", "%s has no %s%v", url, name, labels)
	return 0
}

// replyRate reads the dashboard's state and returns the packet rate of the mapping's
// replies forwarded out of edge-a's enp1s0, 0 while it has none.
func replyRate(t *testing.T, url, namespace, name string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	var st dashboard.State
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	for _, m := range st.Mappings {
		if m.Namespace != namespace || m.Name != name {
			continue
		}
		for _, c := range m.Counters {
			if c.Node == "edge-a" && c.Rule == "forwarded/enp1s0" && c.Direction == metrics.DirectionOut && c.PacketsPerSecond != nil {
				return *c.PacketsPerSecond
			}
		}
	}
	return 0
}
