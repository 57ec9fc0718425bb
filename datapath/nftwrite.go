package datapath

import (
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Writing table ip kuport: the whole table or the elements that changed, in one transaction.

// maxElemBatch bounds the encoded size of one element list. google/nftables v0.3.0 sends a
// list in one netlink attribute whose 16-bit length wraps past 64 KiB, and the kernel then
// keeps a silently truncated list
// (docs/design/nftables.md#the-library-versions-and-a-silent-truncation: 1,261 elements of a
// 52-byte key failed); every list kuport sends is cut below it.
const maxElemBatch = 60 << 10

// elemSize bounds an element's encoded size: the nested element, key and data attributes,
// the comment's userdata and a range's end flag, each with its header and padding.
func elemSize(e nftables.SetElement) int { return 56 + len(e.Key) + len(e.Val) + len(e.Comment) }

// nftElem is e as queued to set s: its key, and to add it its data and comment, their bytes
// appended to buf, which it returns grown. A range is two kernel elements, added and deleted
// alike: its first key, and the key past its last flagged as the interval's end (an rbtree
// holds a range so, layout.go's keyType).
func nftElem(buf []byte, s *setSpec, e elem, withData bool) ([]nftables.SetElement, []byte) {
	at := len(buf)
	buf = append(buf, e.key...)
	ne := nftables.SetElement{Key: buf[at:len(buf):len(buf)]}
	if withData && s.vmap() {
		ne.VerdictData, ne.Comment = &expr.Verdict{Kind: expr.VerdictJump, Chain: e.val}, s.written(e).id
	} else if withData {
		at = len(buf)
		buf = append(buf, e.val...)
		ne.Val, ne.Comment = buf[at:len(buf):len(buf)], s.written(e).id
	}
	if e.end == "" {
		return []nftables.SetElement{ne}, buf
	}
	at = len(buf)
	buf = intervalEnd(buf, e.end)
	return []nftables.SetElement{ne, {Key: buf[at:len(buf):len(buf)], IntervalEnd: true}}, buf
}

// elemQueue queues element adds (or deletes) to one set in lists under maxElemBatch. The
// library encodes a list when it is queued, so one slice of elements and one buffer of their
// bytes serve every list of a write.
type elemQueue struct {
	d     *Datapath
	elems []nftables.SetElement
	buf   []byte
	size  int
	trace bool
}

// queue queues e for set ks of spec s, added or deleted (del).
func (q *elemQueue) queue(ks *nftables.Set, s *setSpec, e elem, del bool) error {
	if q.trace {
		what := "nft add element"
		if del {
			what = "nft delete element"
		}
		q.d.log.Trace(what, "set", s.name, "element", e.text(s, false))
	}
	nes, buf := nftElem(q.buf, s, e, !del)
	n := 0
	for _, ne := range nes {
		n += elemSize(ne)
	}
	if len(q.elems) > 0 && q.size+n > maxElemBatch {
		if err := q.send(ks, del); err != nil {
			return err
		}
		// The bytes of the sent list are encoded: queue e anew at the buffer's start.
		nes, buf = nftElem(q.buf, s, e, !del)
	}
	q.buf, q.elems, q.size = buf, append(q.elems, nes...), q.size+n
	return nil
}

// list queues elems for set ks of spec s, added or deleted (del), and sends them.
func (q *elemQueue) list(ks *nftables.Set, s *setSpec, elems []elem, del bool) error {
	for _, e := range elems {
		if err := q.queue(ks, s, e, del); err != nil {
			return err
		}
	}
	return q.send(ks, del)
}

// send queues the list gathered for set ks (nothing when it is empty) and starts the next.
func (q *elemQueue) send(ks *nftables.Set, del bool) error {
	if len(q.elems) == 0 {
		return nil
	}
	var err error
	if del {
		err = q.d.nft.SetDeleteElements(ks, q.elems)
	} else {
		err = q.d.nft.SetAddElements(ks, q.elems)
	}
	if err != nil {
		return fmt.Errorf("queue elements of %s: %w", ks.Name, err)
	}
	q.elems, q.buf, q.size = q.elems[:0], q.buf[:0], 0
	return nil
}

// writeTable queues, in one transaction, what makes the kernel, which holds have (nil: no
// table; intact: exactly in have's layout), hold want, and commits it when there is
// anything to write. A table that is not intact, or in a layout of other sets or another
// return-mark mask, is deleted and written anew; otherwise only the elements that differ
// are deleted and added, so the others keep their counters, and the chains of return marks
// that come are added before the elements that jump to them, those of marks that go deleted
// after them (a chain an element jumps to cannot be deleted). It returns the number of kernel writes and, when the
// transaction failed, the entries whose elements it added, their kind by id (all failed).
func (d *Datapath) writeTable(have *table, intact bool, want *table) (changes int, added map[string]string, err error) {
	t := &nftables.Table{Name: tableName, Family: tableFamily}
	legacy := d.legacyTable
	if have == want && intact && !legacy {
		return 0, nil, nil // the table planned from the program the kernel is known to hold
	}
	// The table agents before IPv6 wrote goes in the transaction that writes this one, so
	// no packet meets both or neither (docs/upgrade.md).
	if legacy {
		d.nft.DelTable(&nftables.Table{Name: tableName, Family: legacyTableFamily})
		d.log.Info("deleting table ip kuport of an earlier agent with this write")
		changes++
	}
	if want.empty() {
		if have != nil {
			d.nft.DelTable(t)
			d.log.Trace("nft delete table")
			changes++
		}
		if changes == 0 {
			return 0, nil, nil
		}
		return changes, nil, d.flushLegacy()
	}
	sets := map[string]*nftables.Set{}
	rebuild := have == nil || !intact || !sameShape(have.layout, want.layout)
	if rebuild {
		if have != nil {
			d.nft.DelTable(t)
			changes++
		}
		d.nft.AddTable(t)
		// The return marks' chains before the sets: their elements jump to them.
		for _, c := range want.layout.chains {
			d.nft.AddChain(c.kernelChain(t))
		}
		for _, s := range want.layout.sets {
			ks := s.kernelSet(t)
			if err := d.nft.AddSet(ks, nil); err != nil {
				return 0, nil, fmt.Errorf("queue set %s: %w", s.name, err)
			}
			sets[s.name] = ks
		}
		for _, c := range want.layout.chains {
			for _, r := range want.chainRules(c.name) {
				d.nft.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: c.name, Table: t},
					Exprs: r.exprs(func(name string) *nftables.Set { return sets[name] })})
			}
		}
		changes++
		d.log.Trace("nft (re)create table")
		have = newTable(want.layout)
	}
	comes, goes := markChanges(have.layout, want.layout)
	for _, m := range comes {
		for _, name := range []string{markChain(m), ctMarkChain(m)} {
			c, _ := want.layout.chain(name)
			d.nft.AddChain(c.kernelChain(t))
			for _, r := range want.chainRules(name) {
				d.nft.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: name, Table: t}, Exprs: r.exprs(byName)})
			}
			d.log.Trace("nft add chain", "chain", name)
			changes++
		}
	}
	q := &elemQueue{d: d, trace: d.log.IsTrace()}
	for _, s := range want.layout.sets {
		ks := sets[s.name]
		if ks == nil {
			ks = &nftables.Set{Table: t, Name: s.name}
		}
		// Deletes first: an element whose data changed is deleted and added under one key.
		for k, e := range have.elems[s.name] {
			if w, ok := want.elems[s.name][k]; !ok || !s.holds(e, w) {
				if err := q.queue(ks, s, e, true); err != nil {
					return 0, nil, err
				}
				changes++
			}
		}
		if err := q.send(ks, true); err != nil {
			return 0, nil, err
		}
		for k, w := range want.elems[s.name] {
			if e, ok := have.elems[s.name][k]; !ok || !s.holds(e, w) {
				if err := q.queue(ks, s, w, false); err != nil {
					return 0, nil, err
				}
				changes++
			}
		}
		if err := q.send(ks, false); err != nil {
			return 0, nil, err
		}
	}
	if !rebuild {
		for _, c := range chainSpecs {
			if !sameRules(have, want, c.name) {
				d.rewriteRules(t, want, c.name)
				changes++
			}
		}
	}
	for _, m := range goes {
		for _, name := range []string{markChain(m), ctMarkChain(m)} {
			d.nft.DelChain(&nftables.Chain{Name: name, Table: t})
			d.log.Trace("nft delete chain", "chain", name)
			changes++
		}
	}
	if changes == 0 {
		return 0, nil, nil
	}
	if err := d.flushLegacy(); err != nil {
		return changes, unheld(want, func(s *setSpec, k string, w elem) bool {
			e, ok := have.elems[s.name][k]
			return ok && s.holds(e, w)
		}), err
	}
	return changes, nil, nil
}

