package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// maxCommentLen is nft's limit on a comment (NFTNL_UDATA_COMMENT_MAXLEN 128, NUL included);
// an element's comment carries its entry's id.
const maxCommentLen = 127

// portRange is an inclusive range of transport ports.
type portRange struct{ first, last uint16 }

// each calls fn with every port of the range and its offset from the first.
func (r portRange) each(fn func(port, offset uint16)) {
	for p := uint32(r.first); p <= uint32(r.last); p++ {
		fn(uint16(p), uint16(p-uint32(r.first)))
	}
}

// put is one element an entry needs in one set.
type put struct {
	set string
	elem
}

// planTable turns the program's entries into the table's elements (Render's and Apply's
// one source). A range that keeps its ports is one element of a range set, a shifted range
// one element per port of the single ports' hash sets, mapped port by port, which NAT to a
// port range cannot (it picks from the range as a pool; docs/design/datapath.md#port-ranges).
//
// An invalid entry, one whose id repeats, or one that needs a key another entry already
// holds with other data (a dialed port taken, a pod port marked for another link, a range
// overlapping another's or holding a port another translates otherwise: clash) becomes an
// *EntryError and puts nothing. An element another entry already holds with the same data is
// shared: it stays that entry's, whose id it carries and under which it is counted (a rule
// per mapping, the form of docs/design/datapath.md#kup-pre-the-dnat, counted it under the
// first rule that matched, too).
func planTable(p *kuportv1.NodeProgram) (*table, []error) {
	t, errs, _ := planEntries(p)
	return t, errs
}

// planEntries is planTable, and the elements that more than one entry needs (one
// identity SNAT for two mappings to one pod port), which incremental plans leave to a
// plan of the whole program (incremental.go).
func planEntries(p *kuportv1.NodeProgram) (*table, []error, map[setKey]bool) {
	var errs []error
	n := len(p.GetDnatRules()) + len(p.GetSnatRules()) + len(p.GetMarkRules())
	seen := make(map[string]bool, n)
	type entry struct {
		kind, id string
		puts     []put
	}
	entries := make([]entry, 0, n)
	add := func(kind, id string, puts []put, err error) {
		if err == nil && seen[id] {
			err = fmt.Errorf("id used by another entry")
		}
		if err != nil {
			errs = append(errs, &EntryError{Kind: kind, ID: id, Err: err})
			return
		}
		seen[id] = true
		for i := range puts {
			puts[i].id = id
		}
		entries = append(entries, entry{kind, id, puts})
	}
	dnatKind.each(p, add)
	snatKind.each(p, add)
	markKind.each(p, add)

	l := programLayout(p)
	t := newTable(l)
	// Each set's map made for its elements, which spares growing it element by element.
	sizes := map[string]int{}
	for _, en := range entries {
		for _, pt := range en.puts {
			sizes[pt.set]++
		}
	}
	for name, n := range sizes {
		t.elems[name] = make(map[string]elem, n)
	}
	// One return-marks element per return mark, jumping to its packet-mark chain: the restore's
	// second lookup.
	for _, m := range l.marks {
		t.elems["return-marks"][string(markBytes(m))] = elem{key: string(markBytes(m)), val: markChain(m)}
	}
	shared := map[setKey]bool{}
	ranges := rangeIndex{}
	for _, en := range entries {
		var conflict error
		for i := 0; i < len(en.puts); i++ {
			pt := en.puts[i]
			if conflict = l.jumps(pt); conflict != nil {
				break
			}
			conflict = t.clash(pt, ranges)
			if errors.Is(conflict, errSplit) {
				// Its ports, each its own element, beside the range they overlap.
				en.puts = slices.Concat(en.puts[:i], l.byName[pt.set].split(pt), en.puts[i+1:])
				i--
				continue
			}
			if conflict != nil {
				break
			}
		}
		if conflict != nil {
			errs = append(errs, &EntryError{Kind: en.kind, ID: en.id, Err: conflict})
			continue
		}
		for _, pt := range en.puts {
			if _, ok := t.elems[pt.set][pt.key]; ok {
				shared[setKey{pt.set, pt.key}] = true
			} else {
				t.elems[pt.set][pt.key] = pt.elem
				ranges.add(l.byName[pt.set], pt.elem)
			}
		}
	}
	return t, errs, shared
}

