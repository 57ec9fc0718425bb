package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/dashboard"
	"kuport.wlz.li/kuport/controller/dashboard/dashboardtest"
	"kuport.wlz.li/kuport/controller/metrics"
	"kuport.wlz.li/kuport/lab"
)

// TestPrivilegedE2EDashboard loads the controller's dashboard in headless Chromium while a
// UDP stream crosses from edge-a to web-b on worker-b: the page shows the mapping, its reply
// counter (every packet edge-a forwards back to the client) moving between two loads and
// its packet rate, and a refused mapping with its
// reason; /metrics shows the same counter rising, the leader, the agents, compile and
// push-to-ack observations and the refusal; a screenshot is kept as an artifact.
func TestPrivilegedE2EDashboard(t *testing.T) {
	l := startLab(t)
	chromium, err := dashboardtest.Chromium()
	require.NoError(t, err, "make deps installs chromium")
	ctx := context.Background()

	const name, port = "dash-udp", 27300
	serve(t, l, lab.PodB, corev1.ProtocolUDP, port)
	mapTo(t, l, name, "public", corev1.ProtocolUDP, port, 0, port, lab.PodB)
	// And one the controller refuses: web-b is on worker-b, the class builds no link.
	const refused = "dash-refused"
	createMapping(t, l, refused, "public-none", corev1.ProtocolTCP, 3001, 0, 3001, lab.PodB)
	waitCondition(t, l, lab.DemoNamespace, refused, v1alpha1.ConditionProgrammed, "False:"+v1alpha1.ReasonReturnPathUnavailable, 30*time.Second)
	s, err := l.Net.StartStream("udp", fmt.Sprintf("%s:%d", lab.PublicAddr, port), 20*time.Millisecond, 30*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() {
		res, err := s.Wait(ctx)
		assert.NoError(t, err)
		t.Logf("udp stream: %s", res)
	})

	base := "http://" + lab.ControllerHTTPAddr
	metricsURL := base + "/metrics"
	// The reply of every datagram is counted where edge-a forwards it back out of enp1s0
	// (kup-count-in/-out, every packet); the agents report every 2 s in the lab.
	row := "edge-a " + lab.DemoNamespace + "/" + name + "/forwarded/enp1s0 out"
	pageCount := func() (uint64, string, error) {
		dom, err := dashboardtest.DumpDOM(ctx, chromium, base+"/", 2*time.Second)
		return dashboardtest.Counters(dom)[row], dom, err
	}
	var first uint64
	for deadline := time.Now().Add(20 * time.Second); first == 0 && time.Now().Before(deadline); {
		if first, _, err = pageCount(); first == 0 {
			time.Sleep(500 * time.Millisecond)
		}
	}
	require.Positive(t, first, "the page never showed counter row %q (last error: %v)", row, err)
	replies := map[string]string{"namespace": lab.DemoNamespace, "name": name, "node": "edge-a", "interface": "enp1s0", "direction": "out"}
	metric := promSample(t, metricsURL, "kuport_mapping_packets_total", replies)

	time.Sleep(5 * time.Second)
	second, dom, err := pageCount()
	require.NoError(t, err)
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
		rate = replyRate(t, base+"/api/state", lab.DemoNamespace, name)
	}
	t.Logf("the page's packet rate of %s: %.1f/s", row, rate)
	assert.InDelta(t, 50, rate, 15, "the page's packet rate of %s", row)

	dir := os.Getenv("KUPORT_ARTIFACTS")
	if dir == "" {
		dir = "/tmp/kuport-artifacts"
	}
	dir = filepath.Join(dir, t.Name())
	require.NoError(t, os.MkdirAll(dir, 0o755))
	shot := filepath.Join(dir, "dashboard.png")
	require.NoError(t, dashboardtest.Screenshot(ctx, chromium, base+"/", shot, 2*time.Second))
	t.Logf("dashboard screenshot: %s", shot)
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
