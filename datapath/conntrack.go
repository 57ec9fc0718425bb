package datapath

import (
	"cmp"
	"encoding/binary"
	"iter"
	"maps"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Conntrack hygiene. NAT is decided on a flow's first packet and kept in its conntrack
// entry, so a change of kup-pre does nothing to flows that already have one: a flow DNATed
// to a target the program no longer names keeps going there, and a flow that reached the
// node before its DNAT rule existed keeps bypassing it. A client that keeps sending (UDP,
// a game) refreshes its entry forever and stays black-holed. So when kup-pre changes,
// Apply deletes exactly those entries; the client's next packet makes a new entry through
// the rules now in the kernel. The choice of what to delete is derived from the kernel's
// kup-pre before and after the change, never decided: the controller decided the rules.

// staleFlows is the conntrack filter of one change of kup-pre's maps. It matches a flow
// that arrived from elsewhere (its source is not an address of this node) for an address of
// this node, which is what a kup-pre element translates, when either
//   - an element the kernel held translated it (protocol, destination port and, if the
//     element has one, destination address match; the reply comes from the element's target
//     address and port) and no desired element would translate it to that same target: the
//     target moved or the mapping went; or
//   - it was not destination-NATed at all and an element the kernel did not hold would
//     translate it now: it arrived before the element existed. Not for TCP: such a flow is
//     a connection to the node's own listener (kept, as kube-proxy keeps it) or one the node
//     refused, which its client does not resend; a UDP client keeps sending on one entry.
//     So adding a TCP mapping sweeps nothing.
//
// Conntrack does not record the arrival interface, so a flow is matched whatever interface
// it came in by: an entry of the same protocol, port and target from another interface is
// deleted too, and the next packet recreates it.
type staleFlows struct {
	// local are the destinations of the local routing table (this node's addresses).
	local []netip.Prefix
	// gone are kup-pre's translations before the change that want lacks, added those of
	// want the kernel did not hold, and want those after it of the protocols and ports of
	// gone, each by protocol and dialed port. A flow an unchanged element translated is
	// translated the same way by want, so only gone and added are searched for every flow,
	// want only for a flow a gone element made.
	want, gone, added translations
	// matched is called with each flow the filter matches, for the trace log.
	matched func(*netlink.ConntrackFlow)
}

type protoPort struct {
	proto uint8
	port  uint16
}

// translation is one DNAT element read back: a first packet of protocol proto to port
// (to last, for a range; and daddr, when valid) goes to to:toPort, or to to and the port it
// came to when keep (a range keeps each port).
type translation struct {
	protoPort
	last   uint16
	daddr  netip.Addr
	to     netip.Addr
	toPort uint16
	keep   bool
}

// covers reports whether the translation is of pp.
func (tr translation) covers(pp protoPort) bool {
	return tr.proto == pp.proto && tr.port <= pp.port && pp.port <= tr.last
}

// portFor is the port a first packet to port goes to.
func (tr translation) portFor(port uint16) uint16 {
	if tr.keep {
		return port
	}
	return tr.toPort
}

// translations are DNAT translations by protocol and port, a range's apart: a range of
// 16,384 ports is one.
type translations struct {
	byPort map[protoPort][]translation
	ranges []translation
}

func (ts *translations) add(tr translation) {
	if tr.last > tr.port {
		ts.ranges = append(ts.ranges, tr)
		return
	}
	if ts.byPort == nil {
		ts.byPort = map[protoPort][]translation{}
	}
	ts.byPort[tr.protoPort] = append(ts.byPort[tr.protoPort], tr)
}

func (ts *translations) empty() bool { return len(ts.byPort) == 0 && len(ts.ranges) == 0 }

// any reports whether a translation of pp satisfies f.
func (ts *translations) any(pp protoPort, f func(translation) bool) bool {
	return slices.ContainsFunc(ts.byPort[pp], f) || slices.ContainsFunc(ts.ranges, func(tr translation) bool { return tr.covers(pp) && f(tr) })
}

// overlaps reports whether a translation of ts shares a port with tr.
func (ts *translations) overlaps(tr translation) bool {
	if len(ts.byPort[tr.protoPort]) > 0 || slices.ContainsFunc(ts.ranges, func(r translation) bool {
		return r.proto == tr.proto && r.port <= tr.last && tr.port <= r.last
	}) {
		return true
	}
	if tr.last == tr.port {
		return false
	}
	for pp := range ts.byPort {
		if tr.covers(pp) {
			return true
		}
	}
	return false
}

// all calls fn with every translation.
func (ts *translations) all(fn func(translation)) {
	for _, trs := range ts.byPort {
		for _, tr := range trs {
			fn(tr)
		}
	}
	for _, tr := range ts.ranges {
		fn(tr)
	}
}

// translation reads a DNAT element of set s; false for one in no DNAT form.
func translationOf(s *setSpec, e elem) (translation, bool) {
	var tr translation
	key := e.key
	for _, f := range s.key {
		n := int(f.words() * 4)
		if len(key) < n {
			return tr, false
		}
		b := []byte(key[:f.typ.Bytes])
		key = key[n:]
		switch f.typ.Name {
		case "ipv4_addr", "ipv6_addr":
			tr.daddr, _ = netip.AddrFromSlice(b)
		case "inet_proto":
			tr.proto = b[0]
		case "inet_service":
			tr.port = binary.BigEndian.Uint16(b)
		}
	}
	tr.last = tr.port
	n := int(s.data[0].typ.Bytes) // the target address's length: the family's
	if s.interval() {
		if _, tr.last = splitPort(e.end); len(e.val) < n || tr.last < tr.port {
			return tr, false
		}
		tr.to, _ = netip.AddrFromSlice([]byte(e.val[:n]))
		tr.keep = true
		return tr, true
	}
	if len(e.val) < n+2 {
		return tr, false
	}
	tr.to, _ = netip.AddrFromSlice([]byte(e.val[:n]))
	tr.toPort = binary.BigEndian.Uint16([]byte(e.val[n : n+2]))
	return tr, true
}

// dnatSets are t's DNAT sets' elements by set name (none for a nil t).
func dnatSets(t *table) map[string]map[string]elem {
	out := map[string]map[string]elem{}
	if t == nil {
		return out
	}
	for _, s := range t.layout.sets {
		if s.role == roleDNAT {
			out[s.name] = t.elems[s.name]
		}
	}
	return out
}

// dialed maps the key of each DNAT element of t that matches a stand-in (kup-steer wrote it
// over the destination) to the destination the client dialed, which is what conntrack
// records: the key of the steering element that writes that stand-in.
func dialed(t *table) map[string]netip.Addr {
	out := map[string]netip.Addr{}
	if t == nil {
		return out
	}
	for set, n := range steerAddrSets {
		for _, e := range t.elems[set] {
			addDialed(out, e, n)
		}
	}
	return out
}

// steerAddrSets are the steering sets whose elements write a stand-in over a destination
// match, with the length of the family's addresses: a range's key is its first port's, as
// is its DNAT element's.
var steerAddrSets = map[string]int{
	"steer-addr-ports": 4, "steer-addr-ranges": 4,
	familyIPv6.setName("steer-addr-ports"): 16, familyIPv6.setName("steer-addr-ranges"): 16,
}

// addDialed records steering element e, its addresses n bytes long, in a dialed map.
func addDialed(out map[string]netip.Addr, e elem, n int) {
	if k, d, ok := steeredKey(e, n); ok {
		out[k] = d
	}
}

// steeredKey is the key of the DNAT element that steering element e's stand-in meets, and
// the destination the client dialed; its addresses are n bytes long.
func steeredKey(e elem, n int) (string, netip.Addr, bool) {
	// iifname (16 bytes) . daddr (n) . l4proto . dport : stand-in (n)
	if len(e.key) < 16+n || len(e.val) < n {
		return "", netip.Addr{}, false
	}
	d, _ := netip.AddrFromSlice([]byte(e.key[16 : 16+n]))
	return e.key[:16] + e.val[:n] + e.key[16+n:], d, true
}

// translationAt reads DNAT element e of set s, with dialed (if valid) in place of the
// stand-in it matches.
func translationAt(s *setSpec, e elem, dialed netip.Addr) (translation, bool) {
	tr, ok := translationOf(s, e)
	if ok && dialed.IsValid() && tr.daddr.IsValid() {
		tr.daddr = dialed
	}
	return tr, ok
}

// tableStaleFlows is the filter for the change of kup-pre's maps from old (nil: no table)
// to want, or nil when they translate as before.
func tableStaleFlows(old, want *table) *staleFlows {
	if old == want {
		return nil
	}
	before, after := dnatSets(old), dnatSets(want)
	keys := func(yield func(setKey) bool) {
		for set, elems := range before {
			for k := range elems {
				if !yield(setKey{set, k}) {
					return
				}
			}
		}
		for set, elems := range after {
			for k := range elems {
				if _, ok := before[set][k]; !ok && !yield(setKey{set, k}) {
					return
				}
			}
		}
	}
	was := func(k setKey) prior {
		e, ok := before[k.set][k.key]
		return prior{e: e, present: ok}
	}
	return staleFlowsOf(want, keys, was, func() map[string]netip.Addr { return dialed(old) })
}

// dirtyStaleFlows is the filter for the change of the planner's dirty elements into want,
// each as it was before in dirty; nil when kup-pre's maps translate as before.
func dirtyStaleFlows(want *table, dirty map[setKey]prior) *staleFlows {
	was := func(k setKey) prior { return dirty[k] }
	// Before the write: want's steering, but for its dirty elements as they were.
	dialedBefore := func() map[string]netip.Addr {
		out := dialed(want)
		for sk, p := range dirty {
			n, steers := steerAddrSets[sk.set]
			if !steers {
				continue
			}
			if e, now := want.elems[sk.set][sk.key]; now {
				if k, _, ok := steeredKey(e, n); ok {
					delete(out, k)
				}
			}
			if p.present {
				addDialed(out, p.e, n)
			}
		}
		return out
	}
	return staleFlowsOf(want, maps.Keys(dirty), was, dialedBefore)
}

// staleFlowsOf returns the filter for a change of kup-pre's maps into want, or nil when
// they translate as before. keys are the elements the change may have touched (those of
// other sets are skipped), was reads each as it was before, and dialedBefore is dialed of
// the table before (read once, when some element changed). Its cost is the keys' but for
// one pass over want's DNAT elements when some went.
func staleFlowsOf(want *table, keys iter.Seq[setKey], was func(setKey) prior, dialedBefore func() map[string]netip.Addr) *staleFlows {
	s := &staleFlows{}
	// The dialed maps are read when first needed: an added TCP mapping, which sweeps
	// nothing, reads neither (a pass over want's steering each).
	var before, after map[string]netip.Addr
	dialedAfter := func(k string) netip.Addr {
		if after == nil {
			after = dialed(want)
		}
		return after[k]
	}
	for k := range keys {
		spec := want.layout.byName[k.set]
		if spec == nil || spec.role != roleDNAT {
			continue
		}
		w := was(k)
		is, ok := want.elems[k.set][k.key]
		if ok == w.present && is == w.e {
			continue
		}
		if w.present && !(ok && is.val == w.e.val) {
			if before == nil {
				before = dialedBefore()
			}
			if tr, ok := translationAt(spec, w.e, before[k.key]); ok {
				s.gone.add(tr)
			}
		}
		if ok && !(w.present && w.e.val == is.val) {
			if tr, ok := translationOf(spec, is); ok && tr.proto != unix.IPPROTO_TCP {
				tr, _ = translationAt(spec, is, dialedAfter(k.key))
				s.added.add(tr)
			}
		}
	}
	if s.gone.empty() && s.added.empty() {
		return nil
	}
	s.wantFrom(want, dialedAfter)
	return s
}

// wantFrom sets s.want to table t's translations that share a protocol and port with s.gone,
// each DNAT element's dialed destination read through dialedAt (nil: from t's steering).
func (s *staleFlows) wantFrom(t *table, dialedAt func(string) netip.Addr) {
	s.want = translations{}
	if s.gone.empty() {
		return
	}
	if dialedAt == nil {
		steered := dialed(t)
		dialedAt = func(k string) netip.Addr { return steered[k] }
	}
	for set, elems := range dnatSets(t) {
		spec := t.layout.byName[set]
		for k, e := range elems {
			if tr, ok := translationAt(spec, e, dialedAt(k)); ok && s.gone.overlaps(tr) {
				s.want.add(tr)
			}
		}
	}
}

// join adds the changes of o, a later change into table t, to s's (either may be nil) and
// returns the filter of both: a flow either change left going the old way, unless t
// translates it that way again.
func (s *staleFlows) join(o *staleFlows, t *table) *staleFlows {
	if s == nil || o == nil {
		return cmp.Or(s, o)
	}
	o.gone.all(s.gone.add)
	o.added.all(s.added.add)
	s.wantFrom(t, nil)
	return s
}

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (s *staleFlows) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	src, dst := addrOf(f.Forward.SrcIP), addrOf(f.Forward.DstIP)
	if !s.isLocal(dst) || s.isLocal(src) {
		return false
	}
	pp := protoPort{f.Forward.Protocol, f.Forward.DstPort}
	to, toPort := addrOf(f.Reverse.SrcIP), f.Reverse.SrcPort
	// A translation without a destination match catches any of its family's.
	catches := func(tr translation) bool { return tr.to.Is4() == dst.Is4() && (!tr.daddr.IsValid() || tr.daddr == dst) }
	var match bool
	if to == dst && toPort == pp.port {
		match = s.added.any(pp, catches)
	} else {
		made := func(tr translation) bool { return catches(tr) && tr.to == to && tr.portFor(pp.port) == toPort }
		match = s.gone.any(pp, made) && !s.want.any(pp, made)
	}
	if match && s.matched != nil {
		s.matched(f)
	}
	return match
}

