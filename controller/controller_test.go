package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/servingcert"
	"kuport.wlz.li/kuport/lab/cluster"
	"kuport.wlz.li/kuport/lab/labtest"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

func create(t *testing.T, ctx context.Context, c dynamic.Interface, gvr schema.GroupVersionResource, obj runtime.Object) {
	t.Helper()
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	require.NoError(t, err)
	_, err = c.Resource(gvr).Namespace((&unstructured.Unstructured{Object: u}).GetNamespace()).Create(ctx, &unstructured.Unstructured{Object: u}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// TestPrivilegedControllerAPI runs the controller and its gRPC server against the lab's real
// API server with one agent client: a PortMap naming a missing class gets Accepted=False
// ClassNotFound (and an Event); a valid local mapping is Programmed=False NodeNotReady until
// the agent acknowledges the program version carrying it, then True, and False again once the
// agent disconnects.
func TestPrivilegedControllerAPI(t *testing.T) {
	binDir := labtest.K8sBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	log := hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Debug, Output: t.Output()})

	cl, err := cluster.Start(ctx, cluster.Config{Dir: t.TempDir(), BinDir: binDir, CRDDir: "../deploy/crds", Log: log})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cl.Stop()) })
	kube, err := kubernetes.NewForConfig(cl.RESTConfig())
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(cl.RESTConfig())
	require.NoError(t, err)

	ctl, err := New(Config{Kube: kube, Dynamic: dyn, Epoch: 1000, Hold: time.Second, Log: log.Named("controller")})
	require.NoError(t, err)
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- ctl.Run(runCtx) }()
	defer func() {
		stopRun()
		assert.NoError(t, <-ran)
	}()
	// The serving certificate as in a cluster: generated into a Secret, its CA published in a
	// ConfigMap, which the agent trusts.
	require.NoError(t, cl.EnsureNamespace(ctx, "kuport-system", nil))
	src := &servingcert.Secret{Client: kube, Namespace: "kuport-system", Name: servingcert.DefaultSecret,
		CAConfigMap: servingcert.DefaultCAConfigMap, Names: servingcert.DefaultNames("kuport-system")}
	certs, err := servingcert.NewReloader(ctx, src.Load, log.Named("tls"))
	require.NoError(t, err)
	caMap, err := kube.CoreV1().ConfigMaps("kuport-system").Get(ctx, servingcert.DefaultCAConfigMap, metav1.GetOptions{})
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM([]byte(caMap.Data[servingcert.CACertKey])))

	sock := "unix://" + filepath.Join(t.TempDir(), "controller.sock")
	lis, err := agents.Listen(sock)
	require.NoError(t, err)
	srv := agents.NewServer(log.Named("grpc"), nil, certs.TLSConfig())
	srv.Lead(ctl.Registry())
	go func() { assert.NoError(t, srv.Serve(lis)) }()
	defer srv.Stop()

	// The world: node edge-a accepting on wt0, a pod on it behind Service games/web.
	require.NoError(t, cl.EnsureNamespace(ctx, "games", nil))
	_, err = kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-a"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = kube.CoreV1().Services("games").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "games"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	ready, node, portName, port := true, "edge-a", "http", int32(8080)
	_, err = kube.DiscoveryV1().EndpointSlices("games").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "games", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.17.5"}, NodeName: &node,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "games", Name: "web-0"}}},
		Ports: []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	// The agent of edge-a says hello.
	conn, err := grpc.NewClient(sock, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: roots, ServerName: "kuport-controller.kuport-system.svc"})))
	require.NoError(t, err)
	defer conn.Close()
	agent, err := kuportv1.NewAgentServiceClient(conn).Connect(ctx)
	require.NoError(t, err)
	require.NoError(t, agent.Send(&kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Hello{Hello: &kuportv1.Hello{
		Node: "edge-a", AgentVersion: "test",
		State: &kuportv1.NodeState{UnderlayInterface: "wt0", IpForward: true,
			Interfaces: []*kuportv1.Interface{{Name: "wt0", Addresses: []string{"100.64.93.143"}, Mtu: 1420}}},
	}}}))

	create(t, ctx, dyn, v1alpha1.PortMapClassesResource, &v1alpha1.PortMapClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "PortMapClass"},
		ObjectMeta: metav1.ObjectMeta{Name: "public"},
		Spec:       v1alpha1.PortMapClassSpec{Nodes: map[string]v1alpha1.ClassNode{"edge-a": {Interfaces: []string{"wt0"}}}},
	})
	for name, class := range map[string]string{"orphan": "missing", "local": "public"} {
		create(t, ctx, dyn, v1alpha1.PortMapsResource, &v1alpha1.PortMap{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "PortMap"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "games"},
			Spec: v1alpha1.PortMapSpec{ClassName: class, Protocol: v1alpha1.ProtocolTCP, Port: 8080,
				ServiceRef: v1alpha1.ServiceRef{Name: "web", Port: "http"}},
		})
	}

	condition := func(name, typ string) *metav1.Condition {
		u, err := dyn.Resource(v1alpha1.PortMapsResource).Namespace("games").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		var pm v1alpha1.PortMap
		if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pm) != nil {
			return nil
		}
		return meta.FindStatusCondition(pm.Status.Conditions, typ)
	}
	waitFor := func(name, typ string, ok func(*metav1.Condition) bool) {
		t.Helper()
		require.Eventually(t, func() bool {
			c := condition(name, typ)
			return c != nil && ok(c)
		}, 60*time.Second, 100*time.Millisecond, "portmap %s condition %s: last %+v", name, typ, condition(name, typ))
	}

	waitFor("orphan", v1alpha1.ConditionAccepted, func(c *metav1.Condition) bool {
		return c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonClassNotFound
	})
	require.Eventually(t, func() bool {
		evs, err := kube.CoreV1().Events("games").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "orphan" && e.Reason == v1alpha1.ReasonClassNotFound && e.Type == corev1.EventTypeWarning {
				return true
			}
		}
		return false
	}, 60*time.Second, 100*time.Millisecond, "ClassNotFound event")

	// The program carrying games/local arrives; until it is acknowledged, NodeNotReady.
	var prog *kuportv1.NodeProgram
	for prog == nil {
		msg, err := agent.Recv()
		require.NoError(t, err)
		for _, d := range msg.GetProgram().GetDnatRules() {
			if d.Mapping == "games/local" {
				prog = msg.GetProgram()
			}
		}
	}
	assert.Equal(t, uint64(1000), prog.Epoch)
	waitFor("local", v1alpha1.ConditionProgrammed, func(c *metav1.Condition) bool {
		return c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonNodeNotReady &&
			c.Message == "node edge-a has not acknowledged program version "+itoa(prog.Version)
	})
	require.NoError(t, agent.Send(&kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Ack{Ack: &kuportv1.Ack{Epoch: prog.Epoch, Version: prog.Version}}}))
	waitFor("local", v1alpha1.ConditionProgrammed, func(c *metav1.Condition) bool {
		return c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonAllNodesReady
	})

	// The agent goes away: the mapping is no longer known to be in a kernel.
	require.NoError(t, agent.CloseSend())
	waitFor("local", v1alpha1.ConditionProgrammed, func(c *metav1.Condition) bool {
		return c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonNodeNotReady
	})
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

