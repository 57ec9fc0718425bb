package compile

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// ReturnMarking is the cluster-wide setting of where return paths live on a node: the bits of
// the packet and conntrack mark that carry a return mark, the prefs of the two ip rules, and
// the routing tables. Compile carries it in every program (NodeProgram.return_marking); the
// agent writes and matches only these bits, prefs and tables.
type ReturnMarking struct {
	// MarkMask is the bits a return mark takes; a return path's mark is its index (1, 2, ...)
	// spread over them, lowest bit first, so a mask of n bits gives 2^n - 1 return paths.
	MarkMask uint32
	// FirstTable and LastTable bound the routing tables of return paths, inclusive.
	FirstTable, LastTable uint32
	// LoopGuardPref and DivertPref are the prefs of the two ip rules of every return path
	// (docs/design/datapath.md#the-return-path-ip-rules-101-and-102: 101 and 102).
	LoopGuardPref, DivertPref uint32
}

// DefaultReturnMarking avoids every mark, table and pref the CNIs, meshes and proxies in
// knownUsers use (docs/design/cni.md#marks-and-routing-tables-others-use;
// TestReturnMarkingAvoidsKnownUsers fails on an overlap):
//   - marks 0x301f: the low 16 bits free of Cilium's 0x0f00, KubeSpan's 0x60, kuport's own
//     translated bit 0x80 and kube-proxy's 0x4000/0x8000 (the upper 16 are Calico's, Calico
//     eBPF's, Cilium's identity and Tailscale's): 7 bits, 127 return paths per node;
//   - tables 27505-27631 (0x6b71 on, the 0x6b70 of earlier marks): past Calico's
//     RouteTableRanges 1-250, Cilium's 200-202, KubeSpan's 180, Tailscale's 52, wg-quick's
//     51820 and the kernel's 253-255; one table per return path;
//   - prefs 101 and 102, as before: after the local table (0) and Calico's 99 and Cilium's
//     100, before netbird's 105/110 and Cilium's 110-112 (datapath/README.md, the priority
//     contract).
var DefaultReturnMarking = ReturnMarking{
	MarkMask: 0x301f, FirstTable: 0x6b71, LastTable: 0x6b71 + 126, LoopGuardPref: 101, DivertPref: 102,
}

// LegacyReturnMarking is what controllers before the setting wrote: whole-mark writes of
// 0x6b700000 + (table - 200), tables from 201, prefs 101/102. An agent given a program
// without return_marking applies these (proto/kuport/v1/program.proto).
var LegacyReturnMarking = ReturnMarking{
	MarkMask: 0xffffffff, FirstTable: 201, LastTable: 0xffffffff, LoopGuardPref: 101, DivertPref: 102,
}

// marking is the snapshot's setting, or the default when it has none.
func (s *Snapshot) marking() ReturnMarking {
	if s.ReturnMarking == (ReturnMarking{}) {
		return DefaultReturnMarking
	}
	return s.ReturnMarking
}

// translatedBit is the packet-mark bit kup-pre sets on a flow it translated and kup-post
// clears (datapath.TranslatedMark): no return mark may take it.
const translatedBit = 0x80

// minReturnMarkBits is the fewest mark bits a setting may give: 7 return paths per node.
const minReturnMarkBits = 3

// Capacity is how many return paths a node can hold: one mark value and one table each.
func (r ReturnMarking) Capacity() int {
	n := uint64(1)<<bits.OnesCount32(r.MarkMask) - 1
	if t := uint64(r.LastTable) - uint64(r.FirstTable) + 1; t < n {
		n = t
	}
	return int(min(n, 1<<30))
}

// Mark is the return mark of table t, 0 when t is outside the setting's tables: the index of
// t in the range, its bits spread over the mask from the lowest up.
func (r ReturnMarking) Mark(t int32) uint32 {
	if !r.holds(t) {
		return 0
	}
	i := uint32(int64(t) - int64(r.FirstTable) + 1)
	var m uint32
	for mask := r.MarkMask; mask != 0 && i != 0; mask &= mask - 1 {
		if i&1 != 0 {
			m |= mask & -mask
		}
		i >>= 1
	}
	return m
}

// holds reports whether table t is one of the setting's return path tables.
func (r ReturnMarking) holds(t int32) bool {
	return t > 0 && uint32(t) >= r.FirstTable && int64(t)-int64(r.FirstTable) < int64(r.Capacity())
}

func (r ReturnMarking) wire() *kuportv1.ReturnMarking {
	return &kuportv1.ReturnMarking{MarkMask: r.MarkMask, LoopGuardPref: r.LoopGuardPref, DivertPref: r.DivertPref,
		FirstTable: r.FirstTable, LastTable: r.LastTable}
}

// markUser is a component that uses marks, routing tables or ip rule prefs on the nodes
// kuport runs on (docs/design/cni.md#marks-and-routing-tables-others-use;
// datapath/README.md#the-priority-contract).
type markUser struct {
	name   string
	marks  uint32     // bits it writes or matches
	tables [][2]int64 // inclusive ranges
	prefs  []uint32
}

