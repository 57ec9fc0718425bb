package dashboard

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/dashboard/dashboardtest"
)

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
