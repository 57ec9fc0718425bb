package datapath

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The table's layout: its chains, sets and rules, which do not depend on how many entries a
// program has. Every rule is one lookup in a set whose elements are the program's entries
// (elements.go), so a packet costs one hash lookup per rule whatever the number of mappings
// (docs/design/nftables.md#what-a-chain-costs-per-packet: a chain of N rules costs about
// 22 ns per rule per packet; a hash set lookup does not move from 2 to 20,000 elements), and
// the ranges' rules an interval lookup each in a set of ranges only (setSpec). The
// rule forms of docs/design/datapath.md stay the semantics: each set says which of them its
// elements stand for.

// tableName is the one nftables table kuport owns, tableFamily its family: inet, so one
// table holds both address families' sets and rules, and one transaction changes both.
const (
	tableName       = "kuport"
	tableFamily     = nftables.TableFamilyINet
	tableFamilyName = "inet"
)

// legacyTableFamily is the family of the table agents before IPv6 wrote (table ip kuport):
// an agent deletes it in the transaction that writes its inet table (nftwrite.go).
const legacyTableFamily = nftables.TableFamilyIPv4

// family is what the address family decides: the address fields and their type, the NAT
// family, the names of the family's sets. Every set and rule takes its address fields from
// here, so IPv6 is the same sets with ipv6_addr under other names, and the same rules
// behind another meta nfproto match, not another layout.
type family struct {
	name      string // as nft names the family in a payload: "ip", "ip6"
	addrName  string // in errors: "IPv4"
	nfproto   byte   // as meta nfproto loads it: NFPROTO_IPV4
	protoName string // as nft prints it: "ipv4"
	// prefix begins the name of each of the family's sets: "" for IPv4, whose sets keep
	// the names they had in table ip kuport.
	prefix       string
	nat          uint32
	addr         nftables.SetDatatype
	saddr, daddr field
	// daddrOffset is the destination's offset in the network header, csumOffset the
	// checksum the rewrite of the destination fixes (steerTo).
	daddrOffset, csumOffset uint32
	// markReg is the 32-bit register word a rule works the packet mark in, past the
	// family's lookup results (a DNAT target: address and port).
	markReg uint32
}

// v6 reports whether the family is IPv6.
func (f family) v6() bool { return f.nfproto == unix.NFPROTO_IPV6 }

// setName is the name of the family's set called base in IPv4.
func (f family) setName(base string) string { return f.prefix + base }

// field is one part of a set's key or data: its type and, for a key, the expression that
// loads it from the packet and the text nft prints for that.
type field struct {
	typ  nftables.SetDatatype
	text string
	load func(reg uint32) expr.Any
}

func meta(k expr.MetaKey) func(uint32) expr.Any {
	return func(reg uint32) expr.Any { return &expr.Meta{Key: k, Register: reg} }
}

func payload(base expr.PayloadBase, offset, n uint32) func(uint32) expr.Any {
	return func(reg uint32) expr.Any {
		return &expr.Payload{Base: base, Offset: offset, Len: n, DestRegister: reg}
	}
}

var (
	fieldIIF   = field{nftables.TypeIFName, "iifname", meta(expr.MetaKeyIIFNAME)}
	fieldOIF   = field{nftables.TypeIFName, "oifname", meta(expr.MetaKeyOIFNAME)}
	fieldProto = field{nftables.TypeInetProto, "meta l4proto", meta(expr.MetaKeyL4PROTO)}
	// th dport and th sport cover TCP and UDP alike: both put the ports first.
	fieldDport = field{nftables.TypeInetService, "th dport", payload(expr.PayloadBaseTransportHeader, 2, 2)}
	fieldSport = field{nftables.TypeInetService, "th sport", payload(expr.PayloadBaseTransportHeader, 0, 2)}
	fieldPort  = field{typ: nftables.TypeInetService}
	fieldMark  = field{typ: nftables.TypeMark}
	// fieldJump is a verdict map's data: the chain an element jumps to (elem.val holds its
	// name).
	fieldJump = field{typ: nftables.TypeVerdict}
)

var familyIPv4 = family{
	name: "ip", addrName: "IPv4", nfproto: unix.NFPROTO_IPV4, protoName: "ipv4", nat: unix.NFPROTO_IPV4, addr: nftables.TypeIPAddr,
	saddr:       field{nftables.TypeIPAddr, "ip saddr", payload(expr.PayloadBaseNetworkHeader, 12, 4)},
	daddr:       field{nftables.TypeIPAddr, "ip daddr", payload(expr.PayloadBaseNetworkHeader, 16, 4)},
	daddrOffset: 16, csumOffset: 10, markReg: 4,
}

