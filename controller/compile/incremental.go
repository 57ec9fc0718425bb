package compile

import (
	"cmp"
	"iter"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// maxDirtyShare: when more than one mapping in this many changed, a full compile is as cheap.
const maxDirtyShare = 8

// Incremental compiles a sequence of snapshots, each the cluster a moment after the one
// before, and returns for each exactly what Compile returns for it; it recompiles only the
// PortMaps whose inputs changed (the PortMap, its Service or EndpointSlices) when nothing
// else did and the change is isolated: the mapping shares no contested port, link crossing
// or reply way with another, and needs only links other mappings keep. Any other change
// (a class, a node, an agent's state, a namespace, a contested port, a link appearing or
// going unused, a pod on a node whose tunnel uses its class's port) compiles the whole
// snapshot. It is told what changed (Changes), as the controller's informers tell it, and
// compares no objects.
//
// It keeps the last snapshot's compiler state, never mutates a snapshot and shares unchanged
// parts of the previous Result (its programs, indexes and statuses), which the caller must
// not mutate either. Not safe for concurrent use.
type Incremental struct {
	prev *Snapshot
	c    *compiler
	res  *Result
	// recompiled is how many mappings the last Compile planned; changed are the PortMaps
	// whose result it may have changed (nil after a full compile: any).
	recompiled int
	changed    []types.NamespacedName

	// plans by PortMap: each plan's pm is the PortMap compiled.
	plans map[types.NamespacedName]*plan
	// byService: the PortMaps whose serviceRef names each Service, but one named after it
	// (bench/fanout's every one), which plans has by that key (mappingsOf). Nearly always
	// one: a list, not a set per Service (BENCHMARKS.md, "What compile keeps live").
	byService map[types.NamespacedName][]types.NamespacedName
	// needers counts the plans needing each link ("<class>/<pair>").
	needers map[string]int
	// users counts, per node, the mappings whose index names each link device or return path.
	users map[string]map[string]int
	// conflicted are the plans refused for a port another mapping holds.
	conflicted map[types.NamespacedName]*plan
	// stamped are the plans whose status carries the snapshot's time (a condition changed
	// status); classStamped: some class's does. A new second recompiles them.
	stamped      map[types.NamespacedName]bool
	classStamped bool
	// settled: every class's status records the link claims compile left (after a compile
	// that allocated a slot or a table, the next full compile allocates again, in mapping
	// order, until the class status records them).
	settled bool
}

// Recompiled is how many mappings the last Compile planned: every one after a full compile.
func (inc *Incremental) Recompiled() int { return inc.recompiled }

// Changed returns the PortMaps whose result the last Compile may have changed (created,
// updated, deleted or restamped), sorted; nil after a full compile, when any may have. Every
// other PortMap's result is the previous one's, the same pointer.
func (inc *Incremental) Changed() []types.NamespacedName { return inc.changed }

// Changes names what changed from the snapshot given to Incremental before to the next, as
// the informers' events tell it: nothing is compared, and the snapshot's maps may be the
// previous ones updated in place. It must name every change (a missed one stays uncompiled
// until a full compile).
type Changes struct {
	// PortMaps created or updated (the object) or deleted (nil).
	PortMaps map[types.NamespacedName]*v1alpha1.PortMap
	// Services whose Service or EndpointSlices were created, updated or deleted.
	Services map[types.NamespacedName]bool
	// Classes: the PortMapClasses created, updated or deleted. An update of a class that
	// builds no links recompiles its mappings alone; any other a full compile.
	Classes map[string]bool
	// Others: a Node, Namespace, agent state or the CNI's settings changed (a full compile).
	Others bool
}

// CompileChanges returns Compile(s), with ch naming what changed since the previous call,
// reusing that call's work where the changes allow (ch nil: unknown, a full compile).
func (inc *Incremental) CompileChanges(s *Snapshot, ch *Changes) *Result {
	if s == nil {
		s = &Snapshot{}
	}
	if r := inc.update(s, ch); r != nil {
		inc.prev, inc.res = s, r
		return r
	}
	// The previous state (besides the result the caller holds) is no use to a full compile:
	// it goes before the new one is built, not after (BENCHMARKS.md, "What compile keeps
	// live").
	*inc = Incremental{}
	c, r := compileFull(s)
	inc.reset(s, c, r)
	return r
}

// reset records a full compile's state.
func (inc *Incremental) reset(s *Snapshot, c *compiler, r *Result) {
	*inc = Incremental{prev: s, c: c, res: r, recompiled: len(c.plans),
		plans:     map[types.NamespacedName]*plan{},
		byService: map[types.NamespacedName][]types.NamespacedName{},
		needers:   map[string]int{},
		users:     map[string]map[string]int{}, stamped: map[types.NamespacedName]bool{},
		conflicted: map[types.NamespacedName]*plan{}}
	for _, p := range c.plans {
		k := nsName(p.pm.Namespace, p.pm.Name)
		inc.track(k, p, r.PortMaps[k])
	}
	// inc.plans holds them by key: the list would keep the plans an update replaces live.
	c.plans = nil
	for name, idx := range r.Index {
		u := map[string]int{}
		for _, mi := range idx {
			countUses(u, mi, 1)
		}
		inc.users[name] = u
	}
	inc.settled = true
	for _, ci := range c.classOrder {
		inc.classStamped = inc.classStamped || stampedConditions(ci.obj.Status.Conditions, r.Classes[ci.name].Conditions)
		inc.settled = inc.settled && equality.Semantic.DeepEqual(ci.obj.Status.Links, r.Classes[ci.name].Links)
	}
}

// track records a plan's part in the bookkeeping; untrack undoes it.
func (inc *Incremental) track(k types.NamespacedName, p *plan, r *PortMapResult) {
	inc.plans[k] = p
	svc := nsName(p.pm.Namespace, p.pm.Spec.ServiceRef.Name)
	if svc != k && !slices.Contains(inc.byService[svc], k) {
		inc.byService[svc] = append(inc.byService[svc], k)
	}
	for _, n := range p.needs {
		inc.needers[n]++
	}
	if p.acceptReason == v1alpha1.ReasonPortConflict {
		inc.conflicted[k] = p
	}
	if stampedConditions(p.pm.Status.Conditions, r.Status.Conditions) {
		inc.stamped[k] = true
	}
}

// portMap is the PortMap compiled as k (nil: none).
func (inc *Incremental) portMap(k types.NamespacedName) *v1alpha1.PortMap {
	if p := inc.plans[k]; p != nil {
		return p.pm
	}
	return nil
}

func (inc *Incremental) untrack(k types.NamespacedName, p *plan) {
	delete(inc.plans, k)
	svc := nsName(p.pm.Namespace, p.pm.Spec.ServiceRef.Name)
	if svc != k {
		if rest := slices.DeleteFunc(inc.byService[svc], func(x types.NamespacedName) bool { return x == k }); len(rest) > 0 {
			inc.byService[svc] = rest
		} else {
			delete(inc.byService, svc)
		}
	}
	for _, n := range p.needs {
		inc.needers[n]--
	}
	delete(inc.conflicted, k)
	delete(inc.stamped, k)
}

// mappingsOf yields the PortMaps whose serviceRef names svc.
func (inc *Incremental) mappingsOf(svc types.NamespacedName) iter.Seq[types.NamespacedName] {
	return func(yield func(types.NamespacedName) bool) {
		if p := inc.plans[svc]; p != nil && p.pm.Spec.ServiceRef.Name == svc.Name && !yield(svc) {
			return
		}
		for _, k := range inc.byService[svc] {
			if !yield(k) {
				return
			}
		}
	}
}

// countUses adds d to each link device and return path mi names.
func countUses(u map[string]int, mi *MappingIndex, d int) {
	for _, l := range mi.Links {
		u[l] += d
	}
	for _, rp := range mi.ReturnPaths {
		u[rp] += d
	}
}

// stampedConditions reports whether a condition of want changed status from old's: its
// lastTransitionTime is then the snapshot's time.
func stampedConditions(old, want []metav1.Condition) bool {
	for _, w := range want {
		if o := meta.FindStatusCondition(old, w.Type); o == nil || o.Status != w.Status {
			return true
		}
	}
	return false
}

// update compiles s from the previous state when only isolated PortMap changes separate
// them, or returns nil (the state is then to be discarded: a full compile follows).
func (inc *Incremental) update(s *Snapshot, ch *Changes) *Result {
	prev, c := inc.prev, inc.c
	if prev == nil || !inc.settled || s.LinkRetention != prev.LinkRetention || s.marking() != prev.marking() {
		return nil
	}
	if ch == nil || ch.Others {
		return nil
	}
	edits, ok := inc.changedClasses(s, ch)
	if !ok {
		return nil
	}
	stamp := metav1.NewTime(s.Now.Truncate(1e9))
	restamp := !stamp.Equal(&c.stamp)
	if restamp && (inc.classStamped || c.anyUnusedClaim()) {
		return nil
	}
	dirty, pms := inc.dirty(ch)
	if extra := inc.classMappings(edits); len(extra) > 0 {
		for _, k := range extra {
			if !slices.Contains(dirty, k) {
				dirty, pms[k] = append(dirty, k), inc.portMap(k)
			}
		}
		slices.SortFunc(dirty, compareKeys)
	}
	if len(dirty)*maxDirtyShare > len(inc.plans)+maxDirtyShare {
		return nil
	}
	c.s, c.stamp = s, stamp
	r := &Result{Programs: maps.Clone(inc.res.Programs), PortMaps: maps.Clone(inc.res.PortMaps),
		Classes: inc.res.Classes, Index: maps.Clone(inc.res.Index), Keys: inc.res.Keys}
	ed := &edit{inc: inc, r: r, programs: map[string]*programEdit{}}
	var removed []*plan
	for _, k := range dirty {
		if p := inc.plans[k]; p != nil {
			if !ed.remove(k, p) {
				return nil
			}
			removed = append(removed, p)
		}
	}
	// A refused mapping's fate changes only if a change touches the ports it tried to hold.
	if inc.touchesConflicted(removed) {
		return nil
	}
	edits.apply(c)
	inc.recompiled = 0
	for _, k := range dirty {
		pm := pms[k]
		if pm == nil {
			if _, had := r.PortMaps[k]; had {
				ed.keys()
				delete(r.Keys, Key(k.Namespace, k.Name))
			}
			delete(r.PortMaps, k)
			continue
		}
		inc.recompiled++
		p := ed.add(k, pm)
		if p == nil || inc.touchesConflicted([]*plan{p}) {
			return nil
		}
	}
	if !ed.commit() {
		return nil
	}
	edits.statuses(inc, r)
	changed := slices.Clone(dirty)
	if restamp {
		for k := range inc.stamped {
			if !slices.Contains(dirty, k) {
				r.PortMaps[k] = c.portMapResult(inc.plans[k])
				changed = append(changed, k)
			}
		}
	}
	slices.SortFunc(changed, compareKeys)
	if changed == nil {
		changed = []types.NamespacedName{}
	}
	inc.changed = changed
	return r
}

// dirty returns the PortMaps whose inputs ch says changed (created, deleted, updated, or
// their Service or EndpointSlices changed), sorted, and each as compiled now: ch's, else the
// one compiled before (nil: deleted).
func (inc *Incremental) dirty(ch *Changes) ([]types.NamespacedName, map[types.NamespacedName]*v1alpha1.PortMap) {
	pms := maps.Clone(ch.PortMaps)
	if pms == nil {
		pms = map[types.NamespacedName]*v1alpha1.PortMap{}
	}
	for svc := range ch.Services {
		for k := range inc.mappingsOf(svc) {
			if _, ok := pms[k]; !ok {
				pms[k] = inc.portMap(k)
			}
		}
	}
	return slices.SortedFunc(maps.Keys(pms), compareKeys), pms
}

// anyUnusedClaim: a claim no mapping needs is stamped, and ages, with the snapshot's time.
func (c *compiler) anyUnusedClaim() bool {
	for _, ci := range c.classOrder {
		for _, cl := range ci.claims {
			if cl.unusedSince != nil {
				return true
			}
		}
	}
	return false
}

// compareKeys orders PortMaps by namespace, then name.
func compareKeys(a, b types.NamespacedName) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
}

