package netlab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	selfCheckTable = "lab-selfcheck"
	meshCheckPort  = 3999
	egressPort     = 3998
	tunnelPort     = 3997
	// dropWait is how long the mesh check waits for a reply to a datagram it expects dropped:
	// the datagram crosses the kernel's path to wt0 before the probe's send returns.
	dropWait = 200 * time.Millisecond
	// counterWait bounds how long the mesh check waits to see the drop logged.
	counterWait = 5 * time.Second
	// meshReachWait, ping's -w in seconds, covers two handshake attempts on a slow start.
	meshReachWait = "12"
)

// SelfCheck proves the mesh and the CNI emulation bite
// (docs/design/lab.md#emulating-the-cni-and-the-mesh), using the first node as the accepting
// node and the second as the remote one, for IPv4 and for IPv6 alike:
//  1. the mesh carries node-to-node traffic: every node pings every other node's wt0
//     addresses (which also completes the WireGuard handshakes);
//  2. the mesh drops a forwarded packet that keeps the client's source, from both ends
//     (checkMesh): a DNAT on the accepting node straight to a pod on the remote node,
//     routed over wt0, carries the client's source into WireGuard. Send side: no peer's
//     allowed-IPs holds the pod's address, so the datagram enters wt0 and no WireGuard data
//     packet leaves for it. Receive side: with the accepting node's allowed-IPs for the
//     remote node widened to its pod CIDR, the datagram is sent, and the remote daemon
//     discards it because its source is outside the accepting node's allowed-IPs (its
//     log says "IPv4 packet with disallowed source address", or IPv6). Control: with the
//     client's /32 (or /128) added to the remote node's allowed-IPs for the accepting node,
//     the pod receives it, so allowed-IPs alone made the drop. The probe is UDP, not a TCP
//     SYN, because the pod logs every datagram it receives. For IPv4 the remote node's wt0
//     is made loose (rp_filter=2) meanwhile, so its strict rp_filter cannot stand in for
//     the mesh (IPv6 has none), and the DNAT keeps the client's source with a null SNAT, so
//     that no CNI masquerade can hide it;
//  3. under every profile, the CNI's egress masquerade: a datagram a pod on the
//     accepting node sends first to the client reaches the client from the node's
//     uplink address of the same family, not the pod's;
//  4. under cilium, the tunnel-mode host->cluster masquerade: a DNAT on the accepting
//     node to another node's pod address routed into cilium_host (as tunnel mode routes
//     every remote pod CIDR) is SNATed to the cilium_host address, as conntrack shows.
//     Cilium's rule spares traffic to the node's own pods, so a request to a local pod
//     keeps its source whatever kuport does.
//
// It leaves nothing behind: the temporary tables `ip lab-selfcheck` and `ip6
// lab-selfcheck`, the routes, the allowed-IPs, the client's server and the temporary pods
// selfcheck-<node> (last host address of each node's pod CIDR, and its PodAddr6) are
// restored or removed on every path. The error says which check failed to bite.
func (n *Net) SelfCheck(ctx context.Context) error {
	if len(nodes) < 2 {
		return errors.New("netlab: self-check needs two nodes")
	}
	if err := n.checkMeshCarries(ctx); err != nil {
		return fmt.Errorf("netlab: self-check, WireGuard mesh: %w", err)
	}
	if err := n.checkMesh(ctx, nodes[0], nodes[1]); err != nil {
		return fmt.Errorf("netlab: self-check, WireGuard mesh: %w", err)
	}
	if err := n.checkEgressMasquerade(ctx, nodes[0]); err != nil {
		return fmt.Errorf("netlab: self-check, CNI emulation (%s): %w", n.cni, err)
	}
	if n.cni == CNICilium {
		for _, f := range families {
			if err := n.checkHostToCluster(ctx, nodes[0], nodes[1], f); err != nil {
				return fmt.Errorf("netlab: self-check, CNI emulation (%s), %s: %w", n.cni, f, err)
			}
		}
	}
	return nil
}

// family is one IP family of the dual-stack lab, for the checks made in both: its
// addresses of the client and of a node.
type family int

