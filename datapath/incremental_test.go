package datapath

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"kuport.wlz.li/kuport/datapath/datapathtest"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// errTexts are errors as the Ack carries them.
func errTexts(errs []error) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.Error())
	}
	return out
}

// checkPlan plans p through dp's planner and checks the result against planTable
// of the whole program: the same elements (ids included), layout and errors. It reports
// whether the plan was incremental (the planner kept its table).
func checkPlan(t *testing.T, dp *Datapath, p *kuportv1.NodeProgram, step string) bool {
	t.Helper()
	before := dp.planned.tab
	got, gotErrs := dp.plan(p)
	want, wantErrs := planTable(p)
	require.Equal(t, want.elems, got.elems, step)
	require.Equal(t, want.text(), got.text(), step)
	require.Equal(t, errTexts(wantErrs), errTexts(gotErrs), step)
	return before == got
}

func dnatEntry(id, port, to string, toPort uint32) *kuportv1.DnatRule {
	var p uint32
	_, _ = fmt.Sscan(port, &p)
	return &kuportv1.DnatRule{Id: id, Mapping: "ns/" + id, InInterface: "enp1s0", Protocol: kuportv1.Protocol_PROTOCOL_TCP,
		Ports: &kuportv1.PortRange{First: p, Last: p}, ToAddress: to, ToPort: toPort, StandIn: to}
}

func snatEntry(id, addr string, port uint32, kind kuportv1.SnatKind) *kuportv1.SnatRule {
	return &kuportv1.SnatRule{Id: id, Mapping: "ns/" + id, Kind: kind, Address: addr,
		Protocol: kuportv1.Protocol_PROTOCOL_TCP, Ports: &kuportv1.PortRange{First: port, Last: port}}
}

