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
// node and the second as the remote one:
//  1. the mesh carries node-to-node traffic: every node pings every other node's wt0
//     address (which also completes the WireGuard handshakes);
//  2. the mesh drops a forwarded packet that keeps the client's source, from both ends
//     (checkMesh): a DNAT on the accepting node straight to a pod on the remote node,
//     routed over wt0, carries the client's source into WireGuard. Send side: no peer's
//     allowed-IPs holds the pod's address, so the datagram enters wt0 and no WireGuard data
//     packet leaves for it. Receive side: with the accepting node's allowed-IPs for the
//     remote node widened to its pod CIDR, the datagram is sent, and the remote daemon
//     discards it because its source is outside the accepting node's allowed-IPs (its
//     log says "disallowed source address"). Control: with the client's /32 added to the
//     remote node's allowed-IPs for the accepting node, the pod receives it, so allowed-IPs
//     alone made the drop. The probe is UDP, not a TCP SYN, because the pod logs every
//     datagram it receives. The remote node's wt0 is made loose (rp_filter=2) meanwhile,
//     so its strict rp_filter cannot stand in for the mesh, and the DNAT keeps the client's
//     source with a null SNAT, so that no CNI masquerade can hide it;
//  3. under every profile, the CNI's egress masquerade: a datagram a pod on the
//     accepting node sends first to the client reaches the client from the node's
//     uplink address, not the pod's;
//  4. under cilium, the tunnel-mode host->cluster masquerade: a DNAT on the accepting
//     node to another node's pod address routed into cilium_host (as tunnel mode routes
//     every remote pod CIDR) is SNATed to the cilium_host address, as conntrack shows.
//     Cilium's rule spares traffic to the node's own pods, so a request to a local pod
//     keeps its source whatever kuport does.
//
// It leaves nothing behind: the temporary table `ip lab-selfcheck`, the routes, the
// allowed-IPs, the client's server and the temporary pods selfcheck-<node> (last host
// address of each node's pod CIDR) are restored or removed on every path. The error says
// which check failed to bite.
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
		if err := n.checkHostToCluster(ctx, nodes[0], nodes[1]); err != nil {
			return fmt.Errorf("netlab: self-check, CNI emulation (%s): %w", n.cni, err)
		}
	}
	return nil
}

// checkMeshCarries pings, for every pair of nodes, one's wt0 address from the other: the
// echo and its reply cross the mesh both ways, and complete the pair's WireGuard handshake.
// It sends every 0.2 s until a reply, for up to meshReachWait: a handshake initiation that
// reached a daemon still starting is lost, and WireGuard sends the next only after its
// rekey timeout of 5 s (three such failures in one make test on two busy cores).
func (n *Net) checkMeshCarries(ctx context.Context) error {
	for i, from := range nodes {
		for _, to := range nodes[i+1:] {
			if _, err := n.Exec(ctx, from.Name, "ping", "-c", "1", "-i", "0.2", "-w", meshReachWait, "-q", to.UnderlayAddr.Addr().String()); err != nil {
				return fmt.Errorf("%s cannot reach %s over wt0: %w", from.Name, to.Name, err)
			}
		}
	}
	return nil
}

