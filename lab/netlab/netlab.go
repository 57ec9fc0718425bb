// Package netlab builds the lab's network out of Linux network namespaces
// (docs/design/lab.md#topology and docs/design/lab.md#datapath-facts-verified-in-namespaces):
//
//	client (198.51.100.7) ── kup-router (the internet) ── edge-a  enp1s0 203.0.113.9
//	                                                  ├── worker-b eth0  192.0.2.2
//	                                                  └── worker-c eth0  198.18.0.3
//	the mesh: every node's wt0 (MTU 1420) is a real WireGuard device (wireguard-go,
//	          mesh.go): edge-a 100.64.93.143, worker-b 100.64.93.150, worker-c
//	          100.64.93.160, each peer's allowed-IPs its /32 and its IPv6 /128; the
//	          daemons' UDP crosses kup-mesh, a bridge joining every node's wg-udp
//	          (198.19.93.143, .150, .160)
//	each node: the pod network of the CNI profile (Config.CNI, cni.go): under cilium a
//	          bridge cilium_host (first address of its pod CIDR), pods pod-<name> behind it
//
// The lab is dual-stack: every address above has an IPv6 twin, chosen in the node table
// (nodes) and the client's variables, the pods' by NodeSpec.PodAddr6: public ones in the
// documentation prefix 2001:db8::/32 (the client 2001:db8:100::7, edge-a 2001:db8:113::9),
// the mesh's and the pods' unique local (wt0 fd00:64:93::143, pod CIDR fd00:10:244:17::/64).
// The WireGuard underlay (wg-udp) stays IPv4: it carries both families.
//
// Each node namespace also emulates the CNI profile's own masquerade rules (tables `ip
// lab-cni` and `ip6 lab-cni`). The mesh's drop of a packet that keeps a client's source is WireGuard's own
// (its allowed-IPs), not an emulation. SelfCheck proves both bite.
//
// netlab owns the namespaces named in Namespaces plus every `pod-*` namespace, and the
// processes it starts (the WireGuard daemons among them). It never touches the root network
// namespace's interfaces, routes, rules or nftables: every link, address, route and rule is
// created inside a lab namespace (`ip -n NS ...`, `ip netns exec NS ...`). Only one lab
// exists at a time on a machine: Build holds an exclusive lock (lockPath) until Close.
package netlab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Fixed names of the lab's shared namespaces and devices.
const (
	ClientNS     = "client"     // the client: eth0 198.51.100.7/24 and 2001:db8:100::7/64
	RouterNS     = "kup-router" // the internet between the client and the nodes' uplinks
	MeshNS       = "kup-mesh"   // the mesh's underlay: a bridge joining every node's wg-udp
	PodNSPrefix  = "pod-"       // a pod's namespace is PodNSPrefix + pod name
	UnderlayMTU  = 1420         // wt0's MTU, the one wireguard-go gives its device
	meshBridge   = "mesh0"
	clientIface  = "eth0"
	routerPrefix = "to-" // router side of a veth: "to-" + the peer namespace
)

// lockPath serialises labs on one machine: the namespace names are fixed, so two labs
// would tear each other down. The kernel drops the lock when its holder dies.
const lockPath = "/run/kuport-lab/netlab.lock"

var (
	clientAddr     = netip.MustParsePrefix("198.51.100.7/24")
	clientGateway  = netip.MustParseAddr("198.51.100.1")
	clientAddr6    = netip.MustParsePrefix("2001:db8:100::7/64")
	clientGateway6 = netip.MustParseAddr("2001:db8:100::1")
)

