package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// ifnameData is the comparison operand of an iifname/oifname match as nft builds it: the
// name zero-padded to IFNAMSIZ for an exact name, the bare prefix for "prefix*".
func ifnameData(name string) []byte {
	if prefix, ok := strings.CutSuffix(name, "*"); ok {
		return []byte(prefix)
	}
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// Header fields the rules match, as (base, offset, length) payload loads.
var (
	fieldSaddr = expr.Payload{Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}
	fieldDaddr = expr.Payload{Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}
	fieldSport = expr.Payload{Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2}
	fieldDport = expr.Payload{Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
)

// ipsDstNAT is the conntrack status bit of a flow whose destination was translated
// (IPS_DST_NAT, 1 << 5) as "ct status dnat" masks it, in host byte order.
var ipsDstNAT = binaryutil.NativeEndian.PutUint32(1 << 5)

func load(field expr.Payload, reg uint32) *expr.Payload {
	field.DestRegister = reg
	return &field
}

// exprs encodes the rule the way nft 1.0.6 does for the same text (checked with
// `nft --debug=netlink`), so `nft list` prints it back as String does. set is the
// anonymous map of a shifted range, already queued in the same transaction.
func (r *rule) exprs(set *nftables.Set) []expr.Any {
	var e []expr.Any
	if r.iface != nil {
		key, op := expr.MetaKeyIIFNAME, expr.CmpOpEq
		if r.iface.out {
			key = expr.MetaKeyOIFNAME
		}
		if r.iface.neq {
			op = expr.CmpOpNeq
		}
		e = append(e, &expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: ifnameData(r.iface.name)})
	}
	if r.saddr.IsValid() {
		e = append(e, load(fieldSaddr, 1), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: r.saddr.AsSlice()})
	}
	if r.daddr.IsValid() {
		e = append(e, load(fieldDaddr, 1), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: r.daddr.AsSlice()})
	}
	e = append(e, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{r.proto}})
	portMatch := func(field expr.Payload, pr portRange) {
		e = append(e, load(field, 1))
		if pr.first == pr.last {
			e = append(e, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(pr.first)})
			return
		}
		e = append(e, &expr.Cmp{Op: expr.CmpOpGte, Register: 1, Data: be16(pr.first)},
			&expr.Cmp{Op: expr.CmpOpLte, Register: 1, Data: be16(pr.last)})
	}
	if !r.sport.isZero() {
		portMatch(fieldSport, r.sport)
	}
	if !r.dport.isZero() {
		portMatch(fieldDport, r.dport)
	}
	if r.ctDNAT {
		e = append(e, &expr.Ct{Key: expr.CtKeySTATUS, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ipsDstNAT, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)})
	}
	e = append(e, &expr.Counter{})
	switch r.action {
	case actionDNAT:
		e = append(e, &expr.Immediate{Register: 1, Data: r.toAddr.AsSlice()})
		nat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true}
		switch {
		case r.portMap != nil:
			e = append(e, load(fieldDport, 2),
				&expr.Lookup{SourceRegister: 2, DestRegister: 2, IsDestRegSet: true, SetName: set.Name, SetID: set.ID})
		case r.toPorts.first == r.toPorts.last:
			e = append(e, &expr.Immediate{Register: 2, Data: be16(r.toPorts.first)})
		default:
			e = append(e, &expr.Immediate{Register: 2, Data: be16(r.toPorts.first)},
				&expr.Immediate{Register: 3, Data: be16(r.toPorts.last)})
			nat.RegProtoMax = 3
		}
		e = append(e, nat)
	case actionSNATSaddr:
		// "snat to ip saddr": the NAT address register is loaded from the packet's own
		// source, so the translation is the identity and only claims the flow.
		e = append(e, load(fieldSaddr, 1), &expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1})
	case actionMark:
		e = append(e, &expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(r.mark)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
	case actionCtMark:
		e = append(e, &expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(r.mark)},
			&expr.Ct{Key: expr.CtKeyMARK, SourceRegister: true, Register: 1})
	case actionRestoreMark:
		e = append(e, &expr.Ct{Key: expr.CtKeyMARK, Register: 1},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
	}
	return e
}

