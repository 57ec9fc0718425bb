package datapath

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Config injects the kernel a Datapath works on. Every field points at the same network
// namespace: the node's own, or a test's.
type Config struct {
	// NFT is the nftables connection: nftables.New with nftables.AsLasting and
	// NFTSocketOption (and nftables.WithNetNSFd for another namespace). Lasting matters: a
	// connection that is not opens a socket per call, and closing a nftables socket after a
	// transaction that deleted an element waits for the kernel to release it, far longer
	// than the transaction itself, so every change that removes or retargets a mapping
	// would wait that long (BENCHMARKS.md, "Figures moved out of code comments").
	NFT *nftables.Conn
	// Netlink is the netlink handle (netlink.NewHandle, or netlink.NewHandleAt), with the
	// NETLINK_ROUTE and NETLINK_NETFILTER (conntrack) families, as it has when created
	// without a family list.
	Netlink *netlink.Handle
	// NetNS is the namespace of Netlink, where the datapath opens the rtnetlink sockets of
	// its own requests (rp_filter and ip_forward, devconf.go); netns.None() (or any handle
	// <= 0) means the calling process's own namespace, which no setns enters.
	NetNS netns.NsHandle
	// Log receives every kernel write at trace level and a summary per Apply at debug
	// level; nil discards.
	Log hclog.Logger
	// SweepDelay puts off the deletion of the conntrack entries a change of the DNAT rules
	// left going the old way (conntrack.go) by this long after the Apply that made the change,
	// so that the changes of Applies arriving back to back (a thousand mappings deleted at
	// once) are swept together, in one read of the conntrack table; Apply then returns once
	// the kernel holds the program. Zero sweeps in every Apply, before it returns.
	SweepDelay time.Duration
}

// Datapath applies NodePrograms to one namespace's kernel and reads its state back. Its
// methods are safe for concurrent use; they are serialised, Counters giving way to the others.
type Datapath struct {
	mu    sync.Mutex
	nft   nftConn
	nl    netlinkHandle
	own   ownSockets
	netns netns.NsHandle
	log   hclog.Logger
	// counting serialises Counters, which reads the kernel's elements through counterSocket
	// and drains a dump it stopped without holding mu; waiting is the number of callers
	// waiting for mu, for whom Counters gives way, and turn orders the next Counters after
	// them (counters.go).
	counting      sync.Mutex
	counterSocket ownSockets
	waiting       atomic.Int32
	turn          sync.Mutex
	// lastChanges is the number of kernel writes the last Apply made (0 when the kernel
	// already held the program).
	lastChanges int
	// lastInKernel is how long the last Apply took until the kernel held its program (its
	// nftables transaction committed, its links and return paths synced), before the
	// conntrack sweep.
	lastInKernel time.Duration
	// lastPlanned is how long the last Apply took to plan its program (logged as
	// compile_us), the first part of lastInKernel.
	lastPlanned time.Duration
	// sweepDelay is Config.SweepDelay; swept is what its timer, when armed, deletes
	// (conntrack.go).
	sweepDelay time.Duration
	swept      putOffSweep
	// known is the table the kernel holds as of a ruleset generation (gen.go, sync.go), and
	// planned the last plan (incremental.go).
	known   *known
	planned planner
	// legacyTable: the last whole read found table ip kuport, an earlier agent's, which the
	// next write of the table deletes (nftwrite.go).
	legacyTable bool
	// routeTables are the routing tables the last Apply synced (the program's and those
	// its band's rules pointed at), read by Watch without the lock (watch.go).
	routeTables atomic.Pointer[map[int]bool]
	// linkIndexes are the ifindexes of the kup-* devices the last sync of links found or
	// made, read by Watch without the lock: an IPv6 address's notification names its device
	// by index alone (watch.go).
	linkIndexes atomic.Pointer[map[int]bool]
	// netWatches is the number of live rtnetlink watches, and netNotes the number of
	// notifications of devices, ip rules and routes kuport owns they read (a lost burst or a
	// watch that stopped counts as one), both written by Watch (watch.go); netKnown is the
	// links and return paths the last whole read of them found as the program wanted, while
	// netNotes stays as it was when that read began (nil: unknown).
	netWatches atomic.Int32
	netNotes   atomic.Uint64
	netKnown   *netKnown
}

// netKnown is what the kernel's kup-* devices, ip rules and routes held after a sync of
// links and return paths that found or made them as wanted, as of notes notifications.
type netKnown struct {
	links   []*kuportv1.Link
	returns []*kuportv1.ReturnPath
	marking *kuportv1.ReturnMarking
	notes   uint64
}

// New returns a Datapath over the injected kernel handles; it opens nothing itself.
func New(cfg Config) *Datapath {
	log := cfg.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	ns := cfg.NetNS
	if ns <= 0 {
		ns = netns.None()
	}
	return &Datapath{nft: cfg.NFT, nl: cfg.Netlink, own: &sockets{netns: ns, log: log}, counterSocket: &sockets{netns: ns, log: log},
		netns: ns, log: log, sweepDelay: cfg.SweepDelay}
}

