package netlab

import (
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"debug/buildinfo"
	"encoding/base64"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The mesh is real WireGuard (docs/design/mesh.md): every node's wt0 is a device of the
// userspace implementation wireguard-go, one daemon per node, configured with the lab's keys
// through its UAPI socket by `wg` (Debian's wireguard-tools). Each peer's allowed-IPs is
// exactly the peer's wt0 /32 and IPv6 /128, as a mesh such as netbird configures it, so
// WireGuard's cryptokey routing drops a packet of either family that keeps a client's
// source, from both ends: the sender finds no peer for a destination outside every
// allowed-IPs, the receiver discards a source outside the sending peer's. The daemons' UDP
// crosses an underlay of its own, the bridge in MeshNS, on addresses
// (NodeSpec.EndpointAddr, 198.19.93.0/24) that no interface of the machine's root namespace
// holds; it stays IPv4 and carries both families.

const (
	// WireGuardEnv names the environment variable holding the path of the wireguard-go
	// binary (the output of lab/build-wireguard.sh); Build fails without it.
	WireGuardEnv = "KUPORT_WIREGUARD"
	// WireGuardPort is the UDP port every node's daemon listens on, on its EndpointAddr.
	WireGuardPort = 51820
	// endpointIface is a node's veth onto the mesh's underlay bridge, holding EndpointAddr.
	endpointIface = "wg-udp"
	// endpointPrefix names the bridge side of a node's endpoint veth: "ep-" + node name.
	endpointPrefix = "ep-"
	// wgSocketDir is where wireguard-go always puts its UAPI socket, whatever the network
	// namespace: each daemon gets a private tmpfs there, in the mount namespace `ip netns
	// exec` gives it, so the nodes' wt0.sock do not collide.
	wgSocketDir = "/run/wireguard"
	// keepalive is every peer's persistent keepalive in seconds, netbird's default: a
	// restarted daemon sends one as soon as it is configured, so its peers learn its new
	// session at once instead of when their stale one times out (Build turns it on only
	// after the first handshakes: startKeepalives).
	keepalive = 25
	// meshWait bounds how long a daemon may take to open its UAPI socket, and to remove its
	// device once stopped.
	meshWait = 10 * time.Second
)

// meshKey is a node's WireGuard key pair, base64 as `wg` reads it.
type meshKey struct{ private, public string }

func newMeshKey() (meshKey, error) {
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return meshKey{}, fmt.Errorf("wireguard key: %w", err)
	}
	enc := base64.StdEncoding.EncodeToString
	return meshKey{private: enc(k.Bytes()), public: enc(k.PublicKey().Bytes())}, nil
}

// wireGuardBinary returns the wireguard-go binary named by WireGuardEnv and its module
// version, checking that `wg` is installed too.
func wireGuardBinary() (path, version string, err error) {
	path = os.Getenv(WireGuardEnv)
	if path == "" {
		return "", "", fmt.Errorf("%s is not set: set it to the output of lab/build-wireguard.sh (make does)", WireGuardEnv)
	}
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("%s=%s: %w", WireGuardEnv, path, err)
	}
	if _, err := exec.LookPath("wg"); err != nil {
		return "", "", fmt.Errorf("wg (Debian's wireguard-tools, make deps) is needed to configure the mesh: %w", err)
	}
	return path, info.Main.Path + "@" + info.Main.Version + " (" + info.GoVersion + ")", nil
}

