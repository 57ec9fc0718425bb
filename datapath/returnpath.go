package datapath

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// The two ip rules of a return path
// (docs/design/datapath.md#the-return-path-ip-rules-101-and-102), at the program's prefs (101
// and 102 by default, ReturnMarking): the loop guard keeps the encapsulated packet, which the
// vxlan driver gives the inner packet's mark, in main so it is not routed back into the link
// (one tx_error per reply otherwise); the divert sends marked replies to the link's table.
// Both must be consulted before netbird's 105 (resolve from main) and 110 (its catch-all),
// where a reply would already have left, and after the local table's 0. A return path over a
// link that carries IPv6 has a third rule, the divert in the IPv6 rules, and an IPv6 default
// route in the same table; no IPv6 loop guard, as the link's outer packets are IPv4
// (docs/design/datapath.md#ipv6-on-the-link).

// returnFamily is one address family's share of the return paths: the kernel keeps each
// family's ip rules and routing tables apart, so each is listed and changed on its own.
type returnFamily struct {
	nl   int
	name string // in errors: "ip" or "ip -6"
	bits int
	// metric is what the kernel gives a route added without one and reads back: IPv6's
	// 1024, IPv4's 0.
	metric int
}

var (
	returnIPv4 = returnFamily{nl: netlink.FAMILY_V4, name: "ip", bits: 32}
	returnIPv6 = returnFamily{nl: netlink.FAMILY_V6, name: "ip -6", bits: 128, metric: 1024}
)

// owns reports whether the kernel rule r of the family is kuport's: an earlier agent's
// rules (legacyRule) were IPv4 only.
func (f returnFamily) owns(r *netlink.Rule) bool {
	if f.nl == netlink.FAMILY_V6 {
		return r.Protocol == rtprotKuport
	}
	return ownRule(r)
}

// wantReturn is a validated ReturnPath entry.
type wantReturn struct {
	id    string
	link  string
	mark  uint32
	table int
	peer  net.IP
	gw    net.IP
	// gw6 is the peer's end of the link's /127 (nil: no IPv6 return path); no6 says why a
	// return path that names one has none, an error Apply reports without failing the
	// IPv4 one.
	gw6 net.IP
	no6 error
	m   marking
}

