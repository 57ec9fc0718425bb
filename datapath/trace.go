package datapath

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Trace follows one flow through what a program puts in a node's kernel, without a kernel:
// the request's first packet, then the reply to it. It runs the very rule expressions Apply
// sends (layout.go) against the very elements planned from the program (planTable), so the
// element semantics (a range keeps each port, a shifted range maps port by port, a refused
// entry puts nothing) are Apply's and not restated here. What Trace adds is the kernel's
// part, as measured in docs/design/datapath.md and set out in
// datapath/README.md#the-priority-contract: chains run per hook by priority; a NAT chain sees
// a flow's first packet only, and its nat statement ends the chain; the reply's source is
// translated back in postrouting at srcnat (100); the ip rules at 101 and 102 and each return
// path's table route by the mark; a link's /31 is connected.
//
// Outside what the program says, the trace assumes symmetric routing: a request that no
// link and no return path routes leaves by pkt.Out (the device the node's main table
// reaches the translated destination by, such as the CNI's toward a local pod), and a reply
// they do not route leaves by the device its request arrived on.
func Trace(p *kuportv1.NodeProgram, pkt Packet) (*Verdict, error) {
	t, _ := planTable(p)
	returns, _ := planReturns(p)
	tr := &tracer{t: t, returns: returns}
	for _, l := range p.GetLinks() {
		if w, err := planLink(l); err == nil {
			tr.links = append(tr.links, w)
		}
	}
	proto, err := protocol(pkt.Proto)
	if err != nil {
		return nil, err
	}
	v := &Verdict{}
	req := newPacket(pkt.In, proto, pkt.Src, pkt.Dst)
	f := &flow{}
	if err := tr.hook(nftables.ChainHookPrerouting, req, f, ctDirOriginal, v); err != nil {
		return nil, err
	}
	if f.dnat {
		v.DNAT = req.dst()
	}
	req.oif, _ = tr.route(req, pkt.Out)
	v.Out = req.oif
	if req.oif != "" {
		if err := tr.hook(nftables.ChainHookPostrouting, req, f, ctDirOriginal, v); err != nil {
			return nil, err
		}
	}
	v.CtMark = f.ctMark

	reply := newPacket(req.oif, proto, req.dst(), pkt.Src)
	if err := tr.hook(nftables.ChainHookPrerouting, reply, f, ctDirReply, v); err != nil {
		return nil, err
	}
	v.Mark = reply.mark
	reply.oif, v.Route = tr.route(reply, pkt.In)
	f.original = pkt.Dst
	if err := tr.hook(nftables.ChainHookPostrouting, reply, f, ctDirReply, v); err != nil {
		return nil, err
	}
	return v, nil
}

// Packet is a flow's first packet as it arrives on a node.
type Packet struct {
	// In is the device it arrives on.
	In    string
	Proto kuportv1.Protocol
	// Src is the client's address and port, Dst the address and port it dialed.
	Src, Dst netip.AddrPort
	// Out is the device the node's main table routes the translated request by when no link
	// of the program does: the CNI's device toward a local pod. Empty: the request leaves by
	// no device the trace knows, and kup-post and kup-count-out do not see it.
	Out string
}

// Verdict is what kuport's table, ip rules and routes do to a flow.
type Verdict struct {
	// StandIn is what kup-steer wrote over the request's dialed destination ahead of a host
	// firewall; invalid when it left it.
	StandIn netip.Addr
	// DNAT is the request's destination after kup-pre; invalid when kup-pre leaves it.
	DNAT netip.AddrPort
	// Out is the device the request leaves by ("" when unknown: see Packet.Out).
	Out string
	// SNAT is the device on which kup-post's identity SNAT claimed the request ("" none).
	SNAT string
	// CtMark is the mark the request saved on its flow (Multi's ct mark set; 0 none).
	CtMark uint32
	// Mark is the reply's mark after kup-mangle: static (Single) or taken from the flow
	// (Multi); 0 none.
	Mark uint32
	// Route is the return path the reply is routed by; nil when it is routed by main.
	Route *Route
	// Elements are the elements the flow's packets matched, in order, each as
	// "<chain> <set> <entry id>": which entry translated, marked and counted it.
	Elements []string
}

