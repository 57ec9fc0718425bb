package status

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/programmed"
)

var t1 = metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))

func cond(t, s, reason string) metav1.Condition {
	return metav1.Condition{Type: t, Status: metav1.ConditionStatus(s), Reason: reason, LastTransitionTime: t1}
}

func portMap(st v1alpha1.PortMapStatus) *v1alpha1.PortMap {
	return &v1alpha1.PortMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "PortMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "games", Name: "remote", ResourceVersion: "5"},
		Spec:       v1alpha1.PortMapSpec{ClassName: "public", Protocol: v1alpha1.ProtocolUDP, Port: 3000, ServiceRef: v1alpha1.ServiceRef{Name: "s", Port: "p"}},
		Status:     st,
	}
}

func programmedTrue() v1alpha1.PortMapStatus {
	return v1alpha1.PortMapStatus{
		Endpoint: &v1alpha1.EndpointStatus{Node: "worker-b", Address: "10.244.18.107"},
		Conditions: []metav1.Condition{
			cond(v1alpha1.ConditionAccepted, "True", v1alpha1.ReasonValid),
			cond(v1alpha1.ConditionProgrammed, "True", v1alpha1.ReasonAllNodesReady),
		},
	}
}

var (
	settled  = programmed.Term{Now: t1.Add(time.Hour), HoldUntil: t1.Time, Released: true}
	settling = programmed.Term{Now: t1.Add(time.Second), HoldUntil: t1.Add(15 * time.Second), Released: true}
)

// verdict is programmed.Decide's for pm, compile's res and the nodes carrying it.
func verdict(pm *v1alpha1.PortMap, res *compile.PortMapResult, term programmed.Term, nodes ...programmed.Node) programmed.Verdict {
	return programmed.Decide(programmed.Input{Term: term,
		Compiled:   meta.FindStatusCondition(res.Status.Conditions, v1alpha1.ConditionProgrammed),
		Recorded:   meta.FindStatusCondition(pm.Status.Conditions, v1alpha1.ConditionProgrammed),
		Generation: pm.Generation, Nodes: nodes})
}

// ready is a node whose agent acknowledged version 3, where the mapping last changed.
func ready(name string) programmed.Node {
	return programmed.Node{Name: name, Hello: true, Connected: true, Acked: 3, Version: 3}
}

func TestDesired(t *testing.T) {
	pm := portMap(v1alpha1.PortMapStatus{})
	res := &compile.PortMapResult{Status: programmedTrue(), Nodes: []string{"edge-a", "worker-b"}}
	now := metav1.NewTime(t1.Add(time.Minute))

	st := Desired(pm, res, verdict(pm, res, settled, ready("edge-a"), ready("worker-b")), nil, now)
	assert.Equal(t, metav1.ConditionTrue, meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionProgrammed).Status)

	waiting := ready("worker-b")
	waiting.Version = 7
	st = Desired(pm, res, verdict(pm, res, settled, ready("edge-a"), waiting), nil, now)
	c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionProgrammed)
	assert.Equal(t, metav1.ConditionFalse, c.Status)
	assert.Equal(t, v1alpha1.ReasonNodeNotReady, c.Reason)
	assert.Equal(t, "node worker-b has not acknowledged program version 7", c.Message)
	assert.True(t, c.LastTransitionTime.Equal(&now), "a condition the object lacked gets now")
	assert.Equal(t, res.Status.Endpoint, st.Endpoint)
	assert.Equal(t, metav1.ConditionTrue, meta.FindStatusCondition(res.Status.Conditions, v1alpha1.ConditionProgrammed).Status, "compile's result is not mutated")
	assert.Nil(t, st.Unanswered)
	assert.Empty(t, st.UnansweredOn)
}