// TestIncrementalSteps runs a sequence of programs through the planner and the fake
// kernel: each plan equals the whole program's, one mapping changed is planned
// incrementally and writes only its elements, and the cases that depend on other entries
// are planned whole.
func TestIncrementalSteps(t *testing.T) {
	req, rep := kuportv1.SnatKind_SNAT_KIND_REQUEST, kuportv1.SnatKind_SNAT_KIND_REPLY
	base := func() *kuportv1.NodeProgram {
		p := &kuportv1.NodeProgram{Node: "edge-a"}
		for i := range 4 {
			pod := fmt.Sprintf("10.244.1.%d", 10+i)
			p.DnatRules = append(p.DnatRules, dnatEntry(fmt.Sprintf("m%d/dnat", i), fmt.Sprint(4000+i), pod, 3000))
			p.SnatRules = append(p.SnatRules, snatEntry(fmt.Sprintf("m%d/snat", i), pod, 3000, req))
		}
		// m4 reaches m3's pod port through another dialed port: one identity SNAT element
		// for both.
		p.DnatRules = append(p.DnatRules, dnatEntry("m4/dnat", "4004", "10.244.1.13", 3000))
		p.SnatRules = append(p.SnatRules, snatEntry("m4/snat", "10.244.1.13", 3000, req),
			snatEntry("m0/reply", "10.244.1.10", 3000, rep))
		p.MarkRules = append(p.MarkRules, &kuportv1.MarkRule{Id: "m1/mark", Mapping: "ns/m1", Address: "10.244.1.11",
			Protocol: kuportv1.Protocol_PROTOCOL_TCP, Ports: &kuportv1.PortRange{First: 3000, Last: 3000}, Mark: 0x1001,
			Kind: kuportv1.MarkKind_MARK_KIND_STATIC})
		return p
	}
	type step struct {
		name        string
		edit        func(p *kuportv1.NodeProgram)
		incremental bool
		writes      int // -1: not checked
	}
	steps := []step{
		{"retarget m1", func(p *kuportv1.NodeProgram) {
			p.DnatRules[1].ToAddress, p.DnatRules[1].StandIn, p.SnatRules[1].Address = "10.244.2.1", "10.244.2.1", "10.244.2.1"
		}, true, 6},
		{"add m5", func(p *kuportv1.NodeProgram) {
			p.DnatRules = append(p.DnatRules, dnatEntry("m5/dnat", "4005", "10.244.1.15", 3000))
			p.SnatRules = append(p.SnatRules, snatEntry("m5/snat", "10.244.1.15", 3000, req))
		}, true, 4},
		{"remove m5", func(p *kuportv1.NodeProgram) {}, true, 4},
		{"mapping name only", func(p *kuportv1.NodeProgram) { p.DnatRules[0].Mapping = "ns/renamed" }, true, 0},
		{"m6 to m0's pod port: joins m0's SNAT element", func(p *kuportv1.NodeProgram) {
			p.DnatRules = append(p.DnatRules, dnatEntry("m6/dnat", "4006", "10.244.1.10", 3000))
			p.SnatRules = append(p.SnatRules, snatEntry("m6/snat", "10.244.1.10", 3000, req))
		}, true, 3},
		{"m6 gone: m0's SNAT element stays", func(p *kuportv1.NodeProgram) {
			p.DnatRules = slices.DeleteFunc(p.DnatRules, func(e *kuportv1.DnatRule) bool { return e.Id == "m6/dnat" })
			p.SnatRules = slices.DeleteFunc(p.SnatRules, func(e *kuportv1.SnatRule) bool { return e.Id == "m6/snat" })
		}, true, 3},
		{"m7 before m2 on m2's pod port: would hold m2's SNAT element", func(p *kuportv1.NodeProgram) {
			p.DnatRules = append(p.DnatRules, dnatEntry("m7/dnat", "4007", "10.244.1.12", 3000))
			p.SnatRules = slices.Insert(p.SnatRules, 0, snatEntry("m7/snat", "10.244.1.12", 3000, req))
		}, false, -1},
		{"m7 gone: it held m2's SNAT element", func(p *kuportv1.NodeProgram) {
			p.DnatRules = slices.DeleteFunc(p.DnatRules, func(e *kuportv1.DnatRule) bool { return e.Id == "m7/dnat" })
			p.SnatRules = slices.DeleteFunc(p.SnatRules, func(e *kuportv1.SnatRule) bool { return e.Id == "m7/snat" })
		}, false, -1},
		{"retarget m4, whose SNAT element m3 holds for both", func(p *kuportv1.NodeProgram) {
			p.DnatRules[4].ToAddress, p.DnatRules[4].StandIn, p.SnatRules[4].Address = "10.244.2.4", "10.244.2.4", "10.244.2.4"
		}, true, 4 + 1},
		{"retarget m3, which held m4's old SNAT element", func(p *kuportv1.NodeProgram) {
			p.DnatRules[3].ToAddress, p.DnatRules[3].StandIn, p.SnatRules[3].Address = "10.244.2.3", "10.244.2.3", "10.244.2.3"
		}, false, -1},
		{"reorder", func(p *kuportv1.NodeProgram) {
			p.DnatRules[0], p.DnatRules[1] = p.DnatRules[1], p.DnatRules[0]
		}, false, 0},
		{"invalid entry", func(p *kuportv1.NodeProgram) {
			p.DnatRules = append(p.DnatRules, dnatEntry("bad/dnat", "0", "10.244.1.99", 3000))
		}, false, 0},
		{"conflict: a dialed port taken", func(p *kuportv1.NodeProgram) {
			p.DnatRules = append(p.DnatRules, dnatEntry("dup/dnat", "4002", "10.244.1.98", 3000))
		}, false, 0},
		{"repeated id", func(p *kuportv1.NodeProgram) {
			p.SnatRules = append(p.SnatRules, snatEntry("m2/dnat", "10.244.1.97", 3000, req))
		}, false, 0},
		{"back to valid", func(p *kuportv1.NodeProgram) {}, false, 0},
		{"a second reply", func(p *kuportv1.NodeProgram) {
			p.SnatRules = append(p.SnatRules, snatEntry("m2/reply", "10.244.1.12", 3000, rep))
		}, true, 1},
		{"m0's reply gone", func(p *kuportv1.NodeProgram) {
			p.SnatRules = slices.DeleteFunc(p.SnatRules, func(e *kuportv1.SnatRule) bool { return e.Id == "m0/reply" })
		}, true, 1},
		{"retarget m2's reply", func(p *kuportv1.NodeProgram) {
			for _, e := range p.SnatRules {
				if e.Id == "m2/reply" {
					e.Ports = &kuportv1.PortRange{First: 3001, Last: 3001}
				}
			}
		}, true, 2},
		// A range is one element, planned whole; the first one is another layout, the
		// table written anew (deleted, created, every element).
		{"m2's reply a range", func(p *kuportv1.NodeProgram) {
			for _, e := range p.SnatRules {
				if e.Id == "m2/reply" {
					e.Ports = &kuportv1.PortRange{First: 3001, Last: 3002}
				}
			}
		}, false, 25},
		{"nothing", func(p *kuportv1.NodeProgram) { p.DnatRules, p.SnatRules, p.MarkRules = nil, nil, nil }, false, 1},
		{"all again", func(p *kuportv1.NodeProgram) { proto.Merge(p, base()) }, false, -1},
	}
	k := newFakeKernel("100.64.93.150")
	dp := k.datapath(t)
	p := base()
	require.NoError(t, dp.Apply(p))
	var m5 *kuportv1.NodeProgram
	for _, s := range steps {
		p = proto.CloneOf(p)
		if s.name == "remove m5" {
			p = m5
		}
		if s.name == "back to valid" {
			p.DnatRules = slices.DeleteFunc(p.DnatRules, func(e *kuportv1.DnatRule) bool { return e.Id == "bad/dnat" || e.Id == "dup/dnat" })
			p.SnatRules = slices.DeleteFunc(p.SnatRules, func(e *kuportv1.SnatRule) bool { return e.Id == "m2/dnat" })
		}
		if s.name == "add m5" {
			m5 = proto.CloneOf(p)
		}
		s.edit(p)
		assert.Equal(t, s.incremental, checkPlan(t, dp, p, s.name), "%s: planned entry by entry", s.name)
		_ = dp.Apply(p)
		if s.writes >= 0 {
			assert.Equal(t, s.writes, dp.lastChanges, "%s: kernel writes", s.name)
		}
		dump, err := dp.Dump()
		require.NoError(t, err)
		assert.Equal(t, Render(p), dump, s.name)
		_ = dp.Apply(p)
		assert.Zero(t, dp.lastChanges, "%s: re-applying writes nothing", s.name)
	}
}

