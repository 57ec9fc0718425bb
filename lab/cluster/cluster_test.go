package cluster

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"kuport.wlz.li/kuport/lab/labtest"
)

func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "cluster", Level: hclog.Debug, Output: t.Output()})
}

func TestPrivilegedCluster(t *testing.T) {
	bin := labtest.K8sBin(t)
	ctx := t.Context()
	dir := t.TempDir()

	c, err := Start(ctx, Config{Dir: dir, BinDir: bin, CRDDir: "testdata", Log: testLogger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	cs, err := kubernetes.NewForConfig(c.RESTConfig())
	require.NoError(t, err)

	// The CRD from testdata is served, with its schema enforced.
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	require.NoError(t, err)
	widgets := dyn.Resource(schema.GroupVersionResource{Group: "lab.kuport.test", Version: "v1", Resource: "widgets"}).Namespace("default")
	widget := func(name string, size int64) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "lab.kuport.test/v1", "kind": "Widget",
			"metadata": map[string]any{"name": name},
			"spec":     map[string]any{"size": size},
		}}
	}
	_, err = widgets.Create(ctx, widget("good", 3), metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = widgets.Create(ctx, widget("bad", 0), metav1.CreateOptions{})
	assert.True(t, apierrors.IsInvalid(err), "size 0 must fail the CRD schema, got %v", err)

	// Namespace and default ServiceAccount, idempotently, merging labels.
	require.NoError(t, c.EnsureNamespace(ctx, "lab-test", map[string]string{"a": "1"}))
	require.NoError(t, c.EnsureNamespace(ctx, "lab-test", map[string]string{"b": "2"}))
	ns, err := cs.CoreV1().Namespaces().Get(ctx, "lab-test", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "1", ns.Labels["a"])
	assert.Equal(t, "2", ns.Labels["b"])
	_, err = cs.CoreV1().ServiceAccounts("lab-test").Get(ctx, "default", metav1.GetOptions{})
	require.NoError(t, err)

	// A Node and a Pod bound to it by hand, with status written as a kubelet would.
	_, err = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-a"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod, err := cs.CoreV1().Pods("lab-test").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.PodSpec{
			NodeName:   "edge-a",
			Containers: []corev1.Container{{Name: "web", Image: "registry.invalid/web:1"}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod.Status = corev1.PodStatus{
		Phase:      corev1.PodRunning,
		PodIP:      "10.244.1.5",
		PodIPs:     []corev1.PodIP{{IP: "10.244.1.5"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
	}
	_, err = cs.CoreV1().Pods("lab-test").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)
	got, err := cs.CoreV1().Pods("lab-test").Get(ctx, "web", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "edge-a", got.Spec.NodeName)
	assert.Equal(t, corev1.PodRunning, got.Status.Phase)
	assert.Equal(t, "10.244.1.5", got.Status.PodIP)

	// The lab's own kubectl, through the written kubeconfig, sees a v1.36.3 server.
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "kubectl"), "--kubeconfig", c.Kubeconfig(), "version", "-o", "json").Output()
	require.NoError(t, err)
	var version struct {
		ClientVersion struct{ GitVersion string } `json:"clientVersion"`
		ServerVersion struct{ GitVersion string } `json:"serverVersion"`
	}
	require.NoError(t, json.Unmarshal(out, &version), "%s", out)
	assert.Equal(t, "v1.36.3", version.ServerVersion.GitVersion)
	assert.Equal(t, "v1.36.3", version.ClientVersion.GitVersion)

	// Stop reaps both processes and their pid files, and is idempotent.
	pids := c.Pids()
	require.Len(t, pids, 2)
	require.NoError(t, c.Stop())
	for _, pid := range pids {
		assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "pid %d still exists", pid)
	}
	pidFiles, err := filepath.Glob(filepath.Join(dir, "*.pid"))
	require.NoError(t, err)
	assert.Empty(t, pidFiles)
	assert.NoError(t, c.Stop())
	assert.FileExists(t, filepath.Join(dir, "kube-apiserver.log"), "Stop keeps the logs")
}

// TestPrivilegedClusterDetached covers the `make lab-up`/`lab-down` path: a detached start
// recorded in pid files, refused a second start, and stopped by StopDir alone.
func TestPrivilegedClusterDetached(t *testing.T) {
	bin := labtest.K8sBin(t)
	ctx := t.Context()
	dir := t.TempDir()

	c, err := Start(ctx, Config{Dir: dir, BinDir: bin, Detached: true, Log: testLogger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })

	running, err := runningPids(dir)
	require.NoError(t, err)
	assert.ElementsMatch(t, c.Pids(), running)

	_, err = Start(ctx, Config{Dir: dir, BinDir: bin})
	require.ErrorContains(t, err, "StopDir", "a second lab in the same dir must be refused")

	require.NoError(t, StopDir(dir))
	for _, pid := range c.Pids() {
		state, _, err := procStat(pid)
		if !errors.Is(err, os.ErrNotExist) { // not yet reaped by this test process: a zombie
			assert.Equal(t, "Z", state, "pid %d still runs", pid)
		}
	}
	running, err = runningPids(dir)
	require.NoError(t, err)
	assert.Empty(t, running)
	require.NoError(t, StopDir(dir), "StopDir with nothing left is a no-op")
}
