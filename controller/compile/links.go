package compile

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// claim is one class's slot claim for a node pair, persisted in class status.links.
type claim struct {
	class *classInfo
	peers [2]string // sorted
	slot  int32
	// unusedSince is set while no mapping needs the pair.
	unusedSince *metav1.Time
	// ends: the routing table a node's return path over this link uses.
	ends map[string]int32
	// recordedSubnet and recordedSubnet6 are the /31 and /127 the class status recorded,
	// kept while the class has no usable subnet.
	recordedSubnet, recordedSubnet6 string
	// texts and texts6 are the peers' addresses as programs carry them (addressText,
	// addressText6).
	texts, texts6 [2]string
}

func pairOf(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

func pairKey(p [2]string) string { return p[0] + "/" + p[1] }

func (cl *claim) key() string { return pairKey(cl.peers) }

func (cl *claim) vni() uint32 { return cl.class.vni + uint32(cl.slot) }

// address returns a node's end of the claim's /31: the alphabetically first node of the pair
// takes the lower address (docs/design/api.md#links-and-slots).
func (cl *claim) address(node string) netip.Addr {
	low := slotBase(cl.class.subnet, cl.slot)
	if node == cl.peers[0] {
		return low
	}
	return low.Next()
}

// has6 reports whether the claim's link carries IPv6: its class has a usable subnet6.
func (cl *claim) has6() bool { return cl.class.subnet6.IsValid() }

// address6 returns a node's end of the claim's /127, the lower address again the
// alphabetically first node's.
func (cl *claim) address6(node string) netip.Addr {
	low := slotBase6(cl.class.subnet6, cl.slot)
	if node == cl.peers[0] {
		return low
	}
	return low.Next()
}

// addressText6 is address6(node) as text, made once per claim; "" when the link carries no
// IPv6.
func (cl *claim) addressText6(node string) string {
	if !cl.has6() {
		return ""
	}
	return cl.text(&cl.texts6, node, cl.address6)
}

// text is node's address of one family (addr) as text, kept in texts for the next caller.
func (cl *claim) text(texts *[2]string, node string, addr func(string) netip.Addr) string {
	i := 0
	if node != cl.peers[0] {
		i = 1
	}
	if texts[i] == "" {
		texts[i] = addr(node).String()
	}
	return texts[i]
}

// linkMAC is the link-layer address of a node's end of a link, derived from its /31
// address (program.proto, Link.mac): locally administered, unicast, and unique wherever the
// addresses are, which the class's subnet checks make them on a node.
func linkMAC(addr netip.Addr) string {
	a := addr.As4()
	return net.HardwareAddr{0x02, 0x6b, a[0], a[1], a[2], a[3]}.String()
}

// addressText is address(node) as text, made once per claim: every mapping over the link
// carries it, in up to four rules.
func (cl *claim) addressText(node string) string { return cl.text(&cl.texts, node, cl.address) }

// status is the claim as recorded in class status.links.
func (cl *claim) status() v1alpha1.LinkStatus {
	ls := v1alpha1.LinkStatus{
		Key:         cl.key(),
		Peers:       []string{cl.peers[0], cl.peers[1]},
		Slot:        cl.slot,
		UnusedSince: cl.unusedSince,
	}
	if cl.class.subnet.IsValid() {
		ls.Subnet = netip.PrefixFrom(slotBase(cl.class.subnet, cl.slot), 31).String()
	} else {
		// The class has no usable subnet now (None, or invalid): the claim keeps its /31.
		ls.Subnet = cl.recordedSubnet
	}
	switch {
	case cl.has6():
		ls.Subnet6 = netip.PrefixFrom(slotBase6(cl.class.subnet6, cl.slot), 127).String()
	case !cl.class.subnet.IsValid():
		// Likewise its /127, while the class builds no links.
		ls.Subnet6 = cl.recordedSubnet6
	}
	for _, n := range cl.peers {
		if t, ok := cl.ends[n]; ok {
			ls.Ends = append(ls.Ends, v1alpha1.LinkEnd{Node: n, Table: t})
		}
	}
	return ls
}

// slotBase is the lower address of slot s's /31: subnet base + 2s.
func slotBase(subnet netip.Prefix, s int32) netip.Addr {
	b := subnet.Masked().Addr().As4()
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], binary.BigEndian.Uint32(b[:])+2*uint32(s))
	return netip.AddrFrom4(out)
}

