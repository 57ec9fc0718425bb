package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/agent"
	"kuport.wlz.li/kuport/controller/dashboard"
	"kuport.wlz.li/kuport/controller/status"
	"kuport.wlz.li/kuport/lab"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestPrivilegedE2EUnanswered maps a UDP port of web-b nobody serves (the lab's pods serve
// only what a test starts) and probes it: edge-a forwards the requests and sees no reply, so
// the PortMap gets a Warning Event RequestsUnanswered naming edge-a and enp1s0,
// kuport_mapping_unanswered{node="edge-a"} is 1, GetMapping's edge-a row and the dashboard's
// state say unanswered. Then a server starts on the port: once replies flow, a Normal Event
// RequestsAnswered, the gauge 0 and GetMapping's row answered. Last, another table's forward
// chain at policy drop on edge-a makes a served TCP mapping unanswered until it is removed,
// and so does stopping worker-b's WireGuard daemon until it restarts (testMeshDown).
// edge-a's agent reports at the default interval, and the PortMap's status.unanswered (its
// UNANSWERED column, kubectl describe) names edge-a within 15 s of the first request and
// clears once replies flow. The recovery cases (testRecovery) run last, on the same lab.
func TestPrivilegedE2EUnanswered(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	require.NoError(t, l.StopAgent("edge-a", false))
	require.NoError(t, l.StartAgentBinary("edge-a", filepath.Join(l.Bin(), "kuport-agent"),
		"--report-interval", agent.DefaultReportInterval.String()))
	const name, port = "silent-udp", 27320
	mapTo(t, l, name, "public", corev1.ProtocolUDP, port, 0, port, lab.PodB)
	dst := fmt.Sprintf("%s:%d", lab.PublicAddr, port)
	// unansweredOn polls the PortMap's UNANSWERED text.
	unansweredOn := func(name string) string {
		pm, err := l.GetPortMap(ctx, lab.DemoNamespace, name)
		require.NoError(t, err)
		return pm.Status.UnansweredOn
	}

	eventsOf := func(name, reason string) []corev1.Event {
		list, err := l.Kube.CoreV1().Events(lab.DemoNamespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=PortMap,involvedObject.name=" + name + ",reason=" + reason})
		require.NoError(t, err)
		return list.Items
	}
	events := func(reason string) []corev1.Event { return eventsOf(name, reason) }
	onEdgeA := func(evs []corev1.Event) *corev1.Event {
		for i, e := range evs {
			if strings.Contains(e.Message, "node edge-a interface enp1s0:") {
				return &evs[i]
			}
		}
		return nil
	}
	// probeUntil probes dst about every 500 ms until done holds (3 reports of 2 s spanning
	// 10 s make a mapping unanswered in the lab).
	probeUntilAt := func(proto, dst, what string, done func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !done() {
			require.True(t, time.Now().Before(deadline), "no %s within 60 s", what)
			_, _ = l.Net.Probe(ctx, proto, dst, 500*time.Millisecond)
		}
	}
	probeUntil := func(what string, done func() bool) { t.Helper(); probeUntilAt("udp", dst, what, done) }

	firstRequest := time.Now()
	probeUntil("status.unanswered naming edge-a", func() bool {
		return strings.HasPrefix(unansweredOn(name), "edge-a since ")
	})
	tookStatus := time.Since(firstRequest)
	t.Logf("status.unanswered named edge-a %s after the first request (agent reports every %s)",
		tookStatus.Round(time.Millisecond), agent.DefaultReportInterval)
	assert.LessOrEqual(t, tookStatus, 15*time.Second, "the PortMap said unanswered too late")
	pm, err := l.GetPortMap(ctx, lab.DemoNamespace, name)
	require.NoError(t, err)
	// worker-b forwards the same requests from its link into the pod and sees no reply
	// either: its row, when its report came in, names the link.
	require.NotEmpty(t, pm.Status.Unanswered)
	require.LessOrEqual(t, len(pm.Status.Unanswered), 2, "%v", pm.Status.Unanswered)
	assert.Equal(t, "edge-a", pm.Status.Unanswered[0].Node)
	assert.Equal(t, []string{"enp1s0"}, pm.Status.Unanswered[0].Interfaces)
	assert.WithinDuration(t, firstRequest, pm.Status.Unanswered[0].Since.Time, 15*time.Second)
	if len(pm.Status.Unanswered) == 2 {
		assert.Equal(t, "worker-b", pm.Status.Unanswered[1].Node)
		assert.Equal(t, []string{linkOnWorkerB}, pm.Status.Unanswered[1].Interfaces)
	}
	out := labShell(t, "", repoRoot, "kubectl -n demo get portmaps "+name)
	assert.Regexp(t, `(?m)^NAME\s+CLASS\s+PROTOCOL\s+PORT\s+ENDPOINT\s+PROGRAMMED\s+UNANSWERED\s*$`, out)
	assert.Regexp(t, `(?m)^`+name+`\s+public\s+UDP\s+27320\s+\S+\s+True\s+edge-a since \S+Z(,\s*worker-b since \S+Z)?\s*$`, out)
	out = labShell(t, "", repoRoot, "kubectl -n demo describe portmap "+name)
	assert.Regexp(t, `(?s)Unanswered:.*enp1s0.*Node:\s+edge-a\s.*Since:`, out)
	assert.Regexp(t, `Unanswered On:\s+edge-a since \S+Z`, out)

	var warning *corev1.Event
	probeUntil("RequestsUnanswered Event", func() bool {
		warning = onEdgeA(events(status.ReasonRequestsUnanswered))
		return warning != nil
	})
	t.Logf("event: %s %s: %s", warning.Type, warning.Reason, warning.Message)
	assert.Equal(t, corev1.EventTypeWarning, warning.Type)
	assert.Contains(t, warning.Message, "0 replies")
	assert.Empty(t, events(status.ReasonRequestsAnswered), "no RequestsAnswered before any reply")

	base := "http://" + lab.ControllerHTTPAddr
	gauge := map[string]string{"namespace": lab.DemoNamespace, "name": name, "node": "edge-a"}
	assert.Equal(t, 1.0, promSample(t, base+"/metrics", "kuport_mapping_unanswered", gauge))
	row := mappingRow(t, name, "edge-a")
	require.NotNil(t, row, "GetMapping has no edge-a row")
	assert.True(t, row.GetUnanswered(), "GetMapping's edge-a row: %v", row)
	assert.NotNil(t, row.GetUnansweredSince())
	assert.Equal(t, []string{"enp1s0"}, row.GetUnansweredInterfaces())
	st := dashboardState(t, base+"/state")
	var marked bool
	for _, m := range st.Mappings {
		for _, u := range m.Unanswered {
			marked = marked || m.Name == name && u.Node == "edge-a" && u.Interface == "enp1s0" && u.Requests > 0
		}
	}
	assert.True(t, marked, "the dashboard's state does not mark %s unanswered on edge-a/enp1s0", name)

	// A server on the port: replies flow, and the mark clears once.
	serve(t, l, lab.PodB, corev1.ProtocolUDP, port)
	assertAnswersAt(t, l, corev1.ProtocolUDP, lab.PublicAddr, port)
	var answered *corev1.Event
	probeUntil("RequestsAnswered Event", func() bool {
		answered = onEdgeA(events(status.ReasonRequestsAnswered))
		return answered != nil
	})
	t.Logf("event: %s %s: %s", answered.Type, answered.Reason, answered.Message)
	assert.Equal(t, corev1.EventTypeNormal, answered.Type)
	assert.Equal(t, 0.0, promSample(t, base+"/metrics", "kuport_mapping_unanswered", gauge))
	assert.False(t, mappingRow(t, name, "edge-a").GetUnanswered())
	require.Eventually(t, func() bool { return unansweredOn(name) == "" }, 10*time.Second, 100*time.Millisecond,
		"status.unanswered not cleared once replies flow")
	// Once per transition: still one Warning about edge-a.
	n := 0
	for _, e := range events(status.ReasonRequestsUnanswered) {
		if strings.Contains(e.Message, "node edge-a interface enp1s0:") {
			n += int(e.Count)
		}
	}
	assert.Equal(t, 1, n, "RequestsUnanswered Events about edge-a")

	// Another table's forward chain at policy drop on edge-a (Docker's default FORWARD policy,
	// firewalld, ufw): kuport does not override it, and a served TCP mapping whose requests it
	// drops is made unanswered, then answered again once the table goes.
	const served, servedPort = "dropped", 27321
	serve(t, l, lab.PodB, corev1.ProtocolTCP, servedPort)
	mapTo(t, l, served, "public", corev1.ProtocolTCP, servedPort, 0, servedPort, lab.PodB)
	servedDst := fmt.Sprintf("%s:%d", lab.PublicAddr, servedPort)
	assertAnswersAt(t, l, corev1.ProtocolTCP, lab.PublicAddr, servedPort)
	require.NoError(t, l.Net.NftApply(ctx, "edge-a", `table ip lab-forward-drop {
	chain forward {
		type filter hook forward priority filter; policy drop;
	}
}
`))
	probeUntilAt("tcp", servedDst, "RequestsUnanswered Event behind a forward drop", func() bool {
		warning = onEdgeA(eventsOf(served, status.ReasonRequestsUnanswered))
		return warning != nil
	})
	t.Logf("event: %s %s: %s", warning.Type, warning.Reason, warning.Message)
	assert.Contains(t, warning.Message, "0 replies")
	assert.True(t, mappingRow(t, served, "edge-a").GetUnanswered())
	_, err = l.Net.Exec(ctx, "edge-a", "nft", "delete", "table", "ip", "lab-forward-drop")
	require.NoError(t, err)
	assertAnswersAt(t, l, corev1.ProtocolTCP, lab.PublicAddr, servedPort)
	probeUntilAt("tcp", servedDst, "RequestsAnswered Event once the forward drop goes", func() bool {
		return onEdgeA(eventsOf(served, status.ReasonRequestsAnswered)) != nil
	})
	assert.False(t, mappingRow(t, served, "edge-a").GetUnanswered())

	t.Run("the pod node's WireGuard daemon stops, then restarts", func(t *testing.T) { testMeshDown(t, l) })
	t.Run("recovery", func(t *testing.T) { testRecovery(t, l) })
}

// mappingRow returns GetMapping's row of node for the demo mapping name (nil if none).
func mappingRow(t *testing.T, name, node string) *kuportv1.MappingNode {
	t.Helper()
	m, err := programService(t).GetMapping(context.Background(), &kuportv1.GetMappingRequest{Namespace: lab.DemoNamespace, Name: name})
	require.NoError(t, err)
	for _, n := range m.GetNodes() {
		if n.GetNode() == node {
			return n
		}
	}
	return nil
}

// dashboardState reads the dashboard's /state.
func dashboardState(t *testing.T, url string) dashboard.State {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	var st dashboard.State
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	return st
}
