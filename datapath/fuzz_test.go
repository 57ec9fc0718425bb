package datapath

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/google/nftables"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// FuzzValidateProgram feeds Validate, as the agent does before Apply, any NodeProgram a peer
// can send: the wire bytes as proto.Unmarshal reads them, and a golden program with fields
// of its entries overwritten by values the edits bytes pick (ports 0 and 65535, long and
// quoted names, IPv6 and garbage addresses, marks 0, duplicate ids, links missing). On every
// input: no panic; Validate neither changes the program nor answers differently twice; an
// invalid program is refused with one error per refused entry, each naming an entry of the
// program ("<kind> <id>: ..."); a valid one is planned into nftables sets, elements and rules
// the kernel would take (every key and value the size of its set's type, every comment an
// entry's id) and renders.
func FuzzValidateProgram(f *testing.F) {
	seeds := fuzzSeedPrograms(f)
	for i, p := range seeds {
		b, err := proto.Marshal(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, []byte{byte(i)})
		f.Add([]byte{}, []byte{byte(i), 0, 0, 1, 1, 2, 2, 3})
	}
	f.Fuzz(func(t *testing.T, wire, edits []byte) {
		p := &kuportv1.NodeProgram{}
		if err := proto.Unmarshal(wire, p); err == nil && portCount(p) <= maxFuzzPorts {
			checkValidate(t, p)
		}
		if len(edits) > 0 {
			q := proto.CloneOf(seeds[int(edits[0])%len(seeds)])
			mutateProgram(q, edits[1:])
			if portCount(q) <= maxFuzzPorts {
				checkValidate(t, q)
			}
		}
	})
}

// maxFuzzPorts bounds the ports the entries of one input walk, three elements each: 2048
// take about 60 ms to check, where a few hundred entries of 1-65535 from a few kilobytes of
// wire would take minutes. Every check of a range is made before its ports are walked, and
// the golden ranges have 101.
const maxFuzzPorts = 1 << 11

// portCount is the number of ports the program's entries would walk.
func portCount(p *kuportv1.NodeProgram) int {
	n := 0
	count := func(r *kuportv1.PortRange) {
		if r.GetFirst() >= 1 && r.GetFirst() <= r.GetLast() && r.GetLast() <= 65535 {
			n += int(r.GetLast()-r.GetFirst()) + 1
		}
	}
	for _, e := range p.GetDnatRules() {
		count(e.GetPorts())
	}
	for _, e := range p.GetSnatRules() {
		count(e.GetPorts())
	}
	for _, e := range p.GetMarkRules() {
		count(e.GetPorts())
	}
	return n
}

// fuzzSeedPrograms are the golden programs, sorted by name.
func fuzzSeedPrograms(tb testing.TB) []*kuportv1.NodeProgram {
	files, err := filepath.Glob("testdata/*.program.json")
	if err != nil || len(files) == 0 {
		tb.Fatalf("no golden programs: %v", err)
	}
	slices.Sort(files)
	var out []*kuportv1.NodeProgram
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		p := &kuportv1.NodeProgram{}
		if err := protojson.Unmarshal(b, p); err != nil {
			tb.Fatal(f, err)
		}
		out = append(out, p)
	}
	return out
}

// Edge values an edit writes.
var (
	fuzzNames = []string{"", "enp1s0", "wt0", "kup-dcc4266d", "kup-5e30a797", "cilium_", "cilium_host",
		"a-name-longer-than-15", "kup-", "bad\"q", "a*b", "a b", "x/y", "é"}
	fuzzAddrs = []string{"", "10.244.18.107", "169.254.77.1", "169.254.77.0", "100.64.93.143", "0.0.0.0",
		"255.255.255.255", "::1", "::ffff:10.0.0.1", "10.0.0.256", "garbage", "10.0.0.1 "}
	fuzzPorts = []uint32{0, 1, 2, 1023, 3000, 3001, 8080, 65534, 65535, 65536, 1 << 31, 1<<32 - 1}
	fuzzMarks = []uint32{0, 1, 0x6b700001, 0x6b700002, 1<<32 - 1}
	fuzzIDs   = []string{"", "demo/remote/dnat/enp1s0", "demo/remote/snat", "demo/remote/mark", "x",
		strings.Repeat("i", 127), strings.Repeat("i", 128), "quote\"", "back\\slash", "tab\t", "kup-dcc4266d/return", "demo/remote/ct-save#kup-dcc4266d"}
)