// ctMarkSetReg is the source register of a decoded "ct set mark". The library (v0.3.0)
// decodes no NFTA_CT_SREG, so a set the kernel lists comes back with neither a register
// nor SourceRegister, where a load always has its destination; exprs loads the mark into
// register 1 for every set it writes.
func ctMarkSetReg(c *expr.Ct) (reg uint32, set bool) {
	switch {
	case c.SourceRegister:
		return c.Register, true
	case c.Register == 0:
		return 1, true
	}
	return 0, false
}

// ctMark is a register holding the flow's mark (ct load mark).
type ctMark struct{}

// ctStatus is a register holding the flow's status bits (ct load status); ctStatusDNAT
// holds them masked with ipsDstNAT.
type (
	ctStatus     struct{}
	ctStatusDNAT struct{}
)

// errForeign marks a kernel rule that is not in one of kuport's forms.
var errForeign = fmt.Errorf("not in a kuport rule form")

// decodeRule is the inverse of exprs: it reads a kernel rule back into a rule, or fails
// with errForeign when the rule is in no form kuport writes. mapElems returns the
// elements of a named (anonymous) port map.
func decodeRule(chain string, kr *nftables.Rule, mapElems func(name string) ([]portPair, error)) (*rule, error) {
	r := &rule{chain: chain}
	if id, ok := userdata.GetString(kr.UserData, userdata.TypeComment); ok {
		r.id = id
	}
	foreign := func(what string, args ...any) (*rule, error) {
		return nil, fmt.Errorf("%w: %s", errForeign, fmt.Sprintf(what, args...))
	}
	// regs holds what each register was loaded with: an expr.MetaKey, an expr.Payload
	// (without register), immediate bytes, a port map's elements, or ctMark.
	regs := map[uint32]any{}
	counted := false
	for _, x := range kr.Exprs {
		if r.action != 0 {
			return foreign("expression after the action")
		}
		switch e := x.(type) {
		case *expr.Meta:
			if !e.SourceRegister {
				regs[e.Register] = e.Key
				continue
			}
			if e.Key != expr.MetaKeyMARK || !counted {
				return foreign("meta set")
			}
			switch v := regs[e.Register].(type) {
			case ctMark:
				r.action = actionRestoreMark
			case []byte:
				if len(v) != 4 {
					return foreign("meta set")
				}
				r.action, r.mark = actionMark, binaryutil.NativeEndian.Uint32(v)
			default:
				return foreign("meta set")
			}
		case *expr.Ct:
			if e.Key == expr.CtKeySTATUS && !e.SourceRegister {
				regs[e.Register] = ctStatus{}
				continue
			}
			if e.Key != expr.CtKeyMARK {
				return foreign("ct %v", e.Key)
			}
			reg, set := ctMarkSetReg(e)
			if !set {
				regs[e.Register] = ctMark{}
				continue
			}
			data, ok := regs[reg].([]byte)
			if !ok || len(data) != 4 || !counted {
				return foreign("ct set")
			}
			r.action, r.mark = actionCtMark, binaryutil.NativeEndian.Uint32(data)
		case *expr.Payload:
			if e.OperationType != expr.PayloadLoad {
				return foreign("payload write")
			}
			field := *e
			field.DestRegister = 0
			regs[e.DestRegister] = field
		case *expr.Immediate:
			regs[e.Register] = e.Data
		case *expr.Cmp:
			if counted {
				return foreign("match after the counter")
			}
			if err := r.decodeMatch(regs[e.Register], e); err != nil {
				return nil, err
			}
		case *expr.Counter:
			if counted {
				return foreign("two counters")
			}
			counted, r.packets, r.bytes = true, e.Packets, e.Bytes
		case *expr.Bitwise:
			if _, ok := regs[e.SourceRegister].(ctStatus); !ok || e.Len != 4 || !bytes.Equal(e.Mask, ipsDstNAT) || !bytes.Equal(e.Xor, make([]byte, 4)) {
				return foreign("bitwise")
			}
			regs[e.DestRegister] = ctStatusDNAT{}
		case *expr.Lookup:
			if regs[e.SourceRegister] != fieldDport || !e.IsDestRegSet || e.Invert {
				return foreign("lookup")
			}
			pairs, err := mapElems(e.SetName)
			if err != nil {
				return nil, err
			}
			regs[e.DestRegister] = pairs
		case *expr.NAT:
			if !counted || e.Family != unix.NFPROTO_IPV4 || (e.RegAddrMax != 0 && e.RegAddrMax != e.RegAddrMin) || e.Random || e.FullyRandom || e.Persistent || e.Prefix {
				return foreign("nat")
			}
			if err := r.decodeNAT(regs, e); err != nil {
				return nil, err
			}
		default:
			return foreign("expression %T", x)
		}
	}
	if r.action == 0 && counted && r.ctDNAT {
		r.action = actionCount
	}
	if r.action == 0 || r.proto == 0 || r.sport.first > r.sport.last || r.dport.first > r.dport.last {
		return foreign("incomplete rule")
	}
	return r, nil
}

