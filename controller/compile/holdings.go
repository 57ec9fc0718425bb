package compile

// bucketBits: holdings are found by the 256-port bucket of each port they span, so checking a
// mapping against 10,000 others on one interface reads a few, not every one (a list made a
// compile of 10,000 mappings quadratic: 270 ms of its 1 s, issue 13).
const bucketBits = 8

// holdings are the port ranges accepted mappings hold on one key (a node's interface, or a
// link), each in the buckets it spans.
type holdings struct {
	buckets map[uint32][]holding
	// next numbers holdings in holding order: the earliest of several overlapping ranges is
	// the one a conflict names.
	next int
}

type holding struct {
	ports portRange
	by    string
	seq   int
}

func (h *holdings) add(ports portRange, by string) {
	if h.buckets == nil {
		h.buckets = map[uint32][]holding{}
	}
	x := holding{ports: ports, by: by, seq: h.next}
	h.next++
	for b := ports.first >> bucketBits; b <= ports.last>>bucketBits; b++ {
		h.buckets[b] = append(h.buckets[b], x)
	}
}

// first returns the earliest holding overlapping r, if any.
func (h *holdings) first(r portRange) (holding, bool) {
	var found holding
	ok := false
	if h == nil {
		return found, false
	}
	for b := r.first >> bucketBits; b <= r.last>>bucketBits; b++ {
		for _, x := range h.buckets[b] {
			if x.ports.overlaps(r) && (!ok || x.seq < found.seq) {
				found, ok = x, true
			}
		}
	}
	return found, ok
}