// slotBase6 is the lower address of slot s's /127: subnet6 base + 2s.
func slotBase6(subnet6 netip.Prefix, s int32) netip.Addr {
	b := subnet6.Masked().Addr().As16()
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	sum := lo + 2*uint64(s)
	if sum < lo {
		hi++
	}
	var out [16]byte
	binary.BigEndian.PutUint64(out[:8], hi)
	binary.BigEndian.PutUint64(out[8:], sum)
	return netip.AddrFrom16(out)
}

// slotCount is how many two-address slots a prefix of an address of bits bits holds,
// capped above any slot number.
func slotCount(subnet netip.Prefix, bits int) int64 {
	switch free := bits - subnet.Bits() - 1; {
	case free < 0:
		return 0
	case free < 32:
		return int64(1) << free
	}
	return int64(1) << 32
}

// slotFits reports whether slot s's /31 lies inside the subnet and, when the class has a
// usable subnet6, its /127 inside that.
func (ci *classInfo) slotFits(s int32) bool {
	return s >= 0 && int64(s) < slotCount(ci.subnet, 32) &&
		(!ci.subnet6.IsValid() || int64(s) < slotCount(ci.subnet6, 128))
}

// vniFits reports whether slot s's VNI, base + s, is a VXLAN network identifier.
func vniFits(base uint32, s int32) bool { return s >= 0 && uint64(base)+uint64(s) <= maxVNI }

// linkPrefix begins the name of every link device kuport makes.
const linkPrefix = "kup-"

// linkSourcePortLow and linkSourcePortHigh (exclusive) are every link's outer UDP source
// ports: RFC 7348's dynamic range, whatever a node's local port range, so a receiver spreads
// and coalesces the link's flows apart (docs/design/datapath.md#the-link-device).
const linkSourcePortLow, linkSourcePortHigh = 49152, 65535

// linkName is the device a node names after its peer: "kup-" + the first 8 hex digits of
// sha256("<class>/<peer node>") (docs/design/datapath.md#the-link-device).
func linkName(class, peer string) string {
	sum := sha256.Sum256([]byte(class + "/" + peer))
	return linkPrefix + hex.EncodeToString(sum[:4])
}

// linkDevice is the device of a class's links that nodes name after one peer, with the entry
// names and return path id it gives the pod's node: made once per peer, not per mapping
// (BENCHMARKS.md, "Figures moved out of code comments"). links and returnPaths are name and
// returnPath alone, the index lists of a mapping using only it (withOne).
type linkDevice struct {
	name, dnat, ctSave, dnat6, ctSave6, returnPath string
	links, returnPaths                             []string
}

// device returns the class's linkDevice named after peer.
func (ci *classInfo) device(peer string) *linkDevice {
	d := ci.devices[peer]
	if d == nil {
		n := linkName(ci.name, peer)
		d = &linkDevice{name: n, dnat: "dnat/" + n, ctSave: "ct-save/" + n, dnat6: "dnat6/" + n, ctSave6: "ct-save6/" + n,
			returnPath: n + "/return"}
		d.links, d.returnPaths = []string{d.name}, []string{d.returnPath}
		ci.devices[peer] = d
	}
	return d
}

// loadClaims reads the previous allocations from class status. A claim that is malformed,
// repeats a pair or slot, or whose slot no longer fits the class's subnet or VNI range (the
// base VNI was raised) is dropped.
func (c *compiler) loadClaims() {
	for _, ci := range c.classOrder {
		links := slices.Clone(ci.obj.Status.Links)
		slices.SortFunc(links, func(a, b v1alpha1.LinkStatus) int {
			return cmp.Or(cmp.Compare(a.Slot, b.Slot), cmp.Compare(a.Key, b.Key))
		})
		slots := map[int32]bool{}
		for _, ls := range links {
			if len(ls.Peers) != 2 || ls.Peers[0] == "" || ls.Peers[0] == ls.Peers[1] || ls.Slot < 0 || slots[ls.Slot] {
				continue
			}
			if ci.subnet.IsValid() && !ci.slotFits(ls.Slot) || !vniFits(ci.vni, ls.Slot) {
				continue
			}
			cl := &claim{class: ci, peers: pairOf(ls.Peers[0], ls.Peers[1]), slot: ls.Slot, ends: map[string]int32{},
				recordedSubnet: ls.Subnet, recordedSubnet6: ls.Subnet6}
			if _, dup := ci.claims[cl.key()]; dup {
				continue
			}
			if ls.UnusedSince != nil {
				t := *ls.UnusedSince
				cl.unusedSince = &t
			}
			for _, e := range ls.Ends {
				// A table outside the setting's range (one from before it, 201 on, or a
				// range since changed) is dropped: allocate gives the end a new one
				// (docs/upgrade.md says what that costs the end's flows).
				if (e.Node == cl.peers[0] || e.Node == cl.peers[1]) && c.marking.holds(e.Table) {
					cl.ends[e.Node] = e.Table
				}
			}
			slots[ls.Slot] = true
			ci.claims[cl.key()] = cl
		}
	}
}