const (
	ipv4 family = 4
	ipv6 family = 6
)

// families lists both, IPv4 first.
var families = []family{ipv4, ipv6}

// String is "IPv4" or "IPv6", the word wireguard-go's log uses.
func (f family) String() string { return fmt.Sprintf("IPv%d", int(f)) }

// nft is the family's nftables family and match keyword: ip or ip6.
func (f family) nft() string { return map[family]string{ipv4: "ip", ipv6: "ip6"}[f] }

// ipFlag selects the family in an ip command: -4 or -6.
func (f family) ipFlag() string { return fmt.Sprintf("-%d", int(f)) }

// hostBits is the length of a single address: 32 or 128.
func (f family) hostBits() int { return map[family]int{ipv4: 32, ipv6: 128}[f] }

func (f family) client() netip.Addr { return f.pick(clientAddr.Addr(), clientAddr6.Addr()) }

func (f family) uplink(s NodeSpec) netip.Addr {
	return f.pick(s.UplinkAddr.Addr(), s.UplinkAddr6.Addr())
}

func (f family) underlay(s NodeSpec) netip.Addr {
	return f.pick(s.UnderlayAddr.Addr(), s.UnderlayAddr6.Addr())
}

func (f family) podCIDR(s NodeSpec) netip.Prefix {
	if f == ipv6 {
		return s.PodCIDR6.Masked()
	}
	return s.PodCIDR.Masked()
}

func (f family) podGateway(s NodeSpec) netip.Addr {
	return f.pick(s.PodGateway().Addr(), s.PodGateway6().Addr())
}

// lastPod is the address, in this family, of the pod at the last host address of s's
// pod CIDR: where the self-check puts its pods.
func (f family) lastPod(s NodeSpec) netip.Addr {
	last := lastHost(s.PodCIDR)
	return f.pick(last, s.PodAddr6(last))
}

func (f family) pick(v4, v6 netip.Addr) netip.Addr {
	if f == ipv6 {
		return v6
	}
	return v4
}

// sawFrom is how a server's log line begins for a peer at addr: "saw 198.51.100.7:" or
// "saw [2001:db8:100::7]:".
func sawFrom(addr netip.Addr) string {
	return "saw " + strings.TrimSuffix(netip.AddrPortFrom(addr, 0).String(), "0")
}

// checkMeshCarries pings, for every pair of nodes and both families, one's wt0 address from
// the other: the echo and its reply cross the mesh both ways, and complete the pair's
// WireGuard handshake. It sends every 0.2 s until a reply, for up to meshReachWait: a
// handshake initiation that reached a daemon still starting is lost, and WireGuard sends
// the next only after its rekey timeout of 5 s (three such failures in one make test on two
// busy cores).
func (n *Net) checkMeshCarries(ctx context.Context) error {
	for i, from := range nodes {
		for _, to := range nodes[i+1:] {
			for _, f := range families {
				if _, err := n.Exec(ctx, from.Name, "ping", "-c", "1", "-i", "0.2", "-w", meshReachWait, "-q", f.underlay(to).String()); err != nil {
					return fmt.Errorf("%s cannot reach %s over wt0 (%s): %w", from.Name, to.Name, f, err)
				}
			}
		}
	}
	return nil
}

// checkMesh runs checkMeshFamily for both families against one pod on remote.
func (n *Net) checkMesh(ctx context.Context, acc, remote NodeSpec) (err error) {
	podName, err := n.selfCheckPod(ctx, remote, "udp", meshCheckPort)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, n.RemovePod(podName)) }()
	for _, f := range families {
		if err := n.checkMeshFamily(ctx, acc, remote, podName, f); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	return nil
}

