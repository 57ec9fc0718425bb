package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Port ranges that keep their ports, one element each in the range sets beside the
// single-port sets (layout.go, docs/design/datapath.md#port-ranges), and what planning checks
// of them: a range may not overlap another of other data, nor hold a single port it would
// translate otherwise.

// keeps reports whether the range is one element of a range set: more than one port, each
// kept (docs/design/datapath.md#port-ranges).
func (r portRange) keeps(toPort uint32) bool { return r.last > r.first && toPort == uint32(r.first) }

// programRanges reports whether program p has an entry that a range set would hold: its
// layout has the range sets then (newLayout).
func programRanges(p *kuportv1.NodeProgram) bool {
	wide := func(r *kuportv1.PortRange) bool { return r.GetLast() > r.GetFirst() }
	for _, e := range p.GetDnatRules() {
		if wide(e.GetPorts()) && e.GetToPort() == e.GetPorts().GetFirst() {
			return true
		}
	}
	for _, e := range p.GetSnatRules() {
		if wide(e.GetPorts()) {
			return true
		}
	}
	for _, e := range p.GetMarkRules() {
		if wide(e.GetPorts()) {
			return true
		}
	}
	return false
}

// rangePut is the element of set single's range set that holds ports r of key's form.
func rangePut(single string, key func(port uint16) string, r portRange, val string) put {
	return put{set: rangesName(single), elem: elem{key: key(r.first), end: key(r.last), val: val}}
}

// intervalEnd appends to buf the key an rbtree holds as the end of a range whose last key is
// last: the next key, the whole key one big-endian integer. A key ends in its port's padding,
// so the next key never carries past it.
func intervalEnd(buf []byte, last string) []byte {
	at := len(buf)
	buf = append(buf, last...)
	for i := len(buf) - 1; i >= at; i-- {
		buf[i]++
		if buf[i] != 0 {
			break
		}
	}
	return buf
}

// lastKey is the last key of a range whose end element (intervalEnd) has key end; false for
// a key no range ends at (all zeros).
func lastKey(end []byte) (string, bool) {
	b := slices.Clone(end)
	for i := len(b) - 1; i >= 0; i-- {
		b[i]--
		if b[i] != 0xff {
			return string(b), true
		}
	}
	return "", false
}

// pairRanges pairs an rbtree's elements as the kernel lists them (in no set order) into ranges,
// each its first element with end the last key of the range (elem.end's form); false when
// they do not pair, a first key followed by its end, as kuport writes them (nftElem).
func pairRanges(kes []nftables.SetElement) ([]nftables.SetElement, bool) {
	// A first key ends in its port's padding, zeros, and an end one past a last key: no two
	// of kuport's elements have one key, and others only fail to pair.
	sorted := slices.SortedFunc(slices.Values(kes), func(a, b nftables.SetElement) int { return bytes.Compare(a.Key, b.Key) })
	if len(sorted)%2 != 0 {
		return nil, false
	}
	out := make([]nftables.SetElement, 0, len(sorted)/2)
	for i := 0; i < len(sorted); i += 2 {
		first, end := sorted[i], sorted[i+1]
		last, ok := lastKey(end.Key)
		if first.IntervalEnd || !end.IntervalEnd || !ok || len(first.KeyEnd) > 0 || last < string(first.Key) {
			return nil, false
		}
		first.KeyEnd = []byte(last)
		out = append(out, first)
	}
	return out, true
}

// rangeIndex is the elements of a table's range sets by set and by key without its port:
// the ranges a port of a key could fall in.
type rangeIndex map[string]map[string][]elem

// add indexes e when set s holds ranges.
func (x rangeIndex) add(s *setSpec, e elem) {
	if !s.interval() {
		return
	}
	if x[s.name] == nil {
		x[s.name] = map[string][]elem{}
	}
	pre, _ := splitPort(e.key)
	x[s.name][pre] = append(x[s.name][pre], e)
}

// rangeIndexOf indexes t's range elements.
func rangeIndexOf(t *table) rangeIndex {
	x := rangeIndex{}
	for _, s := range t.layout.sets {
		if s.interval() {
			for _, e := range t.elems[s.name] {
				x.add(s, e)
			}
		}
	}
	return x
}