// familyIPv6's header has no checksum. nft fixes only the transport checksum's
// pseudo-header when it rewrites an IPv6 address (the flag, without a checksum type), which
// google/nftables v0.3.0 cannot write: it sends the flag only with a type. So the rewrite
// asks for an inet checksum at the destination's own first bytes, which the kernel updates
// before it stores the new address over them (nft_payload_set_eval), and the flag with it.
var familyIPv6 = family{
	name: "ip6", addrName: "IPv6", nfproto: unix.NFPROTO_IPV6, protoName: "ipv6", prefix: "ip6-", nat: unix.NFPROTO_IPV6, addr: nftables.TypeIP6Addr,
	saddr:       field{nftables.TypeIP6Addr, "ip6 saddr", payload(expr.PayloadBaseNetworkHeader, 8, 16)},
	daddr:       field{nftables.TypeIP6Addr, "ip6 daddr", payload(expr.PayloadBaseNetworkHeader, 24, 16)},
	daddrOffset: 24, csumOffset: 24, markReg: 8,
}

// families are the address families in the order a layout has their sets and rules.
var families = []family{familyIPv4, familyIPv6}

// familyOf is the family of address text s: IPv6 for an IPv6 address (not an IPv4-mapped
// one), IPv4 for anything else, whose parse then says what is wrong.
func familyOf(s string) family {
	if a, err := netip.ParseAddr(s); err == nil && a.Is6() && !a.Is4In6() {
		return familyIPv6
	}
	return familyIPv4
}

// words is the field's length in 32-bit registers: concatenations pad each part to 4 bytes.
func (f field) words() uint32 { return (f.typ.Bytes + 3) / 4 }

// register names the register at 32-bit word w of the data registers as the kernel lists it
// (nft_dump_register): a 128-bit register where one starts (1-4), the 32-bit register
// (8-23) otherwise.
func register(w uint32) uint32 {
	if w%4 == 0 {
		return 1 + w/4
	}
	return unix.NFT_REG32_00 + w
}

// setRole is what a set's elements stand for, which decides the Counter field their
// counters fill.
type setRole int

const (
	roleDNAT setRole = iota + 1
	roleCountOut
	roleSNAT
	roleMark
	roleSteer
	// roleReturn: return-marks, one element per return path, which no entry renders and no
	// Counter reports.
	roleReturn
)

// kind names the program entries the role's elements render, in errors.
func (r setRole) kind() string {
	switch r {
	case roleSNAT:
		return "snat"
	case roleMark:
		return "mark"
	}
	return "dnat"
}

// setSpec is one of kuport's sets: its name, key and data (none for a plain set). Every set
// counts per element (`counter` in its body), and every counter is read (Counters).
//
// An element's comment is the id of the entry it renders, for an operator reading `nft list`
// (Counters attributes counters by key, through the planned table). Only the elements of an
// entry's own translation carry it (DNAT, identity SNAT, marks): a DNAT entry's steering and
// reply-counting elements have its DNAT element's key, the dialed port, so `nft list` shows
// them next to it without the id again, and a comment costs about 1.8 µs an element to write
// (BENCHMARKS.md, "Four elements a mapping and fewer comments").
//
// A range set (interval, `flags interval`) holds the ranges of its single-port set: an element
// per range, its key the first port and its end the last, looked up by a rule of its own after
// the single port's (the request's SNAT before it, newLayout), so a single port pays no
// interval lookup where the hash one hits (docs/design/datapath.md#port-ranges).
type setSpec struct {
	name string
	key  []field
	data []field
	role setRole
	// ranges is a single-port set's range set; single is a range set's single-port set.
	ranges, single *setSpec
}

// rangesName is the name of the range set of the single-port set named single: "dnat-ports"
// has "dnat-ranges", "snat-request" "snat-request-ranges".
func rangesName(single string) string { return strings.TrimSuffix(single, "-ports") + rangesSuffix }

// rangesSuffix ends the name of every range set.
const rangesSuffix = "-ranges"

// interval reports whether the set holds port ranges.
func (s *setSpec) interval() bool { return s.single != nil }