func (n *Net) checkMeshFamily(ctx context.Context, acc, remote NodeSpec, podName string, f family) (err error) {
	podAddr := f.lastPod(remote)
	// What the pod logged before, for the other family, is not this check's.
	earlier, err := n.ServerLog(podName, "udp", meshCheckPort)
	if err != nil {
		return err
	}
	if f == ipv4 {
		rpKey := "net.ipv4.conf." + remote.UnderlayIface + ".rp_filter"
		rp, err := n.Exec(ctx, remote.Name, "sysctl", "-n", rpKey)
		if err != nil {
			return err
		}
		if err := n.sysctl(ctx, remote.Name, rpKey+"=2"); err != nil {
			return err
		}
		defer func() {
			err = errors.Join(err, n.sysctl(context.WithoutCancel(ctx), remote.Name, rpKey+"="+strings.TrimSpace(rp)))
		}()
	}
	route := []string{f.ipFlag(), "route", "", f.podCIDR(remote).String(), "via", f.underlay(remote).String(), "dev", acc.UnderlayIface}
	if err := n.ip(ctx, acc.Name, routeCmd(route, "add")...); err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, n.ip(context.WithoutCancel(ctx), acc.Name, routeCmd(route, "del")...))
	}()
	table := dnatRuleset(f, acc.UplinkIface, "udp", meshCheckPort, podAddr, acc.UnderlayIface) + wgDataTable(remote)
	if err := n.NftApply(ctx, acc.Name, table); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, n.dropSelfCheckTables(ctx, acc.Name)) }()

	dst := netip.AddrPortFrom(f.uplink(acc), meshCheckPort).String()
	// notReceived fails once the pod has received the client's datagram.
	notReceived := func(side string) error {
		log, err := n.ServerLog(podName, "udp", meshCheckPort)
		if err != nil {
			return err
		}
		if log = strings.TrimPrefix(log, earlier); strings.Contains(log, "saw ") {
			return fmt.Errorf("%s: pod %s on %s received a datagram DNATed over wt0 with the client's source: %s", side, podAddr, remote.Name, log)
		}
		return nil
	}
	// probe sends the client's datagram, which the pod must not receive.
	probe := func(side string) error {
		if _, err := n.Probe(ctx, "udp", dst, dropWait); err != nil {
			return err
		}
		return notReceived(side)
	}
	sent := func() (uint64, error) { return n.NftCounter(ctx, acc.Name, "ip", selfCheckTable, wgDataName) }

	txBefore, err := n.linkCounter(ctx, acc.Name, acc.UnderlayIface, "tx_packets")
	if err != nil {
		return err
	}
	if err := probe("send side"); err != nil {
		return err
	}
	txAfter, err := n.linkCounter(ctx, acc.Name, acc.UnderlayIface, "tx_packets")
	if err != nil {
		return err
	}
	sentBefore, err := sent()
	if err != nil {
		return err
	}
	if txAfter == txBefore || sentBefore != 0 {
		return fmt.Errorf("send side: the datagram to %s should enter %s's wt0 (tx_packets %d -> %d) and no WireGuard data packet leave for %s (%d did)",
			podAddr, acc.Name, txBefore, txAfter, remote.Name, sentBefore)
	}

	// Receive side: acc now sends the pod's CIDR to remote.
	if err := n.setAllowedIPs(ctx, acc.Name, remote.Name, append(meshPeerPrefixes(remote), f.podCIDR(remote))...); err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, n.setAllowedIPs(context.WithoutCancel(ctx), acc.Name, remote.Name, meshPeerPrefixes(remote)...))
	}()
	dropsBefore, err := n.disallowedSources(remote.Name, f)
	if err != nil {
		return err
	}
	if err := probe("receive side"); err != nil {
		return err
	}
	// The userspace daemons encrypt, send and discard in their own time.
	for deadline := time.Now().Add(counterWait); ; time.Sleep(50 * time.Millisecond) {
		drops, err := n.disallowedSources(remote.Name, f)
		if err != nil {
			return err
		}
		if drops > dropsBefore {
			break
		}
		if time.Now().After(deadline) {
			after, err := sent()
			return errors.Join(err, fmt.Errorf("receive side: with %s in %s's allowed-IPs for %s, %d WireGuard data packets left, and %s's daemon logged no %q (%s)",
				f.podCIDR(remote), acc.Name, remote.Name, after-sentBefore, remote.Name, disallowedSource(f), n.MeshLog(remote.Name)))
		}
	}
	if err := notReceived("receive side"); err != nil {
		return err
	}

	// Control: remote accepts the client's address from acc, and the pod receives it.
	accPeer := append(meshPeerPrefixes(acc), netip.PrefixFrom(f.client(), f.hostBits()))
	if err := n.setAllowedIPs(ctx, remote.Name, acc.Name, accPeer...); err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, n.setAllowedIPs(context.WithoutCancel(ctx), remote.Name, acc.Name, meshPeerPrefixes(acc)...))
	}()
	if _, err := n.Probe(ctx, "udp", dst, dropWait); err != nil {
		return err
	}
	for deadline := time.Now().Add(counterWait); ; time.Sleep(50 * time.Millisecond) {
		log, err := n.ServerLog(podName, "udp", meshCheckPort)
		if err != nil {
			return err
		}
		if strings.Contains(log, sawFrom(f.client())) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("control: with %s in %s's allowed-IPs for %s the pod still received nothing: %q", f.client(), remote.Name, acc.Name, log)
		}
	}
}

