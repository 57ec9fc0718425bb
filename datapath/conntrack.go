package datapath

import (
	"net"
	"net/netip"
	"slices"

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

// staleFlows is the conntrack filter of one change of kup-pre. It matches a flow that
// arrived from elsewhere (its source is not an address of this node) for an address of
// this node, which is what a kup-pre rule translates, when either
//   - a rule the kernel held translated it (protocol, destination port and, if the rule
//     has one, destination address match; the reply comes from the rule's target address
//     and port) and no desired rule would translate it to that same target: the target
//     moved or the mapping went; or
//   - it was not destination-NATed at all and a rule the kernel did not hold would
//     translate it now: it arrived before the rule existed.
//
// Conntrack does not record the arrival interface, so a flow is matched whatever interface
// it came in by: an entry of the same protocol, port and target from another interface is
// deleted too, and the next packet recreates it.
type staleFlows struct {
	// local are the destinations of the local routing table (this node's addresses).
	local []netip.Prefix
	// want are kup-pre's DNAT rules after the change; gone are the rules before it that
	// want lacks and added the rules of want the kernel did not hold (by their text). A
	// flow an unchanged rule translated is translated the same way by want, so only gone
	// and added are searched for every flow, want only for a flow a gone rule made.
	want, gone, added []*rule
	// matched is called with each flow the filter matches, for the trace log.
	matched func(*netlink.ConntrackFlow)
}

// newStaleFlows returns the filter for a change of kup-pre from old to want (both in chain
// order, any chain; only DNAT rules count), or nil when the DNAT rules are the same.
func newStaleFlows(old, want []*rule) *staleFlows {
	s := &staleFlows{want: dnatRules(want)}
	text := func(rules []*rule) map[string]bool {
		m := map[string]bool{}
		for _, r := range rules {
			m[r.String()] = true
		}
		return m
	}
	had, has := text(old), text(s.want)
	for _, r := range dnatRules(old) {
		if !has[r.String()] {
			s.gone = append(s.gone, r)
		}
	}
	for _, r := range s.want {
		if !had[r.String()] {
			s.added = append(s.added, r)
		}
	}
	if len(s.gone) == 0 && len(s.added) == 0 {
		return nil
	}
	return s
}

func dnatRules(rules []*rule) []*rule {
	var out []*rule
	for _, r := range rules {
		if r.action == actionDNAT {
			out = append(out, r)
		}
	}
	return out
}

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (s *staleFlows) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	src, dst := addrOf(f.Forward.SrcIP), addrOf(f.Forward.DstIP)
	if !s.isLocal(dst) || s.isLocal(src) {
		return false
	}
	proto, dport := f.Forward.Protocol, f.Forward.DstPort
	to, toPort := addrOf(f.Reverse.SrcIP), f.Reverse.SrcPort
	var match bool
	if to == dst && toPort == dport {
		match = anyRule(s.added, func(r *rule) bool { return r.catches(proto, dst, dport) })
	} else {
		made := func(r *rule) bool {
			a, p := r.translate(dport)
			return r.catches(proto, dst, dport) && a == to && p == toPort
		}
		match = anyRule(s.gone, made) && !anyRule(s.want, made)
	}
	if match && s.matched != nil {
		s.matched(f)
	}
	return match
}

// setLocal takes this node's addresses from the local table's routes, and adds each
// changed rule's destination match: this node's end of a link, which is no longer in the
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
	for _, r := range slices.Concat(s.gone, s.added) {
		if r.daddr.IsValid() {
			s.local = append(s.local, netip.PrefixFrom(r.daddr, 32))
		}
	}
}

func (s *staleFlows) isLocal(a netip.Addr) bool {
	for _, p := range s.local {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func anyRule(rules []*rule, pred func(*rule) bool) bool {
	for _, r := range rules {
		if pred(r) {
			return true
		}
	}
	return false
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// catches reports whether the DNAT rule r applies to the first packet of a flow of
// protocol proto to dst:dport; the arrival interface is not checked (conntrack has none).
func (r *rule) catches(proto uint8, dst netip.Addr, dport uint16) bool {
	return r.proto == proto && dport >= r.dport.first && dport <= r.dport.last &&
		(!r.daddr.IsValid() || r.daddr == dst)
}

// translate returns the address and port the DNAT rule r sends a packet for dport to: a
// range keeps the port (the rule forms only ever translate a range onto itself, DESIGN.md
// "Port ranges"), a single port goes to the rule's port, a shifted range by its map.
func (r *rule) translate(dport uint16) (netip.Addr, uint16) {
	for _, p := range r.portMap {
		if p.key == dport {
			return r.toAddr, p.value
		}
	}
	if dport >= r.toPorts.first && dport <= r.toPorts.last {
		return r.toAddr, dport
	}
	return r.toAddr, r.toPorts.first
}

// deleteStaleFlows deletes the conntrack entries s matches (nothing for a nil s). A
// failure is logged, not returned: the program is in the kernel, and what stays behind is
// what conntrack would have kept anyway until the flow idles out.
func (d *Datapath) deleteStaleFlows(s *staleFlows) {
	if s == nil {
		return
	}
	routes, err := d.nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_LOCAL, Type: unix.RTN_LOCAL},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_TYPE)
	if err != nil {
		d.log.Warn("conntrack entries of changed DNAT rules not deleted", "error", err)
		return
	}
	s.setLocal(routes)
	s.matched = func(f *netlink.ConntrackFlow) { d.log.Trace("delete conntrack entry", "flow", f.String()) }
	n, err := d.nl.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, s)
	if err != nil {
		d.log.Warn("deleting conntrack entries of changed DNAT rules", "deleted", n, "error", err)
		return
	}
	log := d.log.Debug
	if n > 0 {
		log = d.log.Info
	}
	log("deleted conntrack entries of changed DNAT rules", "deleted", n)
}