// TestWriterUnanswered: the registry's unanswered nodes become status rows and the
// UNANSWERED column's text, Since cut to the second the API keeps, so the same verdict read
// back is no new write; the rows go once the verdict clears, Programmed untouched.
func TestWriterUnanswered(t *testing.T) {
	ctx := context.Background()
	pm := portMap(programmedTrue())
	client := newFake(pm)
	w := NewWriter(client, record.NewFakeRecorder(10), nil)
	res := &compile.PortMapResult{Status: programmedTrue(), Nodes: []string{"edge-a", "worker-c"}}
	since := time.Date(2026, 12, 1, 9, 30, 0, 123456789, time.UTC)
	unanswered := []agents.UnansweredNode{
		{Node: "edge-a", Interfaces: []string{"enp1s0", "wt0"}, Since: since},
		{Node: "worker-c", Interfaces: []string{"eth0"}, Since: since.Add(5 * time.Second)},
	}
	v := verdict(pm, res, settled, ready("edge-a"), ready("worker-c"))

	wrote, err := w.PortMap(ctx, pm, res, v, unanswered)
	require.NoError(t, err)
	assert.True(t, wrote)
	got := getPortMap(t, client)
	want := []v1alpha1.UnansweredNode{
		{Node: "edge-a", Interfaces: []string{"enp1s0", "wt0"}, Since: metav1.NewTime(since.Truncate(time.Second))},
		{Node: "worker-c", Interfaces: []string{"eth0"}, Since: metav1.NewTime(since.Add(5 * time.Second).Truncate(time.Second))},
	}
	assert.True(t, equality.Semantic.DeepEqual(want, got.Status.Unanswered), "unanswered rows: %v", got.Status.Unanswered)
	assert.Equal(t, "edge-a since 2026-12-01T09:30:00Z,worker-c since 2026-12-01T09:30:05Z", got.Status.UnansweredOn)
	assert.Equal(t, metav1.ConditionTrue, meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionProgrammed).Status)

	wrote, err = w.PortMap(ctx, got, res, v, unanswered)
	require.NoError(t, err)
	assert.False(t, wrote, "an unchanged verdict is no write")

	wrote, err = w.PortMap(ctx, got, res, v, unanswered[1:])
	require.NoError(t, err)
	assert.True(t, wrote)
	got = getPortMap(t, client)
	require.Len(t, got.Status.Unanswered, 1)
	assert.Equal(t, "worker-c since 2026-12-01T09:30:05Z", got.Status.UnansweredOn)

	wrote, err = w.PortMap(ctx, got, res, v, nil)
	require.NoError(t, err)
	assert.True(t, wrote)
	got = getPortMap(t, client)
	assert.Nil(t, got.Status.Unanswered)
	assert.Empty(t, got.Status.UnansweredOn)
}

// TestWriterKeepsProgrammedWhileSettling: a new leader that has not heard from a node yet
// leaves a Programmed=True of the current generation as it is, with no event; once the node
// is no longer settling, the same gap is reported.
func TestWriterKeepsProgrammedWhileSettling(t *testing.T) {
	ctx := context.Background()
	pm := portMap(programmedTrue())
	client := newFake(pm)
	rec := record.NewFakeRecorder(10)
	w := NewWriter(client, rec, nil)
	res := &compile.PortMapResult{Status: programmedTrue(), Nodes: []string{"edge-a", "worker-b"}}
	unheard := programmed.Node{Name: "worker-b", Version: 1}

	wrote, err := w.PortMap(ctx, pm, res, verdict(pm, res, settling, ready("edge-a"), unheard), nil)
	require.NoError(t, err)
	assert.False(t, wrote)
	assert.Empty(t, rec.Events)

	wrote, err = w.PortMap(ctx, pm, res, verdict(pm, res, settled, ready("edge-a"), unheard), nil)
	require.NoError(t, err)
	assert.True(t, wrote)
	prog := meta.FindStatusCondition(getPortMap(t, client).Status.Conditions, v1alpha1.ConditionProgrammed)
	assert.Equal(t, metav1.ConditionFalse, prog.Status)
	assert.Equal(t, "node worker-b: agent not connected", prog.Message)
	assert.Len(t, rec.Events, 1)
}

// TestWriterHoldsAndLimits: nothing is written while the startup hold is on, and every write
// waits for the limiter.
func TestWriterHoldsAndLimits(t *testing.T) {
	ctx := context.Background()
	pm := portMap(v1alpha1.PortMapStatus{})
	client := newFake(pm)
	limiter := &countingLimiter{RateLimiter: flowcontrol.NewFakeAlwaysRateLimiter()}
	w := NewWriter(client, record.NewFakeRecorder(10), limiter)
	res := &compile.PortMapResult{Status: programmedTrue(), Nodes: []string{"edge-a"}}
	wrote, err := w.PortMap(ctx, pm, res, programmed.Verdict{Hold: true}, nil)
	require.NoError(t, err)
	assert.False(t, wrote)
	assert.Empty(t, client.Actions())
	assert.Zero(t, limiter.waits)

	wrote, err = w.PortMap(ctx, pm, res, verdict(pm, res, settled, ready("edge-a")), nil)
	require.NoError(t, err)
	assert.True(t, wrote)
	assert.Equal(t, 1, limiter.waits)
}