// Route is a reply's way back: the table pref 102 sent it to and that table's route.
type Route struct {
	Table int
	Link  string
	Via   netip.Addr
}

// flow is what conntrack keeps of a flow: its ct mark, whether its destination was
// translated, and the request's destination before it was (the reply's source once
// translated back).
type flow struct {
	ctMark   uint32
	dnat     bool
	original netip.AddrPort
}

// packet is an IPv4 or IPv6 packet as the rules read it: the devices, its family, the
// network header's addresses at their offsets and the transport header's ports, the mark.
type packet struct {
	iif, oif string
	fam      family
	l4proto  uint8
	nh       [40]byte
	th       [4]byte
	mark     uint32
}

// newPacket is a packet from src to dst, of their family (the source's: a client dials
// the family it has).
func newPacket(iif string, proto uint8, src, dst netip.AddrPort) *packet {
	p := &packet{iif: iif, l4proto: proto, fam: familyOf(src.Addr().String())}
	p.setSrc(src)
	p.setDst(dst)
	return p
}

// saddrAt is the source address's offset in the family's header, which the destination
// follows.
func (f family) saddrAt() uint32 { return f.daddrOffset - f.addr.Bytes }

func (p *packet) setSrc(a netip.AddrPort) {
	copy(p.nh[p.fam.saddrAt():p.fam.daddrOffset], a.Addr().AsSlice())
	binary.BigEndian.PutUint16(p.th[0:2], a.Port())
}

func (p *packet) setDst(a netip.AddrPort) {
	copy(p.nh[p.fam.daddrOffset:], a.Addr().AsSlice())
	binary.BigEndian.PutUint16(p.th[2:4], a.Port())
}

// daddr and saddr are the packet's addresses.
func (p *packet) daddr() netip.Addr {
	a, _ := netip.AddrFromSlice(p.nh[p.fam.daddrOffset : p.fam.daddrOffset+p.fam.addr.Bytes])
	return a
}

func (p *packet) saddr() netip.Addr {
	a, _ := netip.AddrFromSlice(p.nh[p.fam.saddrAt():p.fam.daddrOffset])
	return a
}

func (p *packet) dst() netip.AddrPort {
	return netip.AddrPortFrom(p.daddr(), binary.BigEndian.Uint16(p.th[2:4]))
}

type tracer struct {
	t       *table
	links   []*wantLink
	returns []*wantReturn
}

// natSrcPriority is NF_IP_PRI_NAT_SRC: where postrouting translates a reply's source back.
const natSrcPriority = 100

// hook runs the table's chains of one hook on a packet in priority order. A packet of the
// reply direction skips the NAT chains, which see a flow's first packet only, and has its
// source translated back before the chains after srcnat.
func (tr *tracer) hook(h *nftables.ChainHook, p *packet, f *flow, dir byte, v *Verdict) error {
	chains := slices.DeleteFunc(slices.Clone(chainSpecs), func(c chainSpec) bool { return c.hook != *h })
	slices.SortStableFunc(chains, func(a, b chainSpec) int { return cmp.Compare(a.priority, b.priority) })
	translated := false
	for _, c := range chains {
		if dir == ctDirReply && f.dnat && !translated && c.priority > natSrcPriority && *h == *nftables.ChainHookPostrouting {
			p.setSrc(f.original)
			translated = true
		}
		if dir == ctDirReply && c.typ == nftables.ChainTypeNAT {
			continue
		}
		for _, r := range tr.t.chainRules(c.name) {
			done, err := tr.rule(c.name, r.exprs(byName), p, f, dir, v)
			if err != nil {
				return fmt.Errorf("%s: %s: %w", c.name, r.text, err)
			}
			if done {
				break
			}
		}
	}
	return nil
}

