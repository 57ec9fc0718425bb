package datapath

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Return marks are written and matched masked: only the bits of the program's mark mask
// (NodeProgram.return_marking) change in the packet mark and the conntrack mark, and the ip
// rules match fwmark <mark>/<mask>, so whatever bits the CNI, a mesh or kube-proxy keep in
// the same marks survive (datapath/README.md, the priority contract).
//
// google/nftables v0.3.0 (and its main branch) has no bitwise operation of two registers, so
// "meta mark set meta mark & ~M | <looked-up mark>" cannot be written. What can, with
// constants only: the mark maps are verdict maps whose elements jump to a chain per return
// mark, which holds the one masked write ("meta mark set meta mark & ~M | V", "ct mark set
// ct mark & ~M | V"); the restore looks the flow's "ct mark & M" up in return-marks, which
// jumps to the same packet-mark chain. A reply still costs one hash lookup in a map as large
// as the program (the restore one more, in a map of one element per return path), a jump
// and one rule.

// markChainPrefix and ctMarkChainPrefix name the chains of one return mark.
const (
	markChainPrefix   = "kup-mark-"
	ctMarkChainPrefix = "kup-ctmark-"
)

func markChain(m uint32) string   { return fmt.Sprintf("%s%08x", markChainPrefix, m) }
func ctMarkChain(m uint32) string { return fmt.Sprintf("%s%08x", ctMarkChainPrefix, m) }

// marking is a program's ReturnMarking, or what controllers before it wrote.
type marking struct {
	mask                  uint32
	loopGuard, divert     int
	firstTable, lastTable uint32
}

// legacyMarking is what a program without return_marking means (program.proto): whole-mark
// writes, prefs 101/102, tables from 201.
var legacyMarking = marking{mask: 0xffffffff, loopGuard: 101, divert: 102, firstTable: 201, lastTable: 0xffffffff}

func markingOf(p *kuportv1.NodeProgram) marking {
	rm := p.GetReturnMarking()
	if rm == nil {
		return legacyMarking
	}
	return marking{mask: rm.GetMarkMask(), loopGuard: int(rm.GetLoopGuardPref()), divert: int(rm.GetDivertPref()),
		firstTable: rm.GetFirstTable(), lastTable: rm.GetLastTable()}
}

// check refuses a marking the datapath cannot write: every return path of the program is
// refused then (the controller checks the setting at start; this is a peer's program).
func (m marking) check() error {
	switch {
	case m.mask == 0:
		return fmt.Errorf("return mark mask is 0")
	case m.loopGuard <= 0 || m.loopGuard >= m.divert || m.divert >= 32766:
		return fmt.Errorf("return rule prefs %d,%d are not in order between 0 and 32766", m.loopGuard, m.divert)
	case m.firstTable == 0 || m.firstTable > m.lastTable:
		return fmt.Errorf("return tables %d-%d are no range", m.firstTable, m.lastTable)
	}
	return nil
}

// ownsTable reports whether table t is one of the marking's, never one of the kernel's.
func (m marking) ownsTable(t int) bool {
	return t > 0 && uint32(t) >= m.firstTable && uint32(t) <= m.lastTable &&
		t != unix.RT_TABLE_DEFAULT && t != unix.RT_TABLE_MAIN && t != unix.RT_TABLE_LOCAL
}

// validMark reports whether mark is a return mark under the mask, clear of the translated
// bit (a whole-mark mask from before the setting includes it; its marks did not).
func (m marking) validMark(mark uint32) bool {
	return mark != 0 && mark&^m.mask == 0 && mark&translatedMark == 0
}

// markWrite is "<key> set <key> & ~mask | mark" for the meta or ct mark, with constants only
// (a whole-mark mask writes the mark outright, as nft lists it).
func markWrite(load, store expr.Any, mask, mark uint32) []expr.Any {
	if mask == 0xffffffff {
		return []expr.Any{&expr.Immediate{Register: register(0), Data: binaryutil.NativeEndian.PutUint32(mark)}, store}
	}
	return []expr.Any{load, &expr.Bitwise{SourceRegister: register(0), DestRegister: register(0), Len: 4,
		Mask: binaryutil.NativeEndian.PutUint32(^mask), Xor: binaryutil.NativeEndian.PutUint32(mark)}, store}
}