// mutateProgram overwrites fields of p's entries as the edits say, two bytes an edit: which
// field of which entry, and the value's index in its edge list.
func mutateProgram(p *kuportv1.NodeProgram, edits []byte) {
	pick := func(b byte, n int) int { return int(b) % n }
	for len(edits) >= 2 {
		op, v := edits[0], edits[1]
		edits = edits[2:]
		name, addr := fuzzNames[pick(v, len(fuzzNames))], fuzzAddrs[pick(v, len(fuzzAddrs))]
		port, mark, id := fuzzPorts[pick(v, len(fuzzPorts))], fuzzMarks[pick(v, len(fuzzMarks))], fuzzIDs[pick(v, len(fuzzIDs))]
		entry := int(op >> 5)
		switch op & 0x1f {
		case 0:
			if d := at(p.DnatRules, entry); d != nil {
				d.Id = id
			}
		case 1:
			if d := at(p.DnatRules, entry); d != nil {
				d.InInterface = name
			}
		case 2:
			if d := at(p.DnatRules, entry); d != nil {
				d.MatchDestination = addr
			}
		case 3:
			if d := at(p.DnatRules, entry); d != nil {
				d.Ports = &kuportv1.PortRange{First: port, Last: fuzzPorts[pick(v>>4, len(fuzzPorts))]}
			}
		case 4:
			if d := at(p.DnatRules, entry); d != nil {
				d.ToAddress, d.ToPort = addr, port
			}
		case 5:
			if d := at(p.DnatRules, entry); d != nil {
				d.Protocol = kuportv1.Protocol(v % 4)
			}
		case 6:
			if s := at(p.SnatRules, entry); s != nil {
				s.Id = id
			}
		case 7:
			if s := at(p.SnatRules, entry); s != nil {
				s.Kind = kuportv1.SnatKind(v % 4)
			}
		case 8:
			if s := at(p.SnatRules, entry); s != nil {
				s.Address = addr
			}
		case 9:
			if s := at(p.SnatRules, entry); s != nil {
				s.Ports = &kuportv1.PortRange{First: port, Last: port}
			}
		case 10:
			if m := at(p.MarkRules, entry); m != nil {
				m.Id, m.Kind = id, kuportv1.MarkKind(v%5)
			}
		case 11:
			if m := at(p.MarkRules, entry); m != nil {
				m.Mark, m.InInterface = mark, name
			}
		case 12:
			if m := at(p.MarkRules, entry); m != nil {
				m.Address, m.Ports = addr, &kuportv1.PortRange{First: port, Last: port}
			}
		case 13:
			if l := at(p.Links, entry); l != nil {
				l.Name = name
			}
		case 14:
			if l := at(p.Links, entry); l != nil {
				l.Vni, l.Port, l.Mtu = mark%(1<<25), port, port
			}
		case 15:
			if l := at(p.Links, entry); l != nil {
				l.LocalUnderlay, l.RemoteUnderlay, l.LocalAddress = addr, fuzzAddrs[pick(v>>4, len(fuzzAddrs))], addr
			}
		case 16:
			if r := at(p.ReturnPaths, entry); r != nil {
				r.Id, r.Link = id, name
			}
		case 17:
			if r := at(p.ReturnPaths, entry); r != nil {
				r.Mark, r.Table = mark, []uint32{0, 200, 201, 202, 253, 254, 255, 256, 1 << 31}[pick(v, 9)]
			}
		case 18:
			if r := at(p.ReturnPaths, entry); r != nil {
				r.PeerUnderlay, r.PeerLinkAddress = addr, fuzzAddrs[pick(v>>4, len(fuzzAddrs))]
			}
		case 19: // an entry twice
			if d := at(p.DnatRules, entry); d != nil {
				p.DnatRules = append(p.DnatRules, proto.CloneOf(d))
			}
		case 20:
			if s := at(p.SnatRules, entry); s != nil {
				p.SnatRules = append(p.SnatRules, proto.CloneOf(s))
			}
		case 21:
			if m := at(p.MarkRules, entry); m != nil {
				p.MarkRules = append(p.MarkRules, proto.CloneOf(m))
			}
		case 22:
			if l := at(p.Links, entry); l != nil {
				p.Links = append(p.Links, proto.CloneOf(l))
			}
		case 23:
			if r := at(p.ReturnPaths, entry); r != nil {
				p.ReturnPaths = append(p.ReturnPaths, proto.CloneOf(r))
			}
		case 24: // an entry lost
			if entry < len(p.Links) {
				p.Links = slices.Delete(p.Links, entry, entry+1)
			}
		case 25:
			if d := at(p.DnatRules, entry); d != nil {
				d.Ports = nil
			}
		case 26: // an empty entry
			p.DnatRules = append(p.DnatRules, &kuportv1.DnatRule{})
		}
	}
}

func at[T any](s []*T, i int) *T {
	if i < len(s) {
		return s[i]
	}
	return nil
}

// checkValidate checks Validate's invariants on p.
func checkValidate(t *testing.T, p *kuportv1.NodeProgram) {
	t.Helper()
	before := proto.CloneOf(p)
	err := Validate(p)
	if !proto.Equal(before, p) {
		t.Fatal("Validate changed the program")
	}
	if again := Validate(p); (again == nil) != (err == nil) || (err != nil && again.Error() != err.Error()) {
		t.Fatalf("Validate answered %v, then %v", err, again)
	}
	if err != nil {
		checkRefusal(t, p, err)
		return
	}
	checkRenders(t, p)
}