type countingLimiter struct {
	flowcontrol.RateLimiter
	waits int
}

func (l *countingLimiter) Wait(ctx context.Context) error {
	l.waits++
	return l.RateLimiter.Wait(ctx)
}

// fakeClient is a Client over a fake dynamic client, which keeps what is written.
type fakeClient struct{ *dynamicfake.FakeDynamicClient }

func newFake(objs ...runtime.Object) fakeClient {
	scheme := runtime.NewScheme()
	_ = v1alpha1.AddToScheme(scheme)
	return fakeClient{dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
		v1alpha1.PortMapsResource: "PortMapList", v1alpha1.PortMapClassesResource: "PortMapClassList",
	}, objs...)}
}

func (c fakeClient) UpdatePortMapStatus(ctx context.Context, pm *v1alpha1.PortMap) error {
	_, err := c.updateStatus(ctx, v1alpha1.PortMapsResource, pm.Namespace, pm)
	return err
}

func (c fakeClient) UpdateClassStatus(ctx context.Context, cls *v1alpha1.PortMapClass) (string, error) {
	u, err := c.updateStatus(ctx, v1alpha1.PortMapClassesResource, "", cls)
	if err != nil {
		return "", err
	}
	return u.GetResourceVersion(), nil
}

func (c fakeClient) updateStatus(ctx context.Context, gvr schema.GroupVersionResource, namespace string, obj runtime.Object) (*unstructured.Unstructured, error) {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	return c.Resource(gvr).Namespace(namespace).UpdateStatus(ctx, &unstructured.Unstructured{Object: u}, metav1.UpdateOptions{})
}

func getPortMap(t *testing.T, c fakeClient) *v1alpha1.PortMap {
	t.Helper()
	u, err := c.Resource(v1alpha1.PortMapsResource).Namespace("games").Get(context.Background(), "remote", metav1.GetOptions{})
	require.NoError(t, err)
	var pm v1alpha1.PortMap
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pm))
	return &pm
}

// publicClass is class public with edge-a's wt0, as the API server would hold it.
func publicClass() *v1alpha1.PortMapClass {
	return &v1alpha1.PortMapClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "PortMapClass"},
		ObjectMeta: metav1.ObjectMeta{Name: "public", ResourceVersion: "3"},
		Spec:       v1alpha1.PortMapClassSpec{Nodes: map[string]v1alpha1.ClassNode{"edge-a": {Interfaces: []string{"wt0"}}}},
	}
}