// routeCmd is route, an ip command with an empty verb at index 2, with verb set.
func routeCmd(route []string, verb string) []string {
	cmd := slices.Clone(route)
	cmd[2] = verb
	return cmd
}

// disallowedSource is what wireguard-go's verbose log says when it discards a packet of
// family f whose source is outside the sending peer's allowed-IPs.
func disallowedSource(f family) string { return f.String() + " packet with disallowed source address" }

// disallowedSources counts disallowedSource(f) in node's daemon log.
func (n *Net) disallowedSources(node string, f family) (int, error) {
	b, err := os.ReadFile(n.MeshLog(node))
	if err != nil {
		return 0, err
	}
	return strings.Count(string(b), disallowedSource(f)), nil
}

// wgDataName is the self-check's counter of WireGuard data packets leaving for a peer.
const wgDataName = "wg_data"

// wgDataTable is the self-check's table `ip lab-selfcheck` with the counter wgDataName and
// the chain that counts WireGuard data packets (message type 4) sent to peer's endpoint,
// which is IPv4 whatever family they carry; a keepalive, the one data packet with no
// payload (a UDP length of 8 + 32), is left out.
func wgDataTable(peer NodeSpec) string {
	return fmt.Sprintf(`table ip %s {
	counter %s {
	}
	chain output {
		type filter hook output priority filter; policy accept;
		oifname %q ip daddr %s udp dport %d @th,64,8 4 udp length > 40 counter name %q
	}
}
`, selfCheckTable, wgDataName, endpointIface, peer.EndpointAddr.Addr(), WireGuardPort, wgDataName)
}

// linkCounter reads one of dev's statistics (tx_packets, ...) in netns.
func (n *Net) linkCounter(ctx context.Context, netns, dev, name string) (uint64, error) {
	out, err := n.Exec(ctx, netns, "cat", "/sys/class/net/"+dev+"/statistics/"+name)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(out), 10, 64)
}

func (n *Net) checkEgressMasquerade(ctx context.Context, acc NodeSpec) (err error) {
	name, addr := "selfcheck-"+acc.Name, lastHost(acc.PodCIDR)
	if err := n.AddPod(ctx, name, acc.Name, addr.String()); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, n.RemovePod(name)) }()
	srv, err := n.ServeClient("udp", egressPort)
	if err != nil {
		return err
	}
	defer srv.Kill()
	for _, f := range families {
		dst := netip.AddrPortFrom(f.client(), egressPort).String()
		res, err := n.SendFromPod(ctx, name, "udp", egressPort, dst, 2*time.Second)
		if err != nil {
			return err
		}
		if want := f.uplink(acc).String(); res.PodSaw != want {
			return fmt.Errorf("a datagram pod %s sent first to the client: %s, want pod_saw=%s (the CNI's egress masquerade)", f.lastPod(acc), res, want)
		}
	}
	return nil
}