var knownUsers = []markUser{
	{name: "the kernel (tables unspec, default, main, local; the local, main and default rules)",
		tables: [][2]int64{{0, 0}, {253, 255}}, prefs: []uint32{0, 32766, 32767}},
	{name: "kuport's identity SNAT (the translated bit)", marks: translatedBit},
	{name: "Calico (IptablesMarkMask, RouteTableRanges, its WireGuard rule)", marks: 0xffff0000,
		tables: [][2]int64{{1, 250}}, prefs: []uint32{99}},
	{name: "Calico eBPF", marks: 0x1ff00000},
	{name: "Cilium (magic bits, identity, IPsec/WireGuard/VTEP tables, its rules)", marks: 0x0f00 | 0xffff0000,
		tables: [][2]int64{{200, 202}}, prefs: []uint32{1, 9, 20, 100, 110, 111, 112}},
	{name: "Talos KubeSpan", marks: 0x60, tables: [][2]int64{{180, 180}}, prefs: []uint32{32500}},
	{name: "kube-proxy", marks: 0x4000 | 0x8000},
	{name: "netbird", prefs: []uint32{105, 110}},
	{name: "Tailscale", marks: 0xff0000, tables: [][2]int64{{52, 52}}, prefs: []uint32{5210, 5230, 5250, 5270}},
	{name: "wg-quick", tables: [][2]int64{{51820, 51820}}},
}

// overlaps lists, per known user, what of the setting lies in that user's marks, tables or
// prefs.
func (r ReturnMarking) overlaps() []string {
	var out []string
	for _, u := range knownUsers {
		var what []string
		if b := r.MarkMask & u.marks; b != 0 {
			what = append(what, fmt.Sprintf("mark bits %#x", b))
		}
		last := int64(r.FirstTable) + int64(r.Capacity()) - 1
		for _, t := range u.tables {
			if int64(r.FirstTable) <= t[1] && t[0] <= last {
				what = append(what, fmt.Sprintf("tables %d-%d", max(t[0], int64(r.FirstTable)), min(t[1], last)))
			}
		}
		for _, p := range u.prefs {
			if p == r.LoopGuardPref || p == r.DivertPref {
				what = append(what, fmt.Sprintf("pref %d", p))
			}
		}
		if len(what) > 0 {
			out = append(out, u.name+": "+strings.Join(what, ", "))
		}
	}
	return out
}

// Check refuses a setting the datapath cannot work with, with the reason, and returns a
// warning per known user it overlaps (an operator may know that user is absent; never
// silent).
func (r ReturnMarking) Check() (warnings []string, err error) {
	switch {
	case bits.OnesCount32(r.MarkMask) < minReturnMarkBits:
		return nil, fmt.Errorf("return mark mask %#x has %d bits, fewer than %d (2^bits - 1 return paths per node)",
			r.MarkMask, bits.OnesCount32(r.MarkMask), minReturnMarkBits)
	case r.MarkMask&translatedBit != 0:
		return nil, fmt.Errorf("return mark mask %#x takes bit %#x, the identity SNAT's translated bit", r.MarkMask, translatedBit)
	case r.FirstTable == 0 || r.FirstTable > r.LastTable || r.LastTable > math.MaxInt32:
		return nil, fmt.Errorf("return tables %d-%d are not a range of tables from 1 to %d (class status records them as int32)",
			r.FirstTable, r.LastTable, math.MaxInt32)
	case r.FirstTable <= 255 && r.LastTable >= 253:
		return nil, fmt.Errorf("return tables %d-%d hold the kernel's tables 253-255 (default, main, local)", r.FirstTable, r.LastTable)
	case r.LoopGuardPref == 0 || r.LoopGuardPref >= r.DivertPref || r.DivertPref >= 32766:
		return nil, fmt.Errorf("return rule prefs %d,%d: the loop guard must come first, after the local table's 0, and both before main's 32766",
			r.LoopGuardPref, r.DivertPref)
	}
	return r.overlaps(), nil
}

// ParseMarkMask reads --return-mark-mask: a 32-bit number, hex with 0x.
func ParseMarkMask(s string) (uint32, error) {
	v, err := strconv.ParseUint(strings.TrimSpace(s), 0, 32)
	if err != nil {
		return 0, fmt.Errorf("return mark mask %q: not a 32-bit number", s)
	}
	return uint32(v), nil
}

// ParseTables reads --return-tables: "first-last".
func ParseTables(s string) (first, last uint32, err error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), "-")
	x, err1 := strconv.ParseUint(a, 0, 32)
	y, err2 := strconv.ParseUint(b, 0, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("return tables %q: want first-last, e.g. 27505-27631", s)
	}
	return uint32(x), uint32(y), nil
}

// ParsePrefs reads --return-rule-prefs: "loopguard,divert".
func ParsePrefs(s string) (loopGuard, divert uint32, err error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), ",")
	x, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 32)
	y, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("return rule prefs %q: want two prefs, e.g. 101,102", s)
	}
	return uint32(x), uint32(y), nil
}