// splitPort splits a key at its last part, the port (every set keyed by a port ends in it).
func splitPort(key string) (string, uint16) {
	if len(key) < 4 {
		return key, 0
	}
	return key[:len(key)-4], binary.BigEndian.Uint16([]byte(key[len(key)-4:]))
}

// withPort is key with port in place of its last part.
func withPort(key string, port uint16) string {
	pre, _ := splitPort(key)
	return pre + pack(portBytes(port))
}

// clash says why t cannot take pt: a key t holds with other data, a port of a range t holds
// with other data as a single port or in another range (the kernel refuses overlapping
// ranges), or a single port within a range of other data; nil when it can (an element the
// same in every part is shared). A range's data is the same as a single port's when it
// translates that port the same: a DNAT range keeps the port its single port names.
func (t *table) clash(pt put, ranges rangeIndex) error {
	s := t.layout.byName[pt.set]
	if have, ok := t.elems[pt.set][pt.key]; ok && (have.val != pt.val || have.end != pt.end) {
		if s.interval() && have.val == pt.val {
			return errSplit
		}
		return fmt.Errorf("%s is %s's in %s", pt.keyText(s), have.id, pt.set)
	}
	return t.rangeClash(s, pt, ranges)
}

// errSplit is clash's answer for a range that overlaps another range of the same data
// without being it, which the kernel would refuse: its ports are written one by one
// instead (split), as they were before ranges were elements, so two mappings to
// overlapping pod port ranges of one pod still share what they need.
var errSplit = errors.New("overlaps a range of the same data")

// split is range element pt of range set s as the single-port elements of its set, each
// translated as the range translates it.
func (s *setSpec) split(pt put) []put {
	_, first := splitPort(pt.key)
	_, last := splitPort(pt.end)
	out := make([]put, 0, int(last-first)+1)
	for p := uint32(first); p <= uint32(last); p++ {
		val := pt.val
		if s.role == roleDNAT {
			val += pack(portBytes(uint16(p)))
		}
		out = append(out, put{set: s.single.name, elem: elem{key: withPort(pt.key, uint16(p)), val: val, id: pt.id}})
	}
	return out
}

// rangeClash is clash but for pt's own key: the ports of other keys pt's range holds, or the
// ranges pt's single port lies in.
func (t *table) rangeClash(s *setSpec, pt put, ranges rangeIndex) error {
	switch pre, port := splitPort(pt.key); {
	case s.interval():
		_, last := splitPort(pt.end)
		for _, have := range ranges[s.name][pre] {
			_, hf := splitPort(have.key)
			_, hl := splitPort(have.end)
			if have.key != pt.key && port <= hl && hf <= last {
				if have.val == pt.val {
					return errSplit
				}
				return fmt.Errorf("%s overlaps %s, %s's in %s", pt.keyText(s), have.keyText(s), have.id, pt.set)
			}
		}
		single := t.elems[s.single.name]
		if len(single) == 0 {
			return nil
		}
		// Each port's key in one buffer: a lookup by string(key) copies nothing.
		key := []byte(pt.key)
		for p := uint32(port); p <= uint32(last); p++ {
			binary.BigEndian.PutUint16(key[len(key)-4:], uint16(p))
			if have, ok := single[string(key)]; ok && !s.keepsAs(pt.val, uint16(p), have.val) {
				return fmt.Errorf("%s is %s's in %s", have.keyText(s.single), have.id, s.single.name)
			}
		}
	case s.ranges != nil:
		for _, have := range ranges[s.ranges.name][pre] {
			_, hf := splitPort(have.key)
			_, hl := splitPort(have.end)
			if hf <= port && port <= hl && !s.ranges.keepsAs(have.val, port, pt.val) {
				return fmt.Errorf("%s is in %s, %s's in %s", pt.keyText(s), have.keyText(s.ranges), have.id, s.ranges.name)
			}
		}
	}
	return nil
}

// keepsAs reports whether range data val of range set s translates port as single-port data
// single does.
func (s *setSpec) keepsAs(val string, port uint16, single string) bool {
	if s.role == roleDNAT {
		return single == val+pack(portBytes(port))
	}
	return single == val
}
