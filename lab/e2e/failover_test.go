package e2e

import (
	"context"
	"crypto/tls"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/leader"
	"kuport.wlz.li/kuport/controller/servingcert"
	"kuport.wlz.li/kuport/internal/fakecontroller"
	"kuport.wlz.li/kuport/lab"
	"kuport.wlz.li/kuport/lab/cluster"
	"kuport.wlz.li/kuport/lab/netlab"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// controllerTLS are client credentials trusting the lab controller's CA (lab.ControllerCAFile)
// and verifying serverName ("" takes the target's host, 127.0.0.1 for a loopback listener).
func controllerTLS(t *testing.T, serverName string) credentials.TransportCredentials {
	t.Helper()
	creds, err := credentials.NewClientTLSFromFile(filepath.Join(cluster.DefaultDir, lab.ControllerCAFile), serverName)
	require.NoError(t, err)
	return creds
}

// replicaService dials controller replica i's inspection listener.
func replicaService(t *testing.T, i int) kuportv1.ProgramServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(lab.ReplicaAddr(i), grpc.WithTransportCredentials(controllerTLS(t, "")))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return kuportv1.NewProgramServiceClient(conn)
}

// leads reports whether the replica behind c serves as the leader; a follower answers
// FAILED_PRECONDITION, a dead or starting replica UNAVAILABLE.
func leads(t *testing.T, c kuportv1.ProgramServiceClient) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := c.ListNodes(ctx, &kuportv1.ListNodesRequest{})
	return err == nil
}

