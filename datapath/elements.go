package datapath

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// elem is one element of one of kuport's sets: its key and data as the registers hold them
// (each part padded to 4 bytes), and the id of the program entry it renders, under which its
// counter is reported and which the elements of an entry's own translation carry as their
// comment, for `nft list` (setSpec.commented). An element read back from a set without
// comments has none. An element of a range set has the key of its last port as end (its key
// is the first's); keyed by its key like any other, since ranges of one set never overlap.
type elem struct {
	key, end, val string
	id            string
}

// table is the whole of table ip kuport: its layout and every set's elements by key.
type table struct {
	layout *layout
	elems  map[string]map[string]elem
	// held are, in a table read back from the kernel, the texts of the rules each base
	// chain holds ("" for one in no kuport form); nil in a planned table, which holds
	// chainRules.
	held map[string][]string
}

func newTable(l *layout) *table {
	t := &table{layout: l, elems: make(map[string]map[string]elem, len(l.sets))}
	for _, s := range l.sets {
		t.elems[s.name] = map[string]elem{}
	}
	return t
}

// empty reports whether the table holds no element: a program without entries has no
// table at all.
func (t *table) empty() bool {
	for _, m := range t.elems {
		if len(m) > 0 {
			return false
		}
	}
	return true
}

// chainRules are the rules of chain the table holds: the layout's, but those whose set is
// empty. A lookup in an empty set costs a packet as much as one that finds its element, and
// a node holding ranges met about ten of them a packet (BENCHMARKS.md, "Rules on empty sets
// left out").
func (t *table) chainRules(chain string) []ruleSpec {
	return slices.DeleteFunc(t.layout.chainRules(chain), func(r ruleSpec) bool { return !r.heldWith(len(t.elems[r.set])) })
}

// sameRules reports whether table have holds the rules table want does in chain.
func sameRules(have, want *table, chain string) bool {
	held, read := have.held[chain]
	if !read {
		held = ruleTexts(have.chainRules(chain))
	}
	return slices.Equal(held, ruleTexts(want.chainRules(chain)))
}

func ruleTexts(rules []ruleSpec) []string {
	texts := make([]string, len(rules))
	for i, r := range rules {
		texts[i] = r.text
	}
	return texts
}

// lookup is the element of set s that key meets: the one of that key, or in a range set
// the one whose every part holds key's between its first and last.
func (t *table) lookup(s *setSpec, key string) (elem, bool) {
	if !s.interval() {
		e, ok := t.elems[s.name][key]
		return e, ok
	}
	for _, e := range t.elems[s.name] {
		if within(s.key, key, e.key, e.end) {
			return e, true
		}
	}
	return elem{}, false
}

// within reports whether each part of key lies between those of first and last, compared
// as the kernel compares them: bytewise, in network order.
func within(fields []field, key, first, last string) bool {
	at := 0
	for _, f := range fields {
		n := int(f.words() * 4)
		if len(key) < at+n || len(first) < at+n || len(last) < at+n {
			return false
		}
		k := key[at : at+n]
		if k < first[at:at+n] || k > last[at:at+n] {
			return false
		}
		at += n
	}
	return true
}

// pack concatenates key or data parts as a concatenation holds them in registers: each
// padded with zeros to a multiple of 4 bytes.
func pack(parts ...[]byte) string {
	n := 0
	for _, p := range parts {
		n += (len(p) + 3) &^ 3
	}
	var b strings.Builder
	b.Grow(n)
	for _, p := range parts {
		b.Write(p)
		for n := len(p); n%4 != 0; n++ {
			b.WriteByte(0)
		}
	}
	return b.String()
}

