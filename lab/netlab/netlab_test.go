package netlab_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/internal/testenv"
	"kuport.wlz.li/kuport/lab/netlab"
)

// testRuleset is what the datapath will program for a local pod
// (docs/design/datapath.md#two-shapes, the first): a plain DNAT on the uplink plus the
// identity SNAT that claims the connection before any CNI masquerade could.
const testRuleset = `table ip test-dnat {
	chain pre {
		type nat hook prerouting priority dstnat - 10; policy accept;
		iifname "enp1s0" tcp dport 3000 dnat to 10.244.17.10:3000
		iifname "enp1s0" udp dport 3001 dnat to 10.244.17.10:3001
	}
	chain post {
		type nat hook postrouting priority srcnat - 10; policy accept;
		oifname "cilium_host" ip daddr 10.244.17.10 tcp dport 3000 snat to ip saddr
		oifname "cilium_host" ip daddr 10.244.17.10 udp dport 3001 snat to ip saddr
	}
}
`

func TestPrivilegedNetlab(t *testing.T) {
	testenv.Privileged(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "kuport-lab")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "kuport.wlz.li/kuport/cmd/kuport-lab").CombinedOutput()
	require.NoError(t, err, string(out))

	log := hclog.New(&hclog.LoggerOptions{Name: "netlab", Level: hclog.Debug, Output: t.Output()})
	n, err := netlab.Build(ctx, netlab.Config{Log: log, Dir: dir, ToolBin: bin})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, n.Close()) })

	edge, ok := n.Node("edge-a")
	require.True(t, ok)
	assert.Equal(t, "10.244.17.1/24", edge.PodGateway().String())
	assert.Len(t, n.Nodes(), 3)

	// wt0 is a WireGuard device (a TUN of wireguard-go) with one peer per other node, whose
	// allowed-IPs is its /32 and its /128, and it carries node-to-node traffic of both
	// families at the underlay MTU.
	link, err := n.Exec(ctx, "edge-a", "ip", "-d", "link", "show", "wt0")
	require.NoError(t, err)
	assert.Contains(t, link, "mtu 1420")
	assert.Contains(t, link, "tun type tun")
	wg, err := n.WireGuard(ctx, "edge-a", "show", "wt0", "allowed-ips")
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^\S+=\t100\.64\.93\.150/32 fd00:64:93::150/128$`, wg)
	assert.Regexp(t, `(?m)^\S+=\t100\.64\.93\.160/32 fd00:64:93::160/128$`, wg)
	assert.Len(t, strings.Split(strings.TrimSpace(wg), "\n"), 2)
	nodeLog := filepath.Join(dir, "serve-worker-b.log")
	_, err = n.Start("worker-b", nodeLog, bin, "serve", "--proto", "udp", "--port", "4000")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(nodeLog)
		return strings.Contains(string(b), "listening udp 4000")
	}, 10*time.Second, 20*time.Millisecond)
	probe, err := n.Exec(ctx, "edge-a", bin, "probe", "--proto", "udp", "--to", "100.64.93.150:4000", "--size", "1392")
	require.NoError(t, err)
	assert.Equal(t, "pod_saw=100.64.93.143 reply_from=100.64.93.150:4000\n", probe, "a full-size datagram crosses the mesh")
	// IPv6 has a 40-byte header: 1420 - 48.
	probe, err = n.Exec(ctx, "edge-a", bin, "probe", "--proto", "udp", "--to", "[fd00:64:93::150]:4000", "--size", "1372")
	require.NoError(t, err)
	assert.Equal(t, "pod_saw=fd00:64:93::143 reply_from=[fd00:64:93::150]:4000\n", probe, "a full-size IPv6 datagram crosses the mesh")
	// The client reaches a node's uplink over IPv6, through the router.
	res, err := n.Probe(ctx, "udp", "[2001:db8:2::2]:4000", 2*time.Second)
	require.NoError(t, err)
	assert.Equal(t, netlab.ProbeResult{PodSaw: "2001:db8:100::7", ReplyFrom: "[2001:db8:2::2]:4000"}, res)
	assert.Equal(t, "2001:db8:100::7", n.ClientAddr6().String())
	assert.Equal(t, "fd00:10:244:17::1/64", edge.PodGateway6().String())

	require.NoError(t, n.SelfCheck(ctx))
	tables, err := n.Exec(ctx, "edge-a", "nft", "list", "tables")
	require.NoError(t, err)
	assert.NotContains(t, tables, "lab-selfcheck", "self-check left its table")
	routes, err := n.Exec(ctx, "edge-a", "ip", "route")
	require.NoError(t, err)
	assert.NotContains(t, routes, "10.244.18.0/24", "self-check left its route")
	assert.NotContains(t, routes, "10.244.18.254", "self-check left its route into cilium_host")
	assert.NotContains(t, netnsList(t), "selfcheck", "self-check left its pods")
	rp, err := n.Exec(ctx, "worker-b", "sysctl", "-n", "net.ipv4.conf.wt0.rp_filter")
	require.NoError(t, err)
	assert.Equal(t, "1", strings.TrimSpace(rp), "self-check restores the strict rp_filter")
	for node, want := range map[string]string{
		"edge-a":   `(?m)^\S+=\t100\.64\.93\.150/32 fd00:64:93::150/128$`,
		"worker-b": `(?m)^\S+=\t100\.64\.93\.143/32 fd00:64:93::143/128$`,
	} {
		wg, err := n.WireGuard(ctx, node, "show", "wt0", "allowed-ips")
		require.NoError(t, err)
		assert.Regexp(t, want, wg, "self-check restores %s's allowed-IPs", node)
	}
	mesh, err := os.ReadFile(n.MeshLog("worker-b"))
	require.NoError(t, err)
	assert.Contains(t, string(mesh), "IPv4 packet with disallowed source address", "worker-b's WireGuard dropped the client's datagram")
	assert.Contains(t, string(mesh), "IPv6 packet with disallowed source address", "worker-b's WireGuard dropped the client's IPv6 datagram")
	assert.NotContains(t, routes, "fd00:10:244:18::", "self-check left its IPv6 route")
	routes6, err := n.Exec(ctx, "edge-a", "ip", "-6", "route")
	require.NoError(t, err)
	assert.NotContains(t, routes6, "fd00:10:244:18:", "self-check left an IPv6 route")

	// A stopped daemon takes wt0 with it; restarted, it carries again (same keys). A frozen
	// one keeps wt0 and carries nothing until thawed.
	ping := func() error {
		for _, addr := range []string{"100.64.93.150", "fd00:64:93::150"} {
			if _, err := n.Exec(ctx, "edge-a", "ping", "-c", "1", "-W", "1", addr); err != nil {
				return err
			}
		}
		return nil
	}
	require.NoError(t, n.FreezeWireGuard("worker-b"))
	assert.Error(t, ping(), "a ping crossed a frozen daemon")
	_, err = n.Exec(ctx, "worker-b", "ip", "link", "show", "wt0")
	assert.NoError(t, err, "wt0 stays while its daemon is frozen")
	require.NoError(t, n.ThawWireGuard("worker-b"))
	require.Eventually(t, func() bool { return ping() == nil }, 20*time.Second, 100*time.Millisecond, "no ping once thawed")
	require.NoError(t, n.StopWireGuard(ctx, "worker-b"))
	_, err = n.Exec(ctx, "worker-b", "ip", "link", "show", "wt0")
	assert.Error(t, err, "wt0 outlived its daemon")
	require.NoError(t, n.StartWireGuard(ctx, "worker-b"))
	require.Eventually(t, func() bool { return ping() == nil }, 20*time.Second, 100*time.Millisecond, "no ping once restarted")

	require.NoError(t, n.AddPod(ctx, "web", "edge-a", "10.244.17.10"))
	tcp, err := n.Serve("web", "tcp", 3000)
	require.NoError(t, err)
	udp, err := n.Serve("web", "udp", 3001)
	require.NoError(t, err)
	require.NoError(t, n.NftApply(ctx, "edge-a", testRuleset))

	for _, c := range []struct {
		proto string
		port  int
		dst   string
	}{{"tcp", 3000, "203.0.113.9:3000"}, {"udp", 3001, "203.0.113.9:3001"}} {
		res, err := n.Probe(ctx, c.proto, c.dst, 2*time.Second)
		require.NoError(t, err)
		assert.Equal(t, netlab.ProbeResult{PodSaw: "198.51.100.7", ReplyFrom: c.dst}, res, c.proto)
		slog, err := n.ServerLog("web", c.proto, c.port)
		require.NoError(t, err)
		assert.Contains(t, slog, "saw 198.51.100.7:", c.proto)
	}

	// The pod is dual-stack: a pod speaking first to the client over IPv6 is masqueraded to
	// its node's IPv6 uplink address, as over IPv4 to its IPv4 one.
	require.Equal(t, "fd00:10:244:17::10", edge.PodAddr6(netip.MustParseAddr("10.244.17.10")).String())
	_, err = n.ServeClient("udp", 4001)
	require.NoError(t, err)
	for dst, saw := range map[string]string{"198.51.100.7:4001": "203.0.113.9", "[2001:db8:100::7]:4001": "2001:db8:113::9"} {
		res, err = n.SendFromPod(ctx, "web", "udp", 3002, dst, 2*time.Second)
		require.NoError(t, err)
		assert.Equal(t, netlab.ProbeResult{PodSaw: saw, ReplyFrom: dst}, res)
	}

	// Nothing listens on 3002 and nothing DNATs it: a probe reports nothing, not an error.
	res, err = n.Probe(ctx, "udp", "203.0.113.9:3002", 300*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, netlab.ProbeResult{}, res)

	// A routed virtual address of either family is steered to the node's uplink address of
	// that family.
	for vip, via := range map[string]string{"198.18.100.1": "via 192.0.2.2 ", "2001:db8:ff::1": "via 2001:db8:2::2 "} {
		require.NoError(t, n.RouteVirtual(ctx, netip.MustParseAddr(vip), "worker-b"))
		route, err := n.Exec(ctx, netlab.RouterNS, "ip", "route", "get", vip)
		require.NoError(t, err)
		assert.Contains(t, route, via, vip)
	}

	// The host firewall passes ICMPv6, neighbour discovery among it, and drops a new IPv6
	// connection to the node's own address as it drops an IPv4 one.
	require.NoError(t, n.AddHostFirewall(ctx, "worker-c"))
	_, err = n.Exec(ctx, netlab.RouterNS, "ip", "-6", "neigh", "flush", "dev", "to-worker-c")
	require.NoError(t, err)
	_, err = n.Exec(ctx, netlab.ClientNS, "ping", "-c", "1", "-W", "2", "2001:db8:18::3")
	assert.NoError(t, err, "the firewall passes ICMPv6 and neighbour discovery")
	fwDrops := func() uint64 {
		drops, err := n.NftCounter(ctx, "worker-c", "inet", netlab.FirewallTable, netlab.FirewallDrops)
		require.NoError(t, err)
		return drops
	}
	before := fwDrops()
	res, err = n.Probe(ctx, "udp", "[2001:db8:18::3]:4002", 300*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, netlab.ProbeResult{}, res)
	assert.Greater(t, fwDrops(), before, "the firewall dropped an IPv6 datagram to the node")

	pids := []int{tcp.Pid(), udp.Pid()}
	daemons := 0
	for _, node := range []string{"edge-a", "worker-b", "worker-c"} {
		out, err := exec.Command("ip", "netns", "pids", node).CombinedOutput()
		require.NoError(t, err, string(out))
		for _, f := range strings.Fields(string(out)) {
			if comm, _ := os.ReadFile("/proc/" + f + "/comm"); strings.TrimSpace(string(comm)) == "wireguard" {
				pid, err := strconv.Atoi(f)
				require.NoError(t, err)
				pids = append(pids, pid)
				daemons++
			}
		}
	}
	assert.Equal(t, 3, daemons, "one WireGuard daemon per node")
	require.NoError(t, n.Close())
	require.NoError(t, n.Close(), "Close is idempotent")
	list := netnsList(t)
	for _, ns := range append(netlab.Namespaces(), "pod-web") {
		assert.NotContains(t, strings.Fields(list), ns)
	}
	for _, pid := range pids {
		assert.True(t, errors.Is(syscall.Kill(pid, 0), syscall.ESRCH), "pid %d still alive", pid)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	assert.NotContains(t, string(mounts), "kuport-lab-wireguard", "a daemon's tmpfs is left mounted")
}

func netnsList(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	require.NoError(t, err, string(out))
	return string(out)
}

// TestPrivilegedNetlabProfiles builds the lab under each non-default CNI profile: the
// self-check passes (the profile's egress masquerade bites), a pod sits behind the
// profile's device, a DNAT with the identity SNAT reaches it with the client's address, and
// a pod speaking first reaches the client from its node's address.
func TestPrivilegedNetlabProfiles(t *testing.T) {
	testenv.Privileged(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "kuport-lab")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "kuport.wlz.li/kuport/cmd/kuport-lab").CombinedOutput()
	require.NoError(t, err, string(out))
	for _, cni := range []netlab.CNI{netlab.CNIFlannel, netlab.CNICalico} {
		t.Run(string(cni), func(t *testing.T) {
			log := hclog.New(&hclog.LoggerOptions{Name: "netlab", Level: hclog.Info, Output: t.Output()})
			n, err := netlab.Build(ctx, netlab.Config{Log: log, Dir: dir, ToolBin: bin, CNI: cni})
			require.NoError(t, err)
			defer func() { assert.NoError(t, n.Close()) }()
			assert.Equal(t, cni, n.CNI())
			require.NoError(t, n.SelfCheck(ctx))

			require.NoError(t, n.AddPod(ctx, "web", "edge-a", "10.244.17.10"))
			dev := cni.PodDevice("web")
			routes, err := n.Exec(ctx, "edge-a", "ip", "route", "get", "10.244.17.10")
			require.NoError(t, err)
			assert.Contains(t, routes, "dev "+dev+" ", "a packet to the pod leaves by the profile's device")
			_, err = n.Serve("web", "udp", 3001)
			require.NoError(t, err)
			require.NoError(t, n.NftApply(ctx, "edge-a", `table ip test-dnat {
	chain pre {
		type nat hook prerouting priority dstnat - 10; policy accept;
		iifname "enp1s0" udp dport 3001 dnat to 10.244.17.10:3001
	}
}
table ip6 test-dnat {
	chain pre {
		type nat hook prerouting priority dstnat - 10; policy accept;
		iifname "enp1s0" udp dport 3001 dnat to [fd00:10:244:17::10]:3001
	}
}
`))
			routes, err = n.Exec(ctx, "edge-a", "ip", "route", "get", "fd00:10:244:17::10")
			require.NoError(t, err)
			assert.Contains(t, routes, "dev "+dev+" ", "an IPv6 packet to the pod leaves by the profile's device")
			for dst, saw := range map[string]string{"203.0.113.9:3001": "198.51.100.7", "[2001:db8:113::9]:3001": "2001:db8:100::7"} {
				res, err := n.Probe(ctx, "udp", dst, 2*time.Second)
				require.NoError(t, err)
				assert.Equal(t, netlab.ProbeResult{PodSaw: saw, ReplyFrom: dst}, res, "the CNI leaves a request to a local pod alone")
			}

			_, err = n.ServeClient("udp", 4001)
			require.NoError(t, err)
			for dst, saw := range map[string]string{"198.51.100.7:4001": "203.0.113.9", "[2001:db8:100::7]:4001": "2001:db8:113::9"} {
				res, err := n.SendFromPod(ctx, "web", "udp", 3002, dst, 2*time.Second)
				require.NoError(t, err)
				assert.Equal(t, netlab.ProbeResult{PodSaw: saw, ReplyFrom: dst}, res,
					"a pod speaking first is masqueraded to its node's address")
			}
		})
	}
}
