package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"google.golang.org/protobuf/encoding/protojson"

	"kuport.wlz.li/kuport/datapath"
	"kuport.wlz.li/kuport/internal/syncbuf"
	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// countingDatapath counts the agent's Applies.
type countingDatapath struct {
	*datapath.Datapath
	applies atomic.Int64
}

func (c *countingDatapath) Apply(p *kuportv1.NodeProgram) error {
	c.applies.Add(1)
	return c.Datapath.Apply(p)
}

// driftNS is a fresh network namespace holding wt0 with worker-b's underlay address, for
// the golden program remote-worker-b (link kup-dcc4266d, return path in table 27505).
type driftNS struct {
	name string
	ns   netns.NsHandle
}

func newDriftNS(t testing.TB) *driftNS {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	d := &driftNS{name: "kupagent-" + hex.EncodeToString(b)}
	out, err := exec.Command("ip", "netns", "add", d.name).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", d.name).Run() })
	d.ns, err = netns.GetFromName(d.name)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.ns.Close() })
	for _, args := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", "wt0", "type", "veth", "peer", "name", "wt0-peer"},
		{"ip", "addr", "add", "100.64.93.150/24", "dev", "wt0"},
		{"ip", "link", "set", "wt0", "up"},
		{"ip", "link", "set", "wt0-peer", "up"},
	} {
		d.exec(t, args...)
	}
	return d
}

// exec runs a command in the namespace and returns its output; it fails the test when the
// command fails.
func (d *driftNS) exec(t testing.TB, args ...string) string {
	t.Helper()
	out, err := d.try(args...)
	require.NoError(t, err, "%v: %s", args, out)
	return out
}

func (d *driftNS) try(args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", d.name}, args...)...).CombinedOutput()
	return string(out), err
}

