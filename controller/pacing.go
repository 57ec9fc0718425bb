package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/controller/timing"
)

// The status workers' pacing: what they remember of the status writes put off for an
// acknowledgement (timing.Decide says for how long) or behind a burst of PortMap arrivals.

// ackWaits remembers since when each PortMap's verdict may wait (programmed.Verdict.MayWait),
// so that timing.Decide puts its write off for that long at most.
type ackWaits struct {
	mu    sync.Mutex
	since map[types.NamespacedName]time.Time
}

// start returns since when key's verdict may wait, now the first time it may; zero when it
// may not (mayWait false), which forgets key's wait.
func (w *ackWaits) start(key types.NamespacedName, now time.Time, mayWait bool) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !mayWait {
		delete(w.since, key)
		return time.Time{}
	}
	if w.since == nil {
		w.since = map[types.NamespacedName]time.Time{}
	}
	since, ok := w.since[key]
	if !ok {
		since, w.since[key] = now, now
	}
	return since
}

// forget drops key's wait (its PortMap is gone).
func (w *ackWaits) forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.since, key)
}

// A burst of PortMaps arriving (created, deleted, their spec changed) puts their status
// writes off until it is over: each write costs the API server more than a create, and
// bench/control's bulk was accepted about twice as fast with the writes put off (BENCHMARKS.md,
// "Figures moved out of code comments").
const (
	// burstArrivals PortMaps arriving within one timing.CompileWindow start a burst.
	burstArrivals = 10
	// burstQuiet without an arrival ends it. Longer than the gaps an API server busy with a
	// burst leaves between the events it sends.
	burstQuiet = 250 * time.Millisecond
	// burstMaxPutOff is the longest a PortMap's status write waits behind a burst: one that lasts
	// longer has its statuses trail it by this much.
	burstMaxPutOff = 2 * time.Second
)

// bursts tells a burst of PortMap arrivals from the arrivals themselves and remembers since
// when each status write has been put off behind it.
type bursts struct {
	mu sync.Mutex
	// at holds the last burstArrivals arrivals' times, next the oldest's index.
	at   [burstArrivals]time.Time
	next int
	// burst is whether arrivals started a burst; it lasts until burstQuiet after the last.
	burst bool
	// since are the PortMaps whose write the burst puts off, with since when; spent, those
	// put off burstMaxPutOff already, whose writes it puts off no more.
	since map[types.NamespacedName]time.Time
	spent map[types.NamespacedName]bool
}

// arrived records a PortMap's arrival at now.
func (b *bursts) arrived(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.burst = b.on(now) // a burst over (burstQuiet since the last) ends here if not released
	b.at[b.next] = now
	b.next = (b.next + 1) % burstArrivals
	if oldest := b.at[b.next]; !oldest.IsZero() && now.Sub(oldest) < timing.CompileWindow {
		b.burst = true
	}
}

// on reports whether a burst is on at now: started, and the last arrival less than
// burstQuiet before now. The caller holds mu.
func (b *bursts) on(now time.Time) bool {
	last := b.at[(b.next+burstArrivals-1)%burstArrivals]
	return b.burst && now.Sub(last) < burstQuiet
}

// putOff reports whether key's status write is put off at now: while a burst is on, for
// burstMaxPutOff at most. release hands it back.
func (b *bursts) putOff(key types.NamespacedName, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.on(now) || b.spent[key] {
		return false
	}
	if b.since == nil {
		b.since = map[types.NamespacedName]time.Time{}
	}
	if _, ok := b.since[key]; !ok {
		b.since[key] = now
	}
	return true
}

// release returns the PortMaps to write at now: every one put off once the burst is over
// (over: true), else those put off burstMaxPutOff.
func (b *bursts) release(now time.Time) (keys []types.NamespacedName, over bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	over = !b.on(now)
	for k, since := range b.since {
		if over || now.Sub(since) >= burstMaxPutOff {
			keys = append(keys, k)
			delete(b.since, k)
			if !over {
				if b.spent == nil {
					b.spent = map[types.NamespacedName]bool{}
				}
				b.spent[k] = true
			}
		}
	}
	if over {
		b.burst, b.since, b.spent = false, nil, nil
	}
	return keys, over
}