func planReturn(rp *kuportv1.ReturnPath, m marking) (*wantReturn, error) {
	w := &wantReturn{id: rp.GetId(), link: rp.GetLink(), mark: rp.GetMark(), table: int(rp.GetTable()), m: m}
	if err := checkID(w.id); err != nil {
		return nil, err
	}
	if err := checkIfname(w.link); err != nil {
		return nil, err
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	if !m.validMark(w.mark) {
		return nil, fmt.Errorf("mark %#x is 0 or not under the return mark mask %#x", w.mark, m.mask)
	}
	if !m.ownsTable(w.table) {
		return nil, fmt.Errorf("table %d is not a kuport table (%d-%d, not 253-255)", w.table, m.firstTable, m.lastTable)
	}
	peer, err := ipv4("peer_underlay", rp.GetPeerUnderlay())
	if err != nil {
		return nil, err
	}
	gw, err := ipv4("peer_link_address", rp.GetPeerLinkAddress())
	if err != nil {
		return nil, err
	}
	w.peer, w.gw = net.IP(peer.AsSlice()), net.IP(gw.AsSlice())
	return w, nil
}

// planReturn6 checks a return path's IPv6 gateway against its link: the peer's end of the
// link's /127. A link too small for IPv6 (tooSmall6) leaves the return path IPv4 only.
func (w *wantReturn) planReturn6(gw6 string, link *kuportv1.Link) error {
	if gw6 == "" {
		return nil
	}
	a, err := netip.ParseAddr(gw6)
	if err != nil || !a.Is6() || a.Is4In6() || a.Zone() != "" {
		return fmt.Errorf("peer_link_address6 %q is not an IPv6 address", gw6)
	}
	if p, err := netip.ParseAddr(link.GetPeerAddress6()); err != nil || p != a {
		return fmt.Errorf("peer_link_address6 %s is not link %s's peer_address6", a, w.link)
	}
	w.gw6 = net.IP(a.AsSlice())
	if err := tooSmall6(int(link.GetMtu())); err != nil {
		w.gw6, w.no6 = nil, fmt.Errorf("link %s's %w: replies return over it for IPv4 only", w.link, err)
	}
	return nil
}

// planReturns are the program's valid return paths (Apply's and Trace's one source): a
// return path whose id or table another holds, or whose link the program does not have,
// is an *EntryError.
func planReturns(p *kuportv1.NodeProgram) ([]*wantReturn, []error) {
	links := map[string]*kuportv1.Link{}
	for _, l := range p.GetLinks() {
		links[l.GetName()] = l
	}
	var returns []*wantReturn
	var errs []error
	ids := map[string]bool{}
	tables, marks := map[uint32]bool{}, map[uint32]bool{}
	m := markingOf(p)
	for _, rp := range p.GetReturnPaths() {
		w, err := planReturn(rp, m)
		switch {
		case err != nil:
		case ids[w.id] || tables[rp.GetTable()] || marks[w.mark]:
			err = fmt.Errorf("id, table %d or mark %#x used by another return path", w.table, w.mark)
		case links[w.link] == nil:
			err = fmt.Errorf("link %s is not in the program", w.link)
		default:
			err = w.planReturn6(rp.GetPeerLinkAddress6(), links[w.link])
		}
		if err != nil {
			errs = append(errs, &EntryError{Kind: "return path", ID: rp.GetId(), Err: err})
			continue
		}
		ids[w.id], tables[rp.GetTable()], marks[w.mark] = true, true, true
		returns = append(returns, w)
	}
	return returns, errs
}

// rules are the return path's two IPv4 ip rules
// (docs/design/datapath.md#the-return-path-ip-rules-101-and-102), matching only the mask's
// bits and carrying kuport's protocol.
func (w *wantReturn) rules() []*netlink.Rule {
	mask := w.m.mask
	guard := netlink.NewRule()
	guard.Priority, guard.Mark, guard.Mask, guard.Table = w.m.loopGuard, w.mark, &mask, unix.RT_TABLE_MAIN
	guard.Dst = &net.IPNet{IP: w.peer, Mask: net.CIDRMask(32, 32)}
	divert := netlink.NewRule()
	divert.Priority, divert.Mark, divert.Mask, divert.Table = w.m.divert, w.mark, &mask, w.table
	for _, r := range []*netlink.Rule{guard, divert} {
		r.Family, r.Protocol = netlink.FAMILY_V4, rtprotKuport
	}
	return []*netlink.Rule{guard, divert}
}

// rules6 is the return path's IPv6 ip rule, the divert alone (nil without an IPv6 gateway).
func (w *wantReturn) rules6() []*netlink.Rule {
	if w.gw6 == nil {
		return nil
	}
	mask := w.m.mask
	divert := netlink.NewRule()
	divert.Priority, divert.Mark, divert.Mask, divert.Table = w.m.divert, w.mark, &mask, w.table
	divert.Family, divert.Protocol = netlink.FAMILY_V6, rtprotKuport
	return []*netlink.Rule{divert}
}

// rules are w's ip rules of the family.
func (f returnFamily) rules(w *wantReturn) []*netlink.Rule {
	if f.nl == netlink.FAMILY_V6 {
		return w.rules6()
	}
	return w.rules()
}

// gateway is the return path's gateway in the family (nil: none).
func (w *wantReturn) gateway(f returnFamily) net.IP {
	if f.nl == netlink.FAMILY_V6 {
		return w.gw6
	}
	return w.gw
}

// ruleKey identifies an ip rule by every selector and action kuport's rules could differ
// in; a kernel rule in the band with any other key is not wanted.
func ruleKey(r *netlink.Rule) string {
	mask := "none"
	if r.Mask != nil {
		mask = fmt.Sprintf("%#x", *r.Mask)
	}
	return fmt.Sprintf("pref %d fwmark %#x/%s from %v to %v iif %q oif %q not %t goto %d proto %d sport %v dport %v tos %d suppress %d/%d uid %v lookup %d protocol %d",
		r.Priority, r.Mark, mask, r.Src, r.Dst, r.IifName, r.OifName, r.Invert, r.Goto, r.IPProto,
		r.Sport, r.Dport, r.Tos, r.SuppressPrefixlen, r.SuppressIfgroup, r.UIDRange, r.Table, r.Protocol)
}

// routeKey identifies a route in one of kuport's tables.
func routeKey(r *netlink.Route) string {
	return fmt.Sprintf("%v via %v dev %d src %v metric %d type %d multipath %d protocol %d", r.Dst, r.Gw, r.LinkIndex, r.Src, r.Priority, r.Type, len(r.MultiPath), r.Protocol)
}

// reservedTable reports the kernel's own tables, never kuport's whatever points at them.
func reservedTable(t int) bool {
	return t == unix.RT_TABLE_UNSPEC || t == unix.RT_TABLE_DEFAULT || t == unix.RT_TABLE_MAIN || t == unix.RT_TABLE_LOCAL
}

// syncReturnPaths makes kuport's ip rules (its protocol's, and an earlier agent's at 101/102
// with a 0x6b70xxxx mark, legacyRule) and the routes of kuport's tables (those the program
// names, those its rules point at, and any holding a route of its protocol) hold exactly the
// program's return paths, whatever pref, mark or table an earlier setting gave them, in
// IPv4 and in IPv6, each family apart.
func (d *Datapath) syncReturnPaths(want []*wantReturn, changes *int) []error {
	var errs []error
	all := map[int]bool{}
	for _, f := range []returnFamily{returnIPv4, returnIPv6} {
		errs = append(errs, d.syncReturnFamily(f, want, all, changes)...)
	}
	for _, w := range want {
		if w.no6 != nil {
			errs = append(errs, &EntryError{Kind: "return path", ID: w.id, Err: fmt.Errorf("IPv6: %w", w.no6)})
		}
	}
	return errs
}

// syncReturnFamily is syncReturnPaths in one family, adding the tables it syncs to all:
// stale rules go first, then each table's routes are corrected, then missing rules are
// added, so a rule never points at an empty table it could fall through.
func (d *Datapath) syncReturnFamily(f returnFamily, want []*wantReturn, all map[int]bool, changes *int) []error {
	var errs []error
	kernelRules, err := d.nl.RuleList(f.nl)
	if err != nil {
		return []error{fmt.Errorf("list %s rules: %w", f.name, err)}
	}
	type owned struct {
		rule *netlink.Rule
		w    *wantReturn
	}
	wantRules := map[string]owned{}
	tables := map[int]bool{}
	byTable := map[int]*wantReturn{}
	for _, w := range want {
		tables[w.table] = true
		if w.gateway(f) != nil {
			byTable[w.table] = w
		}
		for _, r := range f.rules(w) {
			wantRules[ruleKey(r)] = owned{r, w}
		}
	}
	present := map[string]bool{}
	for i := range kernelRules {
		kr := &kernelRules[i]
		if !f.owns(kr) {
			continue
		}
		if !reservedTable(kr.Table) {
			tables[kr.Table] = true
		}
		key := ruleKey(kr)
		if _, ok := wantRules[key]; ok && !present[key] {
			present[key] = true
			continue
		}
		d.log.Trace("delete ip rule", "family", f.name, "rule", key)
		if err := d.nl.RuleDel(kr); err != nil && !isNotFound(err) {
			errs = append(errs, &EntryError{Kind: "ip rule", ID: key, Err: err})
			continue
		}
		*changes++
	}
	// A table kuport's rules no longer point at (an agent stopped between deleting a rule and
	// emptying its table) is still found by its routes' protocol.
	routes, err := d.nl.RouteListFiltered(f.nl, &netlink.Route{Table: unix.RT_TABLE_UNSPEC, Protocol: rtprotKuport},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return append(errs, fmt.Errorf("list kuport's %s routes: %w", f.name, err))
	}
	for _, r := range routes {
		if !reservedTable(r.Table) {
			tables[r.Table] = true
		}
	}
	// The watch reads the tables without the lock (watch.go): a copy, never changed after.
	maps.Copy(all, tables)
	watched := maps.Clone(all)
	d.routeTables.Store(&watched)
	failed := map[*wantReturn]bool{}
	for _, t := range sortedKeys(tables) {
		if err := d.syncRouteTable(f, t, byTable[t], changes); err != nil {
			if w := byTable[t]; w != nil {
				failed[w] = true
				errs = append(errs, &EntryError{Kind: "return path", ID: w.id, Err: err})
			} else {
				errs = append(errs, fmt.Errorf("%s table %d: %w", f.name, t, err))
			}
		}
	}
	for _, key := range sortedKeys(wantRules) {
		o := wantRules[key]
		if present[key] || failed[o.w] {
			continue
		}
		d.log.Trace("add ip rule", "family", f.name, "rule", key)
		if err := d.nl.RuleAdd(o.rule); err != nil {
			errs = append(errs, &EntryError{Kind: "return path", ID: o.w.id, Err: fmt.Errorf("add %s rule pref %d: %w", f.name, o.rule.Priority, err)})
			continue
		}
		*changes++
	}
	return errs
}

// syncRouteTable makes routing table t of the family hold exactly w's default route
// (nothing when w is nil).
func (d *Datapath) syncRouteTable(f returnFamily, t int, w *wantReturn, changes *int) error {
	routes, err := d.nl.RouteListFiltered(f.nl, &netlink.Route{Table: t}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("list %s routes of table %d: %w", f.name, t, err)
	}
	var want *netlink.Route
	if w != nil {
		l, err := d.nl.LinkByName(w.link)
		if err != nil {
			return fmt.Errorf("link %s: %w", w.link, err)
		}
		want = &netlink.Route{Dst: &net.IPNet{IP: make(net.IP, f.bits/8), Mask: net.CIDRMask(0, f.bits)}, Gw: w.gateway(f),
			LinkIndex: l.Attrs().Index, Table: t, Type: unix.RTN_UNICAST, Protocol: rtprotKuport, Priority: f.metric}
	}
	have := false
	for i := range routes {
		r := &routes[i]
		if want != nil && !have && routeKey(r) == routeKey(want) {
			have = true
			continue
		}
		d.log.Trace("delete route", "family", f.name, "table", t, "route", routeKey(r))
		if err := d.nl.RouteDel(r); err != nil && !isNotFound(err) {
			return fmt.Errorf("delete route %s: %w", routeKey(r), err)
		}
		*changes++
	}
	if want != nil && !have {
		d.log.Trace("add route", "family", f.name, "table", t, "route", routeKey(want))
		if err := d.nl.RouteAdd(want); err != nil {
			return fmt.Errorf("add %s default route via %s dev %s table %d: %w", f.name, want.Gw, w.link, t, err)
		}
		*changes++
	}
	return nil
}

func sortedKeys[K int | string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// isNotFound reports a delete of something already gone, which is success.
func isNotFound(err error) bool {
	var lnf netlink.LinkNotFoundError
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENODEV) || errors.As(err, &lnf)
}
