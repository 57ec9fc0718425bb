package datapath

import (
	"fmt"
	"slices"
	"strings"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Counters returns the packets and bytes the kernel counted for every entry of the program
// last applied, one Counter per entry id, sorted by id: the sum over the entry's elements
// (one per port) of the set they are in. A DNAT entry's kup-pre elements count its new flows,
// its kup-steer and kup-count-out elements fill forwarded_in and forwarded_out. Each element
// is the entry's that the compiled table gives its key to (the one whose id the element
// carries, in a set with comments); an element two entries share counts under the entry it is
// compiled for (compileTable), and the other reports none. An element the compiled table
// lacks (someone else's, or one the next Apply removes) is left out.
//
// It reads the sets one at a time, each element's key and counter only, into buffers it keeps
// (elemcounters.go): little garbage however many elements there are. The reads (about 100 ms
// at 10,000 mappings, the agent's every report) hold no lock Apply or Validate takes, so a
// program is not held up by them: the elements are summed by entry under the lock afterwards,
// and read again under it when a compile changed the table's elements meanwhile, so every
// element counts under the entry of the table it was read beside.
func (d *Datapath) Counters() ([]*kuportv1.Counter, error) {
	d.counting.Lock()
	defer d.counting.Unlock()
	d.mu.Lock()
	sets, edits, err := d.counterSets()
	d.mu.Unlock()
	if err == nil {
		err = d.readCounters(sets)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil && d.comp.edits != edits {
		if sets, _, err = d.counterSets(); err == nil {
			err = d.readCounters(sets)
		}
	}
	if err != nil || sets == nil {
		return nil, err
	}
	return d.sumCounters(sets), nil
}

// counterSets lists the kernel's sets of table ip kuport whose elements Counters reads (in the
// layout, as compiled, with compiled elements), with the compiler's edits as of now; nil when
// there is no table. Called with d.mu held.
func (d *Datapath) counterSets() ([]*setSpec, uint64, error) {
	fam := familyIPv4
	t, err := d.kernelTableOf(fam)
	if t == nil || err != nil {
		return nil, 0, err
	}
	kernelSets, err := d.nft.GetSets(t)
	if err != nil {
		return nil, 0, fmt.Errorf("list sets: %w", err)
	}
	l := layoutOf(fam, kernelSets)
	sets := []*setSpec{}
	for _, ks := range kernelSets {
		if s := l.byName[ks.Name]; s != nil && setMatches(ks, s) && d.comp.tab != nil && d.comp.tab.elems[s.name] != nil {
			sets = append(sets, s)
		}
	}
	return sets, d.comp.edits, nil
}

// readCounters reads every element's key and counter of sets into d.counted. Called with
// d.counting held.
func (d *Datapath) readCounters(sets []*setSpec) error {
	c := &d.counted
	c.keys, c.elems = c.keys[:0], c.elems[:0]
	for i, s := range sets {
		err := d.counterSocket.setCounters(familyIPv4.table, tableName, s.name, func(key []byte, packets, bytes uint64) {
			c.keys = append(c.keys, key...)
			c.elems = append(c.elems, countedElem{set: i, end: len(c.keys), packets: packets, bytes: bytes})
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// sumCounters sums d.counted, read from sets, by the entry the compiled table gives each
// element's key to. Called with d.mu and d.counting held.
func (d *Datapath) sumCounters(sets []*setSpec) []*kuportv1.Counter {
	byID := make(map[string]*kuportv1.Counter, len(d.comp.dnat.msgs)+len(d.comp.snat.msgs)+len(d.comp.mark.msgs))
	start := 0
	for _, ce := range d.counted.elems {
		key := d.counted.keys[start:ce.end]
		start = ce.end
		s := sets[ce.set]
		e, ok := d.comp.tab.elems[s.name][string(key)]
		if !ok {
			continue
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
			ctr.Packets += ce.packets
			ctr.Bytes += ce.bytes
			continue
		}
		tr.Packets += ce.packets
		tr.Bytes += ce.bytes
	}
	out := make([]*kuportv1.Counter, 0, len(byID))
	for _, c := range byID {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *kuportv1.Counter) int { return strings.Compare(a.Id, b.Id) })
	return out
}

// counted is what Counters' last reads found, kept for the next: every element's key, one
// after the other in keys, and per element its set (an index into the sets read), the end of
// its key in keys and its counter.
type counted struct {
	keys  []byte
	elems []countedElem
}

type countedElem struct {
	set, end       int
	packets, bytes uint64
}