// edit is one incremental update's changes to the node programs.
type edit struct {
	inc      *Incremental
	r        *Result
	programs map[string]*programEdit
	// ownKeys: r.Keys is a copy of the previous result's.
	ownKeys bool
}

// programEdit is one node's program being edited: the ids removed, the entries added.
type programEdit struct {
	removed map[string]bool
	added   *programBuilder
	index   NodeIndex // copy of the node's index
}

func (ed *edit) node(name string) *programEdit {
	pe := ed.programs[name]
	if pe == nil {
		pe = &programEdit{removed: map[string]bool{}, added: newProgramBuilder(name), index: maps.Clone(ed.r.Index[name])}
		ed.programs[name] = pe
	}
	return pe
}

// remove takes plan p of k out of the state: its holdings, its links' needs and its entries.
// It returns false when that changes more than p's own entries (a link it alone needed or
// used).
func (ed *edit) remove(k types.NamespacedName, p *plan) bool {
	inc, c := ed.inc, ed.inc.c
	inc.untrack(k, p)
	if c.podTunnel(p) {
		return false
	}
	for _, n := range p.needs {
		if inc.needers[n] == 0 {
			return false
		}
	}
	if p.accepted() {
		c.release(p)
	}
	// Only the nodes carrying its entries index it (emit's carriers).
	for _, name := range p.nodes {
		mi := ed.r.Index[name][p.key]
		if mi == nil {
			continue
		}
		pe := ed.node(name)
		for _, e := range mi.Entries {
			pe.removed[e.ID] = true
		}
		delete(pe.index, p.key)
		u := inc.users[name]
		countUses(u, mi, -1)
		for _, l := range append(slices.Clone(mi.Links), mi.ReturnPaths...) {
			if u[l] == 0 {
				return false
			}
		}
	}
	delete(ed.r.PortMaps, k)
	return true
}

