package datapath

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

func TestPlanRejectsInvalidEntries(t *testing.T) {
	tcp := kuportv1.Protocol_PROTOCOL_TCP
	one := &kuportv1.PortRange{First: 3000, Last: 3000}
	p := &kuportv1.NodeProgram{
		DnatRules: []*kuportv1.DnatRule{
			{Id: "ok", InInterface: "enp1s0", Protocol: tcp, Ports: one, ToAddress: "10.0.0.1", ToPort: 3000, StandIn: "10.0.0.1"},
			{Id: "ok", InInterface: "enp1s0", Protocol: tcp, Ports: one, ToAddress: "10.0.0.1", ToPort: 3000, StandIn: "10.0.0.1"},
			{Id: "mixed", InInterface: "enp1s0", Protocol: tcp, Ports: one, ToAddress: "fd00::1", ToPort: 3000, StandIn: "10.0.0.1"},
			{Id: "proto", InInterface: "enp1s0", Ports: one, ToAddress: "10.0.0.1", ToPort: 3000},
			{Id: "overflow", InInterface: "enp1s0", Protocol: tcp, Ports: &kuportv1.PortRange{First: 10, Last: 20}, ToAddress: "10.0.0.1", ToPort: 65530},
			{Id: "ifname", InInterface: "a-name-longer-than-15", Protocol: tcp, Ports: one, ToAddress: "10.0.0.1", ToPort: 3000},
			{Id: "quote\"", InInterface: "enp1s0", Protocol: tcp, Ports: one, ToAddress: "10.0.0.1", ToPort: 3000},
		},
		SnatRules: []*kuportv1.SnatRule{{Id: "kind", Address: "10.0.0.1", Protocol: tcp, Ports: one}},
		MarkRules: []*kuportv1.MarkRule{{Id: "mark0", Address: "10.0.0.1", Protocol: tcp, Ports: one}},
	}
	tbl, errs := planTable(p)
	n := 0
	for _, elems := range tbl.elems {
		for _, e := range elems {
			assert.Equal(t, "ok", e.id)
			n++
		}
	}
	assert.Equal(t, 3, n, "the valid DNAT entry's translation, its steering (which counts requests) and its reply counting")
	got := EntryErrors(errors.Join(errs...))
	var ids []string
	for _, e := range got {
		ids = append(ids, e.GetId())
	}
	assert.Equal(t, []string{"ok", "mixed", "proto", "overflow", "ifname", "quote\"", "kind", "mark0"}, ids)
	assert.Contains(t, got[0].GetMessage(), "dnat ok: id used by another entry")
	assert.Contains(t, got[1].GetMessage(), `dnat mixed: stand_in "10.0.0.1" is not an IPv6 address`, "an entry's addresses are of its target's family")
	assert.NotContains(t, Render(p), "mixed", "invalid entries are not rendered")
}

func TestEntryErrorsOfNonEntryFailure(t *testing.T) {
	assert.Nil(t, EntryErrors(nil))
	got := EntryErrors(errors.Join(errors.New("list nftables tables: boom"), &EntryError{Kind: "link", ID: "kup-1", Err: errors.New("x")}))
	require.Len(t, got, 2)
	assert.Equal(t, "", got[0].GetId())
	assert.Equal(t, "kup-1", got[1].GetId())
	assert.Equal(t, "link kup-1: x", got[1].GetMessage())
}

