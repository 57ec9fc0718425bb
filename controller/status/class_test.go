package status

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/record"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/bench/labbench"
	"kuport.wlz.li/kuport/controller/apiclient"
	"kuport.wlz.li/kuport/lab/cluster"
	"kuport.wlz.li/kuport/lab/labtest"
)

// classLab is a real API server with kuport's CRDs and one class of n nodes.
func classLab(t *testing.T, ctx context.Context, n int) (*apiclient.Client, dynamic.ResourceInterface, *v1alpha1.PortMapClass) {
	t.Helper()
	cl, err := cluster.Start(ctx, cluster.Config{Dir: t.TempDir(), BinDir: labtest.K8sBin(t), CRDDir: "../../deploy/crds",
		Log: hclog.New(&hclog.LoggerOptions{Name: "test", Output: t.Output()})})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cl.Stop()) })
	return classLabOn(t, ctx, cl, n)
}

// classLabOn creates class public of n nodes on cl and returns the controller's client of
// it, a dynamic client of the classes, and the class.
func classLabOn(t testing.TB, ctx context.Context, cl *cluster.Cluster, n int) (*apiclient.Client, dynamic.ResourceInterface, *v1alpha1.PortMapClass) {
	t.Helper()
	rc := cl.RESTConfig()
	rc.QPS, rc.Burst = 100, 100
	dyn, err := dynamic.NewForConfig(rc)
	require.NoError(t, err)
	client, err := apiclient.NewForConfig(rc)
	require.NoError(t, err)
	classes := dyn.Resource(v1alpha1.PortMapClassesResource)
	cls := &v1alpha1.PortMapClass{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "PortMapClass"},
		ObjectMeta: metav1.ObjectMeta{Name: "public"}, Spec: v1alpha1.PortMapClassSpec{Nodes: map[string]v1alpha1.ClassNode{}}}
	for i := range n {
		cls.Spec.Nodes[fmt.Sprintf("node-%03d", i)] = v1alpha1.ClassNode{Interfaces: []string{"eth0"}}
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cls)
	require.NoError(t, err)
	_, err = classes.Create(ctx, &unstructured.Unstructured{Object: u}, metav1.CreateOptions{})
	require.NoError(t, err)
	return client, classes, getClass(t, ctx, classes)
}

func getClass(t testing.TB, ctx context.Context, classes dynamic.ResourceInterface) *v1alpha1.PortMapClass {
	t.Helper()
	u, err := classes.Get(ctx, "public", metav1.GetOptions{})
	require.NoError(t, err)
	cls := &v1alpha1.PortMapClass{}
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cls))
	return cls
}

// classStatus is a status of one ready row per node of cls, each interface of ifaces at an
// address.
func classStatus(cls *v1alpha1.PortMapClass, ifaces ...string) *v1alpha1.PortMapClassStatus {
	st := &v1alpha1.PortMapClassStatus{ObservedGeneration: cls.Generation,
		Conditions: []metav1.Condition{{Type: v1alpha1.ClassConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid}}}
	for i := range len(cls.Spec.Nodes) {
		row := v1alpha1.ClassNodeStatus{Name: fmt.Sprintf("node-%03d", i), Ready: true, UnderlayMTU: 1500, LinkMTU: 1450, Addresses: map[string]string{}}
		for j, name := range ifaces {
			row.Addresses[name] = fmt.Sprintf("10.%d.%d.%d", j, i/250, 1+i%250)
		}
		st.Nodes = append(st.Nodes, row)
	}
	return st
}

// TestPrivilegedClassStatusManagedFields: the API server tracks a class status's node rows
// as one field, so a class's managedFields do not grow with its nodes (with a row per node in
// them, 200 nodes held about 25 KB; 1,000 held 190 KB, more than the status itself).
func TestPrivilegedClassStatusManagedFields(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, classes, cls := classLab(t, ctx, 200)
	w := NewWriter(client, record.NewFakeRecorder(10), nil)
	wrote, err := w.Class(ctx, cls, classStatus(cls, "eth0", "eth1"))
	require.NoError(t, err)
	require.True(t, wrote)

	got := getClass(t, ctx, classes)
	require.Len(t, got.Status.Nodes, 200)
	assert.Equal(t, "10.1.0.200", got.Status.Nodes[199].Addresses["eth1"], "the rows as written")
	var status *metav1.ManagedFieldsEntry
	for i, m := range got.ManagedFields {
		if m.Subresource == "status" {
			status = &got.ManagedFields[i]
		}
	}
	require.NotNil(t, status, "managedFields %v", got.ManagedFields)
	assert.Less(t, len(status.FieldsV1.Raw), 1024, "status fields tracked: %s", status.FieldsV1.Raw)
}