// TestPrivilegedE2EFailover runs two controller replicas and SIGKILLs the leader under
// traffic (docs/leader-election.md): the streams lose nothing, the follower takes the Lease
// over and serves with a higher epoch, a PortMap created right after the kill is Programmed
// by the new leader, and the restarted replica follows, refusing inspection calls with the
// leader's name. That an agent refuses a program of a lower epoch than the one it applied is
// agent.TestLowerEpochProgramRefused's to show.
func TestPrivilegedE2EFailover(t *testing.T) {
	l := startLabReplicas(t, 2)
	ctx := context.Background()
	// Either replica may win the first election: first is the leader, second the follower.
	replicas := []kuportv1.ProgramServiceClient{replicaService(t, 0), replicaService(t, 1)}
	leading := -1
	require.Eventually(t, func() bool {
		for i, c := range replicas {
			if leads(t, c) {
				leading = i
				return true
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond, "no replica leads")
	first, second := replicas[leading], replicas[1-leading]
	nodes := []string{"edge-a", "worker-b"}
	for _, n := range nodes {
		waitAgent(t, first, n, "")
	}
	_, err := second.ListNodes(ctx, &kuportv1.ListNodesRequest{})
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "replica %d must follow: %v", 1-leading, err)

	mapTo(t, l, "stream-tcp", "public", corev1.ProtocolTCP, 3000, 0, 3000, lab.PodB)
	mapTo(t, l, "stream-udp", "public", corev1.ProtocolUDP, 27015, 0, 27015, lab.PodB)
	before, err := first.GetProgram(ctx, &kuportv1.GetProgramRequest{Node: "edge-a"})
	require.NoError(t, err)
	serve(t, l, lab.PodB, corev1.ProtocolTCP, 3002)
	require.NoError(t, l.Expose(ctx, lab.DemoNamespace, "after-kill", "app", corev1.ProtocolTCP, 3002,
		lab.Backend{Pod: lab.PodB, Ready: true}))

	// The takeover's bounds (docs/leader-election.md), from the kill: the leader renewed
	// at most RetryPeriod before it, the follower takes the Lease LeaseDuration after the
	// last renewal it saw, and the new PortMap is Programmed at most 2 s after that.
	takeover := leader.DefaultLeaseDuration + leader.DefaultRetryPeriod
	programmed := takeover + 2*time.Second

	// The streams run from before the kill until the new leader has programmed the new
	// mapping, at the latest.
	const interval, lead = 20 * time.Millisecond, 2 * time.Second
	tcp, err := l.Net.StartStream("tcp", lab.PublicAddr+":3000", interval, lead+programmed)
	require.NoError(t, err)
	udp, err := l.Net.StartStream("udp", lab.PublicAddr+":27015", interval, lead+programmed)
	require.NoError(t, err)
	time.Sleep(lead)

	// The mappings programmed before the kill stay Programmed=True through the failover:
	// their kernels keep the rules, and the new leader, which has not heard from the agents
	// yet, must not say otherwise.
	states := watchProgrammed(t, l, lab.DemoNamespace, "stream-tcp", "stream-udp")
	require.NoError(t, l.StopReplica(leading, true))
	killed := time.Now()
	require.NoError(t, l.ApplyPortMap(ctx, &v1alpha1.PortMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: lab.DemoNamespace, Name: "after-kill"},
		Spec: v1alpha1.PortMapSpec{ClassName: "public", Protocol: v1alpha1.ProtocolTCP, Port: 3002,
			ServiceRef: v1alpha1.ServiceRef{Name: "after-kill", Port: "app"}},
	}))

	require.Eventually(t, func() bool { return leads(t, second) }, takeover+5*time.Second, 50*time.Millisecond,
		"replica %d did not take the leadership over", 1-leading)
	tookOver := time.Since(killed)
	waitCondition(t, l, lab.DemoNamespace, "after-kill", v1alpha1.ConditionProgrammed, "True", programmed+5*time.Second)
	tookProgrammed := time.Since(killed)
	t.Logf("after SIGKILL of the leader: replica %d led after %s (lease %s + retry %s = %s), the new PortMap was Programmed after %s",
		1-leading, tookOver.Round(time.Millisecond), leader.DefaultLeaseDuration, leader.DefaultRetryPeriod,
		leader.DefaultLeaseDuration+leader.DefaultRetryPeriod, tookProgrammed.Round(time.Millisecond))
	assert.Less(t, tookOver, takeover, "leadership moved too slowly")
	assert.Less(t, tookProgrammed, programmed, "the new PortMap was Programmed too slowly")
	assertReaches(t, l, corev1.ProtocolTCP, lab.PublicAddr, 3002, lab.PodB, 3002)
	for name, seen := range states() {
		assert.Equal(t, []string{"True"}, seen, "PortMap %s's Programmed during the failover", name)
	}

	after, err := second.GetProgram(ctx, &kuportv1.GetProgramRequest{Node: "edge-a"})
	require.NoError(t, err)
	t.Logf("epoch %d before the failover, %d after", before.GetProgram().GetEpoch(), after.GetProgram().GetEpoch())
	assert.Greater(t, after.GetProgram().GetEpoch(), before.GetProgram().GetEpoch(), "the new leader's epoch must be higher")
	lease, err := l.Kube.CoordinationV1().Leases(leader.DefaultNamespace).Get(ctx, leader.DefaultName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, uint64(*lease.Spec.LeaseTransitions)+1, after.GetProgram().GetEpoch(), "epoch = leaseTransitions+1")
	holder := *lease.Spec.HolderIdentity

	assertLossless(t, programmed+time.Minute, map[string]*netlab.Stream{"tcp": tcp, "udp": udp})

	// The killed replica comes back as a follower and names the leader.
	require.NoError(t, l.StartReplica(leading))
	want := "leader: " + holder
	require.Eventually(t, func() bool {
		_, err := first.ListNodes(ctx, &kuportv1.ListNodesRequest{})
		return status.Code(err) == codes.FailedPrecondition && strings.Contains(status.Convert(err).Message(), want)
	}, 15*time.Second, 100*time.Millisecond, "the restarted replica must follow, naming %s", holder)
	assert.True(t, leads(t, second), "replica %d must keep leading", 1-leading)

	// A deposed leader cannot get a stale program applied, not even by an agent restarted
	// while only that leader is reachable: the forged leader hands edge-a's restarted agent a
	// program of the old epoch that would remove everything.
	edgeBefore := kernelState(t, l, "edge-a")
	// The deposed leader holds the serving certificate, as every replica does.
	forgedSocket := filepath.Join(t.TempDir(), "forged.sock")
	forgedLeader := forgeLeader(t, l, forgedSocket, &kuportv1.NodeProgram{
		Node: "edge-a", Version: before.GetProgram().GetVersion() + 100, Epoch: before.GetProgram().GetEpoch()})
	require.NoError(t, l.StopAgent("edge-a", false))
	forged, err := l.Net.Start("edge-a", filepath.Join(t.TempDir(), "agent.log"), filepath.Join(l.Bin(), "kuport-agent"),
		"--node-name", "edge-a", "--controller", "unix://"+forgedSocket, "--token-file", "", "--inspect-listen", "",
		"--epoch-file", l.AgentEpochFile("edge-a"),
		"--controller-ca-file", filepath.Join(cluster.DefaultDir, lab.ControllerCAFile), "--controller-server-name", lab.ControllerServerName)
	require.NoError(t, err)
	select {
	case ack := <-forgedLeader.Acks():
		require.Len(t, ack.GetErrors(), 1, "the stale program must be refused")
		assert.Contains(t, ack.GetErrors()[0].GetMessage(), "refused by fencing")
	case <-time.After(30 * time.Second):
		t.Fatal("the restarted agent never answered the forged leader")
	}
	require.NoError(t, forged.Stop())
	assert.Equal(t, edgeBefore, kernelState(t, l, "edge-a"), "the stale program reached edge-a's kernel")
	require.NoError(t, l.StartAgent("edge-a"))
	assertReaches(t, l, corev1.ProtocolTCP, lab.PublicAddr, 3002, lab.PodB, 3002)

	// Deleting the Lease starts its count again: the next leader finds the agents at a
	// higher epoch than its own, raises leaseTransitions above theirs and leads again.
	floor := after.GetProgram().GetEpoch()
	require.NoError(t, l.StopReplica(0, false))
	require.NoError(t, l.StopReplica(1, false))
	require.NoError(t, l.Kube.CoordinationV1().Leases(leader.DefaultNamespace).Delete(ctx, leader.DefaultName, metav1.DeleteOptions{}))
	require.NoError(t, l.StartReplica(0))
	restarted := replicaService(t, 0)
	var raised uint64
	require.Eventually(t, func() bool {
		p, err := restarted.GetProgram(ctx, &kuportv1.GetProgramRequest{Node: "edge-a"})
		raised = p.GetProgram().GetEpoch()
		return err == nil && raised > floor
	}, 30*time.Second, 100*time.Millisecond, "the leader's epoch never passed the agents' %d", floor)
	t.Logf("agents at epoch %d; after the Lease's deletion the leader leads at epoch %d", floor, raised)
	for _, n := range nodes {
		waitAgent(t, restarted, n, "")
	}
	mapTo(t, l, "after-delete", "public", corev1.ProtocolTCP, 3003, 0, 3002, lab.PodB)
	assertReaches(t, l, corev1.ProtocolTCP, lab.PublicAddr, 3003, lab.PodB, 3002)
}