func TestMarkRuleForms(t *testing.T) {
	tcp := kuportv1.Protocol_PROTOCOL_TCP
	one := &kuportv1.PortRange{First: 3000, Last: 3000}
	static, save, restore := kuportv1.MarkKind_MARK_KIND_STATIC, kuportv1.MarkKind_MARK_KIND_CT_SAVE, kuportv1.MarkKind_MARK_KIND_CT_RESTORE
	cases := []struct {
		name    string
		entry   *kuportv1.MarkRule
		want    string // set: element text, or
		wantErr string // a part of its error
	}{
		{"static", &kuportv1.MarkRule{Kind: static, Address: "10.244.18.107", Protocol: tcp, Ports: one, Mark: 0x6b700001},
			"return-marks: 0x6b700001 counter : jump kup-mark-6b700001\n" +
				"mark-static: 10.244.18.107 . tcp . 3000 counter comment \"id\" : jump kup-mark-6b700001", ""},
		{"ct save", &kuportv1.MarkRule{Kind: save, InInterface: "kup-aaaaaaaa", Address: "169.254.79.1", Protocol: tcp, Ports: one, Mark: 0x6b700002},
			"return-marks: 0x6b700002 counter : jump kup-mark-6b700002\n" +
				"mark-ct-save: \"kup-aaaaaaaa\" . 169.254.79.1 . tcp . 3000 counter comment \"id\" : jump kup-ctmark-6b700002", ""},
		{"ct restore", &kuportv1.MarkRule{Kind: restore, Address: "10.244.18.107", Protocol: tcp, Ports: &kuportv1.PortRange{First: 27015, Last: 27016}},
			`mark-ct-restore-ranges: 10.244.18.107 . tcp . 27015-27016 counter comment "id"`, ""},
		{"no kind", &kuportv1.MarkRule{Address: "10.244.18.107", Protocol: tcp, Ports: one, Mark: 1}, "", "unknown mark kind"},
		{"static mark 0", &kuportv1.MarkRule{Kind: static, Address: "10.244.18.107", Protocol: tcp, Ports: one}, "", "mark is 0"},
		{"static with an interface", &kuportv1.MarkRule{Kind: static, InInterface: "kup-aaaaaaaa", Address: "10.244.18.107", Protocol: tcp, Ports: one, Mark: 1},
			"", "in_interface is for MARK_KIND_CT_SAVE only"},
		{"ct save without interface", &kuportv1.MarkRule{Kind: save, Address: "169.254.79.1", Protocol: tcp, Ports: one, Mark: 1}, "", "interface name"},
		{"ct save without address", &kuportv1.MarkRule{Kind: save, InInterface: "kup-aaaaaaaa", Protocol: tcp, Ports: one, Mark: 1}, "", "address"},
		{"ct save mark 0", &kuportv1.MarkRule{Kind: save, InInterface: "kup-aaaaaaaa", Address: "169.254.79.1", Protocol: tcp, Ports: one}, "", "mark is 0"},
		{"ct restore with a mark", &kuportv1.MarkRule{Kind: restore, Address: "10.244.18.107", Protocol: tcp, Ports: one, Mark: 0x6b700001},
			"", "mark 0x6b700001 is set"},
		{"ct restore with an interface", &kuportv1.MarkRule{Kind: restore, InInterface: "kup-aaaaaaaa", Address: "10.244.18.107", Protocol: tcp, Ports: one},
			"", "in_interface"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.entry.Id = "id"
			tbl, errs := planTable(&kuportv1.NodeProgram{MarkRules: []*kuportv1.MarkRule{c.entry}})
			if c.wantErr != "" {
				require.Len(t, errs, 1)
				assert.ErrorContains(t, errs[0], "mark id: "+c.wantErr)
				assert.True(t, tbl.empty())
				return
			}
			require.Empty(t, errs)
			assert.Equal(t, c.want, elementsText(tbl))
		})
	}
}

// elementsText lists a table's elements as "<set>: <elements>", one line per set that has
// any, each element as kuport's logs print it (a range's key readable, elem.text).
func elementsText(tbl *table) string {
	var lines []string
	for _, s := range tbl.layout.sets {
		var es []string
		for _, e := range tbl.elems[s.name] {
			es = append(es, e.text(s, true))
		}
		if len(es) > 0 {
			slices.Sort(es)
			lines = append(lines, s.name+": "+strings.Join(es, ", "))
		}
	}
	return strings.Join(lines, "\n")
}

// TestElementConflicts: a key two entries need with different data goes to the first; the
// second is refused whole. A key they need with the same data is shared, the first's.
func TestElementConflicts(t *testing.T) {
	tcp := kuportv1.Protocol_PROTOCOL_TCP
	dnat := func(id string, port uint32, to string) *kuportv1.DnatRule {
		// Shifted: one element per port.
		return &kuportv1.DnatRule{Id: id, InInterface: "enp1s0", Protocol: tcp, Ports: &kuportv1.PortRange{First: port, Last: port + 1}, ToAddress: to, ToPort: port + 1000}
	}
	snat := func(id string) *kuportv1.SnatRule {
		return &kuportv1.SnatRule{Id: id, Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST, Address: "10.0.0.1", Protocol: tcp,
			Ports: &kuportv1.PortRange{First: 3000, Last: 3000}}
	}
	tbl, errs := planTable(&kuportv1.NodeProgram{
		DnatRules: []*kuportv1.DnatRule{dnat("a", 4000, "10.0.0.1"), dnat("b", 4001, "10.0.0.2"), dnat("c", 4002, "10.0.0.1")},
		SnatRules: []*kuportv1.SnatRule{snat("s1"), snat("s2")},
	})
	got := EntryErrors(errors.Join(errs...))
	require.Len(t, got, 1)
	assert.Equal(t, "b", got[0].GetId())
	assert.Contains(t, got[0].GetMessage(), `dnat b: "enp1s0" . tcp . 4001 is a's in dnat-ports`)
	assert.Equal(t, `dnat-ports: "enp1s0" . tcp . 4000 counter comment "a" : 10.0.0.1 . 5000, `+
		`"enp1s0" . tcp . 4001 counter comment "a" : 10.0.0.1 . 5001, `+
		`"enp1s0" . tcp . 4002 counter comment "c" : 10.0.0.1 . 5002, `+
		`"enp1s0" . tcp . 4003 counter comment "c" : 10.0.0.1 . 5003`,
		strings.Split(elementsText(tbl), "\n")[0])
	assert.Contains(t, elementsText(tbl), `snat-request: 10.0.0.1 . tcp . 3000 counter comment "s1"`)
}