// flushLegacy commits a transaction writeTable queued, which deleted the legacy table if
// there was one: there is none after it commits.
func (d *Datapath) flushLegacy() error {
	err := d.flush()
	if err == nil {
		d.legacyTable = false
	}
	return err
}

// unheld are the entries of want's elements that held reports false for (the elements a
// failed transaction would have added), their kind by id.
func unheld(want *table, held func(s *setSpec, k string, w elem) bool) map[string]string {
	out := map[string]string{}
	for _, s := range want.layout.sets {
		for k, w := range want.elems[s.name] {
			if !held(s, k, w) {
				out[w.id] = s.kind()
			}
		}
	}
	return out
}

// writeDirty writes, in one transaction, the elements of want that dirty says changed since
// the kernel last held want (each as it was then), when the kernel holds want's layout
// intact: each changed element is deleted as it was and added as it is, so the others keep
// their counters. It returns what writeTable returns.
func (d *Datapath) writeDirty(want *table, dirty map[setKey]prior) (changes int, added map[string]string, err error) {
	t := &nftables.Table{Name: tableName, Family: tableFamily}
	dels, adds := map[string][]elem{}, map[string][]elem{}
	grown := map[string]int{} // elements a set has more than before: it had len - grown
	for k, was := range dirty {
		is, ok := want.elems[k.set][k.key]
		if ok == was.present && is == was.e {
			continue
		}
		if was.present {
			dels[k.set] = append(dels[k.set], was.e)
			grown[k.set]--
		}
		if ok {
			adds[k.set] = append(adds[k.set], is)
			grown[k.set]++
		}
	}
	q := &elemQueue{d: d, trace: d.log.IsTrace()}
	for _, s := range want.layout.sets {
		ks := &nftables.Set{Table: t, Name: s.name}
		if err := q.list(ks, s, dels[s.name], true); err != nil {
			return 0, nil, err
		}
		if err := q.list(ks, s, adds[s.name], false); err != nil {
			return 0, nil, err
		}
		changes += len(dels[s.name]) + len(adds[s.name])
	}
	// A set that got its first element or lost its last brings or takes its rules.
	for _, c := range chainSpecs {
		if slices.ContainsFunc(want.layout.chainRules(c.name), func(r ruleSpec) bool {
			n := len(want.elems[r.set])
			return r.heldWith(n) != r.heldWith(n-grown[r.set])
		}) {
			d.rewriteRules(t, want, c.name)
			changes++
		}
	}
	if changes == 0 {
		return 0, nil, nil
	}
	if err := d.flush(); err != nil {
		// The kernel holds want but for the dirty elements, as they were.
		return changes, unheld(want, func(s *setSpec, k string, w elem) bool {
			p, ok := dirty[setKey{s.name, k}]
			return !ok || p.present && p.e == w
		}), err
	}
	return changes, nil, nil
}

