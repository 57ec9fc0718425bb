package kuportv1

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// randomProgram is a program of up to n mappings drawn from r, its lists sorted as compile
// sorts them; a mapping's rules change with r too.
func randomProgram(r *rand.Rand, version uint64, n int) *NodeProgram {
	p := &NodeProgram{Node: "edge-a", Version: version, Epoch: 7}
	for i := range n {
		if r.IntN(3) == 0 {
			continue
		}
		id := fmt.Sprintf("demo/m%03d", i)
		p.DnatRules = append(p.DnatRules, &DnatRule{Id: id + "/dnat/enp1s0", Mapping: id, InInterface: "enp1s0",
			Protocol: Protocol_PROTOCOL_TCP, Ports: &PortRange{First: uint32(3000 + i), Last: uint32(3000 + i)},
			ToAddress: fmt.Sprintf("10.244.17.%d", 2+r.IntN(3)), ToPort: 3000})
		p.SnatRules = append(p.SnatRules, &SnatRule{Id: id + "/snat", Mapping: id, Kind: SnatKind_SNAT_KIND_REQUEST, Address: "10.244.17.2"})
		if r.IntN(4) == 0 {
			p.MarkRules = append(p.MarkRules, &MarkRule{Id: id + "/mark", Mapping: id, Mark: uint32(r.IntN(3))})
		}
	}
	for i := range r.IntN(4) {
		p.Links = append(p.Links, &Link{Name: fmt.Sprintf("kup-%08d", i), Mtu: uint32(1370 + r.IntN(2))})
		p.ReturnPaths = append(p.ReturnPaths, &ReturnPath{Id: fmt.Sprintf("kup-%08d/return", i), Table: uint32(201 + i)})
	}
	return p
}

// TestDeltaSequenceEqualsFull: a stream of deltas, each applied to the program the last one
// made, gives every program byte for byte (deterministic marshalling), and a change of one
// mapping puts only it on the wire.
func TestDeltaSequenceEqualsFull(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 13))
	held := &NodeProgram{}
	for v := range uint64(300) {
		next := randomProgram(r, v+1, 1+r.IntN(40))
		if v%7 == 0 {
			next = &NodeProgram{Node: "edge-a", Version: v + 1, Epoch: 7}
		}
		d := Delta(held, next)
		got, err := d.Apply(held)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := proto.MarshalOptions{Deterministic: true}.Marshal(next)
		have, _ := proto.MarshalOptions{Deterministic: true}.Marshal(got)
		if !slices.Equal(want, have) {
			t.Fatalf("version %d: delta applied differs from the program:\n%v\n%v", v+1, next, got)
		}
		held = got
	}

	// One mapping changed among 1,000: the delta carries its rule alone.
	base := randomProgram(rand.New(rand.NewPCG(2, 2)), 1, 1000)
	next := proto.Clone(base).(*NodeProgram)
	next.Version = 2
	next.DnatRules[500].ToAddress = "10.244.17.99"
	d := Delta(base, next)
	if len(d.Changed.DnatRules) != 1 || len(d.Changed.SnatRules) != 0 || len(d.Removed) != 0 {
		t.Fatalf("delta carries %d DNAT, %d SNAT rules, removes %v", len(d.Changed.DnatRules), len(d.Changed.SnatRules), d.Removed)
	}
	if full, delta := proto.Size(next), proto.Size(d); delta*100 > full {
		t.Fatalf("one change is %d bytes of a %d-byte program", delta, full)
	}
}

// TestDeltaUnsortedAndWrongBase: a list out of key order travels whole and comes back in its
// order; a delta refuses a base of another version.
func TestDeltaUnsortedAndWrongBase(t *testing.T) {
	base := &NodeProgram{Version: 1, DnatRules: []*DnatRule{{Id: "b"}, {Id: "a"}}}
	next := &NodeProgram{Version: 2, DnatRules: []*DnatRule{{Id: "c"}, {Id: "a"}}, Links: []*Link{{Name: "kup-1"}}}
	d := Delta(base, next)
	if !slices.Equal(d.Replaced, []string{"dnat_rules"}) {
		t.Fatalf("replaced %v", d.Replaced)
	}
	got, err := d.Apply(base)
	if err != nil || !proto.Equal(got, next) {
		t.Fatalf("apply: %v, %v", got, err)
	}
	if _, err := d.Apply(&NodeProgram{Version: 5}); err == nil || !strings.Contains(err.Error(), "from version 1, not 5") {
		t.Fatalf("wrong base: %v", err)
	}
}