// allocate settles link claims for this compilation: claims no mapping needs are stamped
// unusedSince (or dropped once older than LinkRetention), needed claims keep their slot and
// have unusedSince cleared, and new pairs take a slot and their return-path ends a table,
// in mapping age order. A pair with no free slot fails its mapping with ReturnPathUnavailable
// and marks the class SubnetExhausted.
func (c *compiler) allocate() {
	needed := map[*classInfo]map[string]bool{}
	for _, p := range c.plans {
		for _, t := range p.remoteTargets() {
			if needed[p.class] == nil {
				needed[p.class] = map[string]bool{}
			}
			needed[p.class][pairKey(p.pair(t))] = true
			p.needs = append(p.needs, c.intern(p.class.name+"/"+pairKey(p.pair(t))))
		}
	}
	for _, ci := range c.classOrder {
		for k, cl := range ci.claims {
			switch {
			case needed[ci][k]:
				cl.unusedSince = nil
			case cl.unusedSince == nil:
				t := c.stamp
				cl.unusedSince = &t
			case c.stamp.Sub(cl.unusedSince.Time) > c.s.LinkRetention:
				delete(ci.claims, k)
				continue
			}
			for n, t := range cl.ends {
				c.useTable(n, t)
			}
		}
	}
	for _, p := range c.plans {
		for _, t := range p.remoteTargets() {
			cl := c.claimFor(p.class, p.pair(t))
			if cl == nil {
				p.fail(v1alpha1.ReasonReturnPathUnavailable, fmt.Sprintf(
					"class %q has no free link slot in subnet %s for nodes %s and %s",
					p.class.name, p.class.subnet, t.node, p.ep.node))
				break
			}
			if _, ok := cl.ends[p.ep.node]; !ok {
				table, ok := c.freeTable(p.ep.node)
				if !ok {
					p.fail(v1alpha1.ReasonReturnPathUnavailable, fmt.Sprintf(
						"node %s holds %d return paths, all the return mark mask %#x and tables %d-%d allow (--return-mark-mask, --return-tables)",
						p.ep.node, c.marking.Capacity(), c.marking.MarkMask, c.marking.FirstTable, c.marking.LastTable))
					break
				}
				cl.ends[p.ep.node] = table
			}
			t.link = cl
		}
	}
}

// claimFor returns the class's claim for a pair, taking the smallest free slot for a new
// pair: one whose /31 fits the subnet and whose VNI no other class's claim uses on either
// node of the pair (docs/design/api.md#links-and-slots). It returns nil, and records the pair
// as exhausted, when none is left.
func (c *compiler) claimFor(ci *classInfo, pair [2]string) *claim {
	if cl, ok := ci.claims[pairKey(pair)]; ok {
		return cl
	}
	taken := map[int32]bool{}
	for _, cl := range ci.claims {
		taken[cl.slot] = true
	}
	foreign := map[uint32]bool{}
	for _, other := range c.classOrder {
		if other == ci {
			continue
		}
		for _, cl := range other.claims {
			if slices.Contains(pair[:], cl.peers[0]) || slices.Contains(pair[:], cl.peers[1]) {
				foreign[cl.vni()] = true
			}
		}
	}
	for s := int32(0); ci.slotFits(s) && vniFits(ci.vni, s); s++ {
		if taken[s] || foreign[ci.vni+uint32(s)] {
			continue
		}
		cl := &claim{class: ci, peers: pair, slot: s, ends: map[string]int32{}}
		ci.claims[cl.key()] = cl
		return cl
	}
	if !slices.Contains(ci.exhausted, pairKey(pair)) {
		ci.exhausted = append(ci.exhausted, pairKey(pair))
	}
	return nil
}

func (c *compiler) useTable(node string, t int32) {
	if c.tables[node] == nil {
		c.tables[node] = map[int32]bool{}
	}
	c.tables[node][t] = true
}

// freeTable takes the smallest routing table of the setting's range that no claim of any
// class uses on the node; false when the node holds as many return paths as the setting
// allows.
func (c *compiler) freeTable(node string) (int32, bool) {
	for t := int64(c.marking.FirstTable); c.marking.holds(int32(t)); t++ {
		if !c.tables[node][int32(t)] {
			c.useTable(node, int32(t))
			return int32(t), true
		}
	}
	return 0, false
}