// rewriteRules queues chain's rules anew as want holds them: a rule comes with its set's
// first element and goes with its last (table.chainRules). The counters are the elements',
// so a rule holds none to lose.
func (d *Datapath) rewriteRules(t *nftables.Table, want *table, chain string) {
	c := &nftables.Chain{Name: chain, Table: t}
	d.nft.FlushChain(c)
	rules := want.chainRules(chain)
	for _, r := range rules {
		d.nft.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: r.exprs(byName)})
	}
	d.log.Trace("nft flush chain, add its rules", "chain", chain, "rules", len(rules))
}

// sameShape reports whether layouts a and b have the same sets and return-mark mask: a
// table in one is made the other's by elements and return marks' chains alone.
func sameShape(a, b *layout) bool {
	if len(a.sets) != len(b.sets) || a.mask != b.mask {
		return false
	}
	for i := range a.sets {
		if a.sets[i].name != b.sets[i].name {
			return false
		}
	}
	return true
}

// markChanges are the return marks layout want has and have lacks (comes), and those have
// has and want lacks (goes).
func markChanges(have, want *layout) (comes, goes []uint32) {
	for _, m := range want.marks {
		if _, found := slices.BinarySearch(have.marks, m); !found {
			comes = append(comes, m)
		}
	}
	for _, m := range have.marks {
		if _, found := slices.BinarySearch(want.marks, m); !found {
			goes = append(goes, m)
		}
	}
	return comes, goes
}

func (d *Datapath) flush() error {
	if err := d.nft.Flush(); err != nil {
		return fmt.Errorf("nftables transaction: %w", err)
	}
	return nil
}