func (n *Net) checkHostToCluster(ctx context.Context, acc, remote NodeSpec, f family) (err error) {
	target := f.lastPod(remote)
	route := []string{f.ipFlag(), "route", "", netip.PrefixFrom(target, f.hostBits()).String(), "dev", n.cni.Bridge()}
	if err := n.ip(ctx, acc.Name, routeCmd(route, "add")...); err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, n.ip(context.WithoutCancel(ctx), acc.Name, routeCmd(route, "del")...))
	}()
	if err := n.NftApply(ctx, acc.Name, dnatRuleset(f, acc.UplinkIface, "udp", tunnelPort, target, "")); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, n.dropSelfCheckTables(ctx, acc.Name)) }()
	dst := netip.AddrPortFrom(f.uplink(acc), tunnelPort).String()
	if _, err := n.Probe(ctx, "udp", dst, 200*time.Millisecond); err != nil {
		return err
	}
	out, err := n.Exec(ctx, acc.Name, "conntrack", "-L", "-f", fmt.Sprintf("ipv%d", int(f)), "-p", "udp", "--orig-port-dst", fmt.Sprint(tunnelPort))
	if err != nil {
		return err
	}
	want := "dst=" + f.podGateway(acc).String()
	for line := range strings.Lines(out) {
		// The reply tuple, the second src=/dst= pair, holds the address the SNAT chose.
		if fields := strings.Fields(line); slices.Contains(fields, "dport="+fmt.Sprint(tunnelPort)) && slices.Index(fields, want) > slices.Index(fields, "dst="+f.uplink(acc).String()) {
			return nil
		}
	}
	return fmt.Errorf("a request DNATed to remote pod address %s into %s was not SNATed to %s: conntrack: %s",
		target, n.cni.Bridge(), f.podGateway(acc), strings.TrimSpace(out))
}

// selfCheckPod adds pod selfcheck-<node> at the last host address of the node's pod
// CIDR (and its PodAddr6), serving proto on port.
func (n *Net) selfCheckPod(ctx context.Context, node NodeSpec, proto string, port int) (string, error) {
	name := "selfcheck-" + node.Name
	if err := n.AddPod(ctx, name, node.Name, lastHost(node.PodCIDR).String()); err != nil {
		return "", err
	}
	if _, err := n.Serve(name, proto, port); err != nil {
		return "", errors.Join(err, n.RemovePod(name))
	}
	return name, nil
}

// dnatRuleset is the self-check's temporary table of family f: a plain DNAT of proto dport
// port arriving on iface to target:port and, when keepOn is not "", a null SNAT of it
// leaving by keepOn ahead of the CNI's masquerade, so it keeps the client's source there.
func dnatRuleset(f family, iface, proto string, port uint16, target netip.Addr, keepOn string) string {
	keep := ""
	if keepOn != "" {
		keep = fmt.Sprintf(`
	chain postrouting {
		type nat hook postrouting priority srcnat - 1; policy accept;
		oifname %q %s daddr %s %s dport %d snat to %[2]s saddr
	}`, keepOn, f.nft(), target, proto, port)
	}
	return fmt.Sprintf(`table %s %s {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname %q %s dport %d dnat to %s
	}%s
}
`, f.nft(), selfCheckTable, iface, proto, port, netip.AddrPortFrom(target, port), keep)
}

// dropSelfCheckTables deletes the self-check's tables of both families, present or not
// (declaring a table that exists is a no-op).
func (n *Net) dropSelfCheckTables(ctx context.Context, netns string) error {
	var script strings.Builder
	for _, f := range families {
		fmt.Fprintf(&script, "table %[1]s %[2]s\ndelete table %[1]s %[2]s\n", f.nft(), selfCheckTable)
	}
	return n.NftApply(context.WithoutCancel(ctx), netns, script.String())
}

// lastHost is the last host address of an IPv4 prefix (10.244.18.254 for /24).
func lastHost(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	v := binary.BigEndian.Uint32(a[:]) | (uint32(1)<<(32-p.Bits()) - 1)
	binary.BigEndian.PutUint32(a[:], v-1)
	return netip.AddrFrom4(a)
}