func ifnameBytes(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func portBytes(p uint16) []byte { return binary.BigEndian.AppendUint16(nil, p) }

// markBytes is a mark as return-marks' key holds it: in network byte order, which nft lists
// a set's key in unless the set's userdata says otherwise (google/nftables v0.3.0 cannot
// write that); the restore turns the conntrack mark to it (restoreRule).
func markBytes(m uint32) []byte { return binary.BigEndian.AppendUint32(nil, m) }

// Transport protocol numbers as they appear in meta l4proto.
const (
	protoTCP uint8 = 6
	protoUDP uint8 = 17
)

// valueText prints the parts of packed by fields as nft lists them.
func valueText(fields []field, packed string) string {
	parts := make([]string, 0, len(fields))
	for _, f := range fields {
		n := int(f.words() * 4)
		if len(packed) < n {
			return fmt.Sprintf("# %d bytes where %s takes %d", len(packed), f.typ.Name, n)
		}
		b := []byte(packed[:f.typ.Bytes])
		packed = packed[n:]
		switch f.typ.Name {
		case "ifname":
			parts = append(parts, fmt.Sprintf("%q", strings.TrimRight(string(b), "\x00")))
		case "ipv4_addr", "ipv6_addr":
			a, _ := netip.AddrFromSlice(b)
			parts = append(parts, a.String())
		case "inet_proto":
			switch b[0] {
			case protoTCP:
				parts = append(parts, "tcp")
			case protoUDP:
				parts = append(parts, "udp")
			default:
				parts = append(parts, fmt.Sprint(b[0]))
			}
		case "inet_service":
			parts = append(parts, fmt.Sprint(binary.BigEndian.Uint16(b)))
		case "mark":
			parts = append(parts, fmt.Sprintf("0x%08x", binary.BigEndian.Uint32(b)))
		default:
			parts = append(parts, fmt.Sprintf("0x%x", b))
		}
	}
	if len(packed) > 0 {
		parts = append(parts, fmt.Sprintf("# %d bytes more", len(packed)))
	}
	return strings.Join(parts, " . ")
}

// rangeText prints a range element's key from first to end as nft lists it: each part
// whose ends differ as "first-last".
func rangeText(fields []field, first, end string) string {
	a, b := strings.Split(valueText(fields, first), " . "), strings.Split(valueText(fields, end), " . ")
	if len(a) != len(b) {
		return valueText(fields, first) + " # ends " + valueText(fields, end)
	}
	for i := range a {
		if a[i] != b[i] {
			a[i] += "-" + b[i]
		}
	}
	return strings.Join(a, " . ")
}

// keyText is the element's key (a range's from first to end) as nft lists it.
func (e elem) keyText(s *setSpec) string {
	if e.end != "" {
		return rangeText(s.key, e.key, e.end)
	}
	return valueText(s.key, e.key)
}

// text is the element as kuport's logs and errors print it: as `nft list` would, were a
// range set's key its concatenation (listed).
func (e elem) text(s *setSpec, counted bool) string { return e.textOf(e.keyText(s), s, counted) }

// listed is the element as `nft list` prints it, its counter normalised to "counter". nft
// 1.0.6 prints a range set's key, one ll_addr as wide as the concatenation (layout.go's
// keyType), as its bytes in hex, the range "first-last".
func (e elem) listed(s *setSpec, counted bool) string {
	if !s.interval() {
		return e.text(s, counted)
	}
	return e.textOf(hexColons(e.key)+"-"+hexColons(e.end), s, counted)
}

// hexColons prints b's bytes as nft prints an ll_addr, as net.HardwareAddr prints any
// length: two hex digits each, between colons.
func hexColons(b string) string { return net.HardwareAddr(b).String() }

// textOf is the element printed with key as its key's text.
func (e elem) textOf(key string, s *setSpec, counted bool) string {
	t := key
	if counted {
		t += " counter"
	}
	if e.id != "" && s.commented() {
		t += fmt.Sprintf(" comment %q", e.id)
	}
	switch {
	case s.vmap():
		t += " : jump " + e.val
	case s.data != nil:
		t += " : " + valueText(s.data, e.val)
	}
	return t
}

// elementLines are a set's elements as nft lists them, sorted: nft prints a hash set in the
// kernel's hash order, which no program can predict, so Render, Dump and the tests' reading
// of `nft list` all sort.
func elementLines(s *setSpec, elems map[string]elem, counted func(elem) bool) []string {
	lines := make([]string, 0, len(elems))
	for _, e := range elems {
		lines = append(lines, e.listed(s, counted(e)))
	}
	slices.Sort(lines)
	return lines
}