func TestWriterPortMap(t *testing.T) {
	ctx := context.Background()
	pm := portMap(programmedTrue())
	client := newFake(pm)
	rec := record.NewFakeRecorder(10)
	w := NewWriter(client, rec, nil)

	// Compile recomputed the same status with a fresh transition time: no write, no event.
	again := programmedTrue()
	for i := range again.Conditions {
		again.Conditions[i].LastTransitionTime = metav1.NewTime(t1.Add(time.Hour))
	}
	res := &compile.PortMapResult{Status: again, Nodes: []string{"edge-a"}}
	wrote, err := w.PortMap(ctx, pm, res, verdict(pm, res, settled, ready("edge-a")), nil)
	require.NoError(t, err)
	assert.False(t, wrote)
	assert.Empty(t, client.Actions())

	// The node has not acknowledged: Programmed turns False/NodeNotReady, Accepted keeps its time.
	moved := programmedTrue()
	moved.Endpoint = &v1alpha1.EndpointStatus{Node: "edge-a", Address: "10.244.17.9"}
	res = &compile.PortMapResult{Status: moved, Nodes: []string{"edge-a"}}
	awaiting := ready("edge-a")
	awaiting.Acked = 2
	wrote, err = w.PortMap(ctx, pm, res, verdict(pm, res, settled, awaiting), nil)
	require.NoError(t, err)
	assert.True(t, wrote)
	got := getPortMap(t, client)
	acc := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionAccepted)
	assert.True(t, acc.LastTransitionTime.Equal(&t1), "unchanged condition keeps its lastTransitionTime")
	prog := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionProgrammed)
	assert.Equal(t, metav1.ConditionFalse, prog.Status)
	assert.Equal(t, v1alpha1.ReasonNodeNotReady, prog.Reason)
	assert.False(t, prog.LastTransitionTime.Equal(&t1), "a changed condition gets a new lastTransitionTime")
	assert.Equal(t, "10.244.17.9", got.Status.Endpoint.Address)
	assert.Equal(t, "public", got.Spec.ClassName, "spec untouched")

	// Waiting for the acknowledgement is no warning; the endpoint move is an event.
	assert.Equal(t, "Normal EndpointChanged endpoint moved from 10.244.18.107 on worker-b to 10.244.17.9 on edge-a", nextEvent(t, rec))
	assert.Empty(t, rec.Events)

	// The agent disconnects: that is a warning.
	pm = getPortMap(t, client)
	gone := ready("edge-a")
	gone.Connected = false
	wrote, err = w.PortMap(ctx, pm, res, verdict(pm, res, settled, gone), nil)
	require.NoError(t, err)
	assert.True(t, wrote)
	assert.Equal(t, "Warning NodeNotReady Programmed: node edge-a: agent disconnected", nextEvent(t, rec))
	assert.Empty(t, rec.Events)

	// The same pod gaining its IPv6 address has not moved: written, with no event.
	pm = getPortMap(t, client)
	dual := *res.Status.DeepCopy()
	dual.Endpoint.Address6 = "fd00:17::9"
	res = &compile.PortMapResult{Status: dual, Nodes: []string{"edge-a"}}
	wrote, err = w.PortMap(ctx, pm, res, verdict(pm, res, settled, gone), nil)
	require.NoError(t, err)
	assert.True(t, wrote)
	assert.Equal(t, "fd00:17::9", getPortMap(t, client).Status.Endpoint.Address6)
	assert.Empty(t, rec.Events)
}

func TestWriterClass(t *testing.T) {
	ctx := context.Background()
	cls := publicClass()
	client := newFake(cls)
	w := NewWriter(client, record.NewFakeRecorder(1), nil)
	want := &v1alpha1.PortMapClassStatus{
		Conditions: []metav1.Condition{{Type: v1alpha1.ClassConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid}},
		Links:      []v1alpha1.LinkStatus{{Key: "edge-a/worker-b", Peers: []string{"edge-a", "worker-b"}, Subnet: "169.254.77.0/31"}},
	}
	wrote, err := w.Class(ctx, cls, want)
	require.NoError(t, err)
	assert.True(t, wrote)
	got := getClass(t, ctx, client.Resource(v1alpha1.PortMapClassesResource))
	assert.Equal(t, want.Links, got.Status.Links)
	ready := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ClassConditionReady)
	require.NotNil(t, ready)
	assert.False(t, ready.LastTransitionTime.IsZero(), "a zero transition time is stamped")

	// Writing the same status onto the updated object is a no-op.
	wrote, err = w.Class(ctx, got, want)
	require.NoError(t, err)
	assert.False(t, wrote)
}

// TestWriterClassWarns: a class condition written False (here the NodePortsReserved warning
// compile decides) is a Warning Event with its reason, once: an unchanged status records
// nothing, a changed message records again, and turning True records nothing.
func TestWriterClassWarns(t *testing.T) {
	ctx := context.Background()
	cls := publicClass()
	client := newFake(cls)
	rec := record.NewFakeRecorder(10)
	w := NewWriter(client, rec, nil)
	status := func(ok metav1.ConditionStatus, reason, msg string) *v1alpha1.PortMapClassStatus {
		return &v1alpha1.PortMapClassStatus{Conditions: []metav1.Condition{
			{Type: v1alpha1.ClassConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid, Message: "the class is valid"},
			{Type: v1alpha1.ClassConditionNodePortsReserved, Status: ok, Reason: reason, Message: msg},
		}}
	}
	kubelet := "ports 10250 (kubelet) are in the port window 1024-65535 and not reserved"
	for _, step := range []struct {
		st    *v1alpha1.PortMapClassStatus
		event string
	}{
		{status(metav1.ConditionFalse, v1alpha1.ReasonNodePortsUnreserved, kubelet),
			"Warning NodePortsUnreserved NodePortsReserved: " + kubelet},
		{status(metav1.ConditionFalse, v1alpha1.ReasonNodePortsUnreserved, kubelet), ""},
		{status(metav1.ConditionFalse, v1alpha1.ReasonNodePortsUnreserved, "ports 6443 (kube-apiserver)"),
			"Warning NodePortsUnreserved NodePortsReserved: ports 6443 (kube-apiserver)"},
		{status(metav1.ConditionTrue, v1alpha1.ReasonAllReserved, "clear"), ""},
	} {
		_, err := w.Class(ctx, getClass(t, ctx, client.Resource(v1alpha1.PortMapClassesResource)), step.st)
		require.NoError(t, err)
		if step.event == "" {
			assert.Empty(t, rec.Events)
			continue
		}
		assert.Equal(t, step.event, nextEvent(t, rec))
		assert.Empty(t, rec.Events)
	}
}

