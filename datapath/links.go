package datapath

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// linkPrefix names every device kuport owns.
const linkPrefix = "kup-"

// linkTTL is the outer TTL of the encapsulation (docs/design/datapath.md#the-link-device).
const linkTTL = 64

// rpFilterLoose is the rp_filter value set on each link: the kernel uses max(all, device),
// and strict (1) drops the decapsulated request after DNAT
// (docs/design/datapath.md#the-link-device).
const rpFilterLoose = 2

// ipv6MinMTU is the smallest MTU IPv6 runs on (RFC 8200); the kernel drops a device's
// IPv6 below it.
const ipv6MinMTU = 1280

// tooSmall6 says why a link of this MTU carries no IPv6 (nil: it can). Not a validation
// error: the kernel itself keeps such a device IPv4 only, and the link's IPv4 side is still
// wanted.
func tooSmall6(mtu int) error {
	if mtu < ipv6MinMTU {
		return fmt.Errorf("mtu %d is below IPv6's minimum %d", mtu, ipv6MinMTU)
	}
	return nil
}

// wantLink is a validated Link entry.
type wantLink struct {
	name    string
	vni     int
	port    int
	local   net.IP
	remote  net.IP
	address *net.IPNet
	// address6 is this end of the /127 (nil: the link carries IPv4 only); no6 says why a
	// link that names one carries IPv4 only, an error Apply reports without failing the
	// link (docs/design/datapath.md#ipv6-on-the-link).
	address6 *net.IPNet
	no6      error
	// linkLocal6 is the device's link-local address when it carries IPv6 (linkLocalOf).
	linkLocal6 *net.IPNet
	mtu        int
	// mac is the address a new device gets (nil: the kernel's choice).
	mac net.HardwareAddr
	// srcLow and srcHigh are the outer UDP source ports, high exclusive (both 0: the
	// node's local port range).
	srcLow, srcHigh int
}

func planLink(l *kuportv1.Link) (*wantLink, error) {
	w := &wantLink{name: l.GetName(), vni: int(l.GetVni()), port: int(l.GetPort()), mtu: int(l.GetMtu()),
		srcLow: int(l.GetSourcePortLow()), srcHigh: int(l.GetSourcePortHigh())}
	if err := checkIfname(w.name); err != nil || !strings.HasPrefix(w.name, linkPrefix) {
		return nil, fmt.Errorf("name %q is not a %s* device name", w.name, linkPrefix)
	}
	if w.vni < 1 || w.vni >= 1<<24 {
		return nil, fmt.Errorf("vni %d is outside 1-16777215", w.vni)
	}
	if w.port < 1 || w.port > 65535 {
		return nil, fmt.Errorf("port %d is outside 1-65535", w.port)
	}
	if w.mtu < 68 {
		return nil, fmt.Errorf("mtu %d is below 68", w.mtu)
	}
	if (w.srcLow != 0 || w.srcHigh != 0) && (w.srcLow < 1 || w.srcLow >= w.srcHigh || w.srcHigh > 65535) {
		return nil, fmt.Errorf("source ports %d-%d are not 1 <= low < high <= 65535", w.srcLow, w.srcHigh)
	}
	if m := l.GetMac(); m != "" {
		mac, err := net.ParseMAC(m)
		if err != nil || len(mac) != 6 || mac[0]&1 != 0 || bytes.Equal(mac, make([]byte, 6)) {
			return nil, fmt.Errorf("mac %q is not a unicast Ethernet address", m)
		}
		w.mac = mac
	}
	for _, f := range []struct {
		field, value string
		dst          *net.IP
	}{{"local_underlay", l.GetLocalUnderlay(), &w.local}, {"remote_underlay", l.GetRemoteUnderlay(), &w.remote}, {"local_address", l.GetLocalAddress(), nil}} {
		a, err := ipv4(f.field, f.value)
		if err != nil {
			return nil, err
		}
		if f.dst != nil {
			*f.dst = net.IP(a.AsSlice())
		} else {
			w.address = &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(31, 32)}
		}
	}
	local6, peer6 := l.GetLocalAddress6(), l.GetPeerAddress6()
	if local6 == "" && peer6 == "" {
		return w, nil
	}
	a, err := linkEnds6(local6, peer6)
	if err != nil {
		return nil, err
	}
	w.address6 = &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(127, 128)}
	w.linkLocal6 = linkLocalOf(w.address.IP)
	if err := tooSmall6(w.mtu); err != nil {
		w.address6, w.linkLocal6, w.no6 = nil, nil, fmt.Errorf("%w: the link carries IPv4 only", err)
	}
	return w, nil
}

