// Package dashboardtest drives headless Chromium (Debian package `chromium`, installed by
// `make deps`) against the dashboard page, for the dashboard's own tests and the lab's
// end-to-end suite: the page is loaded with its scripts run, as a browser shows it.
package dashboardtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"time"
)

// Chromium returns the path of the chromium binary, or an error saying how to install it.
func Chromium() (string, error) {
	path, err := exec.LookPath("chromium")
	if err != nil {
		return "", fmt.Errorf("chromium not found (apt-get install chromium, or make deps): %w", err)
	}
	return path, nil
}

// DumpDOM loads url in headless chromium, lets its scripts run for budget of virtual time
// (timers fire as fast as the page allows; time waiting on the network does not count), and
// returns the resulting DOM serialized as HTML.
func DumpDOM(ctx context.Context, chromium, url string, budget time.Duration) (string, error) {
	return run(ctx, chromium, budget, "--dump-dom", url)
}

// Screenshot loads url like DumpDOM and saves a PNG of a 1400x2000 window at path.
func Screenshot(ctx context.Context, chromium, url, path string, budget time.Duration) error {
	_, err := run(ctx, chromium, budget, "--window-size=1400,2000", "--screenshot="+path, url)
	return err
}

// run runs headless chromium with a throwaway profile (so concurrent runs share no lock).
// --no-sandbox: tests run as root, where chromium refuses its sandbox.
func run(ctx context.Context, chromium string, budget time.Duration, args ...string) (string, error) {
	profile, err := os.MkdirTemp("", "kuport-chromium-")
	if err != nil {
		return "", fmt.Errorf("chromium profile: %w", err)
	}
	defer os.RemoveAll(profile)
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + profile,
		fmt.Sprintf("--virtual-time-budget=%d", budget.Milliseconds())}, args...)
	cmd := exec.CommandContext(ctx, chromium, args...)
	var stderr limitedBuffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("chromium %v: %w: %s", args, err, stderr.b)
	}
	return string(out), nil
}

// limitedBuffer keeps the last 4 KiB written: chromium logs a lot to stderr.
type limitedBuffer struct{ b []byte }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.b = append(l.b, p...)
	if over := len(l.b) - 4096; over > 0 {
		l.b = l.b[over:]
	}
	return len(p), nil
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
