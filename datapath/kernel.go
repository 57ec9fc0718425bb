package datapath

import (
	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// The kernel a Datapath calls, as the narrow interfaces it calls it through: the calls of
// *nftables.Conn, of *netlink.Handle, and of the sockets it opens itself (devconf.go,
// gen.go). New fills them with Config's handles; an unprivileged test fills them with an
// in-memory fake (fake_test.go).

type nftConn interface {
	AddTable(t *nftables.Table) *nftables.Table
	DelTable(t *nftables.Table)
	AddChain(c *nftables.Chain) *nftables.Chain
	DelChain(c *nftables.Chain)
	AddSet(s *nftables.Set, vals []nftables.SetElement) error
	AddRule(r *nftables.Rule) *nftables.Rule
	FlushChain(c *nftables.Chain)
	// SetAddElements and SetDeleteElements encode vals when they queue them (as
	// google/nftables does): the caller may reuse vals and their bytes after the call.
	SetAddElements(s *nftables.Set, vals []nftables.SetElement) error
	SetDeleteElements(s *nftables.Set, vals []nftables.SetElement) error
	Flush() error
	ListTablesOfFamily(family nftables.TableFamily) ([]*nftables.Table, error)
	ListChainsOfTableFamily(family nftables.TableFamily) ([]*nftables.Chain, error)
	GetRules(t *nftables.Table, c *nftables.Chain) ([]*nftables.Rule, error)
	GetSets(t *nftables.Table) ([]*nftables.Set, error)
	GetSetElements(s *nftables.Set) ([]nftables.SetElement, error)
}

type netlinkHandle interface {
	LinkList() ([]netlink.Link, error)
	LinkByName(name string) (netlink.Link, error)
	LinkAdd(link netlink.Link) error
	LinkDel(link netlink.Link) error
	LinkSetMTU(link netlink.Link, mtu int) error
	LinkSetUp(link netlink.Link) error
	LinkSetIP6AddrGenMode(link netlink.Link, mode int) error
	AddrList(link netlink.Link, family int) ([]netlink.Addr, error)
	AddrAdd(link netlink.Link, addr *netlink.Addr) error
	AddrDel(link netlink.Link, addr *netlink.Addr) error
	RouteListFiltered(family int, filter *netlink.Route, filterMask uint64) ([]netlink.Route, error)
	RouteAdd(route *netlink.Route) error
	RouteDel(route *netlink.Route) error
	RuleList(family int) ([]netlink.Rule, error)
	RuleAdd(rule *netlink.Rule) error
	RuleDel(rule *netlink.Rule) error
	ConntrackDeleteFilters(table netlink.ConntrackTableType, family netlink.InetFamily, filters ...netlink.CustomConntrackFilter) (uint, error)
}

// ownSockets are the requests google/nftables and vishvananda/netlink have no call for.
type ownSockets interface {
	rpFilter(ifindex int) (uint32, error)
	setRPFilter(ifindex int, value uint32) error
	ipForward() (bool, error)
	generation() (uint32, error)
	setCounters(fam nftables.TableFamily, table, set string, fn func(key []byte, packets, bytes uint64), yield func() bool) error
	drain() error
}

var (
	_ nftConn       = (*nftables.Conn)(nil)
	_ netlinkHandle = (*netlink.Handle)(nil)
	_ ownSockets    = (*sockets)(nil)
)

// sockets opens the datapath's own sockets in its namespace (netns.None(): the process's).
type sockets struct {
	netns netns.NsHandle
	log   hclog.Logger
	// nfConn asks for the ruleset generation (gen.go) or, in the Datapath's counterSocket,
	// reads element counters (elemcounters.go), opened on first use and kept: closing a
	// nftables socket after a transaction that deleted elements waits for the kernel
	// (Config.NFT).
	nfConn *mdnetlink.Conn
	// dumpBuf receives element dumps (elemcounters.go); dumping is set while one of sequence
	// dumpSeq has not ended.
	dumpBuf []byte
	dumping bool
	dumpSeq uint32
}