// TestIncrementalEqualsFull draws random programs, each a few random edits from the last,
// and checks that every plan equals the whole program's and that the fake kernel holds
// what Render prints, with Validate planning before Apply as the agent does. Mark entries
// take the forms compile emits (a return marking, the arrival link saved on the flow and the
// reply's mark restored by its pod port), so mappings to one pod port share a
// mark-ct-restore element.
func TestIncrementalEqualsFull(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	pods := []string{"10.244.1.1", "10.244.1.2", "10.244.1.3", "10.244.2.1", "10.244.2.2", "10.244.2.3"}
	pick := func(n int) int { return r.IntN(n) }
	port := func() uint32 { return 3000 + uint32(pick(40)) }
	ports := func() *kuportv1.PortRange {
		f := port()
		return &kuportv1.PortRange{First: f, Last: f + uint32(pick(2))}
	}
	// Some DNAT entries keep their ports: a range of them is a range element, which
	// single ports and other ranges may clash with.
	newDnat := func(id string) *kuportv1.DnatRule {
		ps, to := ports(), port()
		if pick(8) == 0 {
			to = ps.GetFirst()
		}
		return &kuportv1.DnatRule{Id: id, InInterface: []string{"enp1s0", "kup-l1"}[pick(2)], Protocol: kuportv1.Protocol(1 + pick(2)),
			Ports: ps, ToAddress: pods[pick(len(pods))], ToPort: to}
	}
	newSnat := func(id string) *kuportv1.SnatRule {
		return &kuportv1.SnatRule{Id: id, Kind: kuportv1.SnatKind(1 + pick(2)), Address: pods[pick(len(pods))],
			Protocol: kuportv1.Protocol(1 + pick(2)), Ports: ports()}
	}
	links := []struct{ name, addr string }{{"kup-l1", "169.254.77.1"}, {"kup-l2", "169.254.79.1"}}
	newMark := func(id string) *kuportv1.MarkRule {
		if pick(2) == 0 {
			return &kuportv1.MarkRule{Id: id, Kind: kuportv1.MarkKind_MARK_KIND_CT_RESTORE, Address: pods[pick(len(pods))],
				Protocol: kuportv1.Protocol(1 + pick(2)), Ports: ports()}
		}
		l := links[pick(len(links))]
		return &kuportv1.MarkRule{Id: id, Kind: kuportv1.MarkKind_MARK_KIND_CT_SAVE, InInterface: l.name, Address: l.addr,
			Protocol: kuportv1.Protocol(1 + pick(2)), Ports: ports(), Mark: 1 + uint32(pick(2))}
	}
	k := newFakeKernel("100.64.93.150")
	dp := k.datapath(t)
	p := &kuportv1.NodeProgram{Node: "edge-a", ReturnMarking: &kuportv1.ReturnMarking{MarkMask: 0x301f, FirstTable: 0x6b71,
		LastTable: 0x6b71 + 126, LoopGuardPref: 101, DivertPref: 102}}
	next := 0
	id := func() string { next++; return fmt.Sprintf("e%d", next) }
	incremental, sharedRestore := 0, 0
	for i := range 400 {
		p = proto.CloneOf(p)
		for range 1 + pick(3) {
			op := pick(12)
			if len(p.DnatRules)+len(p.SnatRules)+len(p.MarkRules) > 12 {
				op = 8 + pick(3)
			}
			switch {
			case op < 3:
				// Anywhere: the entries after it move.
				p.DnatRules = slices.Insert(p.DnatRules, pick(len(p.DnatRules)+1), newDnat(id()))
			case op < 4:
				p.SnatRules = append(p.SnatRules, newSnat(id()))
			case op < 5 && len(p.SnatRules) > 0:
				// Anywhere, sharing another's element: it joins an earlier entry's, or holds
				// a later one's.
				e := proto.CloneOf(p.SnatRules[pick(len(p.SnatRules))])
				e.Id = id()
				p.SnatRules = slices.Insert(p.SnatRules, pick(len(p.SnatRules)+1), e)
			case op < 6 && pick(2) == 0:
				p.MarkRules = append(p.MarkRules, newMark(id()))
			case op < 6:
				// Anywhere, another mapping to a pod port one has: its restore element is
				// shared (joined, or held for a later entry).
				restores := slices.DeleteFunc(slices.Clone(p.MarkRules), func(e *kuportv1.MarkRule) bool {
					return e.Kind != kuportv1.MarkKind_MARK_KIND_CT_RESTORE
				})
				if len(restores) > 0 {
					e := proto.CloneOf(restores[pick(len(restores))])
					e.Id = id()
					p.MarkRules = slices.Insert(p.MarkRules, pick(len(p.MarkRules)+1), e)
				}
			case op < 7 && len(p.MarkRules) > 0:
				if e := p.MarkRules[pick(len(p.MarkRules))]; e.Kind == kuportv1.MarkKind_MARK_KIND_CT_SAVE {
					e.Mark = 1 + uint32(pick(3))
				}
			case op < 8 && len(p.DnatRules) > 0:
				// Retargeted.
				e := p.DnatRules[pick(len(p.DnatRules))]
				e.ToAddress, e.ToPort = pods[pick(len(pods))], port()
			case op < 9 && len(p.SnatRules) > 0:
				j := pick(len(p.SnatRules))
				p.SnatRules = slices.Delete(p.SnatRules, j, j+1)
			case op < 10 && len(p.DnatRules) > 0:
				j := pick(len(p.DnatRules))
				p.DnatRules = slices.Delete(p.DnatRules, j, j+1)
			case op < 11 && len(p.MarkRules) > 0:
				j := pick(len(p.MarkRules))
				p.MarkRules = slices.Delete(p.MarkRules, j, j+1)
			case len(p.DnatRules) > 1 && pick(4) == 0:
				a, b := pick(len(p.DnatRules)), pick(len(p.DnatRules))
				p.DnatRules[a], p.DnatRules[b] = p.DnatRules[b], p.DnatRules[a]
			}
		}
		step := fmt.Sprintf("step %d", i)
		restores := map[string]int{}
		for _, e := range p.MarkRules {
			if e.Kind == kuportv1.MarkKind_MARK_KIND_CT_RESTORE {
				restores[fmt.Sprint(e.Address, e.Protocol, e.Ports.First)]++
			}
		}
		for _, n := range restores {
			if n > 1 {
				sharedRestore++
				break
			}
		}
		if checkPlan(t, dp, p, step) {
			incremental++
		}
		verr := dp.Validate(p)
		assert.Equal(t, fmt.Sprint(Validate(p)), fmt.Sprint(verr), step)
		_ = dp.Apply(p)
		dump, err := dp.Dump()
		require.NoError(t, err)
		require.Equal(t, Render(p), dump, step)
	}
	t.Logf("%d of 400 steps planned entry by entry, %d shared a restore element", incremental, sharedRestore)
	assert.Greater(t, incremental, 100, "most steps plan entry by entry")
	assert.Greater(t, sharedRestore, 100, "steps sharing a restore element")
}