func TestWriterRefusedMappingEmitsOneEvent(t *testing.T) {
	pm := portMap(v1alpha1.PortMapStatus{})
	rec := record.NewFakeRecorder(10)
	w := NewWriter(newFake(pm), rec, nil)
	refused := v1alpha1.PortMapStatus{Conditions: []metav1.Condition{
		cond(v1alpha1.ConditionAccepted, "False", v1alpha1.ReasonClassNotFound),
		cond(v1alpha1.ConditionProgrammed, "False", v1alpha1.ReasonNotAccepted),
	}}
	refused.Conditions[0].Message = `PortMapClass "nope" not found`
	res := &compile.PortMapResult{Status: refused}
	wrote, err := w.PortMap(context.Background(), pm, res, verdict(pm, res, settled), nil)
	require.NoError(t, err)
	assert.True(t, wrote)
	assert.Equal(t, `Warning ClassNotFound Accepted: PortMapClass "nope" not found`, nextEvent(t, rec))
	assert.Empty(t, rec.Events)
}

// nextEvent returns the recorder's next event, failing the test when none comes.
func nextEvent(t *testing.T, rec *record.FakeRecorder) string {
	t.Helper()
	select {
	case e := <-rec.Events:
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no event recorded")
		return ""
	}
}

func TestRequestsEvent(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	w := NewWriter(nil, rec, nil)
	pm := &v1alpha1.PortMap{ObjectMeta: metav1.ObjectMeta{Namespace: "games", Name: "remote"}}
	since := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	w.RequestsEvent(pm, Answers{Node: "edge-a", Interface: "enp1s0", Unanswered: true, Requests: 7, Since: since, Window: "3 reports and 10s"})
	assert.Equal(t, "Warning RequestsUnanswered node edge-a interface enp1s0: 7 requests since 2026-12-01T09:30:00Z, 0 replies over 3 reports and 10s: "+
		"something after kuport's count drops them (another table's forward chain at policy drop, a host firewall), the pod does not answer, "+
		"or the CNI forwards the pod's traffic past netfilter (Cilium eBPF host routing or netkit, Calico eBPF; docs/troubleshooting.md)", nextEvent(t, rec))
	w.RequestsEvent(pm, Answers{Node: "edge-a", Interface: "enp1s0", Requests: 9, Since: since})
	assert.Equal(t, "Normal RequestsAnswered node edge-a interface enp1s0: replies flow again (9 requests had gone unanswered since 2026-12-01T09:30:00Z)", nextEvent(t, rec))
}

// TestMergeConditions: written over old, a condition keeps old's place and, while its status
// holds, old's lastTransitionTime (not the time compile put there); a changed or new one gets
// now, and one want lacks is dropped.
func TestMergeConditions(t *testing.T) {
	now := metav1.NewTime(t1.Add(time.Hour))
	compiled := func(c metav1.Condition) metav1.Condition {
		c.LastTransitionTime = metav1.NewTime(t1.Add(time.Minute))
		return c
	}
	old := []metav1.Condition{cond("A", "True", "a"), cond("B", "False", "b"), cond("C", "True", "c")}
	want := []metav1.Condition{compiled(cond("D", "False", "d")), compiled(cond("B", "True", "b2")), compiled(cond("A", "True", "a2"))}
	at := func(c metav1.Condition, when metav1.Time) metav1.Condition {
		c.LastTransitionTime = when
		return c
	}
	assert.Equal(t, []metav1.Condition{
		at(cond("A", "True", "a2"), t1), at(cond("B", "True", "b2"), now), at(cond("D", "False", "d"), now),
	}, mergeConditions(old, want, now))
}
