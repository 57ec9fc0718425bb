package datapath

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Counters returns the packets and bytes the kernel counted for every entry of the program
// last applied, one Counter per entry id, sorted by id: the sum over the entry's elements
// (one per port, or one per range) of the set they are in. A DNAT entry's kup-pre elements count its new flows,
// its kup-steer and kup-count-out elements fill forwarded_in and forwarded_out. Each element
// is the entry's that the planned table gives its key to (the one whose id the element
// carries, in a set with comments); an element two entries share counts under the entry it is
// planned for (planTable), and the other reports none. An element the planned table
// lacks (someone else's, or one the next Apply removes) is left out.
//
// It reads the sets one at a time, each element's key and counter only, and keeps only the
// sums (elemcounters.go): little garbage however many elements there are. The reads (the agent's
// every report; BENCHMARKS.md, "Figures moved out of code comments") hold the lock Apply and Validate take,
// so every element counts under the entry of the table it was read beside, but give way to
// them: between two reads of a set's dump, a waiting Apply or Validate stops the reading,
// which starts over once it is done (at most maxCounterYields times, then reads through).
// So a program waits for one read (a few hundred elements) behind a report, not for it all.
func (d *Datapath) Counters() ([]*kuportv1.Counter, error) {
	d.counting.Lock()
	defer d.counting.Unlock()
	for yields := 0; ; yields++ {
		d.turn.Lock()
		d.mu.Lock()
		d.turn.Unlock()
		out, err := d.counters(func() bool { return yields < maxCounterYields && d.waiting.Load() > 0 })
		d.mu.Unlock()
		if !errors.Is(err, errYielded) {
			return out, err
		}
		// The dump's rest is read and dropped without the lock, while the Apply runs.
		if err := d.counterSocket.drain(); err != nil {
			return nil, err
		}
	}
}

// maxCounterYields bounds how often one Counters starts over for an Apply or Validate, so
// that a steady stream of programs cannot starve the reports.
const maxCounterYields = 8

// lock takes mu for anything but Counters, which gives way to it (see Counters). It holds
// turn until it has mu, so that a Counters that gave way waits for it.
func (d *Datapath) lock() {
	d.turn.Lock()
	d.waiting.Add(1)
	d.mu.Lock()
	d.waiting.Add(-1)
	d.turn.Unlock()
}

// counters reads and sums the elements of the kernel's counted sets; errYielded when yield
// stopped a read. Called with d.mu and d.counting held.
func (d *Datapath) counters(yield func() bool) ([]*kuportv1.Counter, error) {
	t, err := d.kernelTableOf(tableFamily)
	if t == nil || err != nil {
		return nil, err
	}
	sets, err := d.nft.GetSets(t)
	if err != nil {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	l := newLayout(0, nil, true, true)
	byID := make(map[string]*kuportv1.Counter, len(d.planned.dnat.msgs)+len(d.planned.snat.msgs)+len(d.planned.mark.msgs))
	for _, ks := range sets {
		s := l.byName[ks.Name]
		if s == nil || !setMatches(ks, s) || d.planned.tab == nil || d.planned.tab.elems[s.name] == nil {
			continue
		}
		planned := d.planned.tab.elems[s.name]
		err := d.counterSocket.setCounters(tableFamily, tableName, ks.Name, func(key []byte, packets, bytes uint64) {
			e, ok := planned[string(key)]
			if !ok {
				return
			}
			ctr := byID[e.id]
			if ctr == nil {
				ctr = &kuportv1.Counter{Id: e.id}
				byID[ctr.Id] = ctr
			}
			var tr *kuportv1.Traffic
			switch s.role {
			case roleSteer:
				if ctr.ForwardedIn == nil {
					ctr.ForwardedIn = &kuportv1.Traffic{}
				}
				tr = ctr.ForwardedIn
			case roleCountOut:
				if ctr.ForwardedOut == nil {
					ctr.ForwardedOut = &kuportv1.Traffic{}
				}
				tr = ctr.ForwardedOut
			default:
				ctr.Packets += packets
				ctr.Bytes += bytes
				return
			}
			tr.Packets += packets
			tr.Bytes += bytes
		}, yield)
		if err != nil {
			return nil, err
		}
	}
	out := make([]*kuportv1.Counter, 0, len(byID))
	for _, c := range byID {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *kuportv1.Counter) int { return strings.Compare(a.Id, b.Id) })
	return out, nil
}