// TestSameCoversEveryField changes each field of each entry kind in turn: its same must see
// it, or an entry edited in that field would keep its old elements.
func TestSameCoversEveryField(t *testing.T) {
	check := func(name string, msg proto.Message, same func(a, b proto.Message) bool) {
		fields := msg.ProtoReflect().Descriptor().Fields()
		for i := range fields.Len() {
			f := fields.Get(i)
			other := proto.Clone(msg)
			m := other.ProtoReflect()
			switch f.Kind() {
			case protoreflect.StringKind:
				m.Set(f, protoreflect.ValueOfString(m.Get(f).String()+"x"))
			case protoreflect.Uint32Kind:
				m.Set(f, protoreflect.ValueOfUint32(uint32(m.Get(f).Uint())+1))
			case protoreflect.EnumKind:
				m.Set(f, protoreflect.ValueOfEnum(m.Get(f).Enum()+1))
			case protoreflect.MessageKind:
				pr := m.Mutable(f).Message()
				lf := pr.Descriptor().Fields().ByName("last")
				pr.Set(lf, protoreflect.ValueOfUint32(uint32(pr.Get(lf).Uint())+1))
				assert.False(t, same(msg, other), "%s.%s.last", name, f.Name())
				m.Clear(f)
			default:
				t.Fatalf("%s.%s: a field kind the test cannot change: %v", name, f.Name(), f.Kind())
			}
			assert.False(t, same(msg, other), "%s.%s", name, f.Name())
			assert.True(t, same(msg, proto.Clone(msg)), name)
		}
	}
	ports := &kuportv1.PortRange{First: 1, Last: 2}
	check("DnatRule", &kuportv1.DnatRule{Ports: ports}, func(a, b proto.Message) bool {
		return sameDnat(a.(*kuportv1.DnatRule), b.(*kuportv1.DnatRule))
	})
	check("SnatRule", &kuportv1.SnatRule{Ports: ports}, func(a, b proto.Message) bool {
		return sameSnat(a.(*kuportv1.SnatRule), b.(*kuportv1.SnatRule))
	})
	check("MarkRule", &kuportv1.MarkRule{Ports: ports}, func(a, b proto.Message) bool {
		return sameMark(a.(*kuportv1.MarkRule), b.(*kuportv1.MarkRule))
	})
}