// linkLocalOf is the link-local address of the link end whose /31 address is end:
// fe80::26b:0:<end> (02:6b, kuport's byte, as in its link-layer addresses). The kernel
// resolves the next hop of a forwarded packet only from a link-local address of the device
// (ndisc_send_ns without a source of the packet's own), so a link carrying IPv6 needs one;
// a fixed one, added without duplicate address detection, is usable at once and the same
// after the device is recreated, where the kernel's would be tentative for a second.
func linkLocalOf(end net.IP) *net.IPNet {
	b := [16]byte{0: 0xfe, 1: 0x80, 8: 0x02, 9: 0x6b}
	copy(b[12:], end.To4())
	return &net.IPNet{IP: net.IP(b[:]), Mask: net.CIDRMask(64, 128)}
}

// linkEnds6 parses the ends of a link's /127: two IPv6 addresses (not IPv4-mapped) that
// differ in the last bit only. It returns the local one.
func linkEnds6(local, peer string) (netip.Addr, error) {
	var ends [2]netip.Addr
	for i, f := range []struct{ field, value string }{{"local_address6", local}, {"peer_address6", peer}} {
		a, err := netip.ParseAddr(f.value)
		if err != nil || !a.Is6() || a.Is4In6() || a.Zone() != "" {
			return netip.Addr{}, fmt.Errorf("%s %q is not an IPv6 address", f.field, f.value)
		}
		ends[i] = a
	}
	if p, _ := ends[0].Prefix(127); ends[0] == ends[1] || !p.Contains(ends[1]) {
		return netip.Addr{}, fmt.Errorf("local_address6 %s and peer_address6 %s are not the two ends of a /127", ends[0], ends[1])
	}
	return ends[0], nil
}

// vxlan is the device the link wants: the UDP checksum on, as an underlay that coalesces
// the outer datagrams before the kernel sees them (wireguard-go's) merges none whose
// checksum is zero, and learning on (docs/design/datapath.md#the-link-device).
func (w *wantLink) vxlan() *netlink.Vxlan {
	return &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: w.name, MTU: w.mtu, HardwareAddr: w.mac},
		VxlanId:   w.vni, SrcAddr: w.local, Group: w.remote, Port: w.port, TTL: linkTTL,
		PortLow: w.srcLow, PortHigh: w.srcHigh, Learning: true, UDPCSum: true,
	}
}

// vxlanMatches reports whether an existing device has the encapsulation the link wants;
// the kernel refuses to change most of these attributes in place (VNI, port, source ports,
// checksum), and a new remote would leave learned entries on the old one, so any mismatch
// replaces the device. Source ports match too when either side has none: a device an agent
// made before them keeps the kernel's, as it keeps its link-layer address, and a program
// without them (an older controller's) keeps the device's, so neither an upgrade nor a
// rollback recreates a link (docs/design/datapath.md#the-link-device).
func (w *wantLink) vxlanMatches(l netlink.Link) bool {
	v, ok := l.(*netlink.Vxlan)
	if !ok {
		return false
	}
	want := w.vxlan()
	ports := v.PortLow == want.PortLow && v.PortHigh == want.PortHigh ||
		v.PortLow == 0 && v.PortHigh == 0 || want.PortLow == 0 && want.PortHigh == 0
	return v.VxlanId == want.VxlanId && v.Port == want.Port && v.TTL == want.TTL &&
		v.SrcAddr.Equal(want.SrcAddr) && v.Group.Equal(want.Group) && v.VtepDevIndex == 0 &&
		ports && v.Learning == want.Learning && v.UDPCSum == want.UDPCSum
}