// TestPrivilegedClassStatusAheadOfCache: while the informer's copy of a class has not yet
// received the Writer's own write, the same status is not written again and a new one is
// written over the Writer's write, not refused as a conflict; a write by someone else since
// is still a conflict.
func TestPrivilegedClassStatusAheadOfCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, classes, cached := classLab(t, ctx, 3)
	w := NewWriter(client, record.NewFakeRecorder(10), nil)
	one, two := classStatus(cached, "eth0"), classStatus(cached, "eth0", "eth1")

	wrote, err := w.Class(ctx, cached, one)
	require.NoError(t, err)
	require.True(t, wrote)
	afterOne := getClass(t, ctx, classes)

	// cached is still the copy from before the write.
	wrote, err = w.Class(ctx, cached, one)
	require.NoError(t, err, "the same status again, the cache behind the write")
	assert.False(t, wrote)
	assert.Equal(t, afterOne.ResourceVersion, getClass(t, ctx, classes).ResourceVersion, "nothing written")

	wrote, err = w.Class(ctx, cached, two)
	require.NoError(t, err, "a new status, the cache two writes behind")
	assert.True(t, wrote)
	afterTwo := getClass(t, ctx, classes)
	assert.Equal(t, "10.1.0.3", afterTwo.Status.Nodes[2].Addresses["eth1"])
	assert.Equal(t, afterOne.Status.Conditions, afterTwo.Status.Conditions, "Ready kept its lastTransitionTime")

	// The cache at the first write: still behind.
	wrote, err = w.Class(ctx, afterOne, two)
	require.NoError(t, err)
	assert.False(t, wrote)
	// Caught up.
	wrote, err = w.Class(ctx, afterTwo, two)
	require.NoError(t, err)
	assert.False(t, wrote)

	// Someone edits the spec: a write over a copy from before the edit is a conflict, whether
	// that copy has the Writer's last write or not.
	edit := func(ifs string) {
		patch := fmt.Appendf(nil, `{"spec":{"nodes":{"node-000":{"interfaces":[%s]}}}}`, ifs)
		_, err := classes.Patch(ctx, "public", types.MergePatchType, patch, metav1.PatchOptions{})
		require.NoError(t, err)
	}
	edit(`"eth0","eth2"`)
	_, err = w.Class(ctx, afterTwo, one)
	assert.True(t, apierrors.IsConflict(err), "the cache had the Writer's last write: %v", err)
	fresh := getClass(t, ctx, classes)
	wrote, err = w.Class(ctx, fresh, one)
	require.NoError(t, err)
	require.True(t, wrote)
	edit(`"eth0"`)
	_, err = w.Class(ctx, fresh, two)
	assert.True(t, apierrors.IsConflict(err), "the cache behind the Writer's last write: %v", err)
}

// BenchmarkPrivilegedClassWrites: what one change of a class of 1,000 nodes, its status of
// 1,000 rows recorded, costs the API server (kube-apiserver and etcd CPU, and the call's wall
// time): the operator's merge patch giving every node a second interface (bench/fanout's
// change) and the controller's status write that follows, each per op.
//
//	KUPORT_PRIVILEGED=1 KUPORT_LAB_BIN=$(lab/build-binaries.sh) go test -run '^$' -bench ClassWrites -benchtime 10x ./controller/status/
func BenchmarkPrivilegedClassWrites(b *testing.B) {
	const n = 1000
	ctx := context.Background()
	cl, err := cluster.Start(ctx, cluster.Config{Dir: b.TempDir(), BinDir: labtest.K8sBin(b), CRDDir: "../../deploy/crds"})
	require.NoError(b, err)
	b.Cleanup(func() { assert.NoError(b, cl.Stop()) })
	client, classes, cls := classLabOn(b, ctx, cl, n)
	w := NewWriter(client, record.NewFakeRecorder(10), nil)
	_, err = w.Class(ctx, cls, classStatus(cls, "eth0"))
	require.NoError(b, err)
	plane := func() float64 {
		var s float64
		for _, p := range cl.Pids() {
			c, err := labbench.CPUSeconds(p)
			require.NoError(b, err)
			s += c
		}
		return s
	}
	var patchCPU, statusCPU float64
	var patchWall, statusWall time.Duration
	b.ResetTimer()
	for i := range b.N {
		ifaces := []string{"eth0", "eth1"}
		if i%2 == 1 {
			ifaces = ifaces[:1]
		}
		nodes := map[string]v1alpha1.ClassNode{}
		for name := range cls.Spec.Nodes {
			nodes[name] = v1alpha1.ClassNode{Interfaces: ifaces}
		}
		patch, err := json.Marshal(map[string]any{"spec": map[string]any{"nodes": nodes}})
		require.NoError(b, err)
		time.Sleep(300 * time.Millisecond) // the last op's watch events delivered
		c0, t0 := plane(), time.Now()
		_, err = classes.Patch(ctx, "public", types.MergePatchType, patch, metav1.PatchOptions{})
		require.NoError(b, err)
		patchWall += time.Since(t0)
		patchCPU += plane() - c0
		cur := getClass(b, ctx, classes)
		time.Sleep(300 * time.Millisecond)
		c0, t0 = plane(), time.Now()
		wrote, err := w.Class(ctx, cur, classStatus(cur, ifaces...))
		require.NoError(b, err)
		require.True(b, wrote)
		statusWall += time.Since(t0)
		statusCPU += plane() - c0
	}
	b.ReportMetric(patchCPU*1000/float64(b.N), "patch-cpu-ms/op")
	b.ReportMetric(float64(patchWall.Milliseconds())/float64(b.N), "patch-ms/op")
	b.ReportMetric(statusCPU*1000/float64(b.N), "status-cpu-ms/op")
	b.ReportMetric(float64(statusWall.Milliseconds())/float64(b.N), "status-ms/op")
}
