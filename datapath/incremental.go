package datapath

import (
	"slices"

	"google.golang.org/protobuf/proto"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Incremental planning. A Datapath keeps the table it planned last, the program entries
// it planned it from (the caller's: Apply and Validate say the program must not change
// after the call, which saves a copy of every entry) and, since its last write, every
// element it changed with what the element was before (dirty). A program that differs from
// the last in a few entries renders only those: their old elements go, their new ones come,
// and the write that follows sends only the dirty elements. An element two entries need is
// the first one's: a changed entry that needs one an earlier entry holds (two mappings to one
// pod port share its identity SNAT element) joins it, and one that leaves it leaves it as it
// is. The result is the table planTable makes of the whole program
// (TestIncrementalEqualsFull): every case where an entry's elements could depend on other
// entries otherwise is planned whole instead. Those are a previous plan that refused an
// entry, most entries of a kind changed, entries reordered or an id repeated, a changed entry
// holding an element it shares with another, or needing one a later entry holds (it would
// hold it first), an id moving between kinds, a change of the reply exemptions' device
// prefixes (the layout), a range changed, and a single port within a range of other data.

// wholePlanAt is the number of changed entries of one kind above which a change of most
// of them is planned whole.
const wholePlanAt = 64

// setKey names one element: its set and key.
type setKey struct{ set, key string }

// prior is what an element was before the first change since the last write: absent, or e.
type prior struct {
	e       elem
	present bool
}

// entryMsg is a program entry: DnatRule, SnatRule or MarkRule.
type entryMsg interface {
	proto.Message
	GetId() string
}

// each renders every entry of the kind in p for planEntries.
func (k entryKind[T]) each(p *kuportv1.NodeProgram, add func(kind, id string, puts []put, err error)) {
	for _, e := range k.list(p) {
		puts, err := k.render(e)
		add(k.name, e.GetId(), puts, err)
	}
}

// render is entry e's elements, in the sets of its address family.
func (k entryKind[T]) render(e T) ([]put, error) { return k.puts(familyOf(k.address(e)), e) }

// entryKind is what planning one kind of entry takes: the program's list of it, its
// rendering, and equality of two entries (every field: TestSameCoversEveryField).
type entryKind[T entryMsg] struct {
	name string
	// order is the kind's place in a plan: DNAT, then SNAT, then mark entries.
	order int
	list  func(*kuportv1.NodeProgram) []T
	puts  func(family, T) ([]put, error)
	same  func(a, b T) bool
	// address is the entry's address that decides its family: its target.
	address func(T) string
}

var (
	dnatKind = entryKind[*kuportv1.DnatRule]{name: "dnat", order: 0, list: (*kuportv1.NodeProgram).GetDnatRules, puts: dnatPuts, same: sameDnat, address: (*kuportv1.DnatRule).GetToAddress}
	snatKind = entryKind[*kuportv1.SnatRule]{name: "snat", order: 1, list: (*kuportv1.NodeProgram).GetSnatRules, puts: snatPuts, same: sameSnat, address: (*kuportv1.SnatRule).GetAddress}
	markKind = entryKind[*kuportv1.MarkRule]{name: "mark", order: 2, list: (*kuportv1.NodeProgram).GetMarkRules, puts: markPuts, same: sameMark, address: (*kuportv1.MarkRule).GetAddress}
)

func samePorts(a, b *kuportv1.PortRange) bool {
	return (a == nil) == (b == nil) && a.GetFirst() == b.GetFirst() && a.GetLast() == b.GetLast()
}

func sameDnat(a, b *kuportv1.DnatRule) bool {
	return a.GetId() == b.GetId() && a.GetMapping() == b.GetMapping() && a.GetInInterface() == b.GetInInterface() &&
		a.GetMatchDestination() == b.GetMatchDestination() && a.GetProtocol() == b.GetProtocol() &&
		samePorts(a.GetPorts(), b.GetPorts()) && a.GetToAddress() == b.GetToAddress() && a.GetToPort() == b.GetToPort() &&
		a.GetStandIn() == b.GetStandIn()
}

func sameSnat(a, b *kuportv1.SnatRule) bool {
	return a.GetId() == b.GetId() && a.GetMapping() == b.GetMapping() && a.GetKind() == b.GetKind() &&
		a.GetAddress() == b.GetAddress() && a.GetProtocol() == b.GetProtocol() &&
		samePorts(a.GetPorts(), b.GetPorts())
}

func sameMark(a, b *kuportv1.MarkRule) bool {
	return a.GetId() == b.GetId() && a.GetMapping() == b.GetMapping() && a.GetAddress() == b.GetAddress() &&
		a.GetProtocol() == b.GetProtocol() && samePorts(a.GetPorts(), b.GetPorts()) && a.GetMark() == b.GetMark() &&
		a.GetKind() == b.GetKind() && a.GetInInterface() == b.GetInInterface()
}

// entryList is the planned entries of one kind, in program order, and their positions by id.
type entryList[T entryMsg] struct {
	msgs []T
	pos  map[string]int
}

func newEntryList[T entryMsg](list []T) entryList[T] {
	es := entryList[T]{msgs: make([]T, len(list)), pos: make(map[string]int, len(list))}
	for i, e := range list {
		es.msgs[i] = e
		es.pos[e.GetId()] = i
	}
	return es
}

// change is one entry whose elements change: the ones it had (none for an added entry) and
// the ones it needs (none for a removed one). after, for an entry of the program (not a
// removed one), tells whether it comes after the planned entry of kind order at position pos
// in the program, which (not removed) keeps its place among the others.
type change struct {
	kind, id string
	old, new []put
	after    func(order, pos int) bool
}

// diff compares list with the planned entries: the entries to render anew, the entries that
// replace es (es itself when nothing changed) and the update of es's positions that makes
// them next's, to run when the step commits (it changes es), or false when list cannot be
// planned entry by entry (reordered, an id repeated, an entry that does not render). The
// positions are updated in place, for the entries that moved, rather than built anew: at
// 10,000 mappings a new map cost more than the rest of the step.
func diff[T entryMsg](k entryKind[T], es entryList[T], list []T) (changes []change, added []string, next entryList[T], update func(), ok bool) {
	// changed and moved are positions in list: entries to render anew, and entries whose
	// position differs from es's; gone are positions in es of the entries list lacks.
	var changed, moved, gone []int
	prev, matched := -1, 0
	for i, e := range list {
		// Mostly the entry after the last one found is the one (ids are unique there).
		j, found := prev+1, prev+1 < len(es.msgs) && es.msgs[prev+1].GetId() == e.GetId()
		if !found {
			j, found = es.pos[e.GetId()]
		}
		if !found {
			changed, moved = append(changed, i), append(moved, i)
			continue
		}
		if j <= prev {
			return nil, nil, es, nil, false
		}
		// Found entries come in es's order, so the ones skipped are gone.
		for g := prev + 1; g < j; g++ {
			gone = append(gone, g)
		}
		if j != i {
			moved = append(moved, i)
		}
		prev, matched = j, matched+1
		// The same message is the same entry (neither may change after the call): Validate
		// before Apply, as the agent does, and a resync compare pointers only.
		if any(es.msgs[j]) != any(e) && !k.same(es.msgs[j], e) {
			changed = append(changed, i)
		}
	}
	for g := prev + 1; g < len(es.msgs); g++ {
		gone = append(gone, g)
	}
	if len(changed) == 0 && len(gone) == 0 {
		return nil, nil, es, nil, true
	}
	// Rendering most entries twice (as they were and as they are) costs more than a whole
	// plan.
	if n := len(changed) + len(gone); n > wholePlanAt && n > max(len(list), len(es.msgs))/2 {
		return nil, nil, es, nil, false
	}
	for _, j := range gone {
		old, err := k.render(es.msgs[j])
		if err != nil {
			return nil, nil, es, nil, false
		}
		changes = append(changes, change{kind: k.name, id: es.msgs[j].GetId(), old: old})
	}
	for _, i := range changed {
		e := list[i]
		c := change{kind: k.name, id: e.GetId()}
		j, found := es.pos[e.GetId()]
		if found {
			old, err := k.render(es.msgs[j])
			if err != nil {
				return nil, nil, es, nil, false
			}
			c.old = old
		} else {
			added = append(added, c.id)
		}
		puts, err := k.render(e)
		if err != nil {
			return nil, nil, es, nil, false
		}
		for n := range puts {
			puts[n].id = c.id
		}
		c.new = puts
		c.after = func(order, pos int) bool {
			if order != k.order {
				return order < k.order
			}
			// The planned entries keep their order: the entry is after the one at pos when
			// the nearest planned entry before it is that one or comes after it.
			for j := i - 1; j >= 0; j-- {
				if q, ok := es.pos[list[j].GetId()]; ok {
					return pos <= q
				}
			}
			return false
		}
		changes = append(changes, c)
	}
	// The entries are list's own (they may not change after the call), and the positions
	// es's, updated.
	next = entryList[T]{msgs: list, pos: es.pos}
	update = func() {
		for _, j := range gone {
			delete(es.pos, es.msgs[j].GetId())
		}
		for _, i := range moved {
			es.pos[list[i].GetId()] = i
		}
	}
	return changes, added, next, update, true
}

// planner is the incremental state: the table, the errors of its plan, the entries it
// was planned from, the elements two or more entries need (shared), and the elements
// changed since the last write (sync.go).
type planner struct {
	tab    *table
	errs   []error
	dnat   entryList[*kuportv1.DnatRule]
	snat   entryList[*kuportv1.SnatRule]
	mark   entryList[*kuportv1.MarkRule]
	shared map[setKey]bool
	dirty  map[setKey]prior
}

// plan returns the table planned from p and its refused entries, entry by entry where it
// can (see above), else whole. Either way the planner then holds p.
func (d *Datapath) plan(p *kuportv1.NodeProgram) (*table, []error) {
	c := &d.planned
	if c.tab != nil && len(c.errs) == 0 && c.step(p) {
		return c.tab, nil
	}
	// The table the kernel is known to hold is the planner's with its dirty elements as
	// they were: put them back, so that the write compares it with the new table whole.
	if d.known != nil && d.known.t == c.tab {
		c.revert()
	}
	t, errs, shared := planEntries(p)
	*c = planner{tab: t, errs: errs, shared: shared,
		dnat: newEntryList(p.GetDnatRules()), snat: newEntryList(p.GetSnatRules()), mark: newEntryList(p.GetMarkRules())}
	return t, errs
}

// step plans p from the planner's state entry by entry; false (and nothing changed)
// when p must be planned whole.
func (c *planner) step(p *kuportv1.NodeProgram) bool {
	// Another mask, set of return marks, the first or last range or IPv6 entry is another
	// layout: planned and written whole.
	if !c.tab.layout.sameMarks(programMarks(p)) || c.tab.layout.ranges != programRanges(p) || c.tab.layout.v6 != programV6(p) {
		return false
	}
	dc, da, dn, du, ok1 := diff(dnatKind, c.dnat, p.GetDnatRules())
	sc, sa, sn, su, ok2 := diff(snatKind, c.snat, p.GetSnatRules())
	mc, ma, mn, mu, ok3 := diff(markKind, c.mark, p.GetMarkRules())
	if !ok1 || !ok2 || !ok3 {
		return false
	}
	changes := append(append(dc, sc...), mc...)
	if len(changes) == 0 {
		return true
	}
	// An added id must be new to every kind (planTable refuses a repeated id).
	seen := map[string]bool{}
	for _, id := range append(append(da, sa...), ma...) {
		_, d := c.dnat.pos[id]
		_, s := c.snat.pos[id]
		_, m := c.mark.pos[id]
		if d || s || m || seen[id] {
			return false
		}
		seen[id] = true
	}
	// Check everything before changing anything. An element two entries need is the first
	// one's (planEntries): an entry that needs an element an earlier entry holds, the
	// same, shares it (joins), and one that leaves an element an earlier entry holds leaves
	// it as it is; an entry that would hold such an element first, or that leaves one it
	// holds for others, is planned whole.
	// A range is planned whole: whether it clashes depends on every element of its ports.
	for _, ch := range changes {
		for _, pts := range [][]put{ch.old, ch.new} {
			if slices.ContainsFunc(pts, func(pt put) bool { return pt.end != "" }) {
				return false
			}
		}
	}
	gone := map[setKey]bool{}
	var drops []put
	for _, ch := range changes {
		for _, pt := range ch.old {
			k := setKey{pt.set, pt.key}
			e, ok := c.tab.elems[pt.set][pt.key]
			if ok && e.id != ch.id && e.val == pt.val && c.shared[k] {
				continue // an earlier entry's, which stays
			}
			if !ok || e.id != ch.id || e.val != pt.val || c.shared[k] || gone[k] {
				return false
			}
			gone[k] = true
			drops = append(drops, pt)
		}
	}
	comes := map[setKey]bool{}
	var puts []put
	var joins []setKey
	var ranges rangeIndex
	for _, ch := range changes {
		for _, pt := range ch.new {
			k := setKey{pt.set, pt.key}
			m, ok := c.tab.elems[pt.set]
			if !ok || comes[k] {
				return false // a set the layout lacks, or a key two changed entries need
			}
			comes[k] = true
			if c.tab.layout.jumps(pt) != nil {
				return false // refused by the whole plan
			}
			if s := c.tab.layout.byName[pt.set]; s.ranges != nil && len(c.tab.elems[s.ranges.name]) > 0 {
				if ranges == nil {
					ranges = rangeIndexOf(c.tab)
				}
				if c.tab.rangeClash(s, pt, ranges) != nil {
					return false // a port within a range: refused by the whole plan
				}
			}
			if e, held := m[pt.key]; held && !gone[k] {
				if e.id == ch.id || e.val != pt.val || !c.earlier(e.id, ch) {
					return false
				}
				joins = append(joins, k)
				continue
			}
			puts = append(puts, pt)
		}
	}
	// A program without elements has no table at all, which a whole plan and write make.
	total := len(puts) - len(drops)
	for _, m := range c.tab.elems {
		total += len(m)
	}
	if total == 0 {
		return false
	}
	for _, pt := range drops {
		c.touch(setKey{pt.set, pt.key})
		delete(c.tab.elems[pt.set], pt.key)
	}
	for _, pt := range puts {
		c.touch(setKey{pt.set, pt.key})
		c.tab.elems[pt.set][pt.key] = pt.elem
	}
	for _, k := range joins {
		c.shared[k] = true
	}
	for _, update := range []func(){du, su, mu} {
		if update != nil {
			update()
		}
	}
	c.dnat, c.snat, c.mark = dn, sn, mn
	return true
}

// earlier reports whether the planned entry id, which stays, comes before ch's entry in
// the program.
func (c *planner) earlier(id string, ch change) bool {
	for _, k := range []struct {
		order int
		pos   map[string]int
	}{{dnatKind.order, c.dnat.pos}, {snatKind.order, c.snat.pos}, {markKind.order, c.mark.pos}} {
		if pos, ok := k.pos[id]; ok {
			return ch.after(k.order, pos)
		}
	}
	return false
}

// touch records what the element is before its first change since the last write.
func (c *planner) touch(k setKey) {
	if _, ok := c.dirty[k]; ok {
		return
	}
	if c.dirty == nil {
		c.dirty = map[setKey]prior{}
	}
	e, ok := c.tab.elems[k.set][k.key]
	c.dirty[k] = prior{e: e, present: ok}
}

// revert puts the dirty elements back as they were at the last write.
func (c *planner) revert() {
	for k, b := range c.dirty {
		if b.present {
			c.tab.elems[k.set][k.key] = b.e
		} else {
			delete(c.tab.elems[k.set], k.key)
		}
	}
	c.dirty = nil
}