// markWriteText is markWrite as nft lists it: it prints the bitwise mask with the written
// bits in it.
func markWriteText(key string, mask, mark uint32) string {
	if mask == 0xffffffff {
		return fmt.Sprintf("%s set 0x%08x", key, mark)
	}
	return fmt.Sprintf("%s set %s & 0x%08x | 0x%08x", key, key, ^mask|mark, mark)
}

// markChains adds the two chains of return mark m: the packet-mark write (mark-static's and
// return-marks' jumps) and the conntrack-mark write (mark-ct-save's).
func (l *layout) markChains(m uint32) {
	meta := &expr.Meta{Key: expr.MetaKeyMARK, Register: register(0)}
	metaSet := &expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: register(0)}
	ct := &expr.Ct{Key: expr.CtKeyMARK, Register: register(0)}
	ctSet := &expr.Ct{Key: expr.CtKeyMARK, SourceRegister: true, Register: register(0)}
	for _, c := range []struct {
		name, key   string
		load, store expr.Any
	}{{markChain(m), "meta mark", meta, metaSet}, {ctMarkChain(m), "ct mark", ct, ctSet}} {
		l.chains = append(l.chains, chainSpec{regular: true, name: c.name})
		exprs := markWrite(c.load, c.store, l.mask, m)
		l.rules = append(l.rules, ruleSpec{chain: c.name, text: markWriteText(c.key, l.mask, m),
			exprs: func(func(string) *nftables.Set) []expr.Any { return exprs }})
	}
}

// restoreRule is the reply's restore: the pod port's element (counted), then the flow's
// return mark, "ct mark & mask", looked up in return-marks, which jumps to its chain. A flow
// with none (it came in by no link) finds no element and keeps its mark.
func (l *layout) restoreRule(restore, returns *setSpec) ruleSpec {
	ctText := "ct mark"
	tail := []expr.Any{&expr.Ct{Key: expr.CtKeyMARK, Register: register(0)}}
	if l.mask != 0xffffffff {
		ctText = fmt.Sprintf("ct mark & 0x%08x", l.mask)
		tail = append(tail, &expr.Bitwise{SourceRegister: register(0), DestRegister: register(0), Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(l.mask), Xor: make([]byte, 4)})
	}
	// return-marks holds its keys in network byte order (markBytes): the mark in host order
	// is turned to it before the lookup.
	tail = append(tail, &expr.Byteorder{SourceRegister: register(0), DestRegister: register(0), Op: expr.ByteorderHton, Len: 4, Size: 4})
	r := l.rule("kup-mangle", fmt.Sprintf("%s @%s %s vmap @%s", keyText(restore), restore.name, ctText, returns.name), nil, restore, false)
	inner := r.exprs
	r.exprs = func(set func(string) *nftables.Set) []expr.Any {
		rs := set(returns.name)
		return append(append(inner(set), tail...),
			&expr.Lookup{SourceRegister: register(0), SetName: rs.Name, SetID: rs.ID, IsDestRegSet: true, DestRegister: 0})
	}
	return r
}

// jumps refuses an element that jumps to a chain the layout lacks: a mark entry whose mark
// is not under the return mark mask (the kernel would refuse the whole transaction).
func (l *layout) jumps(pt put) error {
	if s := l.byName[pt.set]; s != nil && s.vmap() && !l.hasChain(pt.val) {
		m := strings.TrimPrefix(strings.TrimPrefix(pt.val, ctMarkChainPrefix), markChainPrefix)
		return fmt.Errorf("mark 0x%s is 0, not under the return mark mask %#x or has its bit %#x", m, l.mask, translatedMark)
	}
	return nil
}