func (n *Net) checkMesh(ctx context.Context, acc, remote NodeSpec) (err error) {
	podName, podAddr, err := n.selfCheckPod(ctx, remote, "udp", meshCheckPort)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, n.RemovePod(podName)) }()
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
	route := []string{remote.PodCIDR.Masked().String(), "via", remote.UnderlayAddr.Addr().String(), "dev", acc.UnderlayIface}
	if err := n.ip(ctx, acc.Name, append([]string{"route", "add"}, route...)...); err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, n.ip(context.WithoutCancel(ctx), acc.Name, append([]string{"route", "del"}, route...)...))
	}()
	table := dnatRuleset(acc.UplinkIface, "udp", meshCheckPort, podAddr, acc.UnderlayIface, wgDataCounter(remote))
	if err := n.NftApply(ctx, acc.Name, table); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, n.dropSelfCheckTable(ctx, acc.Name)) }()

	dst := netip.AddrPortFrom(acc.UplinkAddr.Addr(), meshCheckPort).String()
	// notReceived fails once the pod has received the client's datagram.
	notReceived := func(side string) error {
		log, err := n.ServerLog(podName, "udp", meshCheckPort)
		if err != nil {
			return err
		}
		if strings.Contains(log, "saw ") {
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
	if err := n.setAllowedIPs(ctx, acc.Name, remote.Name, meshPeerPrefix(remote), remote.PodCIDR.Masked()); err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, n.setAllowedIPs(context.WithoutCancel(ctx), acc.Name, remote.Name, meshPeerPrefix(remote)))
	}()
	dropsBefore, err := n.disallowedSources(remote.Name)
	if err != nil {
		return err
	}
	if err := probe("receive side"); err != nil {
		return err
	}
	// The userspace daemons encrypt, send and discard in their own time.
	for deadline := time.Now().Add(counterWait); ; time.Sleep(50 * time.Millisecond) {
		drops, err := n.disallowedSources(remote.Name)
		if err != nil {
			return err
		}
		if drops > dropsBefore {
			break
		}
		if time.Now().After(deadline) {
			after, err := sent()
			return errors.Join(err, fmt.Errorf("receive side: with %s in %s's allowed-IPs for %s, %d WireGuard data packets left, and %s's daemon logged no %q (%s)",
				remote.PodCIDR, acc.Name, remote.Name, after-sentBefore, remote.Name, disallowedSource, n.MeshLog(remote.Name)))
		}
	}
	if err := notReceived("receive side"); err != nil {
		return err
	}

	// Control: remote accepts the client's address from acc, and the pod receives it.
	accPeer := []netip.Prefix{meshPeerPrefix(acc), netip.PrefixFrom(clientAddr.Addr(), 32)}
	if err := n.setAllowedIPs(ctx, remote.Name, acc.Name, accPeer...); err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, n.setAllowedIPs(context.WithoutCancel(ctx), remote.Name, acc.Name, meshPeerPrefix(acc)))
	}()
	if _, err := n.Probe(ctx, "udp", dst, dropWait); err != nil {
		return err
	}
	for deadline := time.Now().Add(counterWait); ; time.Sleep(50 * time.Millisecond) {
		log, err := n.ServerLog(podName, "udp", meshCheckPort)
		if err != nil {
			return err
		}
		if strings.Contains(log, "saw "+clientAddr.Addr().String()+":") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("control: with %s in %s's allowed-IPs for %s the pod still received nothing: %q", clientAddr.Addr(), remote.Name, acc.Name, log)
		}
	}
}

// disallowedSource is what wireguard-go's verbose log says when it discards a packet whose
// source is outside the sending peer's allowed-IPs.
const disallowedSource = "IPv4 packet with disallowed source address"

// disallowedSources counts disallowedSource in node's daemon log.
func (n *Net) disallowedSources(node string) (int, error) {
	b, err := os.ReadFile(n.MeshLog(node))
	if err != nil {
		return 0, err
	}
	return strings.Count(string(b), disallowedSource), nil
}

// wgDataName is the self-check's counter of WireGuard data packets leaving for a peer.
const wgDataName = "wg_data"

// wgDataCounter is the self-check table's counter wgDataName and the chain that counts
// WireGuard data packets (message type 4) sent to peer's endpoint; a keepalive, the one
// data packet with no payload (a UDP length of 8 + 32), is left out.
func wgDataCounter(peer NodeSpec) string {
	return fmt.Sprintf(`
	counter %s {
	}
	chain output {
		type filter hook output priority filter; policy accept;
		oifname %q ip daddr %s udp dport %d @th,64,8 4 udp length > 40 counter name %q
	}`, wgDataName, endpointIface, peer.EndpointAddr.Addr(), WireGuardPort, wgDataName)
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
	dst := netip.AddrPortFrom(clientAddr.Addr(), egressPort).String()
	res, err := n.SendFromPod(ctx, name, "udp", egressPort, dst, 2*time.Second)
	if err != nil {
		return err
	}
	if want := acc.UplinkAddr.Addr().String(); res.PodSaw != want {
		return fmt.Errorf("a datagram pod %s sent first to the client: %s, want pod_saw=%s (the CNI's egress masquerade)", addr, res, want)
	}
	return nil
}