// TestRangeConflicts: a range that keeps its ports is one element of a range set; a single
// port within it with other data, or a range overlapping it with other data, is refused by
// id. A single port that translates the same way is its own element, the same range with the
// same data is shared, and a range overlapping it with the same data is written port by port.
func TestRangeConflicts(t *testing.T) {
	dnat := func(id string, first, last uint32, to string) *kuportv1.DnatRule {
		return &kuportv1.DnatRule{Id: id, InInterface: "enp1s0", Protocol: kuportv1.Protocol_PROTOCOL_UDP,
			Ports: &kuportv1.PortRange{First: first, Last: last}, ToAddress: to, ToPort: first}
	}
	tbl, errs := planTable(&kuportv1.NodeProgram{DnatRules: []*kuportv1.DnatRule{
		dnat("a", 4000, 4099, "10.0.0.1"),
		dnat("b", 4050, 4050, "10.0.0.2"), // within a, elsewhere: refused
		dnat("c", 4060, 4060, "10.0.0.1"), // within a, the same: its own element
		dnat("d", 4090, 4199, "10.0.0.9"), // overlaps a, elsewhere: refused
		dnat("e", 4000, 4099, "10.0.0.1"), // a again: shared
		dnat("f", 5000, 5000, "10.0.0.3"),
		dnat("g", 4990, 5010, "10.0.0.4"), // holds f's port: refused
		dnat("h", 4098, 4101, "10.0.0.1"), // overlaps a, the same: port by port
	}})
	var refused []string
	for _, e := range EntryErrors(errors.Join(errs...)) {
		refused = append(refused, e.GetMessage())
	}
	assert.Equal(t, []string{
		`dnat b: "enp1s0" . udp . 4050 is in "enp1s0" . udp . 4000-4099, a's in dnat-ranges`,
		`dnat d: "enp1s0" . udp . 4090-4199 overlaps "enp1s0" . udp . 4000-4099, a's in dnat-ranges`,
		`dnat g: "enp1s0" . udp . 5000 is f's in dnat-ports`,
	}, refused)
	assert.Equal(t, `dnat-ports: "enp1s0" . udp . 4060 counter comment "c" : 10.0.0.1 . 4060, `+
		`"enp1s0" . udp . 4098 counter comment "h" : 10.0.0.1 . 4098, `+
		`"enp1s0" . udp . 4099 counter comment "h" : 10.0.0.1 . 4099, `+
		`"enp1s0" . udp . 4100 counter comment "h" : 10.0.0.1 . 4100, `+
		`"enp1s0" . udp . 4101 counter comment "h" : 10.0.0.1 . 4101, `+
		`"enp1s0" . udp . 5000 counter comment "f" : 10.0.0.3 . 5000`+"\n"+
		`dnat-ranges: "enp1s0" . udp . 4000-4099 counter comment "a" : 10.0.0.1`,
		strings.Join(strings.Split(elementsText(tbl), "\n")[:2], "\n"))
}

// TestRuleWireRoundTrip passes every rule of the layout through the library's netlink
// encoding and back (what reading the kernel does): it must match what was written, or
// every Apply would find the table damaged and rebuild it.
func TestRuleWireRoundTrip(t *testing.T) {
	for _, ranges := range []bool{false, true} {
		for _, v6 := range []bool{false, true} {
			testRuleWireRoundTrip(t, newLayout(legacyMarking.mask, nil, ranges, v6))
		}
	}
}

func testRuleWireRoundTrip(t *testing.T, l *layout) {
	for _, r := range l.rules {
		want := r.exprs(byName)
		var wire []expr.Any
		for _, e := range r.exprs(func(name string) *nftables.Set { return &nftables.Set{Name: name, ID: 7} }) {
			if _, ok := e.(*expr.Byteorder); ok {
				continue // the library cannot decode it (ruleMatches)
			}
			b, err := expr.MarshalExprData(byte(tableFamily), e)
			require.NoError(t, err)
			back := reflect.New(reflect.TypeOf(e).Elem()).Interface().(expr.Any)
			require.NoError(t, expr.Unmarshal(byte(tableFamily), b, back))
			wire = append(wire, back)
		}
		assert.True(t, ruleMatches(&nftables.Rule{Exprs: wire}, want), r.text)
	}
}