// add plans pm (key k) against everything else held, and emits it. It returns nil when pm
// is not isolated: refused for a port another mapping holds, or needing a link no other
// mapping needs, or a link or return path its nodes' programs lack.
func (ed *edit) add(k types.NamespacedName, pm *v1alpha1.PortMap) *plan {
	inc, c := ed.inc, ed.inc.c
	p := c.plan(pm)
	if p.acceptReason == v1alpha1.ReasonPortConflict || c.podTunnel(p) {
		return nil
	}
	for _, t := range p.remoteTargets() {
		n := p.class.name + "/" + pairKey(p.pair(t))
		cl := p.class.claims[pairKey(p.pair(t))]
		if inc.needers[n] == 0 || cl == nil {
			return nil
		}
		if _, ok := cl.ends[p.ep.node]; !ok {
			return nil
		}
		t.link = cl
		p.needs = append(p.needs, n)
	}
	// emit writes into builders of its own, so they hold pm's entries alone.
	c.programs = map[string]*programBuilder{}
	for _, n := range append(targetNodes(p), epNode(p)) {
		if _, ok := ed.r.Programs[n]; ok {
			c.programs[n] = ed.node(n).added
		}
	}
	c.emit(p)
	c.programs = nil
	for _, name := range p.nodes {
		pe := ed.programs[name]
		if pe == nil {
			continue
		}
		mi := pe.added.index[p.key]
		if mi == nil {
			continue
		}
		u := inc.users[name]
		for _, l := range append(slices.Clone(mi.Links), mi.ReturnPaths...) {
			if u[l] == 0 {
				return nil
			}
		}
		countUses(u, mi, 1)
	}
	res := c.portMapResult(p)
	inc.track(k, p, res)
	if ed.r.Keys[p.key] != k {
		ed.keys()
		ed.r.Keys[p.key] = k
	}
	ed.r.PortMaps[k] = res
	return p
}