// TestDeltaKeepsAnUntouchedList: a list the delta does not carry stays base's, in base's
// order, even unsorted (the agent reorders nothing compile did not).
func TestDeltaKeepsAnUntouchedList(t *testing.T) {
	base := &NodeProgram{Version: 1, DnatRules: []*DnatRule{{Id: "b"}, {Id: "a"}}}
	next := &NodeProgram{Version: 2, DnatRules: []*DnatRule{{Id: "b"}, {Id: "a"}}, Links: []*Link{{Name: "kup-1"}}}
	got, err := Delta(base, next).Apply(base)
	if err != nil || !proto.Equal(got, next) {
		t.Fatalf("apply: %v, %v", got, err)
	}
}

// TestDeltaApplyOutOfOrderBase: a delta that diffs a list applied to a base holding it out of
// key order (not what the sender diffed) still gives base less the removed, plus the changed,
// sorted by key.
func TestDeltaApplyOutOfOrderBase(t *testing.T) {
	base := &NodeProgram{Version: 1, DnatRules: []*DnatRule{{Id: "c"}, {Id: "a"}, {Id: "d"}}}
	d := &ProgramDelta{BaseVersion: 1, Changed: &NodeProgram{Version: 2, DnatRules: []*DnatRule{{Id: "b"}, {Id: "c", Mapping: "new"}}},
		Removed: map[string]*Keys{"dnat_rules": {Keys: []string{"d"}}}}
	got, err := d.Apply(base)
	want := &NodeProgram{Version: 2, DnatRules: []*DnatRule{{Id: "a"}, {Id: "b"}, {Id: "c", Mapping: "new"}}}
	if err != nil || !proto.Equal(got, want) {
		t.Fatalf("apply: %v, %v", got, err)
	}
}

// TestKeyedListsCoverEveryList: every keyed list of NodeProgram (its elements have an id or a
// name, keyField) has its typed diff and merge, by that key, and no other list has: a keyed
// list added to the program without one would travel whole in every delta.
func TestKeyedListsCoverEveryList(t *testing.T) {
	fields := (&NodeProgram{}).ProtoReflect().Descriptor().Fields()
	keyed := 0
	for i := range fields.Len() {
		f := fields.Get(i)
		if !f.IsList() || f.Message() == nil || keyField(f.Message()) == nil {
			continue
		}
		keyed++
		ops, ok := keyedLists[f.Name()]
		if !ok {
			t.Fatalf("list %s has no accessors in keyedLists", f.Name())
		}
		// Two elements keyed "a" and "b" in base, "b" removed and "c" added: the merge must
		// read the key Delta reads.
		base, changed, out := &NodeProgram{}, &NodeProgram{}, &NodeProgram{}
		for _, k := range []string{"a", "b"} {
			addElement(base, f, k)
		}
		addElement(changed, f, "c")
		ops.merge(base, changed, out, []string{"b"})
		l := out.ProtoReflect().Get(f).List()
		var got []string
		for j := range l.Len() {
			got = append(got, l.Get(j).Message().Get(keyField(f.Message())).String())
		}
		if !slices.Equal(got, []string{"a", "c"}) {
			t.Fatalf("list %s merged to keys %v, want [a c]", f.Name(), got)
		}
		// And the diff of base to the merge: "c" changed, "b" removed.
		diffed := &NodeProgram{}
		removed, sortedOK := ops.diff(base, out, diffed)
		l = diffed.ProtoReflect().Get(f).List()
		if !sortedOK || !slices.Equal(removed, []string{"b"}) || l.Len() != 1 || l.Get(0).Message().Get(keyField(f.Message())).String() != "c" {
			t.Fatalf("list %s diffed to %v removing %v (sorted %v), want [c] removing [b]", f.Name(), diffed, removed, sortedOK)
		}
	}
	if keyed != len(keyedLists) {
		t.Fatalf("%d keyed lists, %d merges", keyed, len(keyedLists))
	}
}

// addElement appends to p's list f an element whose key is k.
func addElement(p *NodeProgram, f protoreflect.FieldDescriptor, k string) {
	l := p.ProtoReflect().Mutable(f).List()
	e := l.NewElement()
	e.Message().Set(keyField(f.Message()), protoreflect.ValueOfString(k))
	l.Append(e)
}

// keyField is the field a list element is known by: "id", else "name"; nil when neither.
func keyField(m protoreflect.MessageDescriptor) protoreflect.FieldDescriptor {
	for _, n := range []protoreflect.Name{"id", "name"} {
		if f := m.Fields().ByName(n); f != nil && f.Kind() == protoreflect.StringKind && !f.IsList() {
			return f
		}
	}
	return nil
}
