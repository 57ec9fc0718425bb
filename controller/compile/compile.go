package compile

import (
	"cmp"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Compile turns a snapshot into one program per node and the status of every PortMap and
// PortMapClass. It is pure and deterministic: it reads only s (never mutates it), uses s.Now
// as its only time, and returns every slice sorted, so the same snapshot always yields an
// identical result. A nil snapshot yields an empty result.
//
// Decisions follow docs/design/api.md and docs/design/software.md#shape: acceptance in the
// API's reason order, the endpoint choice, the serving node, per-node interfaces, the return
// path of docs/design/datapath.md#return-path-modes-and-the-refusal-matrix, link slots,
// per-node tables and marks, and link MTU, under servingMode Single and Multi alike.
func Compile(s *Snapshot) *Result {
	_, r := compileFull(s)
	return r
}

// compileFull is Compile, returning the compiler's final state too (Incremental keeps it).
func compileFull(s *Snapshot) (*compiler, *Result) {
	if s == nil {
		s = &Snapshot{}
	}
	c := newCompiler(s)
	c.interned, c.wires = map[string]string{}, map[portRange]*kuportv1.PortRange{}
	c.validateClasses()
	c.loadClaims()
	for _, pm := range c.sortedPortMaps() {
		c.plans = append(c.plans, c.plan(pm))
	}
	c.allocate()
	for _, p := range c.plans {
		c.emit(p)
	}
	r := c.result()
	// The result holds the programs and indexes; Incremental keeps c, and the builders' own
	// sets of links and return paths would stay live with it.
	c.programs, c.interned, c.wires = nil, nil, nil
	return c, r
}

// intern returns the copy of s the compile holds already, if any: a message or link key made
// for many mappings is then kept once (the messages naming a mapping's nodes most of all;
// BENCHMARKS.md, "Figures moved out of code comments"). Only a full compile interns: an
// update compiles few mappings, and a table kept with the state would only grow.
func (c *compiler) intern(s string) string {
	if c.interned == nil {
		return s
	}
	if t, ok := c.interned[s]; ok {
		return t
	}
	c.interned[s] = s
	return s
}

// wire is r as rules carry it, one message per range during a full compile, like intern: the
// pod port of many mappings is the same (BENCHMARKS.md, "Figures moved out of code comments").
func (c *compiler) wire(r portRange) *kuportv1.PortRange {
	if w := c.wires[r]; w != nil {
		return w
	}
	w := r.wire()
	if c.wires != nil {
		c.wires[r] = w
	}
	return w
}

// compiler holds one compilation's working state.
type compiler struct {
	s *Snapshot
	// marking is s.ReturnMarking, or the default.
	marking ReturnMarking
	// stamp is s.Now at the API's one-second precision, so a time compile writes reads back
	// unchanged.
	stamp metav1.Time
	nodes map[string]*nodeView
	// classes by name and in age order (creationTimestamp, then name): the older class wins
	// a subnet or VNI dispute.
	classes    map[string]*classInfo
	classOrder []*classInfo
	// plans in holding order: mappings whose status says they are accepted first, then by
	// age (creationTimestamp, then namespace/name); the first accepted holds a contested port.
	plans []*plan
	// tables in use per node across every class's claims.
	tables map[string]map[int32]bool
	// held: the port ranges accepted mappings hold per protocol, each on its (node, interface)
	// spots.
	held map[kuportv1.Protocol]*holdings
	// crossings: the dialed port ranges that accepted mappings send over each link.
	crossings map[crossing]*holdings
	// programs being built (nil once the result is: an update builds its own).
	programs map[string]*programBuilder
	// interned and wires: the strings and port ranges intern and wire share, during a full
	// compile.
	interned map[string]string
	wires    map[portRange]*kuportv1.PortRange
}

func newCompiler(s *Snapshot) *compiler {
	c := &compiler{
		s:         s,
		marking:   s.marking(),
		stamp:     metav1.NewTime(s.Now.Truncate(time.Second)),
		nodes:     map[string]*nodeView{},
		classes:   map[string]*classInfo{},
		tables:    map[string]map[int32]bool{},
		held:      map[kuportv1.Protocol]*holdings{},
		crossings: map[crossing]*holdings{},
		programs:  map[string]*programBuilder{},
	}
	for name, n := range s.Nodes {
		if n != nil {
			c.nodes[name] = &nodeView{name: name, exists: true}
			c.programs[name] = newProgramBuilder(name)
		}
	}
	for name, a := range s.Agents {
		if a == nil || a.State == nil {
			continue
		}
		v := c.node(name)
		v.state, v.tunnels = a.State, tunnelsOf(a.State)
		c.nodes[name] = v
	}
	if s.CNI != nil {
		cv := newCNIView(s.CNI)
		for name, v := range c.nodes {
			v.cniRefusal, v.cniWarning = cv.verdict(s.Nodes[name], v)
		}
	}
	for name, cl := range s.Classes {
		if cl != nil {
			c.classes[name] = newClassInfo(name, cl, c.nodes)
		}
	}
	c.classOrder = sortedValues(c.classes, func(a, b *classInfo) int {
		return cmp.Or(compareTime(a.obj.CreationTimestamp, b.obj.CreationTimestamp), cmp.Compare(a.name, b.name))
	})
	return c
}

// node returns what is known of a node; an unknown name yields a view with no Node object
// and no agent state.
func (c *compiler) node(name string) *nodeView {
	if v, ok := c.nodes[name]; ok {
		return v
	}
	return &nodeView{name: name}
}

func (c *compiler) sortedPortMaps() []*v1alpha1.PortMap {
	pms := make([]*v1alpha1.PortMap, 0, len(c.s.PortMaps))
	seen := map[types.NamespacedName]bool{}
	for _, pm := range c.s.PortMaps {
		if pm == nil {
			continue
		}
		k := types.NamespacedName{Namespace: pm.Namespace, Name: pm.Name}
		if !seen[k] {
			seen[k] = true
			pms = append(pms, pm)
		}
	}
	slices.SortFunc(pms, func(a, b *v1alpha1.PortMap) int {
		return cmp.Or(-cmp.Compare(holdsPorts(a), holdsPorts(b)), compareTime(a.CreationTimestamp, b.CreationTimestamp),
			cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return pms
}

// holdsPorts is 1 for a mapping whose recorded status says it is accepted: it holds its
// ports, and an older mapping that becomes valid later (its class appears, say) does not
// take them from it under live traffic.
func holdsPorts(pm *v1alpha1.PortMap) int {
	if meta.IsStatusConditionTrue(pm.Status.Conditions, v1alpha1.ConditionAccepted) {
		return 1
	}
	return 0
}

func (c *compiler) result() *Result {
	r := &Result{
		Programs: map[string]*kuportv1.NodeProgram{},
		PortMaps: map[types.NamespacedName]*PortMapResult{},
		Classes:  map[string]*v1alpha1.PortMapClassStatus{},
		Index:    map[string]NodeIndex{},
		Keys:     map[string]types.NamespacedName{},
	}
	for name, b := range c.programs {
		r.Programs[name] = b.program()
		r.Programs[name].ReturnMarking = c.marking.wire()
		r.Index[name] = b.nodeIndex()
	}
	for _, p := range c.plans {
		k := types.NamespacedName{Namespace: p.pm.Namespace, Name: p.pm.Name}
		r.PortMaps[k], r.Keys[p.key] = c.portMapResult(p), k
	}
	for _, ci := range c.classOrder {
		r.Classes[ci.name] = c.classStatus(ci)
	}
	return r
}

func compareTime(a, b metav1.Time) int { return a.Compare(b.Time) }

// sortedValues returns a map's values ordered by cmpFn.
func sortedValues[K comparable, V any](m map[K]V, cmpFn func(a, b V) int) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	slices.SortFunc(out, cmpFn)
	return out
}
