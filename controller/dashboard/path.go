package dashboard

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/metrics"
)

// MappingDetail is one mapping's page: the mapping with its counters and history, its path
// and the links it uses.
type MappingDetail struct {
	Leader  bool      `json:"leader"`
	Time    time.Time `json:"time"`
	Mapping *Mapping  `json:"mapping"`
	Path    *Path     `json:"path,omitempty"`
	Links   []Link    `json:"links"`
}

// Path is a mapping's path as docs/design/datapath.md#two-shapes draws it: client → accepting
// node → link → the pod's node → pod, one Branch per accepting node (a forwarder, under Multi
// several). It is read from compile's index: a DNAT entry over a link (Entry.OverLink) is the
// pod's node receiving over that link, any other DNAT entry an accepting interface.
type Path struct {
	Branches []Branch `json:"branches"`
	// PodNode and Pod are the endpoint's node and address as status has them (its IPv6
	// address for a pod with no IPv4 one); empty while there is none.
	PodNode string `json:"podNode,omitempty"`
	Pod     string `json:"pod,omitempty"`
}

// Hop health, from the counters' rates and the registry's unanswered verdicts.
const (
	// HealthOK: packets arrive and, if the hop has replies to count, they leave.
	HealthOK = "ok"
	// HealthIdle: no packets arrive.
	HealthIdle = "idle"
	// HealthUnanswered: requests arrive and no reply leaves (agents.Judge).
	HealthUnanswered = "unanswered"
	// HealthUnknown: no rate yet.
	HealthUnknown = "unknown"
)

// Where a Branch breaks.
const (
	// BreakLink: requests arrive at the accepting node and none arrive over the link at the
	// pod's node.
	BreakLink = "link"
	// BreakPod: requests reach the pod's node (or the pod, on the accepting node) and no
	// reply comes back.
	BreakPod = "pod"
	// BreakReturn: replies leave the pod's node over the link and none leave the accepting
	// node to the client.
	BreakReturn = "return"
)

// Branch is one accepting node's part of the path.
type Branch struct {
	Node string `json:"node"`
	// Interfaces are the accepting interfaces, by name, with the addresses published on them.
	Interfaces []Hop `json:"interfaces"`
	// Link is the link to the pod's node; nil when the accepting node is the pod's node.
	Link *LinkEnd `json:"link,omitempty"`
	// Arrival is the pod's node receiving over Link; nil without a link.
	Arrival *Hop `json:"arrival,omitempty"`
	// Break is where the branch breaks (BreakLink, BreakPod, BreakReturn), empty if it does
	// not.
	Break string `json:"break,omitempty"`
}

// Hop is one interface of a node where a mapping's DNAT entry counts its packets: in
// towards the pod, out from it.
type Hop struct {
	Node      string   `json:"node"`
	Interface string   `json:"interface"`
	Addresses []string `json:"addresses"`
	// InPerSecond and OutPerSecond are packets/s (nil: not known yet).
	InPerSecond  *float64 `json:"inPerSecond"`
	OutPerSecond *float64 `json:"outPerSecond"`
	InPackets    uint64   `json:"inPackets"`
	OutPackets   uint64   `json:"outPackets"`
	Health       string   `json:"health"`
}

// Mapping reads one mapping's page at now; Mapping is nil when there is no such PortMap.
func (s *Server) Mapping(now time.Time, key types.NamespacedName) *MappingDetail {
	d := &MappingDetail{Time: now.UTC(), Links: []Link{}}
	src, rate := s.read(now)
	if src == nil {
		return d
	}
	d.Leader = true
	snap := readSnapshot(src.Agents)
	snap.count(map[types.NamespacedName]bool{key: true})
	for _, m := range allMappings(src, snap) {
		if m.Namespace == key.Namespace && m.Name == key.Name {
			m = s.withCounters(m, snap, rate)
			d.Mapping = &m
			break
		}
	}
	if d.Mapping == nil {
		return d
	}
	links := s.linkRows(snap, rate)
	d.Path = path(*d.Mapping, snap.index[key], links)
	for _, l := range links {
		if slices.ContainsFunc(l.Ends, func(e LinkEnd) bool {
			return slices.Contains(indexLinks(snap.index[key][e.Node]), e.Device)
		}) {
			d.Links = append(d.Links, l)
		}
	}
	return d
}

