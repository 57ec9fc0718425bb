package datapath

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// leastPrivStep names the step a re-executed test binary runs as the restricted agent.
const leastPrivStep = "KUPORT_LEASTPRIV_STEP"

// restrictScript turns the shell it runs in into the agent container of deploy/agent.yaml,
// as far as the datapath can tell, then execs its arguments: /proc/sys read-only (as the
// container runtime mounts it), no_new_privs (allowPrivilegeEscalation: false), and, for
// root, CAP_NET_ADMIN as the only capability (drop ALL, add NET_ADMIN): exec gives uid 0
// the bounding set as its permitted and effective sets.
const restrictScript = `set -e
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
exec setpriv --no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set=-all,+net_admin -- "$@"`

// leastPrivProgram is remote-worker-b (nftables, a vxlan link with rp_filter and its /127,
// a return path in both families) plus a UDP mapping on enp1s0 whose flow Cleanup must
// delete from conntrack.
func leastPrivProgram(t *testing.T) *kuportv1.NodeProgram {
	p := with6(goldenPrograms(t)["remote-worker-b"])
	p.DnatRules = append(p.DnatRules, &kuportv1.DnatRule{
		Id: "games/udp/dnat/enp1s0", Mapping: "games/udp", InInterface: "enp1s0",
		Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: &kuportv1.PortRange{First: 27015, Last: 27015},
		ToAddress: "10.244.17.5", ToPort: 27015,
	})
	return p
}

// TestPrivilegedLeastPrivilege runs the datapath as the agent runs it in its DaemonSet
// (opened as cmd/kuport-agent opens it, in its own namespace) from a process holding
// CAP_NET_ADMIN and no other capability, with /proc/sys read-only: it applies a program,
// repairs a reset rp_filter and cleans up, conntrack entry included. Any setns
// (CAP_SYS_ADMIN), /proc/sys write or need of CAP_NET_RAW would fail it.
func TestPrivilegedLeastPrivilege(t *testing.T) {
	testenv.Privileged(t)
	if step := os.Getenv(leastPrivStep); step != "" {
		restrictedStep(t, step)
		return
	}
	tn := newTestNS(t, "100.64.93.150")
	tn.addPodNetwork(t)
	client := tn.addPeer(t, "enp1s0", "203.0.113.9", "203.0.113.7")
	p := leastPrivProgram(t)
	restricted := func(step string) string {
		t.Helper()
		cmd := exec.Command("ip", "netns", "exec", tn.name, "unshare", "--mount", "--propagation", "private", "--",
			"sh", "-c", restrictScript, "sh", os.Args[0], "-test.run=^TestPrivilegedLeastPrivilege$")
		cmd.Env = append(os.Environ(), leastPrivStep+"="+step)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "restricted %s:\n%s", step, out)
		m := regexp.MustCompile(`(?m)^restricted ` + step + ` kernel_writes=(\d+)$`).FindStringSubmatch(string(out))
		require.NotNil(t, m, "restricted %s did not run:\n%s", step, out)
		return m[1]
	}

	assert.NotEqual(t, "0", restricted("apply"))
	assert.Equal(t, Render(p), tn.nftList(t))
	tn.checkKernel(t, p)
	assert.Contains(t, tn.exec(t, "ip", "-6", "-o", "addr", "show", "dev", "kup-dcc4266d"), "inet6 fd6b::1/127 scope global nodad")
	assert.NotEmpty(t, tn.rules6(t), "the IPv6 rule")
	// The link's own encapsulated packets have conntrack entries too; the client's port
	// names its flow.
	const sport = 5000
	flow := func() string { return tn.flowsBySport(t, 17)[sport] }
	client.sendUDP(t, sport, "203.0.113.9", 27015)
	deadline := time.Now().Add(5 * time.Second)
	for flow() == "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, "203.0.113.9:27015 -> 10.244.17.5:27015", flow())

	tn.exec(t, "sysctl", "-qw", "net.ipv4.conf.kup-dcc4266d.rp_filter=1")
	assert.Equal(t, "1", restricted("apply"), "the resync writes rp_filter back, and nothing else")
	tn.checkKernel(t, p)

	restricted("cleanup")
	tn.assertNothingOwned(t, itoa(p.GetReturnPaths()[0].GetTable()))
	assert.Empty(t, tn.rules6(t))
	assert.Empty(t, flow(), "the mapping's conntrack entry went with it")
}

// restrictedStep is the restricted process's side: it checks that it holds exactly what the
// DaemonSet grants, then opens the datapath as cmd/kuport-agent does (its watch included)
// and runs step.
func restrictedStep(t *testing.T, step string) {
	status, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for field, want := range map[string]string{
		"CapInh": "0000000000000000", "CapPrm": "0000000000001000", "CapEff": "0000000000001000",
		"CapBnd": "0000000000001000", "CapAmb": "0000000000000000", "NoNewPrivs": "1",
	} {
		require.Regexp(t, `(?m)^`+field+`:\s+`+want+`$`, string(status), "only CAP_NET_ADMIN (bit 12), no_new_privs")
	}
	err = os.WriteFile("/proc/sys/net/ipv4/conf/wt0/rp_filter", []byte("2"), 0o644)
	require.True(t, errors.Is(err, syscall.EROFS), "/proc/sys is read-only: %v", err)

	nft, err := nftables.New(nftables.AsLasting(), NFTSocketOption())
	require.NoError(t, err)
	defer func() { _ = nft.CloseLasting() }()
	nl, err := netlink.NewHandle()
	require.NoError(t, err)
	defer nl.Close()
	// A warning is a failure the datapath only logs (conntrack deletion).
	dp := New(Config{NFT: nft, Netlink: nl, NetNS: netns.None(),
		Log: hclog.New(&hclog.LoggerOptions{Name: "restricted", Level: hclog.Trace, Output: failOnWarn{t}})})
	switch step {
	case "apply":
		// The watch's sockets join their groups with CAP_NET_ADMIN alone; Apply's own writes
		// are notified.
		drift, err := dp.Watch(t.Context())
		require.NoError(t, err)
		require.NoError(t, dp.Apply(leastPrivProgram(t)))
		select {
		case <-drift:
		case <-time.After(5 * time.Second):
			t.Fatal("no drift signal for the apply's writes")
		}
		st, err := dp.NodeState("")
		require.NoError(t, err)
		assert.True(t, st.GetIpForward(), "ip_forward read without /proc/sys")
	case "cleanup":
		require.NoError(t, dp.Cleanup())
	default:
		t.Fatalf("unknown step %q", step)
	}
	fmt.Printf("restricted %s kernel_writes=%d\n", step, dp.lastChanges)
}

// failOnWarn logs to the test and fails it on a WARN or ERROR line.
type failOnWarn struct{ t testing.TB }

func (w failOnWarn) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\n")
	if strings.Contains(line, "[WARN]") || strings.Contains(line, "[ERROR]") {
		w.t.Errorf("logged: %s", line)
	} else {
		w.t.Log(line)
	}
	return len(p), nil
}