// TestPrivilegedDriftRepaired runs the agent over the real datapath in a fresh namespace
// with the periodic resync an hour away, so only the watch (Config.Drift, Datapath.Watch)
// can repair: a deleted table inet kuport, a deleted ip rule at pref 101, a deleted kup-*
// device, a flushed ruleset, a deleted element, route and address and a device set down are
// each back whole within 2 s. Changes to another table, device, rule or route
// cause no Apply at all.
func TestPrivilegedDriftRepaired(t *testing.T) {
	testenv.Privileged(t)
	b, err := os.ReadFile("../datapath/testdata/remote-worker-b.program.json")
	require.NoError(t, err)
	p := &kuportv1.NodeProgram{}
	require.NoError(t, protojson.Unmarshal(b, p))
	p.Version, p.Epoch = 1, 1

	d := newDriftNS(t)
	conn, err := nftables.New(nftables.WithNetNSFd(int(d.ns)), datapath.NFTSocketOption())
	require.NoError(t, err)
	nl, err := netlink.NewHandleAt(d.ns)
	require.NoError(t, err)
	t.Cleanup(nl.Close)
	logs := &syncbuf.Buffer{}
	log := hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug})
	dp := &countingDatapath{Datapath: datapath.New(datapath.Config{NFT: conn, Netlink: nl, NetNS: d.ns, Log: log.Named("datapath")})}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	drift, err := dp.Watch(ctx)
	require.NoError(t, err)

	c, target := startController(t)
	cfg := testConfig(dp, logs, target)
	cfg.NodeName, cfg.Underlay, cfg.Drift = p.GetNode(), "wt0", drift
	require.Equal(t, time.Hour, cfg.ResyncInterval)
	startAgent(t, cfg)
	s := c.NextSession(t)
	s.Send(t, p)
	require.Empty(t, s.NextAck(t).GetErrors())
	defer func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	}()

	// settle waits until no Apply has happened for a second that began with the link's
	// addresses final: the agent's own writes are notified too, and cause one Apply that
	// writes nothing, and so does the kernel's IPv6 link-local address when its duplicate
	// address detection ends, up to 2 s after the link comes up.
	settle := func() {
		t.Helper()
		for n := dp.applies.Load(); ; {
			tentative, _ := d.try("ip", "-6", "-o", "addr", "show", "dev", "kup-dcc4266d", "tentative")
			time.Sleep(time.Second)
			m := dp.applies.Load()
			if m == n && strings.TrimSpace(tentative) == "" {
				return
			}
			n = m
		}
	}
	whole := func() bool {
		dump, err := dp.Dump()
		if err != nil || dump != datapath.Render(p) {
			return false
		}
		rules, _ := d.try("ip", "rule", "show")
		routes, _ := d.try("ip", "route", "show", "table", "27505")
		link, _ := d.try("ip", "-o", "link", "show", "kup-dcc4266d")
		addr, _ := d.try("ip", "-o", "addr", "show", "dev", "kup-dcc4266d")
		return strings.Contains(rules, "101:\tfrom all to 100.64.93.143 fwmark 0x1/0x301f lookup main proto 107") &&
			strings.Contains(rules, "102:\tfrom all fwmark 0x1/0x301f lookup 27505 proto 107") &&
			strings.Contains(routes, "default via 169.254.77.0 dev kup-dcc4266d") &&
			strings.Contains(link, "state UNKNOWN") && // a vxlan device that is up
			strings.Contains(addr, "169.254.77.1/31")
	}
	settle()
	require.True(t, whole(), "the program is in the kernel:\n%s", d.exec(t, "ip", "rule", "show"))
	for _, damage := range [][]string{
		{"nft", "delete", "table", "inet", "kuport"},
		{"ip", "rule", "del", "pref", "101"},
		{"ip", "link", "del", "kup-dcc4266d"},
		// What a firewall reload or a networkd restart does, and smaller damage.
		{"nft", "flush", "ruleset"},
		{"nft", "delete", "element", "inet", "kuport", "dnat-addr-ports", "{ kup-dcc4266d . 10.244.18.107 . tcp . 3000 }"},
		{"ip", "route", "del", "default", "table", "27505"},
		{"ip", "addr", "flush", "dev", "kup-dcc4266d"},
		{"ip", "link", "set", "kup-dcc4266d", "down"},
	} {
		before := dp.applies.Load()
		d.exec(t, damage...)
		start := time.Now()
		// No look at the damage itself: the watch may repair it before whole() has read the
		// kernel (seen under load). The Apply counted below is the agent's answer to it.
		for !whole() {
			require.Less(t, time.Since(start), 2*time.Second, "%v not repaired within 2 s", damage)
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("%v: repaired after %v", strings.Join(damage, " "), time.Since(start).Round(time.Millisecond))
		require.Greater(t, dp.applies.Load(), before)
		settle()
	}

	// Others' objects, even beside kuport's own: no Apply.
	before := dp.applies.Load()
	for _, args := range [][]string{
		{"nft", "add", "table", "ip", "other"},
		{"nft", "add", "chain", "ip", "other", "pre", "{ type nat hook prerouting priority dstnat; }"},
		{"nft", "add", "rule", "ip", "other", "pre", "tcp", "dport", "3000", "counter"},
		{"nft", "add", "table", "inet", "kuport"},
		{"nft", "delete", "table", "ip", "other"},
		{"ip", "link", "add", "other0", "type", "veth", "peer", "name", "other1"},
		{"ip", "link", "set", "other0", "up"},
		{"ip", "addr", "add", "10.9.0.1/24", "dev", "other0"},
		{"ip", "rule", "add", "pref", "100", "fwmark", "0x2", "lookup", "300"},
		// Another's rule with kuport's mark and table, but not its protocol.
		{"ip", "rule", "add", "pref", "500", "fwmark", "0x1/0x301f", "lookup", "27505"},
		{"ip", "route", "add", "default", "via", "100.64.93.1", "dev", "wt0", "table", "300"},
		{"ip", "route", "add", "10.8.0.0/16", "via", "100.64.93.1", "dev", "wt0"},
		{"ip", "link", "del", "other0"},
	} {
		d.exec(t, args...)
	}
	time.Sleep(time.Second)
	require.Equal(t, before, dp.applies.Load(), "another program's changes caused an Apply")
	require.True(t, whole())
}