// TestIncrementalFailedWrite fails the transaction of one mapping's change: the error names
// that mapping's entries only, the kernel keeps the old program, and the next Apply writes
// the change.
func TestIncrementalFailedWrite(t *testing.T) {
	k := newFakeKernel("100.64.93.150")
	dp := k.datapath(t)
	p := datapathtest.Program(3, "enp1s0")
	require.NoError(t, dp.Apply(p))
	before := k.dump(t)
	q := retarget(p, 1, "10.244.200.1")
	k.enqueue(func(map[string]*fakeTable) error { return errors.New("refused") })
	err := dp.Apply(q)
	var ids []string
	for _, e := range EntryErrors(err) {
		ids = append(ids, e.GetId())
	}
	assert.Equal(t, []string{"bench/m00001/dnat/enp1s0", "bench/m00001/snat"}, ids)
	assert.Equal(t, before, k.dump(t), "the failed transaction changed nothing")
	require.NoError(t, dp.Apply(q))
	assert.Equal(t, 6, dp.lastChanges, "the change written")
	dump, err := dp.Dump()
	require.NoError(t, err)
	assert.Equal(t, Render(q), dump)
}

// TestSameProgramCoversEveryField: SameProgram sees a change of each NodeProgram field but
// version and epoch, and ignores those two.
func TestSameProgramCoversEveryField(t *testing.T) {
	base := goldenPrograms(t)["remote-worker-b"]
	fields := base.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		other := proto.Clone(base).(*kuportv1.NodeProgram)
		m := other.ProtoReflect()
		switch {
		case f.Name() == "version" || f.Name() == "epoch":
			m.Set(f, protoreflect.ValueOfUint64(m.Get(f).Uint()+1))
			assert.True(t, SameProgram(base, other), "%s is not content", f.Name())
			continue
		case f.Kind() == protoreflect.StringKind:
			m.Set(f, protoreflect.ValueOfString(m.Get(f).String()+"x"))
		case f.IsList():
			l := m.Mutable(f).List()
			l.Append(l.NewElement())
		case f.Kind() == protoreflect.MessageKind && m.Has(f):
			m.Clear(f)
		case f.Kind() == protoreflect.MessageKind:
			m.Mutable(f)
		default:
			t.Fatalf("%s: a field the test cannot change: %v", f.Name(), f.Kind())
		}
		assert.False(t, SameProgram(base, other), "%s", f.Name())
		assert.False(t, SameProgram(other, base), "%s", f.Name())
	}
	assert.True(t, SameProgram(base, proto.Clone(base).(*kuportv1.NodeProgram)))
	// An element edited in place counts too (the entries' own fields: TestSameCoversEveryField).
	for _, edit := range []func(p *kuportv1.NodeProgram){
		func(p *kuportv1.NodeProgram) { p.Links[0].Mtu++ },
		func(p *kuportv1.NodeProgram) { p.ReturnPaths[0].Table++ },
		func(p *kuportv1.NodeProgram) { p.DnatRules[0].ToPort++ },
		func(p *kuportv1.NodeProgram) { p.ReturnMarking.DivertPref++ },
	} {
		other := proto.Clone(base).(*kuportv1.NodeProgram)
		edit(other)
		assert.False(t, SameProgram(base, other))
	}
}
