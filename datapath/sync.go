package datapath

import (
	"errors"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// compiled is a program and the table it compiles to, kept so that re-applying the same
// program (every resync) compiles nothing.
type compiled struct {
	program *kuportv1.NodeProgram
	table   *table
	errs    []error
}

func (d *Datapath) compile(p *kuportv1.NodeProgram) (*table, []error) {
	if d.last != nil && proto.Equal(d.last.program, p) {
		return d.last.table, d.last.errs
	}
	t, errs := compileTable(p)
	d.last = &compiled{program: proto.Clone(p).(*kuportv1.NodeProgram), table: t, errs: errs}
	return t, errs
}

// known is what table ip kuport holds as of ruleset generation gen, without reading it: the
// table Apply last wrote or read (nil: no table).
type known struct {
	t   *table
	gen uint32
}

// syncTable makes table ip kuport hold want, in one transaction and only where it differs,
// and returns what it held before (nil: no table). While the ruleset generation is the one
// its last write made, nobody changed the table, so it compares want with what it wrote and
// reads nothing; otherwise it reads the whole table first (gen.go), which finds and repairs
// whatever someone changed.
func (d *Datapath) syncTable(want *table, changes *int) (*table, error) {
	gen, gerr := d.own.generation()
	if gerr != nil {
		d.log.Debug("reading the whole table", "error", gerr)
	}
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
	n, added, err := d.writeTable(have, intact, want)
	*changes += n
	if err != nil {
		d.known = nil
		if len(added) == 0 {
			return have, err
		}
		var errs []error
		for _, id := range slices.Sorted(maps.Keys(added)) {
			errs = append(errs, &EntryError{Kind: added[id], ID: id, Err: err})
		}
		return have, errors.Join(errs...)
	}
	if gerr != nil {
		return have, nil
	}
	kept := want
	if want.empty() {
		kept = nil
	}
	if n == 0 {
		d.known = &known{t: kept, gen: gen}
		return have, nil
	}
	// The generation after this transaction is the next one unless someone else committed
	// in between; then what the kernel holds is unknown until read.
	next := gen + 1
	if next == 0 {
		next = 1
	}
	if g, err := d.own.generation(); err == nil && g == next {
		d.known = &known{t: kept, gen: g}
	}
	return have, nil
}
