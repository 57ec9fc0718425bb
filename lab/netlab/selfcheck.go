package netlab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

const (
	selfCheckTable = "lab-selfcheck"
	meshCheckPort  = 3999
	egressPort     = 3998
	tunnelPort     = 3997
	// counterWait bounds how long the mesh check waits to see the drop counted.
	counterWait = 5 * time.Second
)

// SelfCheck proves the emulation bites (DESIGN.md "The lab", Self-check), using the
// first node as the accepting node and the second as the remote one:
//  1. a DNAT on the accepting node straight to a pod on the remote node, routed over
//     wt0, carries the client's source into the mesh: the remote node's mesh_drops
//     counter rises and the pod receives nothing (WireGuard's allowed IPs). The probe is
//     UDP, not a TCP SYN, because the pod logs every datagram it receives, so the check
//     sees that the packet was dropped and not merely counted. The remote node's wt0 is
//     made loose (rp_filter=2) meanwhile, so its strict rp_filter cannot stand in for
//     the mesh drop, and the DNAT keeps the client's source with a null SNAT, so that no
//     CNI masquerade (Flannel's of the outside to a remote pod) can hide it;
//  2. under every profile, the CNI's egress masquerade: a datagram a pod on the
//     accepting node sends first to the client reaches the client from the node's
//     uplink address, not the pod's;
//  3. under cilium, the tunnel-mode host->cluster masquerade: a DNAT on the accepting
//     node to another node's pod address routed into cilium_host (as tunnel mode routes
//     every remote pod CIDR) is SNATed to the cilium_host address, as conntrack shows.
//     Cilium's rule spares traffic to the node's own pods, so a request to a local pod
//     keeps its source whatever kuport does.
//
// It leaves nothing behind: the temporary table `ip lab-selfcheck`, the routes, the
// client's server and the temporary pods selfcheck-<node> (last host address of each
// node's pod CIDR) are removed on every path. The error says which emulation failed to
// bite.
func (n *Net) SelfCheck(ctx context.Context) error {
	if len(nodes) < 2 {
		return errors.New("netlab: self-check needs two nodes")
	}
	if err := n.checkMesh(ctx, nodes[0], nodes[1]); err != nil {
		return fmt.Errorf("netlab: self-check, mesh emulation: %w", err)
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
	if err := n.NftApply(ctx, acc.Name, dnatRuleset(acc.UplinkIface, "udp", meshCheckPort, podAddr, acc.UnderlayIface)); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, n.dropSelfCheckTable(ctx, acc.Name)) }()

	before, err := n.NftCounter(ctx, remote.Name, "ip", "lab-mesh", "mesh_drops")
	if err != nil {
		return err
	}
	dst := netip.AddrPortFrom(acc.UplinkAddr.Addr(), meshCheckPort).String()
	if _, err := n.Probe(ctx, "udp", dst, time.Second); err != nil {
		return err
	}
	log, err := n.ServerLog(podName, "udp", meshCheckPort)
	if err != nil {
		return err
	}
	if strings.Contains(log, "saw ") {
		return fmt.Errorf("pod %s on %s received a datagram DNATed over wt0 with a foreign source: %s", podAddr, remote.Name, log)
	}
	deadline := time.Now().Add(counterWait)
	for {
		after, err := n.NftCounter(ctx, remote.Name, "ip", "lab-mesh", "mesh_drops")
		if err != nil {
			return err
		}
		if after > before {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s mesh_drops stayed at %d after a datagram from %s crossed wt0 to %s", remote.Name, after, clientAddr.Addr(), podAddr)
		}
		time.Sleep(50 * time.Millisecond)
	}
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
	if err := n.NftApply(ctx, acc.Name, dnatRuleset(acc.UplinkIface, "udp", tunnelPort, target, "")); err != nil {
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
// by keepOn ahead of the CNI's masquerade, so it keeps the client's source there.
func dnatRuleset(iface, proto string, port uint16, target netip.Addr, keepOn string) string {
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
	}%s
}
`, selfCheckTable, iface, proto, port, netip.AddrPortFrom(target, port), keep)
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