// commented reports whether the set's elements carry their entry's id as a comment.
func (s *setSpec) commented() bool {
	return s.role != roleSteer && s.role != roleCountOut && s.role != roleReturn
}

// vmap reports whether the set is a verdict map: its elements jump to a chain.
func (s *setSpec) vmap() bool { return len(s.data) == 1 && s.data[0].typ.Name == fieldJump.typ.Name }

// written is e as the set's kernel element holds it: without its id where the set carries none.
func (s *setSpec) written(e elem) elem {
	if !s.commented() {
		e.id = ""
	}
	return e
}

// holds reports whether element have, planned or read back from the kernel, is want: a
// planned one the same in every part, id included (an element that moves to another entry is
// written anew, its counter with it), one read back as the kernel holds want.
func (s *setSpec) holds(have, want elem) bool {
	return have == want || have.id == "" && have == s.written(want)
}

func (s *setSpec) kind() string { return s.role.kind() }

func concat(fields []field) nftables.SetDatatype {
	types := make([]nftables.SetDatatype, len(fields))
	for i, f := range fields {
		types[i] = f.typ
	}
	if len(types) == 1 {
		return types[0]
	}
	return nftables.MustConcatSetType(types...)
}

// keyType is the type of the set's key: a range set's is one ll_addr as wide as the
// concatenation, which nft lists in hex (elem.listed). The kernel keeps an interval set
// whose key is declared a concatenation as pipapo, whose lookup costs several times an
// rbtree's (docs/design/nftables.md#what-a-chain-costs-per-packet), and one of a single key
// as an rbtree, which compares whole keys bytewise. In that order the keys of a range are
// the ones between its first and last key: every part but the port, the last, is the same
// in both.
func (s *setSpec) keyType() nftables.SetDatatype {
	if s.interval() {
		t := nftables.TypeLLAddr
		t.Bytes = s.keyBytes()
		return t
	}
	return concat(s.key)
}

// keyBytes is the length of the set's key: its parts, each padded to 4 bytes.
func (s *setSpec) keyBytes() uint32 {
	n := uint32(0)
	for _, f := range s.key {
		n += f.words() * 4
	}
	return n
}

func (s *setSpec) dataType() nftables.SetDatatype {
	if s.data == nil {
		return nftables.TypeInvalid
	}
	return concat(s.data)
}

// kernelSet is the set as AddSet creates it.
func (s *setSpec) kernelSet(t *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: t, Name: s.name, IsMap: s.data != nil, Counter: true, Interval: s.interval(),
		Concatenation: len(s.key) > 1 && !s.interval(), KeyType: s.keyType(), DataType: s.dataType()}
}

// header is the set's opening lines as nft lists them. nft 1.0.6 lists the type of a range
// set's key, an ll_addr of other than 6 bytes, as that many zero bytes.
func (s *setSpec) header() []string {
	typ := typeText(s.key)
	if s.interval() {
		typ = hexColons(string(make([]byte, s.keyBytes())))
	}
	if s.data != nil {
		typ += " : " + typeText(s.data)
	}
	if s.interval() {
		return []string{"type " + typ, "flags interval", "counter"}
	}
	return []string{"type " + typ, "counter"}
}

func (s *setSpec) keyword() string {
	if s.data != nil {
		return "map"
	}
	return "set"
}

func typeText(fields []field) string {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.typ.Name
	}
	return strings.Join(names, " . ")
}

// chainSpec is one of kuport's base chains. NAT is set up once per hook, so kup-pre and
// kup-post sort 10 ahead of the standard dstnat/srcnat chains (kube-proxy's, the CNI's) and
// claim a flow first; kup-mangle marks after the standard mangle chains, so their mark writes
// cannot undo it (docs/design/datapath.md#kup-mangle-return-marking). kup-steer rewrites a
// new flow's destination to its stand-in at dstnat - 20 (-120): after conntrack (-200) has
// recorded the dialed address and after a mesh's mark on local destinations (mangle, -150),
// before a host firewall at dstnat - 10 (-110) drops new connections to the node's own
// addresses, which no nat chain can run ahead of (the kernel runs every nat chain from its
// one hook at -100). The counting sees the dialed port, which tells mappings apart: kup-steer
// counts every request packet before destination NAT (-100) rewrites it (its steering
// elements' counters), kup-count-out every reply after source NAT (100) has written it back.
// Everything that reads the dialed destination runs before the rewrite: kup-mangle (-140),
// and kup-steer's own lookups.
type chainSpec struct {
	// regular: a chain only jumps reach (a return mark's), with no hook.
	regular      bool
	name         string
	typ          nftables.ChainType
	hook         nftables.ChainHook
	hookName     string
	priority     nftables.ChainPriority
	priorityName string
}

