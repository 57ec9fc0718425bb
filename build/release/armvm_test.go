package release

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"google.golang.org/protobuf/encoding/protojson"

	"kuport.wlz.li/kuport/internal/fakecontroller"
	"kuport.wlz.li/kuport/lab/armvm"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// bootWait bounds the emulated machine's boot and the agent's first apply: a few seconds on a
// quiet machine, far more on a busy one, since every arm64 instruction is emulated.
const bootWait = 5 * time.Minute

// TestIndexArm64AgentAppliesProgram boots an arm64 machine (lab/armvm: Debian's arm64 kernel,
// emulated whole) whose agent is the index's linux/arm64 kuport-agent, hands it a program from
// the fake controller on the host, and checks the arm64 kernel runs it: the agent acknowledges
// the whole program, and a connection to the mapped port moves the DNAT entry's counter in the
// agent's Report.
func TestIndexArm64AgentAppliesProgram(t *testing.T) {
	dir := madeImages(t)
	kernelDir := os.Getenv("KUPORT_ARM64_KERNEL")
	if kernelDir == "" {
		t.Skip("KUPORT_ARM64_KERNEL is unset: `make test` sets it to lab/fetch-arm64-kernel.sh's output")
	}
	if _, err := exec.LookPath("qemu-system-aarch64"); err != nil {
		t.Skip("qemu-system-aarch64 not found: `make deps` installs it (Debian's qemu-system-arm)")
	}
	kernel, err := armvm.FindKernel(kernelDir)
	require.NoError(t, err)
	modules, err := kernel.LoadOrder(armvm.DatapathModules)
	require.NoError(t, err)
	agent, _ := arm64Agent(t, dir)
	tmp := t.TempDir()
	vminit := filepath.Join(tmp, "vminit")
	build := exec.Command("go", "build", "-trimpath", "-o", vminit, "kuport.wlz.li/kuport/lab/armvm/vminit")
	build.Env = append(os.Environ(), "GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	const serverName = "kuport-controller"
	caFile := filepath.Join(tmp, "ca.crt")
	cert, err := fakecontroller.Cert(serverName, caFile)
	require.NoError(t, err)
	c := fakecontroller.New(fakecontroller.Options{Wait: bootWait})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(c.Serve(lis, fakecontroller.TLS(cert)))
	port := lis.Addr().(*net.TCPAddr).Port

	initramfs := filepath.Join(tmp, "initramfs.cpio")
	require.NoError(t, armvm.Initramfs(initramfs, vminit, modules,
		map[string]string{"/kuport-agent": agent, "/ca.crt": caFile},
		[]string{"/kuport-agent", "--node-name=edge-a", fmt.Sprintf("--controller=%s:%d", armvm.HostAddress, port),
			"--controller-ca-file=/ca.crt", "--controller-server-name=" + serverName, "--token-file=",
			"--epoch-file=", "--inspect-listen=", "--underlay-interface=eth0", "--report-interval=1s"}))

	// The mapped port, forwarded from the host's loopback to the machine's eth0.
	fwd, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hostPort := fwd.Addr().(*net.TCPAddr).Port
	require.NoError(t, fwd.Close())
	ctx, cancel := context.WithCancel(context.Background())
	var console syncBuffer
	vm, err := armvm.Boot(ctx, kernel, initramfs, &console, fmt.Sprintf("tcp:127.0.0.1:%d-:10000", hostPort))
	require.NoError(t, err)
	exited := make(chan error, 1)
	go func() { exited <- vm.Wait() }()
	t.Cleanup(func() {
		cancel()
		<-exited
		t.Logf("arm64 machine's console:\n%s", console.String())
	})

	var s *fakecontroller.Session
	select {
	case s = <-c.Sessions():
	case err := <-exited:
		exited <- err // for the cleanup
		t.Fatalf("the arm64 machine stopped before its agent connected: %v", err)
	case <-time.After(bootWait):
		t.Fatalf("no agent connected within %s", bootWait)
	}
	assert.Equal(t, "edge-a", s.Hello.GetNode())
	// A serving node's program (datapath/testdata/remote-worker-b.program.json) over a link
	// to the host's address, so links, return marks, ip rules and routes are written too,
	// and a DNAT to the machine's own address: a connection to it goes nowhere outside the
	// machine and is refused there, after the rule counted it.
	p := &kuportv1.NodeProgram{}
	require.NoError(t, protojson.Unmarshal([]byte(armProgram), p))
	s.Send(t, p)
	ack := s.NextAck(t)
	assert.Equal(t, uint64(1), ack.GetVersion())
	require.Empty(t, ack.GetErrors(), "the arm64 agent refused entries")

	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", hostPort), 30*time.Second)
	require.NoError(t, err)
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, _ = conn.Read(make([]byte, 1)) // ends when the machine refuses the translated connection
	_ = conn.Close()
	deadline := time.Now().Add(bootWait)
	for {
		r := s.NextReport(t)
		var packets uint64
		for _, ctr := range r.GetCounters() {
			if ctr.GetId() == "arm/self/dnat/eth0" {
				packets = ctr.GetPackets()
			}
		}
		if packets > 0 {
			require.Len(t, r.GetLinks(), 1, "the link's statistics")
			assert.Equal(t, "kup-arm64", r.GetLinks()[0].GetName())
			return
		}
		require.True(t, time.Now().Before(deadline), "the DNAT entry's counter never moved")
	}
}

// armProgram is the program the arm64 agent applies; 10.0.2.15 is the machine's address on
// QEMU's user-mode network, 10.0.2.2 the host's.
const armProgram = `{
  "node": "edge-a", "version": "1", "epoch": "1",
  "dnatRules": [
    {"id": "arm/self/dnat/eth0", "mapping": "arm/self", "inInterface": "eth0", "protocol": "PROTOCOL_TCP", "ports": {"first": 10000, "last": 10000}, "toAddress": "10.0.2.15", "toPort": 10001, "standIn": "10.0.2.15"},
    {"id": "arm/remote/dnat/kup-arm64", "mapping": "arm/remote", "inInterface": "kup-arm64", "matchDestination": "169.254.77.1", "protocol": "PROTOCOL_UDP", "ports": {"first": 27015, "last": 27020}, "toAddress": "10.244.18.107", "toPort": 27015, "standIn": "10.244.18.107"}
  ],
  "snatRules": [
    {"id": "arm/self/snat", "mapping": "arm/self", "kind": "SNAT_KIND_REQUEST", "address": "10.0.2.15", "protocol": "PROTOCOL_TCP", "ports": {"first": 10001, "last": 10001}},
    {"id": "arm/remote/snat", "mapping": "arm/remote", "kind": "SNAT_KIND_REQUEST", "address": "10.244.18.107", "protocol": "PROTOCOL_UDP", "ports": {"first": 27015, "last": 27020}},
    {"id": "arm/remote/snat-reply", "mapping": "arm/remote", "kind": "SNAT_KIND_REPLY", "address": "10.244.18.107", "protocol": "PROTOCOL_UDP", "ports": {"first": 27015, "last": 27020}}
  ],
  "markRules": [
    {"id": "arm/remote/ct-restore", "mapping": "arm/remote", "address": "10.244.18.107", "protocol": "PROTOCOL_UDP", "ports": {"first": 27015, "last": 27020}, "kind": "MARK_KIND_CT_RESTORE"},
    {"id": "arm/remote/ct-save/kup-arm64", "mapping": "arm/remote", "address": "169.254.77.1", "protocol": "PROTOCOL_UDP", "ports": {"first": 27015, "last": 27020}, "mark": 1, "kind": "MARK_KIND_CT_SAVE", "inInterface": "kup-arm64"}
  ],
  "links": [
    {"name": "kup-arm64", "className": "public", "peerNode": "edge-b", "vni": 4242, "port": 4790, "localUnderlay": "10.0.2.15", "remoteUnderlay": "10.0.2.2", "localAddress": "169.254.77.1", "peerAddress": "169.254.77.0", "mtu": 1370, "mac": "02:6b:a9:fe:4d:01"}
  ],
  "returnPaths": [
    {"id": "kup-arm64/return", "link": "kup-arm64", "mark": 1, "table": 27505, "peerUnderlay": "10.0.2.2", "peerLinkAddress": "169.254.77.0"}
  ],
  "returnMarking": {"markMask": 12319, "loopGuardPref": 101, "divertPref": 102, "firstTable": 27505, "lastTable": 27631}
}`

// syncBuffer is a bytes.Buffer QEMU's output goroutine and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.ReplaceAll(b.b.String(), "\r\n", "\n")
}
