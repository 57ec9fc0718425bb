package datapath

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Watching for drift. The kernel notifies every change of links, addresses, routes, ip rules
// and nftables objects to the sockets that joined the matching multicast group, whoever made
// it. Watch keeps one rtnetlink and one nfnetlink socket open in the datapath's namespace,
// reads only the few bytes that say whether a notification names something kuport owns, and
// signals the owner of the Datapath, who re-applies its program: Apply then finds and repairs
// what differs, as a periodic resync would, only sooner.

// watchDebounce gathers a burst into one signal: a firewall reload or `nft flush ruleset`
// is many notifications within a few milliseconds, and a signal per notification would
// only queue Applies that find nothing left to do.
const watchDebounce = 150 * time.Millisecond

// watchReadBuffer is the receive buffer asked for each watch socket. A transaction that
// writes thousands of elements notifies each one; when the buffer still overflows, the
// kernel drops notifications and says so (ENOBUFS), which Watch takes as a change.
const watchReadBuffer = 4 << 20

// Watch starts watching the datapath's namespace for changes to what it owns: table ip
// kuport (any table, chain, rule, set or element notification naming it), kup-* devices and
// their addresses, ip rules at prefs 101 and 102, and routes in the tables the last Apply
// synced. The returned channel receives a value watchDebounce (150 ms) after the first such
// notification of a burst; one value is buffered, so a burst during an Apply is one more
// Apply. Notifications of anything else are read and dropped, so another program's tables,
// devices, rules and routes never cause a signal; Apply's own writes are notified like any
// other, and the Apply they cause finds the kernel as it wrote it and writes nothing.
// Notifications lost to a full socket buffer count as a change. While a watch runs, an Apply
// whose program changes table entries but names the links and return paths the last read of
// them found, with no notification of them since, does not read them again (Apply). Watch only
// reads: it never writes to the kernel. The sockets close when ctx ends; the channel is never closed. A
// failed socket stops the watch (logged at warn level), not the datapath.
func (d *Datapath) Watch(ctx context.Context) (<-chan struct{}, error) {
	route, err := d.dialWatch(unix.NETLINK_ROUTE, unix.RTNLGRP_LINK, unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV4_RULE,
		unix.RTNLGRP_IPV6_IFADDR, unix.RTNLGRP_IPV6_ROUTE, unix.RTNLGRP_IPV6_RULE)
	if err != nil {
		return nil, fmt.Errorf("watch rtnetlink: %w", err)
	}
	nft, err := d.dialWatch(unix.NETLINK_NETFILTER, unix.NFNLGRP_NFTABLES)
	if err != nil {
		_ = route.Close()
		return nil, fmt.Errorf("watch nftables: %w", err)
	}
	out := make(chan struct{}, 1)
	db := &debouncer{out: out, log: d.log}
	go func() {
		<-ctx.Done()
		_ = route.Close()
		_ = nft.Close()
	}()
	// While this watch reads, Apply may skip reading links and return paths when nothing
	// of theirs was notified (datapath.go, netUnchanged): every owned notification, a lost
	// burst and the watch's end count.
	d.netWatches.Add(1)
	noted := func(what string) {
		d.netNotes.Add(1)
		db.note(what)
	}
	go func() {
		d.readWatch(ctx, "rtnetlink", route, d.ownedRoute, noted)
		d.netNotes.Add(1)
		d.netWatches.Add(-1)
	}()
	go d.readWatch(ctx, "nftables", nft, ownedNFT, db.note)
	return out, nil
}

// dialWatch opens a netlink socket of family in the datapath's namespace joined to groups.
func (d *Datapath) dialWatch(family int, groups ...uint32) (*netlink.Conn, error) {
	var mask uint32
	for _, g := range groups {
		mask |= 1 << (g - 1)
	}
	c, err := netlink.Dial(family, &netlink.Config{Groups: mask, NetNS: max(int(d.netns), 0)})
	if err != nil {
		return nil, err
	}
	// SO_RCVBUFFORCE needs CAP_NET_ADMIN, which the datapath has; without it the kernel caps
	// the size at net.core.rmem_max, and ENOBUFS covers what overflows.
	if rc, err := c.SyscallConn(); err == nil {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, watchReadBuffer)
		}); err != nil || serr != nil {
			_ = c.SetReadBuffer(watchReadBuffer)
		}
	}
	return c, nil
}

// readWatch reads c until ctx ends or the socket fails, calling changed with a description
// of each notification owned returns one for.
func (d *Datapath) readWatch(ctx context.Context, what string, c *netlink.Conn, owned func(netlink.Message) string, changed func(string)) {
	for {
		msgs, err := c.Receive()
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, unix.ENOBUFS):
			changed(what + " notifications lost")
			continue
		case err != nil:
			d.log.Warn("watching the kernel stopped; only the periodic resync repairs now", "socket", what, "error", err)
			return
		}
		for _, m := range msgs {
			if o := owned(m); o != "" {
				changed(o)
			}
		}
	}
}