func (r *rule) decodeMatch(reg any, c *expr.Cmp) error {
	foreign := fmt.Errorf("%w: match on %v", errForeign, reg)
	eq := c.Op == expr.CmpOpEq
	switch v := reg.(type) {
	case expr.MetaKey:
		switch {
		case (v == expr.MetaKeyIIFNAME || v == expr.MetaKeyOIFNAME) && (eq || c.Op == expr.CmpOpNeq) && r.iface == nil:
			name, exact := strings.CutSuffix(string(c.Data), "\x00")
			name = strings.TrimRight(name, "\x00")
			if !exact {
				name += "*"
			}
			r.iface = &ifMatch{out: v == expr.MetaKeyOIFNAME, neq: !eq, name: name}
		case v == expr.MetaKeyL4PROTO && eq && len(c.Data) == 1:
			r.proto = c.Data[0]
		default:
			return foreign
		}
	case ctStatusDNAT:
		if c.Op != expr.CmpOpNeq || !bytes.Equal(c.Data, make([]byte, 4)) || r.ctDNAT {
			return foreign
		}
		r.ctDNAT = true
	case expr.Payload:
		switch {
		case v == fieldSaddr && eq && len(c.Data) == 4:
			r.saddr = netip.AddrFrom4([4]byte(c.Data))
		case v == fieldDaddr && eq && len(c.Data) == 4:
			r.daddr = netip.AddrFrom4([4]byte(c.Data))
		case (v == fieldSport || v == fieldDport) && len(c.Data) == 2:
			pr := &r.dport
			if v == fieldSport {
				pr = &r.sport
			}
			return decodePort(pr, c, foreign)
		default:
			return foreign
		}
	default:
		return foreign
	}
	return nil
}

// decodePort reads a 2-byte port comparison into pr: eq sets both ends, gte the first and
// lte the last; another operator is foreign.
func decodePort(pr *portRange, c *expr.Cmp, foreign error) error {
	port := binary.BigEndian.Uint16(c.Data)
	switch c.Op {
	case expr.CmpOpEq:
		pr.first, pr.last = port, port
	case expr.CmpOpGte:
		pr.first = port
	case expr.CmpOpLte:
		pr.last = port
	default:
		return foreign
	}
	return nil
}