// NodeSpec describes one node namespace. The namespace is named Name. Each address but
// EndpointAddr has an IPv6 twin (the fields ending in 6), on the same device.
type NodeSpec struct {
	Name           string
	UplinkIface    string       // the node's own internet connection, e.g. enp1s0
	UplinkAddr     netip.Prefix // e.g. 203.0.113.9/24
	UplinkGateway  netip.Addr   // the router's address on that link, the default route
	UplinkAddr6    netip.Prefix // e.g. 2001:db8:113::9/64
	UplinkGateway6 netip.Addr   // the router's IPv6 address on that link, the IPv6 default route
	UnderlayIface  string       // the mesh interface, always wt0, a WireGuard device
	UnderlayAddr   netip.Prefix // e.g. 100.64.93.143/24, MTU UnderlayMTU
	UnderlayAddr6  netip.Prefix // e.g. fd00:64:93::143/64; its peers allow it as a /128
	EndpointAddr   netip.Prefix // where the node's WireGuard daemon listens, e.g. 198.19.93.143/24
	PodCIDR        netip.Prefix // e.g. 10.244.17.0/24
	PodCIDR6       netip.Prefix // e.g. fd00:10:244:17::/64, inside ClusterCIDR6
}

// PodGateway is the first address of the node's pod CIDR with its length (10.244.17.1/24
// for 10.244.17.0/24): the address of the bridge profiles' bridge (cilium_host, cni0),
// which their pods route through and Cilium's host->cluster masquerade rewrites to.
func (s NodeSpec) PodGateway() netip.Prefix {
	return netip.PrefixFrom(s.PodCIDR.Masked().Addr().Next(), s.PodCIDR.Bits())
}

// PodGateway6 is PodGateway's IPv6 twin, the first address of PodCIDR6 with its length
// (fd00:10:244:17::1/64), on the same bridge.
func (s NodeSpec) PodGateway6() netip.Prefix {
	return netip.PrefixFrom(s.PodCIDR6.Masked().Addr().Next(), s.PodCIDR6.Bits())
}

// PodAddr6 is the IPv6 address of the pod at IPv4 address addr on this node: PodCIDR6 with
// addr's host number written in the same digits (10.244.17.10 is fd00:10:244:17::10,
// 10.244.17.254 is fd00:10:244:17::254), so the two read alike. It is the invalid Addr
// when addr is not an IPv4 address inside PodCIDR.
func (s NodeSpec) PodAddr6(addr netip.Addr) netip.Addr {
	cidr := s.PodCIDR.Masked()
	if !addr.Is4() || !cidr.Contains(addr) {
		return netip.Addr{}
	}
	a, base := addr.As4(), cidr.Addr().As4()
	host := binary.BigEndian.Uint32(a[:]) - binary.BigEndian.Uint32(base[:])
	// The decimal digits of a host number below 2^32 read as hex fit in 40 bits.
	digits, _ := strconv.ParseUint(strconv.FormatUint(uint64(host), 10), 16, 64)
	b := s.PodCIDR6.Masked().Addr().As16()
	binary.BigEndian.PutUint64(b[8:], binary.BigEndian.Uint64(b[8:])|digits)
	return netip.AddrFrom16(b)
}