// checkRefusal: every error of a refused program names one of its entries.
func checkRefusal(t *testing.T, p *kuportv1.NodeProgram, err error) {
	t.Helper()
	ids := map[string]map[string]bool{"dnat": {}, "snat": {}, "mark": {}, "link": {}, "return path": {}}
	for _, e := range p.GetDnatRules() {
		ids["dnat"][e.GetId()] = true
	}
	for _, e := range p.GetSnatRules() {
		ids["snat"][e.GetId()] = true
	}
	for _, e := range p.GetMarkRules() {
		ids["mark"][e.GetId()] = true
	}
	for _, e := range p.GetLinks() {
		ids["link"][e.GetName()] = true
	}
	for _, e := range p.GetReturnPaths() {
		ids["return path"][e.GetId()] = true
	}
	errs := EntryErrors(err)
	if len(errs) == 0 {
		t.Fatalf("refused with no entry error: %v", err)
	}
	for _, e := range errs {
		kind, ok := "", false
		for k, byID := range ids {
			if byID[e.GetId()] && strings.HasPrefix(e.GetMessage(), k+" "+e.GetId()+": ") {
				kind, ok = k, true
			}
		}
		if !ok {
			t.Fatalf("entry error %q (id %q) names no entry of the program", e.GetMessage(), e.GetId())
		}
		if e.GetId() == "" && !strings.Contains(e.GetMessage(), "id must be") && !strings.Contains(e.GetMessage(), "name \"\"") &&
			!strings.Contains(e.GetMessage(), "used by another") {
			t.Fatalf("%s entry without an id refused for something else: %q", kind, e.GetMessage())
		}
	}
}

// checkRenders: a valid program is planned into kernel objects of the right sizes and renders.
func checkRenders(t *testing.T, p *kuportv1.NodeProgram) {
	t.Helper()
	tbl, errs := planTable(p)
	if len(errs) > 0 {
		t.Fatalf("valid program's table has errors: %v", errs)
	}
	valid := map[string]bool{}
	for _, e := range p.GetDnatRules() {
		valid[e.GetId()] = true
	}
	for _, e := range p.GetSnatRules() {
		valid[e.GetId()] = true
	}
	for _, e := range p.GetMarkRules() {
		valid[e.GetId()] = true
	}
	kt := &nftables.Table{Family: tableFamily, Name: tableName}
	for _, s := range tbl.layout.sets {
		ks := s.kernelSet(kt)
		for _, e := range tbl.elems[s.name] {
			nes, _ := nftElem(nil, s, e, s.data != nil)
			for _, ne := range nes {
				if len(ne.Key) != int(ks.KeyType.Bytes) {
					t.Fatalf("set %s: key of %d bytes, type %s takes %d", s.name, len(ne.Key), ks.KeyType.Name, ks.KeyType.Bytes)
				}
			}
			if paired, ok := pairRanges(nes); s.interval() && (!ok || len(paired) != 1 || string(paired[0].KeyEnd) != e.end) {
				t.Fatalf("set %s: range %s does not read back as written", s.name, e.text(s, true))
			}
			ne := nes[0]
			switch {
			case s.vmap() && (ne.VerdictData == nil || !tbl.layout.hasChain(ne.VerdictData.Chain)):
				t.Fatalf("map %s: element jumps to no chain of the table: %s", s.name, e.text(s, true))
			case !s.vmap() && s.data != nil && len(ne.Val) != int(ks.DataType.Bytes):
				t.Fatalf("map %s: value of %d bytes, type %s takes %d", s.name, len(ne.Val), ks.DataType.Name, ks.DataType.Bytes)
			}
			// return-marks' elements are the table's own, no entry's.
			if s.role != roleReturn && !valid[e.id] || len(e.id) > maxCommentLen {
				t.Fatalf("set %s: element id %q is no entry's id", s.name, e.id)
			}
			// valueText marks a key or value of the wrong size with "# "; an interface name may
			// hold a "#", never a space (checkIfname), and an id is no part of either.
			if strings.Contains(valueText(s.key, e.key), "# ") || (s.data != nil && !s.vmap() && strings.Contains(valueText(s.data, e.val), "# ")) {
				t.Fatalf("set %s: element prints malformed: %s", s.name, e.text(s, true))
			}
		}
	}
	for _, r := range tbl.layout.rules {
		if len(r.exprs(byName)) == 0 {
			t.Fatalf("rule %q has no expressions", r.text)
		}
	}
	text := Render(p)
	if (text == "") != tbl.empty() {
		t.Fatalf("rendered %d bytes of a table empty=%v", len(text), tbl.empty())
	}
	if _, _, lerrs := planLinks(p); len(lerrs) > 0 {
		t.Fatalf("valid program's links have errors: %v", lerrs)
	}
}