// rule runs one rule's expressions as the kernel would and reports whether it ended the
// chain (a nat statement, an accept). A match that fails, or a lookup that finds no element, goes on
// to the next rule.
func (tr *tracer) rule(chain string, exprs []expr.Any, p *packet, f *flow, dir byte, v *Verdict) (bool, error) {
	var regs [4 * (unix.NFT_REG32_15 - unix.NFT_REG32_00 + 1)]byte
	reg := func(r uint32, n uint32) []byte {
		off := (r - unix.NFT_REG32_00) * 4
		if r < unix.NFT_REG32_00 {
			off = (r - 1) * 16
		}
		return regs[off : off+n]
	}
	// A load fills whole 32-bit registers, zero-padded, as nft_reg_store8/16 do.
	load := func(r uint32, b []byte) {
		d := reg(r, (uint32(len(b))+3)/4*4)
		clear(d)
		copy(d, b)
	}
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Meta:
			switch {
			case e.SourceRegister && e.Key == expr.MetaKeyMARK:
				p.mark = binaryutil.NativeEndian.Uint32(reg(e.Register, 4))
			case e.SourceRegister:
				return false, fmt.Errorf("meta %v set is not traced", e.Key)
			case e.Key == expr.MetaKeyIIFNAME:
				load(e.Register, ifnameBytes(p.iif))
			case e.Key == expr.MetaKeyOIFNAME:
				load(e.Register, ifnameBytes(p.oif))
			case e.Key == expr.MetaKeyL4PROTO:
				load(e.Register, []byte{p.l4proto})
			case e.Key == expr.MetaKeyNFPROTO:
				load(e.Register, []byte{p.fam.nfproto})
			case e.Key == expr.MetaKeyMARK:
				load(e.Register, binaryutil.NativeEndian.PutUint32(p.mark))
			default:
				return false, fmt.Errorf("meta %v is not traced", e.Key)
			}
		case *expr.Payload:
			h := p.nh[:]
			if e.Base == expr.PayloadBaseTransportHeader {
				h = p.th[:]
			} else if e.Base != expr.PayloadBaseNetworkHeader {
				return false, fmt.Errorf("payload base %v is not traced", e.Base)
			}
			if e.OperationType == expr.PayloadWrite {
				// Checksums are not traced: the kernel fixes them as the expression says.
				copy(h[e.Offset:e.Offset+e.Len], reg(e.SourceRegister, e.Len))
				if e.Base == expr.PayloadBaseNetworkHeader && e.Offset == p.fam.daddrOffset {
					v.StandIn = p.daddr()
				}
				continue
			}
			load(e.DestRegister, h[e.Offset:e.Offset+e.Len])
		case *expr.Ct:
			switch {
			case e.SourceRegister && e.Key == expr.CtKeyMARK:
				f.ctMark = binaryutil.NativeEndian.Uint32(reg(e.Register, 4))
			case e.SourceRegister:
				return false, fmt.Errorf("ct %v set is not traced", e.Key)
			case e.Key == expr.CtKeyDIRECTION:
				load(e.Register, []byte{dir})
			case e.Key == expr.CtKeySTATE:
				// The traced request is its flow's first packet; the reply makes it established.
				state := uint32(1 << 3) // new
				if dir == ctDirReply {
					state = 1 << 1 // established
				}
				load(e.Register, binaryutil.NativeEndian.PutUint32(state))
			case e.Key == expr.CtKeySTATUS:
				var status uint32
				if f.dnat {
					status = 1 << 5 // IPS_DST_NAT
				}
				load(e.Register, binaryutil.NativeEndian.PutUint32(status))
			case e.Key == expr.CtKeyMARK:
				load(e.Register, binaryutil.NativeEndian.PutUint32(f.ctMark))
			default:
				return false, fmt.Errorf("ct %v is not traced", e.Key)
			}
		case *expr.Cmp:
			eq := bytes.Equal(reg(e.Register, uint32(len(e.Data))), e.Data)
			switch e.Op {
			case expr.CmpOpEq:
			case expr.CmpOpNeq:
				eq = !eq
			default:
				return false, fmt.Errorf("cmp %v is not traced", e.Op)
			}
			if !eq {
				return false, nil
			}
		case *expr.Bitwise:
			src, dst := reg(e.SourceRegister, e.Len), reg(e.DestRegister, e.Len)
			for i := range dst {
				dst[i] = src[i]&e.Mask[i] ^ e.Xor[i]
			}
		case *expr.Byteorder:
			if e.Size != 4 || e.Len%4 != 0 {
				return false, fmt.Errorf("byteorder of size %d, length %d is not traced", e.Size, e.Len)
			}
			src, dst := reg(e.SourceRegister, e.Len), reg(e.DestRegister, e.Len)
			for i := uint32(0); i < e.Len; i += 4 {
				if e.Op == expr.ByteorderHton {
					binary.BigEndian.PutUint32(dst[i:], binaryutil.NativeEndian.Uint32(src[i:]))
				} else {
					copy(dst[i:], binaryutil.NativeEndian.PutUint32(binary.BigEndian.Uint32(src[i:])))
				}
			}
		case *expr.Immediate:
			load(e.Register, e.Data)
		case *expr.Lookup:
			s, ok := tr.t.layout.byName[e.SetName]
			if !ok {
				return false, fmt.Errorf("lookup in unknown set %s", e.SetName)
			}
			n := uint32(0)
			for _, k := range s.key {
				n += k.words() * 4
			}
			el, ok := tr.t.lookup(s, string(reg(e.SourceRegister, n)))
			if !ok {
				return false, nil
			}
			v.Elements = append(v.Elements, strings.TrimSuffix(chain+" "+s.name+" "+el.id, " "))
			if s.vmap() {
				// A jump: the chain's rules run, then the rule after this one (the lookup
				// ends this rule); an accept in the chain ends the hook's chain too.
				for _, r := range tr.t.chainRules(el.val) {
					done, err := tr.rule(el.val, r.exprs(byName), p, f, dir, v)
					if err != nil || done {
						return done, err
					}
				}
				return false, nil
			}
			if e.IsDestRegSet {
				copy(reg(e.DestRegister, uint32(len(el.val))), el.val)
			}
		case *expr.NAT:
			if e.Family != p.fam.nat {
				return false, fmt.Errorf("NAT of family %d on an %s packet", e.Family, p.fam.addrName)
			}
			addr, _ := netip.AddrFromSlice(reg(e.RegAddrMin, p.fam.addr.Bytes))
			switch e.Type {
			case expr.NATTypeDestNAT:
				// Without a port register NAT keeps the port.
				port := binary.BigEndian.Uint16(p.th[2:4])
				if e.RegProtoMin != 0 {
					port = binary.BigEndian.Uint16(reg(e.RegProtoMin, 2))
				}
				p.setDst(netip.AddrPortFrom(addr, port))
				f.dnat = true
			case expr.NATTypeSourceNAT:
				if e.RegProtoMin != 0 || addr != p.saddr() {
					return false, fmt.Errorf("a source NAT other than the identity is not traced")
				}
				v.SNAT = p.oif
			}
			return true, nil
		case *expr.Verdict:
			if e.Kind != expr.VerdictAccept {
				return false, fmt.Errorf("verdict %v is not traced", e.Kind)
			}
			return true, nil
		default:
			return false, fmt.Errorf("expression %T is not traced", e)
		}
	}
	return false, nil
}

