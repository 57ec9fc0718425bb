package datapath

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// tableName is the one nftables table kuport owns, in family ip.
const tableName = "kuport"

// chainSpec is one of kuport's base chains. The priorities sit 10 ahead of the standard
// ones (founding document, "kup-pre"/"kup-post"/"kup-mangle"): netfilter sets up NAT once
// per hook, so the chain that sees a flow's first packet first claims it, ahead of
// kube-proxy's and the CNI's dstnat/srcnat chains; the mark is set after the standard
// mangle chains so their own mark writes cannot undo it.
type chainSpec struct {
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
	// kup-count only counts: every packet of a mapping's flows the node forwards, both ways
	// (countRules). It is kuport's addition to the founding document's chains.
	{name: "kup-count", typ: nftables.ChainTypeFilter, hook: *nftables.ChainHookForward, hookName: "forward", priority: -10, priorityName: "filter - 10"},
}

// header is the chain's first line as `nft list` prints it.
func (c chainSpec) header() string {
	return fmt.Sprintf("type %s hook %s priority %s; policy accept;", c.typ, c.hookName, c.priorityName)
}

// Transport protocol numbers as they appear in meta l4proto.
const (
	protoTCP uint8 = 6
	protoUDP uint8 = 17
)

// maxCommentLen is nft's limit on a rule comment (NFTNL_UDATA_COMMENT_MAXLEN 128, NUL
// included); the comment carries the entry id.
const maxCommentLen = 127

// portRange is an inclusive range of transport ports; the zero value means "no match".
type portRange struct{ first, last uint16 }

func (r portRange) isZero() bool { return r.first == 0 && r.last == 0 }

func (r portRange) String() string {
	if r.first == r.last {
		return fmt.Sprintf("%d", r.first)
	}
	return fmt.Sprintf("%d-%d", r.first, r.last)
}

// portPair is one element of a shifted range's port map: dport key -> translated port.
type portPair struct{ key, value uint16 }

// ifMatch is an iifname/oifname match; name ends in "*" for a prefix (wildcard) match.
type ifMatch struct {
	out  bool
	neq  bool
	name string
}

// actionKind is what a rule does after its counter.
type actionKind int

const (
	actionDNAT actionKind = iota + 1
	actionSNATSaddr
	// actionMark sets the packet's mark: meta mark set <mark> (Single's return marking).
	actionMark
	// actionCtMark records the mark on the flow: ct mark set <mark> (Multi, per link).
	actionCtMark
	// actionRestoreMark gives the packet its flow's mark: meta mark set ct mark (Multi).
	actionRestoreMark
	// actionCount does nothing after the counter (kup-count).
	actionCount
)

// rule is one kuport nftables rule in a form both the program and the kernel map onto:
// the program is compiled into rules (compileRules), kernel rules are decoded into them
// (decodeRule), rules are encoded into expressions (exprs) and printed as nft text
// (String). Two rules are the same rule when their text is equal.
type rule struct {
	chain string
	// kind names the program entry in errors: dnat, snat or mark.
	kind  string
	id    string
	iface *ifMatch
	saddr netip.Addr
	daddr netip.Addr
	proto uint8
	sport portRange
	dport portRange
	// ctDNAT matches packets of flows whose destination was translated (ct status dnat).
	ctDNAT bool

	action  actionKind
	toAddr  netip.Addr
	toPorts portRange
	// portMap, when set, replaces toPorts: dnat to toAddr : <proto> dport map { ... }.
	portMap []portPair
	// mark is the value actionMark and actionCtMark set.
	mark uint32

	// packets and bytes are the kernel counter's values (decoded rules only).
	packets uint64
	bytes   uint64
}

func protoName(p uint8) string {
	switch p {
	case protoTCP:
		return "tcp"
	case protoUDP:
		return "udp"
	}
	return fmt.Sprintf("meta l4proto %d", p)
}

// String renders the rule exactly as nft 1.0.6 lists it, with the counter normalised to
// a bare "counter".
func (r *rule) String() string {
	var b strings.Builder
	word := func(format string, args ...any) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, format, args...)
	}
	if r.iface != nil {
		key := "iifname"
		if r.iface.out {
			key = "oifname"
		}
		op := ""
		if r.iface.neq {
			op = "!= "
		}
		word("%s %s%q", key, op, r.iface.name)
	}
	if r.saddr.IsValid() {
		word("ip saddr %s", r.saddr)
	}
	if r.daddr.IsValid() {
		word("ip daddr %s", r.daddr)
	}
	if !r.sport.isZero() {
		word("%s sport %s", protoName(r.proto), r.sport)
	}
	if !r.dport.isZero() {
		word("%s dport %s", protoName(r.proto), r.dport)
	}
	if r.ctDNAT {
		word("ct status dnat")
	}
	word("counter")
	switch r.action {
	case actionDNAT:
		if r.portMap != nil {
			elems := make([]string, len(r.portMap))
			for i, p := range r.portMap {
				elems[i] = fmt.Sprintf("%d : %d", p.key, p.value)
			}
			word("dnat to %s:%s dport map { %s }", r.toAddr, protoName(r.proto), strings.Join(elems, ", "))
		} else {
			word("dnat to %s:%s", r.toAddr, r.toPorts)
		}
	case actionSNATSaddr:
		word("snat to ip saddr")
	case actionMark:
		word("meta mark set 0x%08x", r.mark)
	case actionCtMark:
		word("ct mark set 0x%08x", r.mark)
	case actionRestoreMark:
		word("meta mark set ct mark")
	}
	if r.id != "" {
		word("comment %q", r.id)
	}
	return b.String()
}