// forgeLeader serves, on the unix socket path until the test ends, a fake controller replica
// that sends p to every agent that connects, over TLS with the lab controller's serving
// certificate (the Secret the replicas share); its Acks are the agents' answers.
func forgeLeader(t *testing.T, l *lab.Lab, socket string, p *kuportv1.NodeProgram) *fakecontroller.Controller {
	t.Helper()
	sec, err := l.Kube.CoreV1().Secrets(leader.DefaultNamespace).Get(context.Background(), servingcert.DefaultSecret, metav1.GetOptions{})
	require.NoError(t, err)
	cert, err := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	require.NoError(t, err)
	f := fakecontroller.New(fakecontroller.Options{Program: p})
	f.Start(t, socket, fakecontroller.TLS(cert))
	return f
}

// watchProgrammed watches the named PortMaps of namespace from now on; the function it
// returns stops the watch and gives, per PortMap, each Programmed state it passed through
// (condition's form), starting with the one it had.
func watchProgrammed(t *testing.T, l *lab.Lab, namespace string, names ...string) func() map[string][]string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := l.Dyn.Resource(v1alpha1.PortMapsResource).Namespace(namespace).Watch(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	seen := map[string][]string{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || !slices.Contains(names, u.GetName()) {
				continue
			}
			var pm v1alpha1.PortMap
			if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pm) != nil {
				continue
			}
			st := condition(&pm, v1alpha1.ConditionProgrammed)
			if s := seen[pm.Name]; len(s) == 0 || s[len(s)-1] != st {
				seen[pm.Name] = append(s, st)
			}
		}
	}()
	return func() map[string][]string {
		w.Stop()
		cancel()
		<-done
		return seen
	}
}