var chainSpecs = []chainSpec{
	{name: "kup-pre", typ: nftables.ChainTypeNAT, hook: *nftables.ChainHookPrerouting, hookName: "prerouting", priority: -110, priorityName: "dstnat - 10"},
	{name: "kup-post", typ: nftables.ChainTypeNAT, hook: *nftables.ChainHookPostrouting, hookName: "postrouting", priority: 90, priorityName: "srcnat - 10"},
	{name: "kup-mangle", typ: nftables.ChainTypeFilter, hook: *nftables.ChainHookPrerouting, hookName: "prerouting", priority: -140, priorityName: "mangle + 10"},
	{name: "kup-steer", typ: nftables.ChainTypeFilter, hook: *nftables.ChainHookPrerouting, hookName: "prerouting", priority: -120, priorityName: "-120"},
	{name: "kup-count-out", typ: nftables.ChainTypeFilter, hook: *nftables.ChainHookPostrouting, hookName: "postrouting", priority: 110, priorityName: "srcnat + 10"},
}

// header is the chain's first line as `nft list` prints it; none for a regular chain.
func (c chainSpec) header() []string {
	if c.regular {
		return nil
	}
	return []string{fmt.Sprintf("type %s hook %s priority %s; policy accept;", c.typ, c.hookName, c.priorityName)}
}

// kernelChain is the chain as AddChain creates it.
func (c chainSpec) kernelChain(t *nftables.Table) *nftables.Chain {
	if c.regular {
		return &nftables.Chain{Name: c.name, Table: t}
	}
	hook, prio, policy := c.hook, c.priority, nftables.ChainPolicyAccept
	return &nftables.Chain{Name: c.name, Table: t, Type: c.typ, Hooknum: &hook, Priority: &prio, Policy: &policy}
}

func (c chainSpec) matches(k *nftables.Chain) bool {
	if c.regular {
		return k.Hooknum == nil && k.Priority == nil
	}
	return k.Type == c.typ && k.Hooknum != nil && *k.Hooknum == c.hook &&
		k.Priority != nil && *k.Priority == c.priority &&
		(k.Policy == nil || *k.Policy == nftables.ChainPolicyAccept)
}

// ruleSpec is one of kuport's rules: its chain, its text as nft lists it, and its
// expressions, each lookup naming its set (by name and, for a set queued in the same
// transaction, by id).
type ruleSpec struct {
	chain string
	text  string
	exprs func(set func(name string) *nftables.Set) []expr.Any
	// set is the set the rule looks up, which it needs: while the set is empty the rule
	// matches nothing and the table leaves it out (heldWith). "" for a rule that stays
	// whatever the sets hold.
	set string
}

// layout is the whole table but its elements: the same for every program of one return-mark
// mask and one set of return marks (marks.go).
type layout struct {
	mask   uint32
	marks  []uint32 // sorted
	ranges bool     // the range sets and their rules
	v6     bool     // IPv6's sets and rules beside IPv4's
	chains []chainSpec
	sets   []*setSpec
	byName map[string]*setSpec
	rules  []ruleSpec
}

// chain returns the layout's chain named name.
func (l *layout) chain(name string) (chainSpec, bool) {
	i := slices.IndexFunc(l.chains, func(c chainSpec) bool { return c.name == name })
	if i < 0 {
		return chainSpec{}, false
	}
	return l.chains[i], true
}

// hasChain reports whether the layout has a chain named name.
func (l *layout) hasChain(name string) bool { _, ok := l.chain(name); return ok }

// translatedMark is the packet-mark bit kup-pre sets on the first packet of every flow it
// translates and kup-post clears as it claims the flow with the identity SNAT: what kuport
// did to the flow, not the device it leaves by, tells the request's SNAT which flows are
// kuport's, so no CNI device is named. The bit lies outside the marks every CNI, mesh and
// proxy in datapath/README.md (the priority contract) uses, and lives only between the two
// NAT hooks of one packet.
const translatedMark = 0x00000080