// nodes is the lab's node list: add an entry to add a node (names at most 12 bytes, so
// the router's "to-<name>" device fits the kernel's 15).
var nodes = []NodeSpec{
	{
		Name:           "edge-a",
		UplinkIface:    "enp1s0",
		UplinkAddr:     netip.MustParsePrefix("203.0.113.9/24"),
		UplinkGateway:  netip.MustParseAddr("203.0.113.1"),
		UplinkAddr6:    netip.MustParsePrefix("2001:db8:113::9/64"),
		UplinkGateway6: netip.MustParseAddr("2001:db8:113::1"),
		UnderlayIface:  "wt0",
		UnderlayAddr:   netip.MustParsePrefix("100.64.93.143/24"),
		UnderlayAddr6:  netip.MustParsePrefix("fd00:64:93::143/64"),
		EndpointAddr:   netip.MustParsePrefix("198.19.93.143/24"),
		PodCIDR:        netip.MustParsePrefix("10.244.17.0/24"),
		PodCIDR6:       netip.MustParsePrefix("fd00:10:244:17::/64"),
	},
	{
		Name:           "worker-b",
		UplinkIface:    "eth0",
		UplinkAddr:     netip.MustParsePrefix("192.0.2.2/24"),
		UplinkGateway:  netip.MustParseAddr("192.0.2.1"),
		UplinkAddr6:    netip.MustParsePrefix("2001:db8:2::2/64"),
		UplinkGateway6: netip.MustParseAddr("2001:db8:2::1"),
		UnderlayIface:  "wt0",
		UnderlayAddr:   netip.MustParsePrefix("100.64.93.150/24"),
		UnderlayAddr6:  netip.MustParsePrefix("fd00:64:93::150/64"),
		EndpointAddr:   netip.MustParsePrefix("198.19.93.150/24"),
		PodCIDR:        netip.MustParsePrefix("10.244.18.0/24"),
		PodCIDR6:       netip.MustParsePrefix("fd00:10:244:18::/64"),
	},
	{
		// worker-c is the second accepting node of the lab's Multi class.
		Name:           "worker-c",
		UplinkIface:    "eth0",
		UplinkAddr:     netip.MustParsePrefix("198.18.0.3/24"),
		UplinkGateway:  netip.MustParseAddr("198.18.0.1"),
		UplinkAddr6:    netip.MustParsePrefix("2001:db8:18::3/64"),
		UplinkGateway6: netip.MustParseAddr("2001:db8:18::1"),
		UnderlayIface:  "wt0",
		UnderlayAddr:   netip.MustParsePrefix("100.64.93.160/24"),
		UnderlayAddr6:  netip.MustParsePrefix("fd00:64:93::160/64"),
		EndpointAddr:   netip.MustParsePrefix("198.19.93.160/24"),
		PodCIDR:        netip.MustParsePrefix("10.244.19.0/24"),
		PodCIDR6:       netip.MustParsePrefix("fd00:10:244:19::/64"),
	},
}

// Namespaces lists the lab's fixed namespace names (pods add PodNSPrefix + name).
func Namespaces() []string {
	names := []string{RouterNS, MeshNS, ClientNS}
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	return names
}

// Config configures Build.
type Config struct {
	Log     hclog.Logger // nil: discard
	Dir     string       // directory for process logs; created if missing; required
	ToolBin string       // path of the built kuport-lab binary (serve, probe); required
	CNI     CNI          // the CNI profile; "" is CNICilium
}

// Net is a built lab network. Its methods are safe for concurrent use.
type Net struct {
	log       hclog.Logger
	dir       string
	toolBin   string
	cni       CNI
	wireGuard string             // the wireguard-go binary
	keys      map[string]meshKey // by node name

	mu      sync.Mutex
	created []string       // namespaces this Net created, in creation order
	pods    map[string]pod // by pod name
	procs   map[*Proc]struct{}
	daemons map[string]*Proc // each node's WireGuard daemon, by node name
	lock    *os.File
	closed  bool
}

// Build removes whatever a previous lab left (every lab namespace, and the processes in
// them), then creates the client, router, mesh and node namespaces with their links,
// addresses, routes, sysctls and CNI tables, and starts every node's WireGuard daemon (the
// binary WireGuardEnv names; its version is logged) and completes every pair's handshake.
// It waits (bounded by ctx) while another
// lab on the machine holds the lock. On error everything it created is removed.
func Build(ctx context.Context, cfg Config) (*Net, error) {
	if cfg.Dir == "" || cfg.ToolBin == "" {
		return nil, errors.New("netlab: Config.Dir and Config.ToolBin are required")
	}
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	cni, err := ParseCNI(string(cfg.CNI))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("netlab: create log dir: %w", err)
	}
	wireGuard, version, err := wireGuardBinary()
	if err != nil {
		return nil, fmt.Errorf("netlab: %w", err)
	}
	keys := map[string]meshKey{}
	for _, s := range nodes {
		if keys[s.Name], err = newMeshKey(); err != nil {
			return nil, fmt.Errorf("netlab: %w", err)
		}
	}
	cfg.Log.Info("mesh: every node's wt0 is a wireguard-go device", "wireguard-go", version, "binary", wireGuard)
	lock, err := acquireLock(ctx, cfg.Log)
	if err != nil {
		return nil, err
	}
	n := &Net{
		log:       cfg.Log,
		dir:       cfg.Dir,
		toolBin:   cfg.ToolBin,
		cni:       cni,
		wireGuard: wireGuard,
		keys:      keys,
		pods:      map[string]pod{},
		procs:     map[*Proc]struct{}{},
		daemons:   map[string]*Proc{},
		lock:      lock,
	}
	if err := Teardown(); err != nil {
		return nil, errors.Join(fmt.Errorf("netlab: remove leftovers: %w", err), n.Close())
	}
	// Each lab's process logs start empty, so grepping them reads only this run.
	if err := clearLogs(cfg.Dir); err != nil {
		return nil, errors.Join(fmt.Errorf("netlab: %w", err), n.Close())
	}
	if err := n.build(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("netlab: build: %w", err), n.Close())
	}
	return n, nil
}

