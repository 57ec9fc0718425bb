// Package dashboardtest drives headless Chromium (Debian package `chromium`, installed by
// `make deps`) through the DevTools protocol (github.com/chromedp/chromedp) against the
// dashboard page, for the dashboard's own tests and the lab's end-to-end suite: the page is
// loaded with its scripts run, read, typed into and photographed as a person would.
package dashboardtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Chromium returns the path of the chromium binary, or an error saying how to install it.
func Chromium() (string, error) {
	path, err := exec.LookPath("chromium")
	if err != nil {
		return "", fmt.Errorf("chromium not found (apt-get install chromium, or make deps): %w", err)
	}
	return path, nil
}

// Browser is one headless chromium with a throwaway profile and one tab.
type Browser struct {
	ctx     context.Context
	cancel  func()
	profile string
}

// Start starts chromium at path with a fresh profile (so concurrent runs share no lock) and
// a 1400x1000 window. --no-sandbox: tests run as root, where chromium refuses its sandbox;
// the rest keep it from calling out (no QUIC, sync, component updates or background
// networking: the tests run offline). Close it when done.
func Start(ctx context.Context, path string) (*Browser, error) {
	profile, err := os.MkdirTemp("", "kuport-chromium-")
	if err != nil {
		return nil, fmt.Errorf("chromium profile: %w", err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.UserDataDir(profile), chromedp.WindowSize(1400, 1000),
		chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("no-default-browser-check", true),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelTab := chromedp.NewContext(actx)
	b := &Browser{ctx: bctx, profile: profile, cancel: func() { cancelTab(); cancelAlloc() }}
	if err := chromedp.Do(bctx); err != nil { // starts the browser
		b.Close()
		return nil, fmt.Errorf("start chromium %s: %w", path, err)
	}
	return b, nil
}

// Close stops the browser and removes its profile.
func (b *Browser) Close() {
	b.cancel()
	_ = os.RemoveAll(b.profile)
}

// Do runs actions in the browser's tab, for at most timeout.
func (b *Browser) Do(timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	return chromedp.Do(ctx, actions...)
}

// Get runs action in b's tab, for at most timeout, and returns its value.
func Get[T any](b *Browser, timeout time.Duration, action chromedp.Action[T]) (T, error) {
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	return chromedp.Run(ctx, action)
}

// DumpDOM loads url, waits until the page has drawn (an element matching the CSS selector
// ready is in the DOM) and returns the DOM serialized as HTML.
func (b *Browser) DumpDOM(url, ready string, timeout time.Duration) (string, error) {
	if err := b.Do(timeout, chromedp.Navigate(url), chromedp.WaitReady(chromedp.CSS(ready))); err != nil {
		return "", err
	}
	return b.DOM(timeout)
}

// DOM returns the current DOM serialized as HTML, without loading anything.
func (b *Browser) DOM(timeout time.Duration) (string, error) {
	return Get(b, timeout, chromedp.OuterHTML(chromedp.CSS("html")))
}

// Screenshot saves a PNG of the whole current page at path.
func (b *Browser) Screenshot(path string, timeout time.Duration) error {
	png, err := Get(b, timeout, chromedp.FullScreenshot(100))
	if err != nil {
		return err
	}
	return os.WriteFile(path, png, 0o644)
}

// ArtifactDir returns the directory for t's artifacts (screenshots), made if missing:
// $KUPORT_ARTIFACTS/<test name>, by default under the repository's gitignored .artifacts/.
func ArtifactDir(t testing.TB) string {
	t.Helper()
	root := os.Getenv("KUPORT_ARTIFACTS")
	if root == "" {
		dir, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				break
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				t.Fatal("no go.mod above the test's directory")
			}
			dir = parent
		}
		root = filepath.Join(dir, ".artifacts")
	}
	dir := filepath.Join(root, t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// counterRow matches a rendered counter row:
// <tr data-counter="<node> <entry id> <direction>" data-packets="N".
var counterRow = regexp.MustCompile(`data-counter="([^"]+)" data-packets="(\d+)"`)

// Counters reads the counter rows of a dumped page: packets by "<node> <entry id>
// <direction>", e.g. "worker-b demo/remote-udp/mark out" or "edge-a
// demo/remote-udp/forwarded/enp1s0 in".
func Counters(dom string) map[string]uint64 {
	out := map[string]uint64{}
	for _, m := range counterRow.FindAllStringSubmatch(dom, -1) {
		if n, err := strconv.ParseUint(m[2], 10, 64); err == nil {
			out[m[1]] = n
		}
	}
	return out
}