// endpoint joins node s to the mesh's underlay bridge by its endpoint veth.
func (n *Net) endpoint(ctx context.Context, s NodeSpec) error {
	peer := endpointPrefix + s.Name
	steps := [][]string{
		{s.Name, "link", "add", endpointIface, "type", "veth", "peer", "name", peer, "netns", MeshNS},
		{s.Name, "addr", "add", s.EndpointAddr.String(), "dev", endpointIface},
		{s.Name, "link", "set", endpointIface, "up"},
		{MeshNS, "link", "set", peer, "master", meshBridge, "up"},
	}
	for _, st := range steps {
		if err := n.ip(ctx, st[0], st[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// StartWireGuard starts node's WireGuard daemon and brings its wt0 up: the device with the
// node's key, one peer per other node (allowed-IPs the peer's wt0 /32 and /128, endpoint the
// peer's EndpointAddr), the node's UnderlayAddr and UnderlayAddr6. Build does it for every
// node; a test restarts a daemon it stopped with StopWireGuard. The daemon logs verbosely to wireguard-<node>.log in
// the lab's log dir (MeshLog), where the receive-side drop shows.
func (n *Net) StartWireGuard(ctx context.Context, node string) error {
	return n.startWireGuardDaemon(ctx, node, keepalive)
}

// startWireGuardDaemon is StartWireGuard with every peer's persistent keepalive set to
// keepaliveSecs (0: off).
func (n *Net) startWireGuardDaemon(ctx context.Context, node string, keepaliveSecs int) error {
	s, ok := n.Node(node)
	if !ok {
		return fmt.Errorf("netlab: no node %q", node)
	}
	n.mu.Lock()
	_, running := n.daemons[node]
	n.mu.Unlock()
	if running {
		return fmt.Errorf("netlab: %s's WireGuard daemon is running", node)
	}
	// A daemon that exits before it is configured is started once more: it happened once in
	// a make test on two busy cores, its log gone with the next lab; the error carries it.
	var err error
	for attempt := 1; attempt <= 2; attempt++ {
		var p *Proc
		if p, err = n.startWireGuard(ctx, s, keepaliveSecs); err == nil {
			n.mu.Lock()
			n.daemons[node] = p
			n.mu.Unlock()
			return nil
		}
		n.log.Warn("WireGuard daemon failed to start", "node", node, "attempt", attempt, "error", err)
	}
	return err
}

func (n *Net) startWireGuard(ctx context.Context, s NodeSpec, keepaliveSecs int) (*Proc, error) {
	// The tmpfs lives and dies with the daemon's mount namespace: nothing to unmount. mkdir
	// only makes the mount point, in the machine's /run.
	script := `mkdir -p ` + wgSocketDir + ` && mount -t tmpfs -o size=64k,mode=0700 kuport-lab-wireguard ` + wgSocketDir +
		` && LOG_LEVEL=verbose exec "$0" --foreground "$1"`
	p, err := n.Start(s.Name, n.MeshLog(s.Name), "sh", "-c", script, n.wireGuard, s.UnderlayIface)
	if err != nil {
		return nil, err
	}
	if err := n.configureWireGuard(ctx, s, p, keepaliveSecs); err != nil {
		p.Kill()
		return nil, fmt.Errorf("netlab: %s's WireGuard: %w", s.Name, err)
	}
	return p, nil
}

func (n *Net) configureWireGuard(ctx context.Context, s NodeSpec, p *Proc, keepaliveSecs int) error {
	deadline := time.Now().Add(meshWait)
	for {
		_, err := n.wg(ctx, p, "", "show", s.UnderlayIface, "public-key")
		if err == nil {
			break
		}
		select {
		case <-p.Done():
			log, _ := os.ReadFile(n.MeshLog(s.Name))
			return fmt.Errorf("the daemon exited: %w; its log %s: %s", p.exitErr(), n.MeshLog(s.Name), lastLines(string(log), 10))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no UAPI socket after %s: %w", meshWait, err)
		}
	}
	conf := fmt.Sprintf("[Interface]\nPrivateKey = %s\nListenPort = %d\n", n.keys[s.Name].private, WireGuardPort)
	for _, peer := range nodes {
		if peer.Name == s.Name {
			continue
		}
		conf += fmt.Sprintf("\n[Peer]\nPublicKey = %s\nAllowedIPs = %s\nEndpoint = %s\nPersistentKeepalive = %d\n", n.keys[peer.Name].public,
			prefixList(meshPeerPrefixes(peer)), netip.AddrPortFrom(peer.EndpointAddr.Addr(), WireGuardPort), keepaliveSecs)
	}
	if _, err := n.wg(ctx, p, conf, "setconf", s.UnderlayIface, "/dev/stdin"); err != nil {
		return err
	}
	if err := n.ip(ctx, s.Name, "addr", "add", s.UnderlayAddr.String(), "dev", s.UnderlayIface); err != nil {
		return err
	}
	if err := n.ip(ctx, s.Name, "addr", "add", s.UnderlayAddr6.String(), "dev", s.UnderlayIface); err != nil {
		return err
	}
	return n.ip(ctx, s.Name, "link", "set", s.UnderlayIface, "up")
}

// StopWireGuard stops node's WireGuard daemon, as a crash of the mesh would: its wt0 goes
// with it (a TUN device lives as long as its process), and with wt0 its address and routes.
// It returns once the device is gone.
func (n *Net) StopWireGuard(ctx context.Context, node string) error {
	s, ok := n.Node(node)
	if !ok {
		return fmt.Errorf("netlab: no node %q", node)
	}
	n.mu.Lock()
	p := n.daemons[node]
	delete(n.daemons, node)
	n.mu.Unlock()
	if p == nil {
		return fmt.Errorf("netlab: %s's WireGuard daemon is not running", node)
	}
	if err := p.Stop(); err != nil {
		return fmt.Errorf("netlab: stop %s's WireGuard: %w", node, err)
	}
	deadline := time.Now().Add(meshWait)
	for {
		if err := n.ip(ctx, node, "link", "show", s.UnderlayIface); err != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("netlab: %s's %s still exists %s after its daemon exited", node, s.UnderlayIface, meshWait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FreezeWireGuard stops node's WireGuard daemon with SIGSTOP, as a hung daemon: its wt0 stays,
// with its address and routes, and nothing crosses it until ThawWireGuard.
func (n *Net) FreezeWireGuard(node string) error { return n.signalWireGuard(node, syscall.SIGSTOP) }

// ThawWireGuard resumes a daemon FreezeWireGuard stopped.
func (n *Net) ThawWireGuard(node string) error { return n.signalWireGuard(node, syscall.SIGCONT) }

func (n *Net) signalWireGuard(node string, sig syscall.Signal) error {
	n.mu.Lock()
	p := n.daemons[node]
	n.mu.Unlock()
	if p == nil {
		return fmt.Errorf("netlab: %s's WireGuard daemon is not running", node)
	}
	if err := syscall.Kill(p.Pid(), sig); err != nil {
		return fmt.Errorf("netlab: %s %s's WireGuard: %w", sig, node, err)
	}
	return nil
}

// MeshLog is the log file of node's WireGuard daemon.
func (n *Net) MeshLog(node string) string {
	return filepath.Join(n.dir, "wireguard-"+node+".log")
}

// wg runs `wg args...` against node's daemon p, in the daemon's mount namespace (where its
// UAPI socket is) and network namespace, with stdin.
func (n *Net) wg(ctx context.Context, p *Proc, stdin string, args ...string) (string, error) {
	return n.command(ctx, stdin, "", append([]string{"nsenter", "-t", strconv.Itoa(p.Pid()), "-m", "-n", "wg"}, args...)...)
}

// WireGuard runs `wg args...` against node's daemon (e.g. "show", "wt0") and returns what
// it printed.
func (n *Net) WireGuard(ctx context.Context, node string, args ...string) (string, error) {
	n.mu.Lock()
	p := n.daemons[node]
	n.mu.Unlock()
	if p == nil {
		return "", fmt.Errorf("netlab: %s's WireGuard daemon is not running", node)
	}
	return n.wg(ctx, p, "", args...)
}

// setAllowedIPs replaces the allowed-IPs of node's peer named peer with prefixes (the
// self-check widens them for a moment).
func (n *Net) setAllowedIPs(ctx context.Context, node, peer string, prefixes ...netip.Prefix) error {
	s, _ := n.Node(node)
	_, err := n.WireGuard(ctx, node, "set", s.UnderlayIface, "peer", n.keys[peer].public, "allowed-ips", prefixList(prefixes))
	return err
}

// prefixList is prefixes comma-separated, as `wg` reads allowed-IPs.
func prefixList(prefixes []netip.Prefix) string {
	list := make([]string, len(prefixes))
	for i, pr := range prefixes {
		list[i] = pr.String()
	}
	return strings.Join(list, ",")
}

// startKeepalives turns every node's persistent keepalive to every peer on, once the
// pairs' sessions are up: a keepalive on an established session starts no handshake.
func (n *Net) startKeepalives(ctx context.Context) error {
	for _, s := range nodes {
		for _, peer := range nodes {
			if peer.Name == s.Name {
				continue
			}
			if _, err := n.WireGuard(ctx, s.Name, "set", s.UnderlayIface, "peer", n.keys[peer.Name].public,
				"persistent-keepalive", strconv.Itoa(keepalive)); err != nil {
				return err
			}
		}
	}
	return nil
}

// meshPeerPrefixes is the allowed-IPs the lab gives every peer: its wt0 addresses, a /32
// and a /128, so WireGuard drops either family from any other source.
func meshPeerPrefixes(s NodeSpec) []netip.Prefix {
	return []netip.Prefix{netip.PrefixFrom(s.UnderlayAddr.Addr(), 32), netip.PrefixFrom(s.UnderlayAddr6.Addr(), 128)}
}

// lastLines returns the last n lines of s, trimmed.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