// newLayout is the layout of a return-mark mask and marks, with the range sets and their
// rules when ranges, and IPv6's sets and rules when v6: a program without ranges has the
// table of single ports alone, and a single port's packet pays no range lookup; one without
// IPv6 entries has IPv4's alone.
func newLayout(mask uint32, marks []uint32, ranges, v6 bool) *layout {
	l := &layout{mask: mask, marks: marks, ranges: ranges, v6: v6, chains: slices.Clone(chainSpecs), byName: map[string]*setSpec{}}
	// One return-marks map serves both families: it is keyed by the conntrack mark alone.
	returns := l.addSet("return-marks", roleReturn, []field{fieldMark}, []field{fieldJump})
	l.addFamily(familyIPv4, returns)
	if v6 {
		l.addFamily(familyIPv6, returns)
	}
	for _, m := range marks {
		l.markChains(m)
	}
	return l
}

// families are the layout's address families, IPv4 first.
func (l *layout) families() []family {
	if l.v6 {
		return families
	}
	return families[:1]
}

// addSet adds a set to the layout.
func (l *layout) addSet(name string, role setRole, key, data []field) *setSpec {
	s := &setSpec{name: name, key: key, data: data, role: role}
	l.sets = append(l.sets, s)
	l.byName[name] = s
	return s
}