func TestIsOnlyConflicts(t *testing.T) {
	gr := schema.GroupResource{Group: "kuport.wlz.li", Resource: "portmaps"}
	conflict := fmt.Errorf("portmap demo/a status: %w", apierrors.NewConflict(gr, "a", errors.New("modified")))
	assert.True(t, isOnlyConflicts(conflict))
	assert.True(t, isOnlyConflicts(errors.Join(conflict, conflict)))
	assert.False(t, isOnlyConflicts(errors.Join(conflict, errors.New("forbidden"))))
	assert.False(t, isOnlyConflicts(errors.New("forbidden")))
}

// TestCachesHoldNoManagedFields: what the informers cache has no managedFields, typed or not.
func TestCachesHoldNoManagedFields(t *testing.T) {
	mf := []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", ManagedFields: mf}}
	out, err := stripManagedFields(svc)
	require.NoError(t, err)
	assert.Empty(t, out.(*corev1.Service).ManagedFields)
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kuport.wlz.li/v1alpha1", "kind": "PortMap",
		"metadata": map[string]any{"name": "web", "namespace": "games",
			"managedFields": []any{map[string]any{"manager": "kubectl", "operation": "Update"}}}}}
	typed, err := toTyped[v1alpha1.PortMap](u)
	require.NoError(t, err)
	assert.Empty(t, typed.(*v1alpha1.PortMap).ManagedFields)
	assert.Equal(t, "web", typed.(*v1alpha1.PortMap).Name)
	tomb := cache.DeletedFinalStateUnknown{Key: "games/web"}
	out, err = stripManagedFields(tomb)
	require.NoError(t, err)
	assert.Equal(t, tomb, out, "a tombstone passes")
}