// clearLogs empties the earlier runs' *.log files in dir.
func clearLogs(dir string) error {
	logs, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return err
	}
	for _, f := range logs {
		if err := os.Truncate(f, 0); err != nil {
			return err
		}
	}
	return nil
}

// acquireLock takes the machine-wide lab lock, waiting (and saying so once on log) while
// another lab holds it, until ctx ends.
func acquireLock(ctx context.Context, log hclog.Logger) (*os.File, error) {
	waiting := false
	for {
		f, err := tryLock()
		if f != nil || err != nil {
			return f, err
		}
		if !waiting {
			waiting = true
			log.Info("waiting for another lab to finish (make lab-down stops a lab started by make lab-up)", "lock", lockPath)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("netlab: another lab holds %s: %w", lockPath, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tryLock takes the machine-wide lab lock if it is free: the locked file (closing it
// releases the lock), or nil and no error while another lab holds it.
func tryLock() (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(lockPath), 0o755); err != nil {
		return nil, fmt.Errorf("netlab: lock dir: %w", err)
	}
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("netlab: open lock: %w", err)
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	switch {
	case err == nil:
		return f, nil
	case errors.Is(err, syscall.EWOULDBLOCK):
		_ = f.Close()
		return nil, nil
	}
	_ = f.Close()
	return nil, fmt.Errorf("netlab: lock %s: %w", lockPath, err)
}

// ErrLabRunning is WhileFree's answer when another lab holds the lock.
var ErrLabRunning = errors.New("another lab is running (it holds " + lockPath + ")")

// WhileFree runs fn holding the machine-wide lab lock, if no lab holds it, and returns fn's
// error; while a lab holds it, it returns ErrLabRunning and runs nothing, so clean-up such
// as `make lab-down`'s cannot tear down a lab that another command started meanwhile.
func WhileFree(fn func() error) error {
	f, err := tryLock()
	if err != nil {
		return err
	}
	if f == nil {
		return ErrLabRunning
	}
	defer func() { _ = f.Close() }()
	return fn()
}

func (n *Net) build(ctx context.Context) error {
	for _, s := range nodes {
		if len(routerPrefix+s.Name) > 15 {
			return fmt.Errorf("node name %q: longer than 12 bytes", s.Name)
		}
	}
	for _, ns := range Namespaces() {
		if err := n.addNamespace(ctx, ns); err != nil {
			return err
		}
	}
	if err := n.sysctl(ctx, RouterNS, "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
		return err
	}
	if err := n.ip(ctx, MeshNS, "link", "add", meshBridge, "type", "bridge"); err != nil {
		return err
	}
	if err := n.ip(ctx, MeshNS, "link", "set", meshBridge, "up"); err != nil {
		return err
	}
	if err := n.uplink(ctx, ClientNS, clientIface, clientAddr, clientGateway, clientAddr6, clientGateway6); err != nil {
		return err
	}
	for _, s := range nodes {
		if err := n.buildNode(ctx, s); err != nil {
			return fmt.Errorf("node %s: %w", s.Name, err)
		}
	}
	for _, ns := range Namespaces() {
		if err := n.waitLinks(ctx, ns); err != nil {
			return err
		}
	}
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	// The daemons start with no keepalive, so that no two of them start a handshake with
	// each other at once: wireguard-go v0.0.20250522 could lose such a crossing for good
	// (each side logged a completed handshake, then nothing crossed for 12 s; once in 11
	// labs here). The pings then make each pair's handshake from one side, and the
	// keepalives start on the sessions they made.
	for i, s := range nodes {
		wg.Go(func() { errs[i] = n.startWireGuardDaemon(ctx, s.Name, 0) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Handshakes now, not on a test's first packet: a busy machine can delay the userspace
	// daemons' first exchange past a probe's timeout.
	if err := n.checkMeshCarries(ctx); err != nil {
		return err
	}
	return n.startKeepalives(ctx)
}

// addNamespace creates ns with lo up and duplicate address detection off (noDAD), and
// records it for Close.
func (n *Net) addNamespace(ctx context.Context, ns string) error {
	if _, err := n.command(ctx, "", "", "ip", "netns", "add", ns); err != nil {
		return err
	}
	n.mu.Lock()
	n.created = append(n.created, ns)
	n.mu.Unlock()
	if err := n.noDAD(ctx, ns); err != nil {
		return err
	}
	return n.ip(ctx, ns, "link", "set", "lo", "up")
}

// noDAD turns IPv6 duplicate address detection off in ns for every link created after it,
// as it must be before they exist. While DAD runs (a second or more) an address is
// tentative, and a node or router whose link-local address is tentative sends no neighbour
// solicitation for a packet it forwards: the first forwarded packets waited a second.
func (n *Net) noDAD(ctx context.Context, ns string) error {
	return n.sysctl(ctx, ns, "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
}

// uplink joins ns to the router: iface in ns holds addr and addr6 with default routes via
// gw and gw6, and the router side "to-<ns>" holds gw and gw6.
func (n *Net) uplink(ctx context.Context, ns, iface string, addr netip.Prefix, gw netip.Addr, addr6 netip.Prefix, gw6 netip.Addr) error {
	peer := routerPrefix + ns
	gwPrefix := netip.PrefixFrom(gw, addr.Bits()).String()
	steps := [][]string{
		{ns, "link", "add", iface, "type", "veth", "peer", "name", peer, "netns", RouterNS},
		{ns, "addr", "add", addr.String(), "dev", iface},
		{ns, "link", "set", iface, "up"},
		{RouterNS, "addr", "add", gwPrefix, "dev", peer},
		{RouterNS, "link", "set", peer, "up"},
		{ns, "route", "add", "default", "via", gw.String()},
		{ns, "addr", "add", addr6.String(), "dev", iface},
		{RouterNS, "addr", "add", netip.PrefixFrom(gw6, addr6.Bits()).String(), "dev", peer},
		{ns, "-6", "route", "add", "default", "via", gw6.String()},
	}
	for _, st := range steps {
		if err := n.ip(ctx, st[0], st[1:]...); err != nil {
			return err
		}
	}
	return nil
}

func (n *Net) buildNode(ctx context.Context, s NodeSpec) error {
	// Strict rp_filter, so the datapath's loose setting on its own devices is load-bearing.
	// IPv6 has no rp_filter in the kernel.
	if err := n.sysctl(ctx, s.Name, "net.ipv4.ip_forward=1",
		"net.ipv4.conf.all.rp_filter=1", "net.ipv4.conf.default.rp_filter=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
		return err
	}
	// A bridge would hand bridged frames to iptables where br_netfilter is loaded: a lab
	// artefact, off where the key exists (-e ignores it where it does not).
	if _, err := n.Exec(ctx, s.Name, "sysctl", "-e", "-q", "-w", "net.bridge.bridge-nf-call-iptables=0"); err != nil {
		return err
	}
	if err := n.uplink(ctx, s.Name, s.UplinkIface, s.UplinkAddr, s.UplinkGateway, s.UplinkAddr6, s.UplinkGateway6); err != nil {
		return err
	}
	if err := n.endpoint(ctx, s); err != nil {
		return err
	}
	var steps [][]string
	// The bridge profiles' bridge holds the node's first pod address, as cilium_host does
	// and as the bridge plugin (isGateway) makes cni0; Calico has no bridge and no address
	// in the pod network, only a route per pod (pods.go).
	if br := n.cni.Bridge(); br != "" {
		steps = append(steps,
			[]string{s.Name, "link", "add", br, "type", "bridge"},
			[]string{s.Name, "addr", "add", s.PodGateway().String(), "dev", br},
			[]string{s.Name, "addr", "add", s.PodGateway6().String(), "dev", br},
			[]string{s.Name, "link", "set", br, "up"})
	}
	for _, st := range steps {
		if err := n.ip(ctx, st[0], st[1:]...); err != nil {
			return err
		}
	}
	return n.NftApply(ctx, s.Name, n.cni.ruleset(s))
}

// CNI is the lab's CNI profile.
func (n *Net) CNI() CNI { return n.cni }

// ClientAddr6 is the client's IPv6 address (its IPv4 one, 198.51.100.7, is lab.ClientAddr).
func (n *Net) ClientAddr6() netip.Addr { return clientAddr6.Addr() }

// Nodes returns the node specs, in the lab's order.
func (n *Net) Nodes() []NodeSpec { return slices.Clone(nodes) }

// Node returns the spec of the node named name.
func (n *Net) Node(name string) (NodeSpec, bool) {
	i := slices.IndexFunc(nodes, func(s NodeSpec) bool { return s.Name == name })
	if i < 0 {
		return NodeSpec{}, false
	}
	return nodes[i], true
}

// Close kills every process the Net started, deletes every namespace it created and
// releases the lab lock. It is idempotent; errors from each step are joined.
func (n *Net) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	procs := make([]*Proc, 0, len(n.procs))
	for p := range n.procs {
		procs = append(procs, p)
	}
	created := slices.Clone(n.created)
	n.created = nil
	for pod := range n.pods {
		created = append(created, PodNSPrefix+pod)
	}
	n.mu.Unlock()

	for _, p := range procs {
		p.Kill()
	}
	var errs []error
	for _, ns := range slices.Backward(created) {
		if err := deleteNamespace(ns); err != nil {
			errs = append(errs, err)
		}
	}
	if n.lock != nil {
		errs = append(errs, n.lock.Close()) // closing drops the flock
	}
	return errors.Join(errs...)
}

// Teardown removes every lab namespace left on the machine, fixed names and pod-*, after
// killing the processes inside them (agents left by `make lab-up`). For `make lab-down`
// and for Build's cleanup of a crashed run. It does not take the lab lock: call it holding
// the lock (Build, WhileFree).
func Teardown() error {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	fixed := Namespaces()
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !slices.Contains(fixed, name) && !strings.HasPrefix(name, PodNSPrefix) {
			continue
		}
		if err := deleteNamespace(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RouteVirtual points the router's route for a routed virtual address (a /32 or, for an
// IPv6 vip, a /128 no namespace holds) at a node's uplink address of vip's family, as a
// mesh or an upstream router would steer a VIP: clients dialing vip reach that node, which
// holds no address for it and forwards it by its kuport DNAT. Calling it again with another
// node moves the address. It returns an error for an unknown node or when ip fails.
func (n *Net) RouteVirtual(ctx context.Context, vip netip.Addr, node string) error {
	s, ok := n.Node(node)
	if !ok {
		return fmt.Errorf("netlab: no node %q", node)
	}
	if vip.Is6() {
		return n.ip(ctx, RouterNS, "-6", "route", "replace", netip.PrefixFrom(vip, 128).String(), "via", s.UplinkAddr6.Addr().String())
	}
	return n.ip(ctx, RouterNS, "route", "replace", netip.PrefixFrom(vip, 32).String(), "via", s.UplinkAddr.Addr().String())
}
