package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/internal/fakecontroller"
	"kuport.wlz.li/kuport/internal/testenv"
	"kuport.wlz.li/kuport/internal/version"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// runMainEnv makes the test binary act as kuport-agent, so a privileged test can run the
// real command inside a network namespace with `ip netns exec`.
const runMainEnv = "KUPORT_AGENT_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{name: "version", args: []string{"--version"}, code: 0, stdout: version.String("kuport-agent") + "\n"},
		{name: "no node", args: []string{"--controller", "unix:///x"}, code: 2, stderr: "--node-name is required"},
		{name: "no controller", args: []string{"--node-name", "edge-a"}, code: 2, stderr: "--controller is required"},
		{name: "bad log level", args: []string{"--log-level", "loud"}, code: 2, stderr: `unknown --log-level "loud"`},
		{name: "unknown subcommand", args: []string{"purge"}, code: 2, stderr: "unexpected arguments"},
		{name: "unknown flag", args: []string{"--frobnicate"}, code: 2, stderr: "unknown flag"},
		{name: "bad interval", args: []string{"--node-name", "n", "--controller", "unix:///x", "--report-interval", "0s"}, code: 2, stderr: "must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			require.Equal(t, tc.code, run(tc.args, &stdout, &stderr), stderr.String())
			require.Equal(t, tc.stdout, stdout.String())
			require.Contains(t, stderr.String(), tc.stderr)
		})
	}
}

// agentNS is a fresh network namespace for running kuport-agent in: wt0 (a veth whose
// peer stays in the namespace) holds 100.64.93.143/10 and the default route.
type agentNS struct {
	name string
}

func newAgentNS(t *testing.T, suffix string) *agentNS {
	t.Helper()
	testenv.Privileged(t)
	n := &agentNS{name: fmt.Sprintf("kup-agent-%s-%d", suffix, os.Getpid())}
	sh(t, "ip", "netns", "add", n.name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", n.name).Run() })
	n.ip(t, "link", "add", "wt0", "type", "veth", "peer", "name", "wt0-peer")
	n.ip(t, "link", "set", "wt0-peer", "up")
	n.ip(t, "addr", "add", "100.64.93.143/10", "dev", "wt0")
	n.ip(t, "link", "set", "wt0", "up")
	n.ip(t, "route", "add", "default", "dev", "wt0")
	return n
}

func sh(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	require.NoError(t, err, "%s: %s", strings.Join(args, " "), out)
	return string(out)
}

// ip runs `ip -n <namespace> args...`.
func (n *agentNS) ip(t *testing.T, args ...string) string {
	t.Helper()
	return sh(t, append([]string{"ip", "-n", n.name}, args...)...)
}

// exec runs a command inside the namespace.
func (n *agentNS) exec(t *testing.T, args ...string) string {
	t.Helper()
	return sh(t, append([]string{"ip", "netns", "exec", n.name}, args...)...)
}

// agentCmd is kuport-agent (this test binary acting as main) run inside the namespace,
// its output collected.
func (n *agentNS) agentCmd(t *testing.T, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.name, self}, args...)...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	return cmd, &out
}

// startAgent starts kuport-agent in the namespace; it is killed when the test ends. The
// returned channel yields its exit.
func (n *agentNS) startAgent(t *testing.T, args ...string) (*exec.Cmd, chan error) {
	t.Helper()
	cmd, out := n.agentCmd(t, args...)
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		t.Logf("agent output:\n%s", out.String())
	})
	return cmd, exited
}

// controllerEndpoint is how an agent reaches and verifies a test controller: its target, the
// CA file and the server name of its certificate.
type controllerEndpoint struct {
	target, caFile, serverName string
}

// flags are the kuport-agent flags for e.
func (e controllerEndpoint) flags() []string {
	return []string{"--controller", e.target, "--controller-ca-file", e.caFile, "--controller-server-name", e.serverName}
}

// serveOneShot serves a fake controller that sends every agent program over TLS on a unix
// socket and returns it with its endpoint.
func serveOneShot(t *testing.T, program *kuportv1.NodeProgram) (*fakecontroller.Controller, controllerEndpoint) {
	t.Helper()
	dir := t.TempDir()
	e := controllerEndpoint{caFile: filepath.Join(dir, "ca.crt"), serverName: "kuport-controller.test"}
	cert, err := fakecontroller.Cert(e.serverName, e.caFile)
	require.NoError(t, err)
	ctrl := fakecontroller.New(fakecontroller.Options{Program: program, Wait: 30 * time.Second})
	e.target = ctrl.Start(t, filepath.Join(dir, "controller.sock"), fakecontroller.TLS(cert))
	return ctrl, e
}

// TestPrivilegedAgentFailStaticAndCleanup runs kuport-agent in a fresh network namespace:
// it applies the program, keeps it in the kernel across SIGTERM, and `cleanup` removes it.
func TestPrivilegedAgentFailStaticAndCleanup(t *testing.T) {
	ns := newAgentNS(t, "failstatic")
	ctrl, controller := serveOneShot(t, &kuportv1.NodeProgram{Node: "edge-a", Version: 1, Epoch: 1, DnatRules: []*kuportv1.DnatRule{{
		Id: "games/gs/dnat/wt0", Mapping: "games/gs", InInterface: "wt0",
		Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: &kuportv1.PortRange{First: 27015, Last: 27015},
		ToAddress: "10.244.17.5", ToPort: 27015,
	}}})
	nftList := func() (string, error) {
		out, err := exec.Command("ip", "netns", "exec", ns.name, "nft", "list", "table", "inet", "kuport").CombinedOutput()
		return string(out), err
	}

	cmd, exited := ns.startAgent(t, append(controller.flags(), "--node-name", "edge-a", "--token-file", "", "--inspect-listen", "", "--epoch-file", "", "--log-level", "debug")...)

	hello := ctrl.NextSession(t).Hello
	require.Equal(t, "edge-a", hello.GetNode())
	require.Equal(t, "wt0", hello.GetState().GetUnderlayInterface(), "underlay from the default route device")
	var wt0 *kuportv1.Interface
	for _, itf := range hello.GetState().GetInterfaces() {
		if itf.GetName() == "wt0" {
			wt0 = itf
		}
	}
	require.NotNil(t, wt0, "hello lists wt0")
	require.Equal(t, []string{"100.64.93.143"}, wt0.GetAddresses())

	ack := ctrl.NextAck(t)
	require.Empty(t, ack.GetErrors())
	require.Equal(t, uint64(1), ack.GetVersion())
	table, err := nftList()
	require.NoError(t, err, table)
	require.Contains(t, table, `comment "games/gs/dnat/wt0" : 10.244.17.5 . 27015`)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "agent exits 0 on SIGTERM")
		exited <- err // for the cleanup's receive
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not exit on SIGTERM")
	}
	table, err = nftList()
	require.NoError(t, err, "fail static: the table stays after the agent stops")
	require.Contains(t, table, `comment "games/gs/dnat/wt0" : 10.244.17.5 . 27015`)

	cleanup, cleanupOut := ns.agentCmd(t, "cleanup")
	require.NoError(t, cleanup.Run(), cleanupOut.String())
	table, err = nftList()
	require.Error(t, err, "cleanup removes table inet kuport: %s", table)
}