// dnatPuts is the DnatRule form of program.proto (docs/design/datapath.md#kup-pre-the-dnat):
// per port, the translation, the stand-in kup-steer writes over the dialed destination first,
// and the key that counts the mapping's replies. Both count by the dialed port, the only
// thing that tells two mappings to one pod port apart: kup-steer's element every request
// before DNAT, kup-count-out's every reply after its translation back, both on the entry's
// interface. An entry without a stand-in (a controller older than the steering of every
// entry) is neither steered nor counted in.
func dnatPuts(fam family, e *kuportv1.DnatRule) ([]put, error) {
	if err := checkID(e.GetId()); err != nil {
		return nil, err
	}
	if err := checkIfname(e.GetInInterface()); err != nil {
		return nil, err
	}
	var daddr netip.Addr
	var err error
	if e.GetMatchDestination() != "" {
		if daddr, err = parseAddr(fam, "match_destination", e.GetMatchDestination()); err != nil {
			return nil, err
		}
	}
	proto, err := protocol(e.GetProtocol())
	if err != nil {
		return nil, err
	}
	dport, err := ports(e.GetPorts())
	if err != nil {
		return nil, err
	}
	to, err := parseAddr(fam, "to_address", e.GetToAddress())
	if err != nil {
		return nil, err
	}
	width := uint32(dport.last - dport.first)
	toPort := e.GetToPort()
	if toPort == 0 || toPort+width > 65535 {
		return nil, fmt.Errorf("to_port %d with range width %d is outside 1-65535", toPort, width)
	}
	var standIn netip.Addr
	if e.GetStandIn() != "" {
		if standIn, err = parseAddr(fam, "stand_in", e.GetStandIn()); err != nil {
			return nil, err
		}
	}
	dnat, out, steer := fam.setName("dnat-ports"), fam.setName("count-out-ports"), fam.setName("steer-ports")
	if daddr.IsValid() {
		dnat, out, steer = fam.setName("dnat-addr-ports"), fam.setName("count-out-addr-ports"), fam.setName("steer-addr-ports")
	}
	key := func(daddr netip.Addr, port uint16) string {
		if daddr.IsValid() {
			return pack(ifnameBytes(e.GetInInterface()), daddr.AsSlice(), []byte{proto}, portBytes(port))
		}
		return pack(ifnameBytes(e.GetInInterface()), []byte{proto}, portBytes(port))
	}
	if dport.keeps(toPort) {
		// One element a set: the dialed range, translated to the target address alone.
		dialed := func(port uint16) string { return key(daddr, port) }
		nat := dialed
		var puts []put
		if standIn.IsValid() {
			if daddr.IsValid() {
				nat = func(port uint16) string { return key(standIn, port) }
			}
			puts = append(puts, rangePut(steer, dialed, dport, pack(standIn.AsSlice())))
		}
		return append(puts, rangePut(dnat, nat, dport, pack(to.AsSlice())), rangePut(out, dialed, dport, "")), nil
	}
	var puts []put
	dport.each(func(port, offset uint16) {
		// Steered, kup-pre sees the stand-in where the dialed destination was.
		dialed := key(daddr, port)
		nat := dialed
		if standIn.IsValid() {
			if daddr.IsValid() {
				nat = key(standIn, port)
			}
			puts = append(puts, put{set: steer, elem: elem{key: dialed, val: pack(standIn.AsSlice())}})
		}
		puts = append(puts,
			put{set: dnat, elem: elem{key: nat, val: pack(to.AsSlice(), portBytes(uint16(toPort)+offset))}},
			put{set: out, elem: elem{key: dialed}})
	})
	return puts, nil
}

// podPortMatch checks what an SNAT and a mark entry share, the entry's id and the pod
// address, protocol and ports it matches, and returns them parsed.
func podPortMatch(fam family, id, address string, p kuportv1.Protocol, r *kuportv1.PortRange) (netip.Addr, byte, portRange, error) {
	if err := checkID(id); err != nil {
		return netip.Addr{}, 0, portRange{}, err
	}
	addr, err := parseAddr(fam, "address", address)
	if err != nil {
		return netip.Addr{}, 0, portRange{}, err
	}
	proto, err := protocol(p)
	if err != nil {
		return netip.Addr{}, 0, portRange{}, err
	}
	pr, err := ports(r)
	if err != nil {
		return netip.Addr{}, 0, portRange{}, err
	}
	return addr, proto, pr, nil
}

// snatPuts is the identity SNAT of program.proto's SnatKind
// (docs/design/datapath.md#kup-post-the-identity-snat): one element per port, a range one
// element.
func snatPuts(fam family, e *kuportv1.SnatRule) ([]put, error) {
	addr, proto, pr, err := podPortMatch(fam, e.GetId(), e.GetAddress(), e.GetProtocol(), e.GetPorts())
	if err != nil {
		return nil, err
	}
	var set string
	switch e.GetKind() {
	case kuportv1.SnatKind_SNAT_KIND_REQUEST:
		set = fam.setName("snat-request")
	case kuportv1.SnatKind_SNAT_KIND_REPLY:
		set = fam.setName("snat-reply")
	default:
		return nil, fmt.Errorf("unknown snat kind %v", e.GetKind())
	}
	return podPortPuts(set, func(port uint16) string { return pack(addr.AsSlice(), []byte{proto}, portBytes(port)) }, pr, ""), nil
}

// podPortPuts are the elements of an SNAT or mark entry matching ports pr of key's form in
// set: a range is one element of the set's range set (a pod port range is kept whatever the
// dialed ports, so any range is), a single port one of set.
func podPortPuts(set string, key func(port uint16) string, pr portRange, val string) []put {
	if pr.last > pr.first {
		return []put{rangePut(set, key, pr, val)}
	}
	return []put{{set: set, elem: elem{key: key(pr.first), val: val}}}
}