// setLocal takes this node's addresses from the local table's routes, and adds each
// changed element's destination match: this node's end of a link, which is no longer in the
// local table when this Apply removed the link, while flows to it may remain.
func (s *staleFlows) setLocal(routes []netlink.Route) {
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		if p, ok := netip.AddrFromSlice(r.Dst.IP); ok {
			ones, _ := r.Dst.Mask.Size()
			s.local = append(s.local, netip.PrefixFrom(p.Unmap(), ones))
		}
	}
	for _, ts := range []*translations{&s.gone, &s.added} {
		ts.all(func(tr translation) {
			if tr.daddr.IsValid() {
				s.local = append(s.local, netip.PrefixFrom(tr.daddr, tr.daddr.BitLen()))
			}
		})
	}
}

// families are the address families of the filter's translations (netlink.FAMILY_V4,
// FAMILY_V6): a sweep dumps only their conntrack tables.
func (s *staleFlows) families() []int {
	var v4, v6 bool
	for _, ts := range []*translations{&s.gone, &s.added} {
		ts.all(func(tr translation) {
			v4, v6 = v4 || tr.to.Is4(), v6 || tr.to.Is6()
		})
	}
	var out []int
	if v4 {
		out = append(out, netlink.FAMILY_V4)
	}
	if v6 {
		out = append(out, netlink.FAMILY_V6)
	}
	return out
}