// path draws m's path from its index entries by node, with m's counters (rated) and the
// links (rated).
func path(m Mapping, index map[string]*compile.MappingIndex, links []Link) *Path {
	p := &Path{Branches: []Branch{}}
	if m.Endpoint != nil {
		p.PodNode, p.Pod = m.Endpoint.Node, cmp.Or(m.Endpoint.Address, m.Endpoint.Address6)
	}
	ends := map[string]LinkEnd{} // by node and device
	for _, l := range links {
		for _, e := range l.Ends {
			ends[e.Node+"/"+e.Device] = e
		}
	}
	hops := map[string]*Hop{} // by node and interface
	unanswered := map[string]bool{}
	for _, u := range m.Unanswered {
		unanswered[u.Node+"/"+u.Interface] = true
	}
	for _, c := range m.Counters {
		if !c.forwarded {
			continue
		}
		k := c.Node + "/" + c.interfaceName
		h := hops[k]
		if h == nil {
			h = &Hop{Node: c.Node, Interface: c.interfaceName, Addresses: []string{}}
			hops[k] = h
		}
		// An interface's IPv4 and IPv6 entries count apart: the hop sums them.
		if c.Direction == metrics.DirectionIn {
			h.InPerSecond, h.InPackets = addRate(h.InPerSecond, c.PacketsPerSecond), h.InPackets+c.Packets
		} else {
			h.OutPerSecond, h.OutPackets = addRate(h.OutPerSecond, c.PacketsPerSecond), h.OutPackets+c.Packets
		}
	}
	for _, h := range hops {
		h.Health = health(*h, unanswered[h.Node+"/"+h.Interface])
	}
	for _, pub := range m.Published {
		h := hops[pub.Node+"/"+pub.Interface]
		if h == nil {
			continue
		}
		for _, a := range []string{pub.Address, pub.Address6} {
			if a != "" {
				h.Addresses = append(h.Addresses, a)
			}
		}
	}

	for _, node := range slices.Sorted(maps.Keys(index)) {
		mi := index[node]
		b := Branch{Node: node, Interfaces: []Hop{}}
		for _, e := range mi.Entries {
			// One hop per interface, whichever families its entries serve.
			if e.Kind != compile.KindDNAT || e.OverLink ||
				slices.ContainsFunc(b.Interfaces, func(h Hop) bool { return h.Interface == e.Interface }) {
				continue
			}
			h := hops[node+"/"+e.Interface]
			if h == nil {
				h = &Hop{Node: node, Interface: e.Interface, Addresses: []string{}, Health: HealthUnknown}
			}
			b.Interfaces = append(b.Interfaces, *h)
		}
		if len(b.Interfaces) == 0 {
			continue // the pod's node, receiving over links only
		}
		for _, dev := range mi.Links {
			end, ok := ends[node+"/"+dev]
			if !ok || (p.PodNode != "" && end.PeerNode != p.PodNode) {
				continue
			}
			b.Link = &end
			for _, e := range indexEntries(index[end.PeerNode]) {
				peer, ok := ends[end.PeerNode+"/"+e.Interface]
				if e.Kind == compile.KindDNAT && e.OverLink && ok && peer.PeerNode == node {
					h := hops[end.PeerNode+"/"+e.Interface]
					if h == nil {
						h = &Hop{Node: end.PeerNode, Interface: e.Interface, Addresses: []string{}, Health: HealthUnknown}
					}
					b.Arrival = h
				}
			}
			break
		}
		b.Break = breaks(b)
		p.Branches = append(p.Branches, b)
	}
	return p
}

// addRate is a + b: a rate known for one family only is that family's, nil while neither
// is known.
func addRate(a, b *float64) *float64 {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	sum := *a + *b
	return &sum
}

func health(h Hop, unanswered bool) string {
	switch {
	case unanswered:
		return HealthUnanswered
	case h.InPerSecond == nil:
		return HealthUnknown
	case *h.InPerSecond == 0:
		return HealthIdle
	}
	return HealthOK
}

// breaks says where b breaks: the first hop that receives and does not pass on.
func breaks(b Branch) string {
	receiving, unanswered := false, false
	for _, h := range b.Interfaces {
		receiving = receiving || h.Health == HealthOK || h.Health == HealthUnanswered
		unanswered = unanswered || h.Health == HealthUnanswered
	}
	if !receiving {
		return ""
	}
	if b.Link == nil {
		if unanswered {
			return BreakPod
		}
		return ""
	}
	a := b.Arrival
	if a == nil || a.Health == HealthIdle {
		return BreakLink
	}
	if a.Health == HealthUnanswered {
		return BreakPod
	}
	if unanswered && a.OutPerSecond != nil && *a.OutPerSecond > 0 {
		return BreakReturn
	}
	return ""
}

// indexLinks and indexEntries read a possibly absent index.
func indexLinks(mi *compile.MappingIndex) []string {
	if mi == nil {
		return nil
	}
	return mi.Links
}

func indexEntries(mi *compile.MappingIndex) []compile.Entry {
	if mi == nil {
		return nil
	}
	return mi.Entries
}
