package controller

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// TestPrivilegedControllerCNI runs the controller against the lab's real API server while the
// CNIs' settings come and go: kube-system/cilium-config asking for netkit makes edge-a's row
// of class public not ready and its local mapping NodeNotReady, naming the setting; Cilium's
// and Calico's CRDs installed after the controller started are found and watched: an empty
// list of CiliumNodes puts edge-a outside Cilium (ready again), its CiliumNode back inside, a
// CiliumNodeConfig picking it overrides the ConfigMap (ready), and Calico eBPF before v3.29
// with the conntrack bypass refuses it again.
func TestPrivilegedControllerCNI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := startAPILab(t, ctx, func(c *Config) { c.CNIDiscoverEvery = 200 * time.Millisecond })
	kube, dyn := l.kube, l.dyn
	create(t, ctx, dyn, v1alpha1.PortMapsResource, portMap("local", "public", 8080))

	row := func() (v1alpha1.ClassNodeStatus, bool) {
		u, err := dyn.Resource(v1alpha1.PortMapClassesResource).Get(ctx, "public", metav1.GetOptions{})
		if err != nil {
			return v1alpha1.ClassNodeStatus{}, false
		}
		var cl v1alpha1.PortMapClass
		if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cl) != nil || len(cl.Status.Nodes) != 1 {
			return v1alpha1.ClassNodeStatus{}, false
		}
		return cl.Status.Nodes[0], true
	}
	// waitRow waits for edge-a's row to be ready or not, its message holding want.
	waitRow := func(ready bool, want string) {
		t.Helper()
		require.Eventually(t, func() bool {
			r, ok := row()
			return ok && r.Ready == ready && strings.Contains(r.Message, want)
		}, 30*time.Second, 100*time.Millisecond, "edge-a's row ready=%v with %q", ready, want)
	}
	programmed := func() *metav1.Condition {
		u, err := dyn.Resource(v1alpha1.PortMapsResource).Namespace("games").Get(ctx, "local", metav1.GetOptions{})
		if err != nil {
			return nil
		}
		var pm v1alpha1.PortMap
		if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pm) != nil {
			return nil
		}
		return meta.FindStatusCondition(pm.Status.Conditions, v1alpha1.ConditionProgrammed)
	}

	waitRow(true, "")

	// cilium-config alone (no Cilium CRDs yet): every node counts as Cilium's.
	require.NoError(t, l.cl.EnsureNamespace(ctx, ciliumNamespace, nil))
	_, err := kube.CoreV1().ConfigMaps(ciliumNamespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: ciliumConfigMap, Namespace: ciliumNamespace},
		Data:       map[string]string{"datapath-mode": "netkit", "kube-proxy-replacement": "true"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	waitRow(false, `datapath-mode: "netkit" (cilium-config)`)
	require.Eventually(t, func() bool {
		c := programmed()
		return c != nil && c.Reason == v1alpha1.ReasonNodeNotReady && strings.Contains(c.Message, "node edge-a: Cilium datapath-mode")
	}, 30*time.Second, 100*time.Millisecond, "games/local NodeNotReady naming the setting: last %+v", programmed())

	// Another ConfigMap in kube-system is none of kuport's business.
	_, err = kube.CoreV1().ConfigMaps(ciliumNamespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ciliumNamespace}}, metav1.CreateOptions{})
	require.NoError(t, err)

	// The CRDs arrive: no CiliumNode names edge-a, so it runs no Cilium.
	installCRDs(t, ctx, l, "testdata/cni-crds")
	waitRow(true, "")
	ciliumNodes := schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnodes"}
	createObject(t, ctx, l, ciliumNodes, "", `{"apiVersion":"cilium.io/v2","kind":"CiliumNode","metadata":{"name":"edge-a"},"spec":{}}`)
	waitRow(false, `datapath-mode: "netkit" (cilium-config)`)

	// A CiliumNodeConfig picking every node overrides the ConfigMap.
	cncs := schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnodeconfigs"}
	createObject(t, ctx, l, cncs, ciliumNamespace, `{"apiVersion":"cilium.io/v2","kind":"CiliumNodeConfig",
		"metadata":{"name":"veth","namespace":"kube-system"},
		"spec":{"nodeSelector":{},"defaults":{"datapath-mode":"veth","enable-host-legacy-routing":"true"}}}`)
	waitRow(true, "")

	// Cilium goes; Calico eBPF before v3.29 bypassing conntrack comes.
	require.NoError(t, kube.CoreV1().ConfigMaps(ciliumNamespace).Delete(ctx, ciliumConfigMap, metav1.DeleteOptions{}))
	createObject(t, ctx, l, schema.GroupVersionResource{Group: "crd.projectcalico.org", Version: "v1", Resource: "clusterinformations"}, "",
		`{"apiVersion":"crd.projectcalico.org/v1","kind":"ClusterInformation","metadata":{"name":"default"},"spec":{"calicoVersion":"v3.28.2"}}`)
	createObject(t, ctx, l, schema.GroupVersionResource{Group: "crd.projectcalico.org", Version: "v1", Resource: "felixconfigurations"}, "",
		`{"apiVersion":"crd.projectcalico.org/v1","kind":"FelixConfiguration","metadata":{"name":"default"},"spec":{"bpfEnabled":true}}`)
	waitRow(false, "Calico v3.28.2 eBPF (FelixConfiguration default bpfEnabled: true) with bpfHostConntrackBypass unset")
	// Its per-node configuration turning the bypass off leaves a warning.
	createObject(t, ctx, l, schema.GroupVersionResource{Group: "crd.projectcalico.org", Version: "v1", Resource: "felixconfigurations"}, "",
		`{"apiVersion":"crd.projectcalico.org/v1","kind":"FelixConfiguration","metadata":{"name":"node.edge-a"},"spec":{"bpfHostConntrackBypass":false}}`)
	waitRow(true, "warning: Calico v3.28.2 eBPF")
}

// installCRDs creates every CRD in dir's YAML files and waits until they are served.
func installCRDs(t *testing.T, ctx context.Context, l *apiLab, dir string) {
	t.Helper()
	api, err := apiextensionsclient.NewForConfig(l.cl.RESTConfig())
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	require.NoError(t, err)
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, doc := range bytes.Split(b, []byte("\n---\n")) {
			var crd apiextensionsv1.CustomResourceDefinition
			require.NoError(t, yaml.UnmarshalStrict(doc, &crd), f)
			_, err := api.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{})
			require.NoError(t, err, crd.Name)
			names = append(names, crd.Name)
		}
	}
	require.NotEmpty(t, names)
	for _, n := range names {
		require.Eventually(t, func() bool {
			crd, err := api.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false
			}
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true
				}
			}
			return false
		}, 30*time.Second, 100*time.Millisecond, "CRD %s established", n)
	}
}

// createObject creates the object of JSON text in namespace ns ("" for cluster-scoped).
func createObject(t *testing.T, ctx context.Context, l *apiLab, gvr schema.GroupVersionResource, ns, text string) {
	t.Helper()
	var u unstructured.Unstructured
	require.NoError(t, u.UnmarshalJSON([]byte(text)))
	_, err := l.dyn.Resource(gvr).Namespace(ns).Create(ctx, &u, metav1.CreateOptions{})
	require.NoError(t, err)
}
