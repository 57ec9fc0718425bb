package datapath

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

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

// wantLink is a validated Link entry.
type wantLink struct {
	name    string
	vni     int
	port    int
	local   net.IP
	remote  net.IP
	address *net.IPNet
	mtu     int
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
	return w, nil
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
// encapsulation differs, MTU, address, up state and rp_filter corrected one by one.
func (d *Datapath) syncLink(w *wantLink, changes *int) error {
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
	}
	if l.Attrs().MTU != w.mtu {
		if err := d.nl.LinkSetMTU(l, w.mtu); err != nil {
			return fmt.Errorf("set mtu: %w", err)
		}
		*changes++
	}
	addrs, err := d.nl.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	have := false
	for _, a := range addrs {
		if a.IPNet.String() == w.address.String() {
			have = true
			continue
		}
		if err := d.nl.AddrDel(l, &a); err != nil {
			return fmt.Errorf("delete address %s: %w", a.IPNet, err)
		}
		*changes++
	}
	if !have {
		if err := d.nl.AddrAdd(l, &netlink.Addr{IPNet: w.address}); err != nil {
			return fmt.Errorf("add address %s: %w", w.address, err)
		}
		*changes++
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
