package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/agent"
	"kuport.wlz.li/kuport/internal/syncbuf"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// restrictScript makes the shell it runs in what deploy/agent.yaml grants the agent, then
// execs its arguments: /proc/sys read-only, no_new_privs, and CAP_NET_ADMIN as the only
// capability of uid 0 (exec gives root its bounding set). The datapath's
// TestPrivilegedLeastPrivilege does the same.
const restrictScript = `set -e
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
exec setpriv --no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set=-all,+net_admin -- "$@"`

// TestPrivilegedAgentLeastPrivilege runs kuport-agent as its DaemonSet runs it, with
// CAP_NET_ADMIN alone and /proc/sys read-only, its epoch file in a directory owned by root:
// it applies a program with a link (rp_filter 2), keeps the fencing epoch, and the exec
// probe finds it ready.
func TestPrivilegedAgentLeastPrivilege(t *testing.T) {
	ns := newAgentNS(t, "leastpriv")
	ns.ip(t, "link", "set", "lo", "up") // for the inspection server and the probe
	ctrl, controller := serveOneShot(t, &kuportv1.NodeProgram{Node: "edge-a", Version: 1, Epoch: 7,
		DnatRules: []*kuportv1.DnatRule{{
			Id: "games/gs/dnat/wt0", Mapping: "games/gs", InInterface: "wt0",
			Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: &kuportv1.PortRange{First: 27015, Last: 27015},
			ToAddress: "169.254.77.1", ToPort: 27015,
		}},
		Links: []*kuportv1.Link{{
			Name: "kup-1a2b3c4d", ClassName: "public", PeerNode: "worker-b", Vni: 4242, Port: 4790,
			LocalUnderlay: "100.64.93.143", RemoteUnderlay: "100.64.93.150",
			LocalAddress: "169.254.77.0", PeerAddress: "169.254.77.1", Mtu: 1370,
		}},
	})
	epoch := filepath.Join(t.TempDir(), "kuport", "epoch")
	self, err := os.Executable()
	require.NoError(t, err)
	args := append([]string{"netns", "exec", ns.name, "unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", restrictScript, "sh", self, "--node-name", "edge-a", "--token-file", "",
		"--epoch-file", epoch, "--inspect-listen", "127.0.0.1:7400", "--log-level", "debug"}, controller.flags()...)
	cmd := exec.Command("ip", args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Logf("agent output:\n%s", out.String())
	})

	ack := ctrl.NextAck(t)
	require.Empty(t, ack.GetErrors())
	// ip netns exec, unshare, sh and setpriv each exec the next: the pid is the agent's.
	status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "status"))
	require.NoError(t, err)
	require.Regexp(t, `(?m)^CapEff:\s+0000000000001000$`, string(status), "CAP_NET_ADMIN only")
	require.Regexp(t, `(?m)^CapBnd:\s+0000000000001000$`, string(status))
	require.Regexp(t, `(?m)^NoNewPrivs:\s+1$`, string(status))
	require.Contains(t, string(status), "Name:\tkuport-agent.te", "the status is the agent's")
	require.Equal(t, "2\n", ns.exec(t, "cat", "/proc/sys/net/ipv4/conf/kup-1a2b3c4d/rp_filter"))
	require.Contains(t, ns.exec(t, "nft", "list", "table", "inet", "kuport"), `comment "games/gs/dnat/wt0" : 169.254.77.1 . 27015`)
	b, err := os.ReadFile(epoch)
	require.NoError(t, err)
	require.Equal(t, "7\n", string(b))

	probe, probeOut := ns.agentCmd(t, "probe", "--service", agent.ReadyService)
	require.NoError(t, probe.Run(), probeOut.String())
	require.NotContains(t, out.String(), "[ERROR]")
	require.NotContains(t, out.String(), "[WARN]")
}