// chainText is one chain as listed: its name, header line and rule lines.
type chainText struct {
	name   string
	header string
	rules  []string
}

// render prints a table as `nft list table ip kuport` does.
func render(chains []chainText) string {
	var b strings.Builder
	b.WriteString("table ip " + tableName + " {\n")
	for i, c := range chains {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "\tchain %s {\n\t\t%s\n", c.name, c.header)
		for _, r := range c.rules {
			b.WriteString("\t\t" + r + "\n")
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// Render returns the nftables table a program compiles to, exactly as `nft list table ip
// kuport` (nft 1.0.6) prints it once applied, with every "counter packets N bytes M"
// normalised to "counter": tab indentation, chains kup-pre, kup-post, kup-mangle, kup-count
// in that order separated by a blank line, rules in program order. A program with no rules renders
// as "" (Apply removes the table). Entries that fail validation are left out; Apply
// reports them.
func Render(p *kuportv1.NodeProgram) string {
	rules, _ := compileRules(p)
	return renderRules(rules)
}

func renderRules(rules []*rule) string {
	if len(rules) == 0 {
		return ""
	}
	chains := make([]chainText, len(chainSpecs))
	for i, c := range chainSpecs {
		chains[i] = chainText{name: c.name, header: c.header()}
		for _, r := range rules {
			if r.chain == c.name {
				chains[i].rules = append(chains[i].rules, r.String())
			}
		}
	}
	return render(chains)
}

// compileRules turns the program's rule entries into rules, in chain order. An invalid
// entry, or one whose id repeats, becomes an *EntryError and is left out.
func compileRules(p *kuportv1.NodeProgram) ([]*rule, []error) {
	var rules []*rule
	var errs []error
	seen := map[string]bool{}
	add := func(kind, id string, r *rule, err error) bool {
		if err == nil && seen[id] {
			err = fmt.Errorf("id used by another rule")
		}
		if err != nil {
			errs = append(errs, &EntryError{Kind: kind, ID: id, Err: err})
			return false
		}
		seen[id] = true
		r.kind, r.id = kind, id
		rules = append(rules, r)
		return true
	}
	var counts []*rule
	for _, e := range p.GetDnatRules() {
		r, err := dnatRule(e)
		if add("dnat", e.GetId(), r, err) {
			counts = append(counts, countRules(r)...)
		}
	}
	for _, e := range p.GetSnatRules() {
		r, err := snatRule(e)
		add("snat", e.GetId(), r, err)
	}
	for _, e := range p.GetMarkRules() {
		r, err := markRule(e)
		add("mark", e.GetId(), r, err)
	}
	return append(rules, counts...), errs
}

// countRules are the kup-count rules of a DNAT rule. In the forward hook a request of a
// flow it translated already carries the DNAT target as its destination, and a reply
// still carries it as its source (the reply is translated back on the way out, in
// postrouting), so one rule counts the translated flows' packets arriving on the rule's
// interface for the target (towards the pod), the other those leaving by it from the
// target (from the pod). Both carry the DNAT rule's id: Counters folds them into its
// Counter. Two mappings translating to the same target ports on the same interface (a
// shifted range onto another mapping's pod ports) count each other's packets too.
func countRules(dnat *rule) []*rule {
	target := dnat.toPorts
	if dnat.portMap != nil {
		target = portRange{dnat.portMap[0].value, dnat.portMap[len(dnat.portMap)-1].value}
	}
	in := &rule{chain: "kup-count", kind: dnat.kind, id: dnat.id, action: actionCount, ctDNAT: true,
		iface: &ifMatch{name: dnat.iface.name}, proto: dnat.proto, daddr: dnat.toAddr, dport: target}
	out := &rule{chain: "kup-count", kind: dnat.kind, id: dnat.id, action: actionCount, ctDNAT: true,
		iface: &ifMatch{out: true, name: dnat.iface.name}, proto: dnat.proto, saddr: dnat.toAddr, sport: target}
	return []*rule{in, out}
}

// dnatRule is the DnatRule form of program.proto (founding document, kup-pre). A range
// whose translated ports start at its own first port is one range NAT, which keeps each
// port; a shifted range becomes a per-port map, because NAT to a port range picks from it
// as a pool rather than by offset (DESIGN.md, "Port ranges").
func dnatRule(e *kuportv1.DnatRule) (*rule, error) {
	if err := checkID(e.GetId()); err != nil {
		return nil, err
	}
	r := &rule{chain: "kup-pre", action: actionDNAT}
	var err error
	if r.iface, err = exactIface(false, e.GetInInterface()); err != nil {
		return nil, err
	}
	if e.GetMatchDestination() != "" {
		if r.daddr, err = ipv4("match_destination", e.GetMatchDestination()); err != nil {
			return nil, err
		}
	}
	if r.proto, err = protocol(e.GetProtocol()); err != nil {
		return nil, err
	}
	if r.dport, err = ports(e.GetPorts()); err != nil {
		return nil, err
	}
	if r.toAddr, err = ipv4("to_address", e.GetToAddress()); err != nil {
		return nil, err
	}
	width := uint32(r.dport.last - r.dport.first)
	to := e.GetToPort()
	if to == 0 || to+width > 65535 {
		return nil, fmt.Errorf("to_port %d with range width %d is outside 1-65535", to, width)
	}
	switch {
	case to == uint32(r.dport.first):
		r.toPorts = r.dport
	case width == 0:
		r.toPorts = portRange{uint16(to), uint16(to)}
	default:
		r.portMap = make([]portPair, 0, width+1)
		for i := uint32(0); i <= width; i++ {
			r.portMap = append(r.portMap, portPair{uint16(uint32(r.dport.first) + i), uint16(to + i)})
		}
	}
	return r, nil
}

// snatRule is the identity SNAT of program.proto's SnatKind (founding document and
// DESIGN.md, kup-post).
func snatRule(e *kuportv1.SnatRule) (*rule, error) {
	if err := checkID(e.GetId()); err != nil {
		return nil, err
	}
	r := &rule{chain: "kup-post", action: actionSNATSaddr}
	addr, err := ipv4("address", e.GetAddress())
	if err != nil {
		return nil, err
	}
	if r.proto, err = protocol(e.GetProtocol()); err != nil {
		return nil, err
	}
	pr, err := ports(e.GetPorts())
	if err != nil {
		return nil, err
	}
	switch e.GetKind() {
	case kuportv1.SnatKind_SNAT_KIND_REQUEST:
		if r.iface, err = exactIface(true, e.GetOutInterface()); err != nil {
			return nil, err
		}
		r.daddr, r.dport = addr, pr
	case kuportv1.SnatKind_SNAT_KIND_REPLY:
		prefix := e.GetOutInterface()
		if err := checkIfname(prefix); err != nil {
			return nil, err
		}
		r.iface = &ifMatch{out: true, neq: true, name: prefix + "*"}
		r.saddr, r.sport = addr, pr
	default:
		return nil, fmt.Errorf("unknown snat kind %v", e.GetKind())
	}
	return r, nil
}

// markRule is a return-marking form of program.proto's MarkKind (DESIGN.md, "Return
// marking forms that worked"). Single marks the reply by its source. Multi cannot: the
// reply says nothing about which forwarder its request came through, so the request's
// arrival link is saved on the flow and the reply takes it back from there (founding
// document, Multi). The save writes only the ct mark, so the request itself is not
// diverted on its way in.
func markRule(e *kuportv1.MarkRule) (*rule, error) {
	if err := checkID(e.GetId()); err != nil {
		return nil, err
	}
	r := &rule{chain: "kup-mangle", mark: e.GetMark()}
	addr, err := ipv4("address", e.GetAddress())
	if err != nil {
		return nil, err
	}
	if r.proto, err = protocol(e.GetProtocol()); err != nil {
		return nil, err
	}
	pr, err := ports(e.GetPorts())
	if err != nil {
		return nil, err
	}
	kind := e.GetKind()
	if kind != kuportv1.MarkKind_MARK_KIND_CT_SAVE && e.GetInInterface() != "" {
		return nil, fmt.Errorf("in_interface is for %v only", kuportv1.MarkKind_MARK_KIND_CT_SAVE)
	}
	switch kind {
	case kuportv1.MarkKind_MARK_KIND_STATIC:
		r.action, r.saddr, r.sport = actionMark, addr, pr
	case kuportv1.MarkKind_MARK_KIND_CT_SAVE:
		if r.iface, err = exactIface(false, e.GetInInterface()); err != nil {
			return nil, err
		}
		r.action, r.daddr, r.dport = actionCtMark, addr, pr
	case kuportv1.MarkKind_MARK_KIND_CT_RESTORE:
		r.action, r.saddr, r.sport = actionRestoreMark, addr, pr
	default:
		return nil, fmt.Errorf("unknown mark kind %v", kind)
	}
	switch restore := r.action == actionRestoreMark; {
	case restore && r.mark != 0:
		return nil, fmt.Errorf("mark %#x is set: a restore takes the flow's mark", r.mark)
	case !restore && r.mark == 0:
		return nil, fmt.Errorf("mark is 0")
	}
	return r, nil
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

func exactIface(out bool, name string) (*ifMatch, error) {
	if err := checkIfname(name); err != nil {
		return nil, err
	}
	return &ifMatch{out: out, name: name}, nil
}

func ipv4(field, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return netip.Addr{}, fmt.Errorf("%s %q is not an IPv4 address", field, s)
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