// addFamily adds the family's sets and their rules. Each rule matches the family first
// (meta nfproto): in an inet table a rule meets both families' packets, and IPv4's sets
// without an address in their key would translate an IPv6 packet to an IPv4 target.
func (l *layout) addFamily(fam family, returns *setSpec) {
	ranges := l.ranges
	set := func(name string, role setRole, key, data []field) *setSpec {
		return l.addSet(fam.setName(name), role, key, data)
	}
	first := len(l.rules)
	defer func() {
		for i := first; i < len(l.rules); i++ {
			l.rules[i] = fam.guard(l.rules[i])
		}
	}()
	target := []field{{typ: fam.addr}, fieldPort}
	// ranged adds single's range set: the same key, and data for a range (a DNAT range keeps
	// each port, so its data is the target address alone).
	ranged := func(single *setSpec, data []field) *setSpec {
		if !ranges {
			return nil
		}
		r := l.addSet(rangesName(single.name), single.role, single.key, data)
		single.ranges, r.single = r, single
		return r
	}
	// A DNAT entry with a destination match (this node's end of a link) and one without are
	// separate maps: a hash key has no wildcard.
	dnatAddr := set("dnat-addr-ports", roleDNAT, []field{fieldIIF, fam.daddr, fieldProto, fieldDport}, target)
	dnatAddrR := ranged(dnatAddr, []field{{typ: fam.addr}})
	dnat := set("dnat-ports", roleDNAT, []field{fieldIIF, fieldProto, fieldDport}, target)
	dnatR := ranged(dnat, []field{{typ: fam.addr}})
	outAddr := set("count-out-addr-ports", roleCountOut, []field{fieldOIF, fam.saddr, fieldProto, fieldSport}, nil)
	outAddrR := ranged(outAddr, nil)
	out := set("count-out-ports", roleCountOut, []field{fieldOIF, fieldProto, fieldSport}, nil)
	outR := ranged(out, nil)
	request := set("snat-request", roleSNAT, []field{fam.daddr, fieldProto, fieldDport}, nil)
	requestR := ranged(request, nil)
	reply := set("snat-reply", roleSNAT, []field{fam.saddr, fieldProto, fieldSport}, nil)
	replyR := ranged(reply, nil)
	static := set("mark-static", roleMark, []field{fam.saddr, fieldProto, fieldSport}, []field{fieldJump})
	staticR := ranged(static, []field{fieldJump})
	save := set("mark-ct-save", roleMark, []field{fieldIIF, fam.daddr, fieldProto, fieldDport}, []field{fieldJump})
	saveR := ranged(save, []field{fieldJump})
	restore := set("mark-ct-restore", roleMark, []field{fam.saddr, fieldProto, fieldSport}, nil)
	restoreR := ranged(restore, nil)
	steerAddr := set("steer-addr-ports", roleSteer, []field{fieldIIF, fam.daddr, fieldProto, fieldDport}, []field{{typ: fam.addr}})
	steerAddrR := ranged(steerAddr, []field{{typ: fam.addr}})
	steer := set("steer-ports", roleSteer, []field{fieldIIF, fieldProto, fieldDport}, []field{{typ: fam.addr}})
	steerR := ranged(steer, []field{{typ: fam.addr}})

	// each is build's rule for each of sets the layout has (a range set only with ranges).
	each := func(build func(*setSpec) ruleSpec, sets ...*setSpec) []ruleSpec {
		var out []ruleSpec
		for _, s := range sets {
			if s != nil {
				out = append(out, build(s))
			}
		}
		return out
	}
	var accept []expr.Any
	acceptText := ""
	if ranges {
		accept, acceptText = []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}, " accept"
	}
	// The mark is worked on in a register past the lookup's result (the DNAT target).
	markReg := register(fam.markReg)
	setMarkBits := func(mask, xor uint32) []expr.Any {
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyMARK, Register: markReg},
			&expr.Bitwise{SourceRegister: markReg, DestRegister: markReg, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: binaryutil.NativeEndian.PutUint32(xor)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: markReg}}
	}
	flag := binaryutil.NativeEndian.PutUint32(translatedMark)
	dnatTo := func(s *setSpec) ruleSpec {
		if s.interval() {
			// A range keeps each port: NAT to an address alone leaves the port as it is.
			return l.rule("kup-pre", fmt.Sprintf("meta mark set meta mark | 0x%08x dnat %s to %s map @%s", translatedMark, fam.name, keyText(s), s.name), nil, s, true,
				append(setMarkBits(^uint32(translatedMark), translatedMark),
					&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam.nat, RegAddrMin: register(0), RegAddrMax: register(0)})...)
		}
		return l.rule("kup-pre", fmt.Sprintf("meta mark set meta mark | 0x%08x dnat %s to %s map @%s", translatedMark, fam.name, keyText(s), s.name), nil, s, true,
			append(setMarkBits(^uint32(translatedMark), translatedMark),
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam.nat, RegAddrMin: register(0), RegAddrMax: register(0),
					RegProtoMin: register(fam.addr.Bytes / 4), RegProtoMax: register(fam.addr.Bytes / 4), Specified: true})...)
	}
	// "snat to ip saddr": the address register is loaded from the packet's own source, so
	// the translation is the identity and only claims the flow before the CNI's masquerade.
	identity := []expr.Any{fam.saddr.load(register(0)),
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: fam.nat, RegAddrMin: register(0), RegAddrMax: register(0)}}
	// The request's claim: a flow kup-pre translated, whatever device it leaves by (the
	// CNI's bridge, a pod's own veth, a link), its bit cleared before anything else sees it.
	translated := append([]expr.Any{&expr.Meta{Key: expr.MetaKeyMARK, Register: markReg},
		&expr.Bitwise{SourceRegister: markReg, DestRegister: markReg, Len: 4, Mask: flag, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: markReg, Data: flag}},
		setMarkBits(^uint32(translatedMark), 0)...)
	// The reply's exemption: a packet the pod sends first and routes into a link, which every
	// CNI would masquerade on its way out (datapath/README.md).
	byLink := []expr.Any{fieldOIF.load(register(0)), &expr.Cmp{Op: expr.CmpOpEq, Register: register(0), Data: []byte(linkPrefix)}}
	snatReply := func(s *setSpec) ruleSpec {
		return l.rule("kup-post", fmt.Sprintf("oifname %q %s @%s snat %s to %s saddr", linkPrefix+"*", keyText(s), s.name, fam.name, fam.name),
			byLink, s, false, identity...)
	}
	// Each destination match before the rules without one, each single port before its
	// ranges. The request's range rule comes first and clears the bit only when it claims the
	// flow: the single-port rule after it clears it whatever its lookup finds.
	l.rules = append(l.rules, each(dnatTo, dnatAddr, dnatAddrR, dnat, dnatR)...)
	if requestR != nil {
		l.rules = append(l.rules, l.rule("kup-post", fmt.Sprintf("meta mark & 0x%08x == 0x%08x %s @%s meta mark set meta mark & 0x%08x snat %s to %s saddr",
			translatedMark, translatedMark, keyText(requestR), requestR.name, ^uint32(translatedMark), fam.name, fam.name),
			translated[:3], requestR, false, append(setMarkBits(^uint32(translatedMark), 0), identity...)...))
	}
	// It stays with snat-request empty: it clears the bit of every flow kup-pre translated.
	l.rules = append(l.rules, kept(l.rule("kup-post", fmt.Sprintf("meta mark & 0x%08x == 0x%08x meta mark set meta mark & 0x%08x %s @%s snat %s to %s saddr",
		translatedMark, translatedMark, ^uint32(translatedMark), keyText(request), request.name, fam.name, fam.name), translated, request, false, identity...)))
	l.rules = append(l.rules, each(snatReply, reply, replyR)...)
	dirIs := func(dir byte) []expr.Any {
		return []expr.Any{&expr.Ct{Key: expr.CtKeyDIRECTION, Register: register(0)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: register(0), Data: []byte{dir}}}
	}
	dnatted := func(dir byte) []expr.Any {
		return append(dirIs(dir),
			&expr.Ct{Key: expr.CtKeySTATUS, Register: register(0)},
			&expr.Bitwise{SourceRegister: register(0), DestRegister: register(0), Len: 4, Mask: ipsDstNAT, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: register(0), Data: make([]byte, 4)})
	}
	replyDNAT := dnatted(ctDirReply)
	vmap := func(s *setSpec) ruleSpec {
		return l.rule("kup-mangle", fmt.Sprintf("%s vmap @%s", keyText(s), s.name), nil, s, false)
	}
	// With ranges, "accept" ends kup-count-out (only) once a reply is counted: a single
	// port's reply is not looked up in the ranges, and no reply counts twice.
	countOut := func(s *setSpec) ruleSpec {
		return l.rule("kup-count-out", fmt.Sprintf("ct direction reply ct status dnat %s @%s%s", keyText(s), s.name, acceptText),
			replyDNAT, s, false, accept...)
	}
	restoreTo := func(s *setSpec) ruleSpec { return l.restoreRule(s, returns) }
	l.rules = append(l.rules, each(vmap, static, staticR, save, saveR)...)
	// The single ports' restore stays with mark-ct-restore empty: its mask is how a table
	// read back tells its layout (kernelLayout).
	l.rules = append(l.rules, kept(restoreTo(restore)))
	l.rules = append(l.rules, each(restoreTo, restoreR)...)
	l.rules = append(l.rules, each(countOut, outAddr, outAddrR, out, outR)...)
	// "ip daddr set": the looked-up stand-in written over the destination, with the IPv4
	// header checksum (csum_type inet at offset 10) and the transport checksum's pseudo-header
	// part fixed, as nft writes it. New flows only (a UDP flow's packets until the first
	// reply): conntrack holds the dialed address of a flow from its first packet on, so a later
	// packet is translated by the nat of its entry and a stateful firewall passes it as
	// established. "accept" ends kup-steer (only: the hook's later chains still run), so the
	// packet is not counted again below.
	stateNew := []expr.Any{&expr.Ct{Key: expr.CtKeySTATE, Register: register(0)},
		&expr.Bitwise{SourceRegister: register(0), DestRegister: register(0), Len: 4, Mask: ctStateNew, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: register(0), Data: make([]byte, 4)}}
	steerTo := func(s *setSpec) ruleSpec {
		return l.rule("kup-steer", fmt.Sprintf("ct state new %s daddr set %s map @%s accept", fam.name, keyText(s), s.name), stateNew, s, true,
			&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: register(0), Base: expr.PayloadBaseNetworkHeader,
				Offset: fam.daddrOffset, Len: fam.addr.Bytes, CsumType: expr.CsumTypeInet, CsumOffset: fam.csumOffset,
				CsumFlags: unix.NFT_PAYLOAD_L4CSUM_PSEUDOHDR},
			&expr.Verdict{Kind: expr.VerdictAccept})
	}
	// The rest of a translated flow's requests are looked up without a rewrite, only to count
	// them: every request packet of kuport's flows meets one steering element, by the port it
	// dialed (Counter.forwarded_in). A flow kuport did not translate (one that reached a host
	// listener before its mapping existed) is neither rewritten nor counted. The lookup loads
	// the stand-in and compares it with the unspecified address, which no stand-in is: Debian
	// 12's Linux 6.1 refuses a lookup of a map without a destination register (EINVAL, found
	// by build/release/armvm_test.go). nft cannot type a map's value in a comparison and
	// prints the address as "0x0 [invalid type]". With ranges, "accept" ends kup-steer once a
	// request is counted, as in kup-count-out.
	countIn := func(s *setSpec) ruleSpec {
		return l.rule("kup-steer", fmt.Sprintf("ct direction original ct status dnat %s map @%s != 0x0 [invalid type]%s", keyText(s), s.name, acceptText),
			dnatted(ctDirOriginal), s, true, append([]expr.Any{&expr.Cmp{Op: expr.CmpOpNeq, Register: register(0), Data: make([]byte, fam.addr.Bytes)}}, accept...)...)
	}
	l.rules = append(l.rules, each(steerTo, steerAddr, steerAddrR, steer, steerR)...)
	l.rules = append(l.rules, each(countIn, steerAddr, steerAddrR, steer, steerR)...)
}