// route is the kernel's route lookup for a packet: the ip rules at 101 and 102 by its mark,
// then main, where each link's /31 (and /127) is connected and anything else leaves by
// fallback; the rules and routes of the packet's family. It
// returns the device and, when a return path's table routed it, that route.
func (tr *tracer) route(p *packet, fallback string) (string, *Route) {
	dst := net.IP(p.daddr().AsSlice())
	fam := returnIPv4
	if p.fam.v6() {
		fam = returnIPv6
	}
	type ipRule struct {
		*netlink.Rule
		w *wantReturn
	}
	var rules []ipRule
	for _, w := range tr.returns {
		for _, r := range fam.rules(w) {
			rules = append(rules, ipRule{r, w})
		}
	}
	slices.SortStableFunc(rules, func(a, b ipRule) int { return cmp.Compare(a.Priority, b.Priority) })
	for _, r := range rules {
		if p.mark&*r.Mask != r.Mark || r.Dst != nil && !r.Dst.Contains(dst) {
			continue
		}
		if r.Table == unix.RT_TABLE_MAIN {
			break
		}
		gw, _ := netip.AddrFromSlice(r.w.gateway(fam))
		return r.w.link, &Route{Table: r.Table, Link: r.w.link, Via: gw.Unmap()}
	}
	for _, l := range tr.links {
		for _, a := range []*net.IPNet{l.address, l.address6} {
			if a != nil && a.Contains(dst) {
				return l.name, nil
			}
		}
	}
	return fallback, nil
}