func (n *Net) checkHostToCluster(ctx context.Context, acc, remote NodeSpec) (err error) {
	target := lastHost(remote.PodCIDR)
	route := []string{netip.PrefixFrom(target, 32).String(), "dev", n.cni.Bridge()}
	if err := n.ip(ctx, acc.Name, append([]string{"route", "add"}, route...)...); err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, n.ip(context.WithoutCancel(ctx), acc.Name, append([]string{"route", "del"}, route...)...))
	}()
	if err := n.NftApply(ctx, acc.Name, dnatRuleset(acc.UplinkIface, "udp", tunnelPort, target, "", "")); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, n.dropSelfCheckTable(ctx, acc.Name)) }()
	dst := netip.AddrPortFrom(acc.UplinkAddr.Addr(), tunnelPort).String()
	if _, err := n.Probe(ctx, "udp", dst, 200*time.Millisecond); err != nil {
		return err
	}
	out, err := n.Exec(ctx, acc.Name, "conntrack", "-L", "-p", "udp", "--orig-port-dst", fmt.Sprint(tunnelPort))
	if err != nil {
		return err
	}
	want := "dst=" + acc.PodGateway().Addr().String()
	for line := range strings.Lines(out) {
		// The reply tuple, the second src=/dst= pair, holds the address the SNAT chose.
		if f := strings.Fields(line); slices.Contains(f, "dport="+fmt.Sprint(tunnelPort)) && slices.Index(f, want) > slices.Index(f, "dst="+acc.UplinkAddr.Addr().String()) {
			return nil
		}
	}
	return fmt.Errorf("a request DNATed to remote pod address %s into %s was not SNATed to %s: conntrack: %s",
		target, n.cni.Bridge(), acc.PodGateway().Addr(), strings.TrimSpace(out))
}

// selfCheckPod adds pod selfcheck-<node> at the last host address of the node's pod
// CIDR, serving proto on port.
func (n *Net) selfCheckPod(ctx context.Context, node NodeSpec, proto string, port int) (string, netip.Addr, error) {
	name, addr := "selfcheck-"+node.Name, lastHost(node.PodCIDR)
	if err := n.AddPod(ctx, name, node.Name, addr.String()); err != nil {
		return "", netip.Addr{}, err
	}
	if _, err := n.Serve(name, proto, port); err != nil {
		return "", netip.Addr{}, errors.Join(err, n.RemovePod(name))
	}
	return name, addr, nil
}

// dnatRuleset is the self-check's temporary table: a plain DNAT of proto dport port
// arriving on iface to target:port and, when keepOn is not "", a null SNAT of it leaving
// by keepOn ahead of the CNI's masquerade, so it keeps the client's source there; extra
// adds objects and chains.
func dnatRuleset(iface, proto string, port uint16, target netip.Addr, keepOn, extra string) string {
	keep := ""
	if keepOn != "" {
		keep = fmt.Sprintf(`
	chain postrouting {
		type nat hook postrouting priority srcnat - 1; policy accept;
		oifname %q ip daddr %s %s dport %d snat to ip saddr
	}`, keepOn, target, proto, port)
	}
	return fmt.Sprintf(`table ip %s {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname %q %s dport %d dnat to %s
	}%s%s
}
`, selfCheckTable, iface, proto, port, netip.AddrPortFrom(target, port), keep, extra)
}

func (n *Net) dropSelfCheckTable(ctx context.Context, netns string) error {
	_, err := n.Exec(context.WithoutCancel(ctx), netns, "nft", "delete", "table", "ip", selfCheckTable)
	return err
}

// lastHost is the last host address of an IPv4 prefix (10.244.18.254 for /24).
func lastHost(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	v := binary.BigEndian.Uint32(a[:]) | (uint32(1)<<(32-p.Bits()) - 1)
	binary.BigEndian.PutUint32(a[:], v-1)
	return netip.AddrFrom4(a)
}