// guard makes r the family's: it matches the family first. nft 1.0.6 lists that match only
// where it cannot tell it from a statement on the network header that implies it: in a
// rule that reads or writes no address, or sets the mark before its first statement that
// does (impliedFamily).
func (f family) guard(r ruleSpec) ruleSpec {
	inner := r.exprs
	g := []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: register(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: register(0), Data: []byte{f.nfproto}}}
	r.exprs = func(set func(string) *nftables.Set) []expr.Any { return append(slices.Clone(g), inner(set)...) }
	if !impliedFamily(inner(func(name string) *nftables.Set { return &nftables.Set{Name: name} })) {
		r.text = "meta nfproto " + f.protoName + " " + r.text
	}
	return r
}

// impliedFamily reports whether nft lists a rule of exprs without its family match: when a
// statement on an address (a match, lookup, NAT or write using a network header load, or a
// write of it) comes before any mark write. A map lookup's result carries its key's load
// on to the statement that uses it.
func impliedFamily(exprs []expr.Any) bool {
	loaded := false
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Payload:
			if e.Base == expr.PayloadBaseNetworkHeader {
				if e.OperationType == expr.PayloadWrite {
					return true
				}
				loaded = true
			}
		case *expr.Meta:
			if e.SourceRegister {
				return false
			}
		case *expr.Lookup:
			if loaded && (!e.IsDestRegSet || e.DestRegister == 0) {
				return true
			}
		case *expr.Cmp, *expr.NAT:
			if loaded {
				return true
			}
		}
	}
	return false
}