func (s *staleFlows) isLocal(a netip.Addr) bool {
	for _, p := range s.local {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// putOffSweep is the conntrack sweep put off behind Config.SweepDelay: the filter of the
// changes since the last sweep, how many changes that is, and the timer that runs it (nil
// when none is armed). Guarded by the Datapath's mu.
type putOffSweep struct {
	stale   *staleFlows
	changes int
	timer   *time.Timer
}

// sweep deletes the flows that the change into want left going the old way (s; nil: none):
// at once without a SweepDelay, else together with those of the changes after it, when the
// timer the first change armed fires. A stream of changes postpones no sweep past its
// first change's delay. Called with mu held.
func (d *Datapath) sweep(s *staleFlows, want *table) {
	if s == nil {
		return
	}
	d.swept.stale = d.swept.stale.join(s, want)
	d.swept.changes++
	if d.sweepDelay <= 0 {
		d.sweepPutOff()
		return
	}
	if d.swept.timer == nil {
		d.swept.timer = time.AfterFunc(d.sweepDelay, func() {
			d.lock()
			defer d.mu.Unlock()
			d.sweepPutOff()
		})
	}
}

// SweepNow deletes at once the conntrack entries whose deletion is put off
// (Config.SweepDelay), as before the process ends.
func (d *Datapath) SweepNow() {
	d.lock()
	defer d.mu.Unlock()
	if d.swept.timer != nil {
		d.swept.timer.Stop()
	}
	d.sweepPutOff()
}

// sweepPutOff deletes the flows of the changes put off so far (mu held). A timer that
// fired meanwhile finds nothing left, or the changes since, which it deletes early.
func (d *Datapath) sweepPutOff() {
	s, n := d.swept.stale, d.swept.changes
	d.swept = putOffSweep{}
	d.deleteStaleFlows(s, n)
}

// deleteStaleFlows deletes the conntrack entries s matches, the filter of changes changes
// (nothing for a nil s). A failure is logged, not returned: the program is in the kernel,
// and what stays behind is what conntrack would have kept anyway until the flow idles out.
func (d *Datapath) deleteStaleFlows(s *staleFlows, changes int) {
	if s == nil {
		return
	}
	var routes []netlink.Route
	fams := s.families()
	for _, f := range fams {
		r, err := d.nl.RouteListFiltered(f, &netlink.Route{Table: unix.RT_TABLE_LOCAL, Type: unix.RTN_LOCAL},
			netlink.RT_FILTER_TABLE|netlink.RT_FILTER_TYPE)
		if err != nil {
			d.log.Warn("conntrack entries of changed DNAT rules not deleted", "error", err)
			return
		}
		routes = append(routes, r...)
	}
	s.setLocal(routes)
	s.matched = func(f *netlink.ConntrackFlow) { d.log.Trace("delete conntrack entry", "flow", f.String()) }
	var n uint
	for _, f := range fams {
		m, err := d.nl.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.InetFamily(f), s)
		n += m
		if err != nil {
			d.log.Warn("deleting conntrack entries of changed DNAT rules", "deleted", n, "error", err)
			return
		}
	}
	log := d.log.Debug
	if n > 0 {
		log = d.log.Info
	}
	log("deleted conntrack entries of changed DNAT rules", "deleted", n, "changes", changes)
}