// podTunnel reports whether a plan's pod is on a node its class does not accept where a
// tunnel of another program uses the class's port: the class's status names such a node
// while a mapping's link would go to it (tunnelConflicts), so the plan's change may change
// the class's status too. The link rules do not catch it: such a plan builds no link, and
// one refused for want of a slot needs the same links without naming the node.
func (c *compiler) podTunnel(p *plan) bool {
	return p.class != nil && p.ep != nil && !p.class.accepts(p.ep.node) && c.tunnelConflict(p.class, p.ep.node) != ""
}

// keys makes the result's Keys its own before a change (the previous result's are shared
// while no PortMap comes or goes).
func (ed *edit) keys() {
	if !ed.ownKeys {
		ed.r.Keys, ed.ownKeys = maps.Clone(ed.r.Keys), true
	}
}

func targetNodes(p *plan) []string {
	var out []string
	for _, t := range p.targets {
		out = append(out, t.node)
	}
	return out
}

func epNode(p *plan) string {
	if p.ep == nil {
		return ""
	}
	return p.ep.node
}

// commit writes the edited programs and indexes into the result. The links and return paths
// added are already in the programs (add checked): only rules are added.
func (ed *edit) commit() bool {
	for name, pe := range ed.programs {
		old := ed.r.Programs[name]
		if old == nil {
			return false
		}
		add := pe.added.program()
		if len(pe.removed) == 0 && len(add.DnatRules)+len(add.SnatRules)+len(add.MarkRules) == 0 {
			continue
		}
		ed.r.Programs[name] = &kuportv1.NodeProgram{Node: old.Node, Links: old.Links, ReturnPaths: old.ReturnPaths,
			ReturnMarking: old.ReturnMarking,
			DnatRules:     merge(old.DnatRules, add.DnatRules, pe.removed, (*kuportv1.DnatRule).GetId),
			SnatRules:     merge(old.SnatRules, add.SnatRules, pe.removed, (*kuportv1.SnatRule).GetId),
			MarkRules:     merge(old.MarkRules, add.MarkRules, pe.removed, (*kuportv1.MarkRule).GetId),
		}
		for key, mi := range pe.added.nodeIndex() {
			pe.index[key] = mi
		}
		ed.r.Index[name] = pe.index
	}
	return true
}