// Conntrack directions as "ct direction" loads them (IP_CT_DIR_ORIGINAL, IP_CT_DIR_REPLY).
const (
	ctDirOriginal byte = 0
	ctDirReply    byte = 1
)

// ctStateNew is the "ct state new" bit (NF_CT_STATE_BIT(IP_CT_NEW), 1 << 3) in host byte
// order.
var ctStateNew = binaryutil.NativeEndian.PutUint32(1 << 3)

// ipsDstNAT is the conntrack status bit of a flow whose destination was translated
// (IPS_DST_NAT, 1 << 5) as "ct status dnat" masks it, in host byte order.
var ipsDstNAT = binaryutil.NativeEndian.PutUint32(1 << 5)

// keyText is a set's key as a rule prints the expression that builds it.
func keyText(s *setSpec) string {
	parts := make([]string, len(s.key))
	for i, f := range s.key {
		parts[i] = f.text
	}
	return strings.Join(parts, " . ")
}

// rule builds a rule: the match expressions, the loads of set's key from register 1 on, the
// lookup (its result in register 1 when toReg), then the action.
func (l *layout) rule(chain, text string, match []expr.Any, s *setSpec, toReg bool, action ...expr.Any) ruleSpec {
	return ruleSpec{chain: chain, text: text, set: s.name, exprs: func(set func(string) *nftables.Set) []expr.Any {
		e := slices.Clone(match)
		w := uint32(0)
		for _, f := range s.key {
			e = append(e, f.load(register(w)))
			w += f.words()
		}
		ks := set(s.name)
		lookup := &expr.Lookup{SourceRegister: register(0), SetName: ks.Name, SetID: ks.ID}
		switch {
		case s.vmap():
			lookup.DestRegister, lookup.IsDestRegSet = 0, true // the verdict register
		case toReg:
			lookup.DestRegister, lookup.IsDestRegSet = register(0), true
		}
		return append(append(e, lookup), action...)
	}}
}

// kept is r staying in the table while its set is empty: it does something without a match.
func kept(r ruleSpec) ruleSpec {
	r.set = ""
	return r
}

// heldWith reports whether a table holds r while r's set has elements elements: a rule
// on an empty set matches nothing, and is left out.
func (r ruleSpec) heldWith(elements int) bool { return r.set == "" || elements > 0 }

// chainRules returns the rules of chain in order.
func (l *layout) chainRules(chain string) []ruleSpec {
	var out []ruleSpec
	for _, r := range l.rules {
		if r.chain == chain {
			out = append(out, r)
		}
	}
	return out
}