// syncLink makes one device match the program: created when missing, replaced when its
// encapsulation differs, MTU, addresses, up state and rp_filter corrected one by one, and
// adds its ifindex to indexes. A failure of the IPv6 side alone is returned after the rest
// is done, so it never keeps the link from carrying IPv4.
func (d *Datapath) syncLink(w *wantLink, indexes map[int]bool, changes *int) error {
	l, err := d.nl.LinkByName(w.name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		l = nil
	case err != nil:
		return fmt.Errorf("read device: %w", err)
	case !w.vxlanMatches(l):
		d.log.Trace("replace link", "name", w.name)
		if err := d.nl.LinkDel(l); err != nil {
			return fmt.Errorf("delete device to replace it: %w", err)
		}
		*changes++
		l = nil
	}
	var err6 error
	if l == nil {
		d.log.Trace("add link", "name", w.name, "vni", w.vni)
		// A device that already exists keeps its address: changing it would leave the peer's
		// neighbor entry for this end pointing at the old one until it is probed again.
		if err := d.nl.LinkAdd(w.vxlan()); err != nil {
			return fmt.Errorf("add vxlan device: %w", err)
		}
		*changes++
		if l, err = d.nl.LinkByName(w.name); err != nil {
			return fmt.Errorf("read added device: %w", err)
		}
		// Before the device is first up, so the kernel generates no link-local address of
		// its own, which would be tentative for a second: the link's is linkLocalOf's
		// (docs/design/datapath.md#ipv6-on-the-link).
		if w.address6 != nil {
			if err := d.nl.LinkSetIP6AddrGenMode(l, nl.IN6_ADDR_GEN_MODE_NONE); err != nil {
				err6 = fmt.Errorf("set addrgenmode none: %w", err)
			} else {
				*changes++
			}
		}
	}
	indexes[l.Attrs().Index] = true
	if l.Attrs().MTU != w.mtu {
		if err := d.nl.LinkSetMTU(l, w.mtu); err != nil {
			return fmt.Errorf("set mtu: %w", err)
		}
		*changes++
	}
	addrs, err := d.nl.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	// linkLocal is kuport's link-local address when the device has it: not the kernel's,
	// which a device made before IPv6 may have.
	var addrs4, addrs6, linkLocal []netlink.Addr
	ours := linkLocalOf(w.address.IP)
	for _, a := range addrs {
		switch {
		case a.IP.To4() != nil:
			addrs4 = append(addrs4, a)
		case a.IP.IsLinkLocalUnicast():
			if a.IPNet.String() == ours.String() {
				linkLocal = append(linkLocal, a)
			}
		default:
			addrs6 = append(addrs6, a)
		}
	}
	if err := d.syncAddress(l, addrs4, w.address, changes); err != nil {
		return err
	}
	err = d.syncAddress(l, addrs6, w.address6, changes)
	if err == nil {
		err = d.syncAddress(l, linkLocal, w.linkLocal6, changes)
	}
	if err != nil && err6 == nil {
		err6 = err
		if errors.Is(err, unix.EACCES) {
			err6 = fmt.Errorf("%w (net.ipv6.conf.%s.disable_ipv6 is 1; a new device takes net.ipv6.conf.default's)", err, w.name)
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := d.nl.LinkSetUp(l); err != nil {
			return fmt.Errorf("set up: %w", err)
		}
		*changes++
	}
	v, err := d.own.rpFilter(l.Attrs().Index)
	if err != nil {
		return err
	}
	if v != rpFilterLoose {
		if err := d.own.setRPFilter(l.Attrs().Index, rpFilterLoose); err != nil {
			return err
		}
		*changes++
	}
	if err6 == nil {
		err6 = w.no6
	}
	if err6 != nil {
		return fmt.Errorf("IPv6: %w", err6)
	}
	return nil
}

// syncAddress makes want (nil: none) the only one of have, the device's addresses of one
// family, leaving link-local ones aside. An IPv6 address is added without duplicate address
// detection: the /127's other end is the peer's, and detection would hold the address back
// for a second or more after every creation (docs/design/datapath.md#ipv6-on-the-link).
func (d *Datapath) syncAddress(l netlink.Link, have []netlink.Addr, want *net.IPNet, changes *int) error {
	found := false
	for _, a := range have {
		if want != nil && !found && a.IPNet.String() == want.String() {
			found = true
			continue
		}
		if err := d.nl.AddrDel(l, &a); err != nil {
			return fmt.Errorf("delete address %s: %w", a.IPNet, err)
		}
		*changes++
	}
	if want == nil || found {
		return nil
	}
	a := &netlink.Addr{IPNet: want}
	if want.IP.To4() == nil {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := d.nl.AddrAdd(l, a); err != nil {
		return fmt.Errorf("add address %s: %w", want, err)
	}
	*changes++
	return nil
}

// ownedLinks lists the devices named kup-*.
func (d *Datapath) ownedLinks() ([]netlink.Link, error) {
	all, err := d.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list devices: %w", err)
	}
	var owned []netlink.Link
	for _, l := range all {
		if strings.HasPrefix(l.Attrs().Name, linkPrefix) {
			owned = append(owned, l)
		}
	}
	slices.SortFunc(owned, func(a, b netlink.Link) int { return strings.Compare(a.Attrs().Name, b.Attrs().Name) })
	return owned, nil
}

// pruneLinks deletes every kup-* device the program does not name.
func (d *Datapath) pruneLinks(keep map[string]bool, changes *int) []error {
	owned, err := d.ownedLinks()
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, l := range owned {
		name := l.Attrs().Name
		if keep[name] {
			continue
		}
		d.log.Trace("delete link", "name", name)
		if err := d.nl.LinkDel(l); err != nil && !isNotFound(err) {
			errs = append(errs, &EntryError{Kind: "link", ID: name, Err: fmt.Errorf("delete device: %w", err)})
			continue
		}
		*changes++
	}
	return errs
}

// LinkStats returns the kernel statistics of every kup-* device, by name.
func (d *Datapath) LinkStats() ([]*kuportv1.LinkStats, error) {
	d.lock()
	defer d.mu.Unlock()
	owned, err := d.ownedLinks()
	if err != nil {
		return nil, err
	}
	stats := make([]*kuportv1.LinkStats, 0, len(owned))
	for _, l := range owned {
		s := &kuportv1.LinkStats{Name: l.Attrs().Name}
		if st := l.Attrs().Statistics; st != nil {
			s.TxPackets, s.RxPackets, s.TxErrors, s.RxErrors = st.TxPackets, st.RxPackets, st.TxErrors, st.RxErrors
		}
		stats = append(stats, s)
	}
	return stats, nil
}