// merge returns old without the removed ids and with add, sorted by id as program() sorts
// (nil when empty, as a builder leaves it). old is sorted: each id is found by binary search,
// as a scan hashing every id of 10,000 mappings took most of an incremental update.
func merge[T any](old, add []T, removed map[string]bool, id func(T) string) []T {
	byID := func(e T, t string) int { return strings.Compare(id(e), t) }
	// Room for every insert: one past a full copy doubled a node's list of 10,000 rules.
	out := append(make([]T, 0, len(old)+len(add)), old...)
	for r := range removed {
		if i, found := slices.BinarySearchFunc(out, r, byID); found {
			out = slices.Delete(out, i, i+1)
		}
	}
	for _, x := range add {
		i, _ := slices.BinarySearchFunc(out, id(x), byID)
		out = slices.Insert(out, i, x)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// release takes an accepted plan's holdings back (hold's inverse).
func (c *compiler) release(p *plan) {
	c.held[p.proto].remove(p.ports, p)
	for _, k := range p.crossed {
		c.crossings[k].remove(p.ports, p)
	}
}

// touchesConflicted reports whether a plan of ps tried to hold ports a refused mapping tried
// to hold too (on an interface or a link crossing).
func (inc *Incremental) touchesConflicted(ps []*plan) bool {
	for _, q := range inc.conflicted {
		for _, p := range ps {
			if attempts(p).touch(attempts(q)) {
				return true
			}
		}
	}
	return false
}

// attempt is what a plan tried to hold: ports on interfaces and over links.
type attempt struct {
	ports     portRange
	holds     *spots
	crossings []crossing
}

func attempts(p *plan) attempt {
	a := attempt{ports: p.ports}
	if p.class == nil {
		return a
	}
	a.holds = p.holds()
	if p.ep == nil {
		return a
	}
	for _, t := range p.targets {
		if t.node != p.ep.node {
			a.crossings = append(a.crossings, crossing{class: p.class.name, pair: pairKey(p.pair(t)), proto: p.proto})
		}
	}
	return a
}

func (a attempt) touch(b attempt) bool {
	if !a.ports.overlaps(b.ports) {
		return false
	}
	if a.holds != nil && b.holds != nil && a.holds.firstShared(b.holds) >= 0 {
		return true
	}
	for _, x := range a.crossings {
		if slices.Contains(b.crossings, x) {
			return true
		}
	}
	return false
}
