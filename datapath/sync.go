package datapath

import (
	"errors"
	"maps"
	"slices"
)

// known is what table ip kuport holds as of ruleset generation gen, without reading it: the
// table Apply last wrote or read (nil: no table). While t is the planner's table, the kernel
// holds it with the elements changed since (the planner's dirty ones) as they were.
type known struct {
	t   *table
	gen uint32
}

// syncTable makes table ip kuport hold want (the planner's table), in one transaction and
// only where it differs, and returns the conntrack filter of the flows its change of kup-pre's
// maps leaves going the old way (nil: none). While the ruleset
// generation is the one its last write made, nobody changed the table, so it reads nothing:
// it writes the elements planned anew since (incremental.go), or, after a whole plan,
// compares want with what it wrote. Otherwise it reads the whole table first (gen.go), which
// finds and repairs whatever someone changed.
func (d *Datapath) syncTable(want *table, changes *int) (*staleFlows, error) {
	dirty := d.planned.dirty
	d.planned.dirty = nil
	gen, gerr := d.own.generation()
	if gerr != nil {
		d.log.Debug("reading the whole table", "error", gerr)
	}
	var (
		n     int
		added map[string]string
		err   error
		stale *staleFlows
	)
	if gerr == nil && d.known != nil && d.known.gen == gen && d.known.t == want {
		n, added, err = d.writeDirty(want, dirty)
		stale = dirtyStaleFlows(want, dirty)
	} else {
		have, intact := (*table)(nil), true
		if gerr == nil && d.known != nil && d.known.gen == gen {
			have = d.known.t
		} else {
			d.known = nil
			kt, err := d.readKernel()
			if err != nil {
				return nil, err
			}
			if kt != nil {
				have, intact, _ = kt.view(kt.layout())
			}
		}
		n, added, err = d.writeTable(have, intact, want)
		stale = tableStaleFlows(have, want)
	}
	*changes += n
	if err != nil {
		d.known = nil
		// The transaction failed whole: every entry whose elements it added failed.
		if len(added) == 0 {
			return nil, err
		}
		var errs []error
		for _, id := range slices.Sorted(maps.Keys(added)) {
			errs = append(errs, &EntryError{Kind: added[id], ID: id, Err: err})
		}
		return nil, errors.Join(errs...)
	}
	if gerr != nil {
		return stale, nil
	}
	kept := want
	if want.empty() {
		kept = nil
	}
	if n == 0 {
		d.known = &known{t: kept, gen: gen}
		return stale, nil
	}
	// The generation after this transaction is the next one unless someone else committed
	// in between; then what the kernel holds is unknown until read.
	next := gen + 1
	if next == 0 {
		next = 1
	}
	d.known = nil
	if g, err := d.own.generation(); err == nil && g == next {
		d.known = &known{t: kept, gen: g}
	}
	return stale, nil
}