// programMarks are the return-mark mask of program p and its return marks, sorted and each
// once: the marks its valid mark entries write, when valid under the mask, and those its
// valid return paths match. Each has its two chains and its return-marks element, whether or
// not another entry's key refuses the entry (planEntries).
func programMarks(p *kuportv1.NodeProgram) (uint32, []uint32) {
	m := markingOf(p)
	var marks []uint32
	for _, e := range p.GetMarkRules() {
		if _, _, _, err := checkMarkRule(familyOf(e.GetAddress()), e); err == nil && m.validMark(e.GetMark()) {
			marks = append(marks, e.GetMark())
		}
	}
	returns, _ := planReturns(p)
	for _, w := range returns {
		marks = append(marks, w.mark)
	}
	slices.Sort(marks)
	return m.mask, slices.Compact(marks)
}

// programLayout is the layout planned from program p.
func programLayout(p *kuportv1.NodeProgram) *layout {
	mask, marks := programMarks(p)
	return newLayout(mask, marks, programRanges(p), programV6(p))
}

// programV6 reports whether program p has an IPv6 entry, valid or not: its layout has
// IPv6's sets then, as one with a range has the range sets.
func programV6(p *kuportv1.NodeProgram) bool {
	return slices.ContainsFunc(p.GetDnatRules(), func(e *kuportv1.DnatRule) bool { return familyOf(e.GetToAddress()).v6() }) ||
		slices.ContainsFunc(p.GetSnatRules(), func(e *kuportv1.SnatRule) bool { return familyOf(e.GetAddress()).v6() }) ||
		slices.ContainsFunc(p.GetMarkRules(), func(e *kuportv1.MarkRule) bool { return familyOf(e.GetAddress()).v6() })
}

// sameMarks reports whether layout l is the layout of mask and marks.
func (l *layout) sameMarks(mask uint32, marks []uint32) bool {
	return l.mask == mask && slices.Equal(l.marks, marks)
}

// kernelLayout is the layout a kernel table was written in: its return marks by the names of
// its mark chains, the mask by the restore rule's (a whole mark when it has none), its ranges
// by its range sets.
func (kt *kernelTable) kernelLayout() *layout {
	mask := uint32(0xffffffff)
	for _, r := range kt.rules["kup-mangle"] {
		for i, e := range r.Exprs {
			b, ok := e.(*expr.Bitwise)
			if c, isCt := r.Exprs[max(i-1, 0)].(*expr.Ct); ok && isCt && c.Key == expr.CtKeyMARK && len(b.Mask) == 4 {
				mask = binaryutil.NativeEndian.Uint32(b.Mask)
			}
		}
	}
	var marks []uint32
	for _, c := range kt.chains {
		if s, ok := strings.CutPrefix(c.Name, markChainPrefix); ok {
			if m, err := strconv.ParseUint(s, 16, 32); err == nil {
				marks = append(marks, uint32(m))
			}
		}
	}
	slices.Sort(marks)
	ranges := slices.ContainsFunc(kt.sets, func(s *nftables.Set) bool { return strings.HasSuffix(s.Name, rangesSuffix) })
	v6 := slices.ContainsFunc(kt.sets, func(s *nftables.Set) bool { return strings.HasPrefix(s.Name, familyIPv6.prefix) })
	return newLayout(mask, marks, ranges, v6)
}

// rtprotKuport is the protocol of kuport's ip rules and routes (FRA_PROTOCOL, rtm_protocol):
// what tells the agent its own, whatever pref, mark or table a setting gave them, so a
// changed setting leaves nothing behind. 0x6b is kuport's byte (its marks were 0x6b70xxxx,
// its link addresses are 02:6b:...); iproute2's rt_protos assigns 0-4, 8-18, 42, 99, 186-192
// and none of the CNIs in docs/design/cni.md use it.
const rtprotKuport = 0x6b

// legacyRule reports whether r is a return path rule an agent from before rtprotKuport wrote:
// pref 101 or 102, a whole-mark fwmark 0x6b70xxxx. An upgraded agent deletes it (and empties
// its table, syncReturnPaths).
func legacyRule(r *netlink.Rule) bool {
	return r.Protocol != rtprotKuport && (r.Priority == 101 || r.Priority == 102) &&
		r.Mask != nil && *r.Mask == 0xffffffff && r.Mark&0xffff0000 == 0x6b700000
}

// ownRule reports whether the kernel rule r is kuport's.
func ownRule(r *netlink.Rule) bool { return r.Protocol == rtprotKuport || legacyRule(r) }
