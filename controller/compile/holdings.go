package compile

import (
	"iter"
	"slices"
)

// bucketBits: holdings are found by the 256-port bucket of each port they span, so checking a
// mapping against 10,000 others reads a few, not every one (a list made a compile of 10,000
// mappings quadratic: 270 ms of its 1 s; BENCHMARKS.md, "Compile at 10,000 mappings").
const bucketBits = 8

// fewHoldings: up to this many holdings are one list, read whole. Most links carry a few
// mappings, each in buckets of its own, and a map of buckets per link costs more than the
// few it holds (BENCHMARKS.md, "Figures moved out of code comments").
const fewHoldings = 16

// holdings are the port ranges accepted mappings hold on one key (a protocol, or a link): in
// few while they are few, then each in the buckets it spans.
type holdings struct {
	few     []holding
	buckets map[uint32][]holding
	// next numbers holdings in holding order: the earliest of several overlapping ranges is
	// the one a conflict names.
	next int
}

// holding is one mapping's port range, held on the interfaces of on (nil: the whole key, a
// link crossing).
type holding struct {
	ports portRange
	by    *plan
	seq   int
	on    *spots
}

func (h *holdings) add(ports portRange, by *plan, on *spots) {
	x := holding{ports: ports, by: by, seq: h.next, on: on}
	h.next++
	if h.buckets == nil && len(h.few) < fewHoldings {
		h.few = append(h.few, x)
		return
	}
	if h.buckets == nil {
		h.buckets = map[uint32][]holding{}
		for _, y := range h.few {
			h.bucket(y)
		}
		h.few = nil
	}
	h.bucket(x)
}

func (h *holdings) bucket(x holding) {
	for b := x.ports.first >> bucketBits; b <= x.ports.last>>bucketBits; b++ {
		h.buckets[b] = append(h.buckets[b], x)
	}
}

// near yields the holdings that may overlap r (one spanning several buckets once per bucket).
func (h *holdings) near(r portRange) iter.Seq[holding] {
	return func(yield func(holding) bool) {
		if h == nil {
			return
		}
		if h.buckets == nil {
			for _, x := range h.few {
				if !yield(x) {
					return
				}
			}
			return
		}
		for b := r.first >> bucketBits; b <= r.last>>bucketBits; b++ {
			for _, x := range h.buckets[b] {
				if !yield(x) {
					return
				}
			}
		}
	}
}

// first returns the earliest holding overlapping r, if any.
func (h *holdings) first(r portRange) (holding, bool) {
	var found holding
	ok := false
	for x := range h.near(r) {
		if x.ports.overlaps(r) && (!ok || x.seq < found.seq) {
			found, ok = x, true
		}
	}
	return found, ok
}

// firstOn returns the first of s's interfaces (in s's order) on which a holding overlaps r,
// and the earliest such holding there.
func (h *holdings) firstOn(r portRange, s *spots) (hold, holding, bool) {
	var found holding
	at := -1
	for x := range h.near(r) {
		if !x.ports.overlaps(r) {
			continue
		}
		if i := s.firstShared(x.on); i >= 0 && (at < 0 || i < at || i == at && x.seq < found.seq) {
			at, found = i, x
		}
	}
	if at < 0 {
		return hold{}, found, false
	}
	return s.list[at], found, true
}

// spots are the (node, interface, protocol) a mapping holds its ports on, in holding order
// (accepting nodes by name, each node's interfaces sorted). Every mapping of a class binding
// the same interfaces shares one, so holding a port on 1,000 accepting nodes is one holding,
// not 1,000.
type spots struct {
	list []hold
	at   map[hold]int
}

func newSpots(list []hold) *spots {
	s := &spots{list: list, at: make(map[hold]int, len(list))}
	for i, h := range list {
		if _, ok := s.at[h]; !ok {
			s.at[h] = i
		}
	}
	return s
}

// firstShared is the index in s of the first of its spots o holds too, -1 when none is.
func (s *spots) firstShared(o *spots) int {
	switch {
	case o == s:
		if len(s.list) == 0 {
			return -1
		}
		return 0
	case len(o.list) < len(s.list):
		best := -1
		for _, h := range o.list {
			if i, ok := s.at[h]; ok && (best < 0 || i < best) {
				best = i
			}
		}
		return best
	}
	for i, h := range s.list {
		if _, ok := o.at[h]; ok {
			return i
		}
	}
	return -1
}

// remove drops by's holding of ports.
func (h *holdings) remove(ports portRange, by *plan) {
	if h == nil {
		return
	}
	if h.buckets == nil {
		h.few = slices.DeleteFunc(h.few, func(x holding) bool { return x.by == by })
		return
	}
	for b := ports.first >> bucketBits; b <= ports.last>>bucketBits; b++ {
		h.buckets[b] = slices.DeleteFunc(h.buckets[b], func(x holding) bool { return x.by == by })
	}
}