// markPuts is a return-marking form of program.proto's MarkKind
// (docs/design/datapath.md#kup-mangle-return-marking). Single marks the reply by its source.
// Multi cannot: the reply says nothing about which forwarder its request came through, so the
// request's arrival link is saved on the flow and the reply takes it back from there. The
// save writes only the ct mark, so the request itself is not diverted on its way in.
func markPuts(fam family, e *kuportv1.MarkRule) ([]put, error) {
	addr, proto, pr, err := checkMarkRule(fam, e)
	if err != nil {
		return nil, err
	}
	mark := e.GetMark()
	bySource := func(port uint16) string { return pack(addr.AsSlice(), []byte{proto}, portBytes(port)) }
	switch e.GetKind() {
	case kuportv1.MarkKind_MARK_KIND_STATIC:
		return podPortPuts(fam.setName("mark-static"), bySource, pr, markChain(mark)), nil
	case kuportv1.MarkKind_MARK_KIND_CT_SAVE:
		return podPortPuts(fam.setName("mark-ct-save"), func(port uint16) string {
			return pack(ifnameBytes(e.GetInInterface()), addr.AsSlice(), []byte{proto}, portBytes(port))
		}, pr, ctMarkChain(mark)), nil
	case kuportv1.MarkKind_MARK_KIND_CT_RESTORE:
		return podPortPuts(fam.setName("mark-ct-restore"), bySource, pr, ""), nil
	}
	return nil, nil
}

// checkMarkRule validates a mark entry (markPuts', and the layout's marks', programMarks).
func checkMarkRule(fam family, e *kuportv1.MarkRule) (netip.Addr, byte, portRange, error) {
	addr, proto, pr, err := podPortMatch(fam, e.GetId(), e.GetAddress(), e.GetProtocol(), e.GetPorts())
	if err != nil {
		return addr, proto, pr, err
	}
	kind, mark := e.GetKind(), e.GetMark()
	switch kind {
	case kuportv1.MarkKind_MARK_KIND_STATIC, kuportv1.MarkKind_MARK_KIND_CT_SAVE, kuportv1.MarkKind_MARK_KIND_CT_RESTORE:
	default:
		return addr, proto, pr, fmt.Errorf("unknown mark kind %v", kind)
	}
	if kind != kuportv1.MarkKind_MARK_KIND_CT_SAVE && e.GetInInterface() != "" {
		return addr, proto, pr, fmt.Errorf("in_interface is for %v only", kuportv1.MarkKind_MARK_KIND_CT_SAVE)
	}
	switch restore := kind == kuportv1.MarkKind_MARK_KIND_CT_RESTORE; {
	case restore && mark != 0:
		return addr, proto, pr, fmt.Errorf("mark %#x is set: a restore takes the flow's mark", mark)
	case !restore && mark == 0:
		return addr, proto, pr, fmt.Errorf("mark is 0")
	}
	if kind == kuportv1.MarkKind_MARK_KIND_CT_SAVE {
		if err := checkIfname(e.GetInInterface()); err != nil {
			return addr, proto, pr, err
		}
	}
	return addr, proto, pr, nil
}

// checkID keeps an id printable inside nft's quoted comment and within its length limit.
func checkID(id string) error {
	if id == "" || len(id) > maxCommentLen {
		return fmt.Errorf("id must be 1-%d bytes", maxCommentLen)
	}
	if strings.ContainsAny(id, "\"\\") || strings.IndexFunc(id, func(c rune) bool { return c < 0x20 || c > 0x7e }) >= 0 {
		return fmt.Errorf("id %q has characters nft cannot print in a comment", id)
	}
	return nil
}

// checkIfname accepts a Linux interface name (at most 15 bytes, IFNAMSIZ - 1).
func checkIfname(name string) error {
	if name == "" || len(name) > 15 || strings.ContainsAny(name, "\"\\*/ ") {
		return fmt.Errorf("interface name %q is not a valid device name", name)
	}
	return nil
}

func ipv4(field, s string) (netip.Addr, error) { return parseAddr(familyIPv4, field, s) }

// parseAddr parses an address of the family.
func parseAddr(fam family, field, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.BitLen() != int(fam.addr.Bytes*8) || a.Is4In6() {
		return netip.Addr{}, fmt.Errorf("%s %q is not an %s address", field, s, fam.addrName)
	}
	return a, nil
}

func protocol(p kuportv1.Protocol) (uint8, error) {
	switch p {
	case kuportv1.Protocol_PROTOCOL_TCP:
		return protoTCP, nil
	case kuportv1.Protocol_PROTOCOL_UDP:
		return protoUDP, nil
	}
	return 0, fmt.Errorf("unknown protocol %v", p)
}

func ports(p *kuportv1.PortRange) (portRange, error) {
	if p == nil || p.GetFirst() < 1 || p.GetLast() < p.GetFirst() || p.GetLast() > 65535 {
		return portRange{}, fmt.Errorf("ports %d-%d are not a range within 1-65535", p.GetFirst(), p.GetLast())
	}
	return portRange{uint16(p.GetFirst()), uint16(p.GetLast())}, nil
}