func (r *rule) decodeNAT(regs map[uint32]any, n *expr.NAT) error {
	foreign := fmt.Errorf("%w: nat form", errForeign)
	// The kernel lists a max register equal to the min one when only the min was given.
	protoMax := n.RegProtoMax
	if protoMax == n.RegProtoMin {
		protoMax = 0
	}
	switch n.Type {
	case expr.NATTypeSourceNAT:
		if regs[n.RegAddrMin] != fieldSaddr || n.RegProtoMin != 0 || n.Specified {
			return foreign
		}
		r.action = actionSNATSaddr
	case expr.NATTypeDestNAT:
		addr, ok := regs[n.RegAddrMin].([]byte)
		if !ok || len(addr) != 4 || !n.Specified {
			return foreign
		}
		r.action, r.toAddr = actionDNAT, netip.AddrFrom4([4]byte(addr))
		switch v := regs[n.RegProtoMin].(type) {
		case []portPair:
			if protoMax != 0 {
				return foreign
			}
			r.portMap = v
		case []byte:
			if len(v) != 2 {
				return foreign
			}
			r.toPorts.first = binary.BigEndian.Uint16(v)
			r.toPorts.last = r.toPorts.first
			if protoMax != 0 {
				last, ok := regs[protoMax].([]byte)
				if !ok || len(last) != 2 {
					return foreign
				}
				r.toPorts.last = binary.BigEndian.Uint16(last)
			}
		default:
			return foreign
		}
	default:
		return foreign
	}
	return nil
}

// kernelRule is a rule as found in the kernel: its handle and its text (a "# ..." note
// when it is in no kuport form); r is nil for such a rule.
type kernelRule struct {
	handle uint64
	line   string
	r      *rule
}

// kernelTable is table ip kuport as read from the kernel.
type kernelTable struct {
	table  *nftables.Table
	chains []*nftables.Chain
	rules  map[string][]kernelRule
}

// readTable reads table ip kuport, its chains in kernel order and their rules; nil when
// there is no such table.
func (d *Datapath) readTable() (*kernelTable, error) {
	tables, err := d.nft.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	var kt *kernelTable
	for _, t := range tables {
		if t.Name == tableName {
			kt = &kernelTable{table: t, rules: map[string][]kernelRule{}}
		}
	}
	if kt == nil {
		return nil, nil
	}
	chains, err := d.nft.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return nil, fmt.Errorf("list nftables chains: %w", err)
	}
	mapElems := func(name string) ([]portPair, error) {
		set, err := d.nft.GetSetByName(kt.table, name)
		if err != nil {
			return nil, fmt.Errorf("get set %s: %w", name, err)
		}
		elems, err := d.nft.GetSetElements(set)
		if err != nil {
			return nil, fmt.Errorf("get elements of set %s: %w", name, err)
		}
		pairs := make([]portPair, 0, len(elems))
		for _, el := range elems {
			if len(el.Key) != 2 || len(el.Val) != 2 {
				return nil, fmt.Errorf("%w: set %s is not a port map", errForeign, name)
			}
			pairs = append(pairs, portPair{binary.BigEndian.Uint16(el.Key), binary.BigEndian.Uint16(el.Val)})
		}
		slices.SortFunc(pairs, func(a, b portPair) int { return int(a.key) - int(b.key) })
		return pairs, nil
	}
	for _, c := range chains {
		if c.Table.Name != tableName {
			continue
		}
		kt.chains = append(kt.chains, c)
		krs, err := d.nft.GetRules(kt.table, c)
		if err != nil {
			return nil, fmt.Errorf("list rules of chain %s: %w", c.Name, err)
		}
		for _, kr := range krs {
			r, err := decodeRule(c.Name, kr, mapElems)
			if err != nil {
				kt.rules[c.Name] = append(kt.rules[c.Name], kernelRule{handle: kr.Handle, line: fmt.Sprintf("# rule handle %d: %v", kr.Handle, err)})
				continue
			}
			kt.rules[c.Name] = append(kt.rules[c.Name], kernelRule{handle: kr.Handle, line: r.String(), r: r})
		}
	}
	return kt, nil
}

func specOf(name string) (chainSpec, bool) {
	for _, s := range chainSpecs {
		if s.name == name {
			return s, true
		}
	}
	return chainSpec{}, false
}

