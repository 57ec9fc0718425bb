package dashboard

import (
	"slices"
	"sync"
	"time"
)

// rateWindow is how far back rates look. Agents report every 5 s by default (2 s in the
// lab), so a window of six default reports averages over at least five of them; it is
// also how long a rate takes to fall to 0 after traffic stops.
const rateWindow = 30 * time.Second

// rates turns successive readings of cumulative counters (Server.Run's samples) into
// per-second rates. A counter only moves when its agent reports, so a rate is not taken
// between two samples (most see no change) but across the changes seen within rateWindow,
// each timed by the sample that first saw it. A counter that reads 0 has counted nothing
// since its rule was made: its rate is 0, known at once, and it keeps no series (an idle
// cluster's counters held tens of MB of series and keys; BENCHMARKS.md, "controller memory
// at 10,000 mappings and 1,000 agents").
// Safe for concurrent use.
type rates struct {
	mu sync.Mutex
	// series by counter, by value: one per counter that read above 0 (48 bytes each).
	series map[string]series
	at     int64 // unix nanoseconds of the latest observe
}

// series is one counter's history; times are unix nanoseconds.
type series struct {
	since          int64     // first reading
	packets, bytes uint64    // latest value
	changes        []reading // the values first seen after since, within rateWindow, oldest first
}

type reading struct {
	at             int64 // unix nanoseconds (observe sets it)
	packets, bytes uint64
}

// Rate is a counter's rate per second; nil fields mean unknown (fewer than two changes seen
// since the counter was first read, less than rateWindow ago).
type Rate struct {
	PacketsPerSecond *float64 `json:"packetsPerSecond"`
	BytesPerSecond   *float64 `json:"bytesPerSecond"`
}

// observe records the readings taken at now, keyed by counter; rate then gives each one's
// rate. Counters absent from readings are forgotten; readings need not hold those at 0.
func (r *rates) observe(readings map[string]reading, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := make(map[string]series, len(readings))
	at := now.UnixNano()
	for key, v := range readings {
		if v.zero() {
			continue
		}
		v.at = at
		s, ok := r.series[key]
		switch {
		case !ok || v.packets < s.packets || v.bytes < s.bytes:
			// New, or reset (its rule was re-created, its agent restarted).
			s = series{since: at, packets: v.packets, bytes: v.bytes}
		case v.packets != s.packets || v.bytes != s.bytes:
			s.changes = append(s.changes, v)
			s.packets, s.bytes = v.packets, v.bytes
		}
		old := 0
		for old < len(s.changes) && time.Duration(at-s.changes[old].at) > rateWindow {
			old++
		}
		// In place: reslicing from the front made every append reallocate, each window
		// growing to twice its length (most of the sampler's heap at 10,000 mappings).
		s.changes = slices.Delete(s.changes, 0, old)
		next[key] = s
	}
	r.series, r.at = next, at
}

func (v reading) zero() bool { return v.packets == 0 && v.bytes == 0 }

// rate returns the rate of counter key, which reads v now, as of the latest observe: 0 for
// a counter at 0, unknown for another observe was not given above 0. Computed when asked,
// not kept: a page reads a few of them.
func (r *rates) rate(key string, v reading) Rate {
	if v.zero() {
		return zeroRate()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.series[key]
	if !ok {
		return Rate{}
	}
	return s.rate(r.at)
}

func (s *series) rate(now int64) Rate {
	if len(s.changes) < 2 {
		if time.Duration(now-s.since) < rateWindow {
			return Rate{}
		}
		return zeroRate()
	}
	first, last := s.changes[0], s.changes[len(s.changes)-1]
	secs := time.Duration(last.at - first.at).Seconds()
	pps := float64(last.packets-first.packets) / secs
	bps := float64(last.bytes-first.bytes) / secs
	return Rate{PacketsPerSecond: &pps, BytesPerSecond: &bps}
}

func zeroRate() Rate {
	zero := 0.0
	return Rate{PacketsPerSecond: &zero, BytesPerSecond: &zero}
}