// ownedRoute describes an rtnetlink notification of a kup-* device or an address on one, an
// IPv4 or IPv6 ip rule of kuport's protocol, or a route in one of the tables the last Apply
// synced; "" for any other.
func (d *Datapath) ownedRoute(m netlink.Message) string {
	switch m.Header.Type {
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		if name := stringAttr(m.Data, unix.SizeofIfInfomsg, unix.IFLA_IFNAME); strings.HasPrefix(name, linkPrefix) {
			return "device " + name
		}
	case unix.RTM_NEWADDR, unix.RTM_DELADDR:
		// An IPv4 address's label is its device's name; an IPv6 address has none, and its
		// device is the ifaddrmsg's index.
		if name := stringAttr(m.Data, unix.SizeofIfAddrmsg, unix.IFA_LABEL); strings.HasPrefix(name, linkPrefix) {
			return "address of " + name
		}
		if len(m.Data) >= unix.SizeofIfAddrmsg && m.Data[0] == unix.AF_INET6 {
			index := binary.NativeEndian.Uint32(m.Data[4:8])
			if indexes := d.linkIndexes.Load(); indexes != nil && (*indexes)[int(index)] {
				return fmt.Sprintf("address of ifindex %d", index)
			}
		}
	case unix.RTM_NEWRULE, unix.RTM_DELRULE:
		// struct fib_rule_hdr is an rtmsg's size. kuport's rules carry its protocol, whatever
		// their pref (marks.go).
		if proto, ok := uint8Attr(m.Data, unix.SizeofRtMsg, unix.FRA_PROTOCOL); ok && proto == rtprotKuport {
			pref, _ := uint32Attr(m.Data, unix.SizeofRtMsg, unix.FRA_PRIORITY)
			return fmt.Sprintf("ip rule pref %d", pref)
		}
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
		if len(m.Data) < unix.SizeofRtMsg {
			return ""
		}
		table := uint32(m.Data[4]) // rtm_table; RTA_TABLE holds the whole number
		if t, ok := uint32Attr(m.Data, unix.SizeofRtMsg, unix.RTA_TABLE); ok {
			table = t
		}
		if tables := d.routeTables.Load(); tables != nil && (*tables)[int(table)] {
			return fmt.Sprintf("route in table %d", table)
		}
	}
	return ""
}

// ownedNFT describes an nftables notification of an object in table inet kuport; "" for any
// other. Every object notification carries its table's name as attribute 1
// (NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, NFTA_SET_TABLE,
// NFTA_SET_ELEM_LIST_TABLE, NFTA_OBJ_TABLE, NFTA_FLOWTABLE_TABLE); the generation's, which
// ends each transaction, carries a number there.
func ownedNFT(m netlink.Message) string {
	if m.Header.Type>>8 != unix.NFNL_SUBSYS_NFTABLES || m.Header.Type&0xff == unix.NFT_MSG_NEWGEN ||
		len(m.Data) < 4 || m.Data[0] != byte(tableFamily) {
		return ""
	}
	if stringAttr(m.Data, 4, 1) == tableName {
		return "table " + tableFamilyName + " " + tableName
	}
	return ""
}

// stringAttr is the string attribute typ after a header of size hdr ("" when absent).
func stringAttr(b []byte, hdr int, typ uint16) string {
	ad := attrs(b, hdr)
	for ad != nil && ad.Next() {
		if ad.Type() == typ {
			return ad.String()
		}
	}
	return ""
}

// uint32Attr is the native-endian 32-bit attribute typ after a header of size hdr.
func uint32Attr(b []byte, hdr int, typ uint16) (uint32, bool) {
	ad := attrs(b, hdr)
	for ad != nil && ad.Next() {
		if ad.Type() == typ && len(ad.Bytes()) == 4 {
			return ad.Uint32(), true
		}
	}
	return 0, false
}

func uint8Attr(b []byte, hdr int, typ uint16) (uint8, bool) {
	ad := attrs(b, hdr)
	for ad != nil && ad.Next() {
		if ad.Type() == typ && len(ad.Bytes()) == 1 {
			return ad.Uint8(), true
		}
	}
	return 0, false
}

func attrs(b []byte, hdr int) *netlink.AttributeDecoder {
	if len(b) < hdr {
		return nil
	}
	ad, err := netlink.NewAttributeDecoder(b[hdr:])
	if err != nil {
		return nil
	}
	return ad
}

// debouncer sends one value on out watchDebounce after the first note of a burst.
type debouncer struct {
	out chan<- struct{}
	log hclog.Logger

	mu      sync.Mutex
	pending bool
	first   string
}

func (b *debouncer) note(what string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pending {
		return
	}
	b.pending, b.first = true, what
	time.AfterFunc(watchDebounce, b.fire)
}

func (b *debouncer) fire() {
	b.mu.Lock()
	first := b.first
	b.pending = false
	b.mu.Unlock()
	b.log.Debug("kernel state kuport owns changed", "first", first)
	select {
	case b.out <- struct{}{}:
	default:
	}
}