// EntryError is the failure of one program entry. Kind is "dnat", "snat", "mark", "link",
// "return path" or "ip rule"; ID is the entry's id (a Link's name, or a stale ip rule's
// text for "ip rule").
type EntryError struct {
	Kind string
	ID   string
	Err  error
}

func (e *EntryError) Error() string { return fmt.Sprintf("%s %s: %v", e.Kind, e.ID, e.Err) }

func (e *EntryError) Unwrap() error { return e.Err }

// EntryErrors flattens an error returned by Apply into the per-entry errors an Ack
// carries: one per *EntryError, and one with an empty id for a failure that belongs to no
// entry (reading the kernel, say). nil for a nil error.
func EntryErrors(err error) []*kuportv1.EntryError {
	if err == nil {
		return nil
	}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		var out []*kuportv1.EntryError
		for _, e := range joined.Unwrap() {
			out = append(out, EntryErrors(e)...)
		}
		return out
	}
	var ee *EntryError
	if errors.As(err, &ee) {
		return []*kuportv1.EntryError{{Id: ee.ID, Message: err.Error()}}
	}
	return []*kuportv1.EntryError{{Message: err.Error()}}
}

// Apply reconciles the kernel to the program: it reads what the kernel holds and changes
// only what differs, so re-applying the program the kernel holds writes nothing (rule
// handles, counters and device indexes stay). The nftables table is rewritten in one
// transaction; links are set up before the routes that use them, and stale ip rules and
// routes are removed before stale links. While a watch runs (Watch), an Apply that changes
// table entries but names the links and return paths the last read of them found, with no
// notification of them since, reads none of them again; a resync of the same program always
// reads and repairs them. The program is then in the kernel (the debug log's in_kernel_us).
// When the DNAT rules change, the conntrack entries of flows that still go the old way (to a
// target no rule names any more, or un-NATed past a UDP rule added now; conntrack.go) are
// deleted last, so the flows' next packets take the new rules; Apply returns after that, or,
// with Config.SweepDelay, as soon as the kernel holds the program, the entries deleted that
// long after it together with those of the Applies since. An invalid or failing entry does
// not stop the others: the returned error joins one *EntryError per failed entry (see
// EntryErrors).
//
// The Datapath keeps p's entries to compare the next program with (incremental.go): p must
// not be modified after the call (apply a changed copy, proto.Clone).
func (d *Datapath) Apply(p *kuportv1.NodeProgram) error {
	d.lock()
	defer d.mu.Unlock()
	changes := 0
	start := time.Now()
	err := d.apply(p, &changes, start)
	d.lastChanges = changes
	// Writes are news: a new program's, or a repair of what someone else changed in the
	// kernel (the agent re-applies the same program on every resync).
	log := d.log.Debug
	if changes > 0 {
		log = d.log.Info
	}
	log("applied program", "node", p.GetNode(), "version", p.GetVersion(), "kernel_writes", changes,
		"compile_us", d.lastPlanned.Microseconds(), "in_kernel_us", d.lastInKernel.Microseconds(), "took_us", time.Since(start).Microseconds())
	return err
}

func (d *Datapath) apply(p *kuportv1.NodeProgram, changes *int, start time.Time) error {
	want, errs := d.plan(p)
	d.lastPlanned = time.Since(start)
	// The program's table entries differ from what the kernel was last known to hold: not
	// a resync of the same program (which reads and repairs everything).
	entriesChanged := len(d.planned.dirty) > 0 || d.known == nil || d.known.t != want
	stale, err := d.syncTable(want, changes)
	if err != nil {
		errs = append(errs, err)
	}
	if entriesChanged && d.netUnchanged(p) {
		d.log.Trace("links and return paths as last read, no notification since: not read")
	} else {
		errs = append(errs, d.syncNet(p, changes)...)
	}
	d.lastInKernel = time.Since(start)
	// Last, so a flow's next packet finds the links and routes its new target needs: the
	// flows that still go the old way, when kup-pre's maps changed.
	if err == nil {
		d.sweep(stale, want)
	}
	return errors.Join(errs...)
}

// netUnchanged reports whether the kernel's links and return paths are known to be p's: p
// names the same ones as the last whole read of them found or made, and a watch has seen
// no notification of kuport's devices, ip rules or routes since that read began.
func (d *Datapath) netUnchanged(p *kuportv1.NodeProgram) bool {
	k := d.netKnown
	return k != nil && d.netWatches.Load() > 0 && d.netNotes.Load() == k.notes && sameNet(k.links, k.returns, k.marking, p)
}