// header is the chain's header line: the spec's text when the chain has kuport's
// attributes, else a note that it does not.
func chainHeader(c *nftables.Chain) string {
	if s, ok := specOf(c.Name); ok && chainMatches(c, s) {
		return s.header()
	}
	return fmt.Sprintf("# not a kuport chain: type %q hook %v priority %v policy %v", c.Type, deref(c.Hooknum), deref(c.Priority), deref(c.Policy))
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func chainMatches(c *nftables.Chain, s chainSpec) bool {
	return c.Type == s.typ && c.Hooknum != nil && *c.Hooknum == s.hook &&
		c.Priority != nil && *c.Priority == s.priority &&
		(c.Policy == nil || *c.Policy == nftables.ChainPolicyAccept)
}

// decoded returns the rules of chain that are in a kuport form, in chain order (none for
// a nil kt).
func (kt *kernelTable) decoded(chain string) []*rule {
	if kt == nil {
		return nil
	}
	var out []*rule
	for _, kr := range kt.rules[chain] {
		if kr.r != nil {
			out = append(out, kr.r)
		}
	}
	return out
}

// structureOK reports whether kuport's chains are all present, in order, with their
// attributes; other chains are allowed (they get deleted).
func (kt *kernelTable) structureOK() bool {
	var ours []*nftables.Chain
	for _, c := range kt.chains {
		if _, ok := specOf(c.Name); ok {
			ours = append(ours, c)
		}
	}
	if len(ours) != len(chainSpecs) {
		return false
	}
	for i, s := range chainSpecs {
		if ours[i].Name != s.name || !chainMatches(ours[i], s) {
			return false
		}
	}
	return true
}

func (kt *kernelTable) text() string {
	chains := make([]chainText, 0, len(kt.chains))
	for _, c := range kt.chains {
		ct := chainText{name: c.Name, header: chainHeader(c)}
		for _, kr := range kt.rules[c.Name] {
			ct.rules = append(ct.rules, kr.line)
		}
		chains = append(chains, ct)
	}
	return render(chains)
}

// ruleOp is one queued rule addition: insert before the rule with handle before, or
// append when before is 0.
type ruleOp struct {
	r      *rule
	before uint64
}

// diffChain keeps the longest run of kernel rules that already stand in the desired
// order (rules are equal when their text, id included, is equal), deletes the others and
// inserts the missing ones in place, so unchanged rules keep their handles and counters.
func diffChain(have []kernelRule, want []*rule) (dels []uint64, adds []ruleOp) {
	pos := make(map[string]int, len(want))
	for i, w := range want {
		pos[w.String()] = i
	}
	// Candidates: kernel rules that are wanted, in kernel order, with their desired index.
	type cand struct{ k, w int }
	var cands []cand
	used := map[int]bool{}
	for k, h := range have {
		if w, ok := pos[h.line]; ok && !used[w] {
			used[w] = true
			cands = append(cands, cand{k, w})
		}
	}
	// Longest increasing subsequence of desired indices (patience sorting).
	tails := []int{}                // index into cands of the smallest tail of each length
	prev := make([]int, len(cands)) // predecessor in the subsequence
	for i, c := range cands {
		j, _ := slices.BinarySearchFunc(tails, c.w, func(t, w int) int { return cands[t].w - w })
		prev[i] = -1
		if j > 0 {
			prev[i] = tails[j-1]
		}
		if j == len(tails) {
			tails = append(tails, i)
		} else {
			tails[j] = i
		}
	}
	keptHandle := map[int]uint64{} // desired index -> handle of the kept kernel rule
	keptKernel := map[int]bool{}
	if len(tails) > 0 {
		for i := tails[len(tails)-1]; i >= 0; i = prev[i] {
			keptHandle[cands[i].w] = have[cands[i].k].handle
			keptKernel[cands[i].k] = true
		}
	}
	for k, h := range have {
		if !keptKernel[k] {
			dels = append(dels, h.handle)
		}
	}
	before := uint64(0)
	for i := len(want) - 1; i >= 0; i-- {
		if h, ok := keptHandle[i]; ok {
			before = h
			continue
		}
		adds = append(adds, ruleOp{r: want[i], before: before})
	}
	slices.Reverse(adds)
	return dels, adds
}

// queueRule queues a rule (and the anonymous map of a shifted range) in the open
// transaction.
func (d *Datapath) queueRule(t *nftables.Table, c *nftables.Chain, op ruleOp) error {
	var set *nftables.Set
	if op.r.portMap != nil {
		set = &nftables.Set{Table: t, Anonymous: true, Constant: true, IsMap: true,
			KeyType: nftables.TypeInetService, DataType: nftables.TypeInetService}
		elems := make([]nftables.SetElement, len(op.r.portMap))
		for i, p := range op.r.portMap {
			elems[i] = nftables.SetElement{Key: be16(p.key), Val: be16(p.value)}
		}
		if err := d.nft.AddSet(set, elems); err != nil {
			return fmt.Errorf("queue port map: %w", err)
		}
	}
	nr := &nftables.Rule{Table: t, Chain: c, Exprs: op.r.exprs(set),
		UserData: userdata.AppendString(nil, userdata.TypeComment, op.r.id)}
	if op.before != 0 {
		nr.Position = op.before
		d.nft.InsertRule(nr)
	} else {
		d.nft.AddRule(nr)
	}
	d.log.Trace("nft add rule", "chain", c.Name, "rule", op.r.String(), "before", op.before)
	return nil
}

// syncTable makes table ip kuport, which the kernel holds as kt (nil: no table), hold
// exactly want (no table when want is empty) in one nftables transaction, and only when
// something differs. It returns the rules it tried to add (all of them failed when err is
// a transaction error) and the number of changes.
func (d *Datapath) syncTable(kt *kernelTable, want []*rule) (added []*rule, changes int, err error) {
	t := &nftables.Table{Name: tableName, Family: nftables.TableFamilyIPv4}
	if len(want) == 0 {
		if kt == nil {
			return nil, 0, nil
		}
		d.nft.DelTable(t)
		d.log.Trace("nft delete table")
		return nil, 1, d.flush()
	}
	chains := map[string]*nftables.Chain{}
	ops := map[string][]ruleOp{}
	if kt == nil || !kt.structureOK() {
		if kt != nil {
			d.nft.DelTable(t)
			changes++
		}
		d.nft.AddTable(t)
		for _, s := range chainSpecs {
			hook, prio, policy := s.hook, s.priority, nftables.ChainPolicyAccept
			chains[s.name] = d.nft.AddChain(&nftables.Chain{Name: s.name, Table: t, Type: s.typ,
				Hooknum: &hook, Priority: &prio, Policy: &policy})
		}
		changes++
		d.log.Trace("nft (re)create table")
		for _, r := range want {
			ops[r.chain] = append(ops[r.chain], ruleOp{r: r})
		}
	} else {
		for _, c := range kt.chains {
			if _, ok := specOf(c.Name); !ok {
				d.nft.FlushChain(c)
				d.nft.DelChain(c)
				changes++
				d.log.Trace("nft delete chain", "chain", c.Name)
			}
		}
		for _, s := range chainSpecs {
			c := &nftables.Chain{Name: s.name, Table: t}
			chains[s.name] = c
			var wantHere []*rule
			for _, r := range want {
				if r.chain == s.name {
					wantHere = append(wantHere, r)
				}
			}
			dels, adds := diffChain(kt.rules[s.name], wantHere)
			for _, h := range dels {
				if err := d.nft.DelRule(&nftables.Rule{Table: t, Chain: c, Handle: h}); err != nil {
					return nil, 0, fmt.Errorf("queue rule deletion: %w", err)
				}
				changes++
				d.log.Trace("nft delete rule", "chain", s.name, "handle", h)
			}
			ops[s.name] = adds
		}
	}
	for _, s := range chainSpecs {
		for _, op := range ops[s.name] {
			if err := d.queueRule(t, chains[s.name], op); err != nil {
				return nil, 0, err
			}
			added = append(added, op.r)
			changes++
		}
	}
	if changes == 0 {
		return nil, 0, nil
	}
	return added, changes, d.flush()
}

func (d *Datapath) flush() error {
	if err := d.nft.Flush(); err != nil {
		return fmt.Errorf("nftables transaction: %w", err)
	}
	return nil
}