// syncNet reads and reconciles the kup-* devices, ip rules and routes to p's links and
// return paths, and records them as known when all succeeded under a live watch.
func (d *Datapath) syncNet(p *kuportv1.NodeProgram, changes *int) []error {
	d.netKnown = nil
	notes, watched := d.netNotes.Load(), d.netWatches.Load() > 0
	// Links and return paths that fail validation are reported and left out (Validate).
	links, returns, errs := planLinks(p)
	keep := map[string]bool{}
	for _, l := range p.GetLinks() {
		keep[l.GetName()] = true
	}
	indexes := map[int]bool{}
	for _, w := range links {
		if err := d.syncLink(w, indexes, changes); err != nil {
			errs = append(errs, &EntryError{Kind: "link", ID: w.name, Err: err})
		}
	}
	d.linkIndexes.Store(&indexes)
	errs = append(errs, d.syncReturnPaths(returns, changes)...)
	errs = append(errs, d.pruneLinks(keep, changes)...)
	if len(errs) == 0 && watched {
		d.netKnown = &netKnown{links: p.GetLinks(), returns: p.GetReturnPaths(), marking: p.GetReturnMarking(), notes: notes}
	}
	return errs
}

// Cleanup removes everything kuport made in the namespace: table ip kuport, every kup-*
// device, the ip rules at prefs 101/102 and the routes of the kuport tables they point
// at, and the conntrack entries of flows kuport's DNAT rules translated, those of sweeps put
// off included (Config.SweepDelay), before it returns. Nothing else is touched. It is Apply
// of an empty program.
func (d *Datapath) Cleanup() error {
	err := d.Apply(&kuportv1.NodeProgram{})
	d.SweepNow()
	return err
}

// Dump returns the kernel's table ip kuport in Render's form ("" when there is no table):
// what `nft list table ip kuport` prints with counters normalised and elements sorted, read
// through the nftables library. A set, chain or rule in no kuport form appears as a "# ..."
// line.
func (d *Datapath) Dump() (string, error) {
	d.lock()
	defer d.mu.Unlock()
	kt, err := d.readKernel()
	if err != nil || kt == nil {
		return "", err
	}
	return kt.text(), nil
}

// NodeState reports every interface (name, IPv4 addresses and global IPv6 addresses in kernel
// order, MTU, for a vxlan or geneve device its UDP port, and whether it is a netkit device),
// the underlay interface name and whether net.ipv4.ip_forward and
// net.ipv6.conf.all.forwarding are 1. An empty underlay is resolved to the device of the
// main table's IPv4 default route ("" when there is none). It reads only.
func (d *Datapath) NodeState(underlay string) (*kuportv1.NodeState, error) {
	d.lock()
	defer d.mu.Unlock()
	links, err := d.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list devices: %w", err)
	}
	st := &kuportv1.NodeState{UnderlayInterface: underlay}
	names := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		names[a.Index] = a.Name
		addrs, err := d.nl.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return nil, fmt.Errorf("list addresses of %s: %w", a.Name, err)
		}
		itf := &kuportv1.Interface{Name: a.Name, Mtu: uint32(a.MTU)}
		itf.Tunnel, itf.UdpPort = tunnelOf(l)
		_, itf.Netkit = l.(*netlink.Netkit)
		for _, ad := range addrs {
			itf.Addresses = append(itf.Addresses, ad.IP.String())
		}
		addrs6, err := d.nl.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			return nil, fmt.Errorf("list IPv6 addresses of %s: %w", a.Name, err)
		}
		for _, ad := range addrs6 {
			// Global and settled only: a tentative address may still fail duplicate address
			// detection, and a deprecated one takes no new flows.
			if ad.IP.To4() == nil && ad.IP.IsGlobalUnicast() && ad.Scope == unix.RT_SCOPE_UNIVERSE &&
				ad.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DEPRECATED|unix.IFA_F_DADFAILED) == 0 {
				itf.Addresses6 = append(itf.Addresses6, ad.IP.String())
			}
		}
		st.Interfaces = append(st.Interfaces, itf)
	}
	if underlay == "" {
		routes, err := d.nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("list main routes: %w", err)
		}
		for _, r := range routes {
			if isDefault(r.Dst) {
				st.UnderlayInterface = names[r.LinkIndex]
				break
			}
		}
	}
	if st.IpForward, err = d.own.ipForward(); err != nil {
		return nil, err
	}
	// Read from /proc/sys, which the agent's read-only mount still lets it read: the
	// rtnetlink netconf read (devconf.go) asks IPv4's settings. It is the process's namespace's
	// setting, the node's own as the agent is deployed. A kernel without IPv6 has no such
	// file, and any failure to read it means the node serves no IPv6.
	b, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/forwarding")
	st.Ipv6Forward = err == nil && strings.TrimSpace(string(b)) == "1"
	return st, nil
}

// tunnelOf is a device's UDP encapsulation and port: the controller checks a class's vxlan
// port against the CNI's tunnels with it. A WireGuard device's listen port is not read: it
// needs a generic netlink client (wgctrl) this module does not depend on.
func tunnelOf(l netlink.Link) (kuportv1.TunnelKind, uint32) {
	switch t := l.(type) {
	case *netlink.Vxlan:
		return kuportv1.TunnelKind_TUNNEL_KIND_VXLAN, uint32(t.Port)
	case *netlink.Geneve:
		return kuportv1.TunnelKind_TUNNEL_KIND_GENEVE, uint32(t.Dport)
	}
	return kuportv1.TunnelKind_TUNNEL_KIND_UNSPECIFIED, 0
}

func isDefault(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0
}
