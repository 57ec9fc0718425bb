package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
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
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/apiclient"
	"kuport.wlz.li/kuport/controller/metrics"
	"kuport.wlz.li/kuport/controller/programmed"
	"kuport.wlz.li/kuport/controller/servingcert"
	"kuport.wlz.li/kuport/controller/timing"
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

// apiLab is the lab's real API server with the controller and its gRPC server running
// against it, and the world every test here maps: node edge-a accepting on wt0 (class
// public), a pod on it behind Service games/web (port http).
type apiLab struct {
	cl   *cluster.Cluster
	kube kubernetes.Interface
	dyn  dynamic.Interface
	// agent is edge-a's agent stream, its Hello sent.
	agent agentStream
	// connect opens another stream of edge-a's agent and sends its Hello, as a restarted
	// agent does (no applied version).
	connect func() agentStream
}

type agentStream = grpc.BidiStreamingClient[kuportv1.ConnectRequest, kuportv1.ConnectResponse]

func startAPILab(t *testing.T, ctx context.Context, configure ...func(*Config)) *apiLab {
	t.Helper()
	binDir := labtest.K8sBin(t)
	log := hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Debug, Output: t.Output()})

	cl, err := cluster.Start(ctx, cluster.Config{Dir: t.TempDir(), BinDir: binDir, CRDDir: "../deploy/crds", Log: log})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cl.Stop()) })
	kube, err := kubernetes.NewForConfig(cl.RESTConfig())
	require.NoError(t, err)
	rc := cl.RESTConfig()
	rc.QPS, rc.Burst = 1000, 1000 // the tests' own creates
	dyn, err := dynamic.NewForConfig(rc)
	require.NoError(t, err)

	kuport, err := apiclient.NewForConfig(rc)
	require.NoError(t, err)
	cfg := Config{Kube: kube, Kuport: kuport, Dynamic: dyn, Epoch: 1000, Hold: time.Second, Log: log.Named("controller")}
	for _, f := range configure {
		f(&cfg)
	}
	ctl, err := New(cfg)
	require.NoError(t, err)
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- ctl.Run(runCtx) }()
	t.Cleanup(func() {
		stopRun()
		assert.NoError(t, <-ran)
	})
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
	t.Cleanup(srv.Stop)

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
	t.Cleanup(func() { _ = conn.Close() })
	connect := func() agentStream {
		agent, err := kuportv1.NewAgentServiceClient(conn).Connect(ctx)
		require.NoError(t, err)
		require.NoError(t, agent.Send(&kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Hello{Hello: &kuportv1.Hello{
			Node: "edge-a", AgentVersion: "test",
			State: &kuportv1.NodeState{UnderlayInterface: "wt0", IpForward: true,
				Interfaces: []*kuportv1.Interface{{Name: "wt0", Addresses: []string{"100.64.93.143"}, Mtu: 1420}}},
		}}}))
		return agent
	}
	agent := connect()

	create(t, ctx, dyn, v1alpha1.PortMapClassesResource, &v1alpha1.PortMapClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "PortMapClass"},
		ObjectMeta: metav1.ObjectMeta{Name: "public"},
		Spec:       v1alpha1.PortMapClassSpec{Nodes: map[string]v1alpha1.ClassNode{"edge-a": {Interfaces: []string{"wt0"}}}},
	})
	return &apiLab{cl: cl, kube: kube, dyn: dyn, agent: agent, connect: connect}
}

// portMap is PortMap games/<name> of class on port, to Service web.
func portMap(name, class string, port int32) *v1alpha1.PortMap {
	return &v1alpha1.PortMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "PortMap"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "games"},
		Spec: v1alpha1.PortMapSpec{ClassName: class, Protocol: v1alpha1.ProtocolTCP, Port: port,
			ServiceRef: v1alpha1.ServiceRef{Name: "web", Port: "http"}},
	}
}

// TestPrivilegedControllerAPI runs the controller and its gRPC server against the lab's real
// API server with one agent client: a PortMap naming a missing class gets Accepted=False
// ClassNotFound (and an Event); a valid local mapping is Programmed=False NodeNotReady when
// the agent has not acknowledged the program version carrying it for programmed.AckGrace, then True
// once it does, and False again once the agent disconnects.
func TestPrivilegedControllerAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := startAPILab(t, ctx)
	kube, dyn, agent := l.kube, l.dyn, l.agent
	for name, class := range map[string]string{"orphan": "missing", "local": "public"} {
		create(t, ctx, dyn, v1alpha1.PortMapsResource, portMap(name, class, 8080))
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

// TestPrivilegedBulkCreate: PortMaps created at once, with an agent acknowledging every
// program at once, reach it as few program versions (a compile per timing.CompileWindow, not per
// event), and each PortMap's status is written once, Programmed=True: no Programmed=False
// awaiting the acknowledgement goes before it (programmed.AckGrace).
func TestPrivilegedBulkCreate(t *testing.T) {
	const n = 100
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := startAPILab(t, ctx)

	// The agent: acknowledges each program as it comes and notes when the versions carrying
	// the bulk's mappings came.
	var (
		mu   sync.Mutex
		came []time.Time
	)
	go func() {
		for {
			msg, err := l.agent.Recv()
			if err != nil {
				return
			}
			p := msg.GetProgram()
			if d := msg.GetDelta(); d != nil {
				p = d.GetChanged()
			}
			if p == nil {
				continue
			}
			for _, d := range p.GetDnatRules() {
				if strings.HasPrefix(d.Mapping, "games/bulk-") {
					mu.Lock()
					came = append(came, time.Now())
					mu.Unlock()
					break
				}
			}
			if l.agent.Send(&kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Ack{Ack: &kuportv1.Ack{Epoch: p.Epoch, Version: p.Version}}}) != nil {
				return
			}
		}
	}()
	// Past the startup hold, with the class's first program acknowledged.
	require.Eventually(t, func() bool {
		cls, err := l.dyn.Resource(v1alpha1.PortMapClassesResource).Get(ctx, "public", metav1.GetOptions{})
		return err == nil && cls.Object["status"] != nil
	}, 60*time.Second, 10*time.Millisecond)

	pms := l.dyn.Resource(v1alpha1.PortMapsResource).Namespace("games")
	list, err := pms.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	// Resumed where it ended when the API server ends it; read at once, as it ends a watch
	// that falls behind.
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.GetResourceVersion(), &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return pms.Watch(ctx, o) },
	})
	require.NoError(t, err)
	defer w.Stop()
	events := make(chan watch.Event, 10*n)
	go func() {
		for ev := range w.ResultChan() {
			events <- ev
		}
		close(events)
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			create(t, ctx, l.dyn, v1alpha1.PortMapsResource, portMap(fmt.Sprintf("bulk-%03d", i), "public", int32(20000+i)))
		})
	}
	wg.Wait()
	created := time.Since(start)

	writes := map[string]int{}
	done := 0
	for done < n {
		select {
		case ev, ok := <-events:
			require.True(t, ok, "the watch ended")
			u, ok := ev.Object.(*unstructured.Unstructured)
			require.True(t, ok, "watch event %v", ev)
			if ev.Type != watch.Modified {
				continue
			}
			writes[u.GetName()]++
			var pm v1alpha1.PortMap
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pm))
			c := meta.FindStatusCondition(pm.Status.Conditions, v1alpha1.ConditionProgrammed)
			require.NotNil(t, c, "%s written without Programmed", pm.Name)
			require.Equal(t, metav1.ConditionTrue, c.Status, "%s: %s %s", pm.Name, c.Reason, c.Message)
			done++
		case <-ctx.Done():
			t.Fatalf("%d of %d PortMaps Programmed", done, n)
		}
	}
	// Nothing more is written once all are True.
	select {
	case ev := <-events:
		t.Fatalf("another write after all were Programmed: %s %v", ev.Type, ev.Object.(*unstructured.Unstructured).GetName())
	case <-time.After(2 * programmed.AckGrace):
	}
	for name, c := range writes {
		assert.Equal(t, 1, c, "status writes of %s", name)
	}
	mu.Lock()
	defer mu.Unlock()
	// Compiles start timing.CompileWindow apart while the creates come (each version's own compile
	// and send time varies by a few milliseconds): a compile per event or two would send
	// them about a millisecond apart.
	t.Logf("%d PortMaps created in %s reached the agent in %d program versions", n, created, len(came))
	for i := 1; i < len(came); i++ {
		assert.GreaterOrEqual(t, came[i].Sub(came[i-1]), timing.CompileWindow/2, "versions %d and %d", i-1, i)
	}
}

// TestCachesHoldLeanObjects: what the informers cache has no managedFields, typed or not,
// and of the core objects only what the controller reads (lean).
func TestCachesHoldLeanObjects(t *testing.T) {
	mf := []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate}}
	objMeta := metav1.ObjectMeta{Name: "web", Namespace: "games", UID: "u1", ResourceVersion: "7", ManagedFields: mf,
		Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"note": "big"}, Generation: 3}
	want := metav1.ObjectMeta{Name: "web", Namespace: "games", UID: "u1", ResourceVersion: "7"}

	svc := &corev1.Service{ObjectMeta: objMeta, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}, ClusterIP: "10.96.0.9"}}
	out, err := lean(svc)
	require.NoError(t, err)
	assert.Equal(t, &corev1.Service{ObjectMeta: want}, out, "a Service: whether it exists")

	node := &corev1.Node{ObjectMeta: objMeta, Status: corev1.NodeStatus{Images: []corev1.ContainerImage{{Names: []string{"a"}}}}}
	out, err = lean(node)
	require.NoError(t, err)
	assert.Equal(t, &corev1.Node{ObjectMeta: want}, out, "a Node: whether it exists")

	out, err = lean(&corev1.Namespace{ObjectMeta: objMeta, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}})
	require.NoError(t, err)
	wantNs := want
	wantNs.Labels = objMeta.Labels
	assert.Equal(t, &corev1.Namespace{ObjectMeta: wantNs}, out, "a Namespace: its labels")

	sliceMeta := objMeta
	sliceMeta.Labels = map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "x"}
	es := &discoveryv1.EndpointSlice{ObjectMeta: sliceMeta, AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("p"), Port: ptr.To[int32](80)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			Hostname: ptr.To("web-0"), NodeName: ptr.To("worker-b"), Zone: ptr.To("z"),
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "games", Name: "web-0", UID: "p1"}}}}
	out, err = lean(es)
	require.NoError(t, err)
	wantSlice := want
	wantSlice.Labels = map[string]string{discoveryv1.LabelServiceName: "web"}
	assert.Equal(t, &discoveryv1.EndpointSlice{ObjectMeta: wantSlice, AddressType: discoveryv1.AddressTypeIPv4, Ports: es.Ports,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName: ptr.To("worker-b"), TargetRef: &corev1.ObjectReference{Name: "web-0"}}}}, out,
		"an EndpointSlice: what compile chooses the endpoint by")

	pm := &v1alpha1.PortMap{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "games",
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate}}}}
	typed, err := withoutManagedFields(pm)
	require.NoError(t, err)
	assert.Empty(t, typed.(*v1alpha1.PortMap).ManagedFields)
	assert.Equal(t, "web", typed.(*v1alpha1.PortMap).Name)
	tomb := cache.DeletedFinalStateUnknown{Key: "games/web"}
	for _, transform := range []cache.TransformFunc{lean, withoutManagedFields} {
		out, err = transform(tomb)
		require.NoError(t, err)
		assert.Equal(t, tomb, out, "a tombstone passes")
	}
}

// TestSameButVersion: an update of lean objects that changed only the resourceVersion is
// no change; any other difference is.
func TestSameButVersion(t *testing.T) {
	node := func(rv string) any {
		out, _ := lean(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-b", ResourceVersion: rv},
			Status: corev1.NodeStatus{Phase: corev1.NodePhase(rv)}})
		return out
	}
	assert.True(t, sameButVersion(node("1"), node("2")), "a Node's status update")
	ns := func(rv, team string) any {
		out, _ := lean(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "games", ResourceVersion: rv, Labels: map[string]string{"team": team}}})
		return out
	}
	assert.True(t, sameButVersion(ns("1", "a"), ns("2", "a")))
	assert.False(t, sameButVersion(ns("1", "a"), ns("2", "b")), "a Namespace's labels changed")
	slice := func(rv string, ready bool) any {
		out, _ := lean(&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-x", ResourceVersion: rv},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)},
				Zone: ptr.To(rv)}}})
		return out
	}
	assert.True(t, sameButVersion(slice("1", true), slice("2", true)), "only the zone changed, which the cache does not keep")
	assert.False(t, sameButVersion(slice("1", true), slice("2", false)), "the endpoint's readiness changed")
	assert.False(t, sameButVersion(cache.DeletedFinalStateUnknown{}, node("1")), "not an object")
}

// TestPrivilegedAgentRestartWritesNoStatus: an agent that restarts (its stream ends, and a new
// one says Hello with no applied version, gets its whole program and acknowledges it within
// programmed.ResumeGrace) has no PortMap's status written. When it stays away, its PortMaps
// are written NodeNotReady once the grace has passed.
func TestPrivilegedAgentRestartWritesNoStatus(t *testing.T) {
	const n = 20
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := startAPILab(t, ctx)
	// acknowledge answers every program agent is sent.
	acknowledge := func(agent agentStream) {
		go func() {
			for {
				msg, err := agent.Recv()
				if err != nil {
					return
				}
				p := msg.GetProgram()
				if d := msg.GetDelta(); d != nil {
					p = d.GetChanged()
				}
				if p != nil && agent.Send(&kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Ack{Ack: &kuportv1.Ack{Epoch: p.Epoch, Version: p.Version}}}) != nil {
					return
				}
			}
		}()
	}
	acknowledge(l.agent)
	for i := range n {
		create(t, ctx, l.dyn, v1alpha1.PortMapsResource, portMap(fmt.Sprintf("restart-%02d", i), "public", int32(21000+i)))
	}
	pms := l.dyn.Resource(v1alpha1.PortMapsResource).Namespace("games")
	var list *unstructured.UnstructuredList
	require.Eventually(t, func() bool {
		var err error
		if list, err = pms.List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != n {
			return false
		}
		for _, u := range list.Items {
			var pm v1alpha1.PortMap
			if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pm) != nil ||
				!meta.IsStatusConditionTrue(pm.Status.Conditions, v1alpha1.ConditionProgrammed) {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "every PortMap Programmed")
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.GetResourceVersion(), &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return pms.Watch(ctx, o) },
	})
	require.NoError(t, err)
	defer w.Stop()
	noWrite := func(d time.Duration, why string) {
		t.Helper()
		select {
		case ev := <-w.ResultChan():
			t.Fatalf("%s: %s of %s", why, ev.Type, ev.Object.(*unstructured.Unstructured).GetName())
		case <-time.After(d):
		}
	}

	// The agent restarts: its stream ends, and a new one is acknowledged a moment later.
	require.NoError(t, l.agent.CloseSend())
	noWrite(500*time.Millisecond, "a write while the agent is away")
	again := l.connect()
	acknowledge(again)
	noWrite(2*programmed.AckGrace, "a write across the agent's restart")

	// It goes away again and stays away: NodeNotReady, once the grace has passed.
	start := time.Now()
	require.NoError(t, again.CloseSend())
	notReady := map[string]bool{}
	for len(notReady) < n {
		select {
		case ev := <-w.ResultChan():
			u, ok := ev.Object.(*unstructured.Unstructured)
			require.True(t, ok, "watch event %v", ev)
			var pm v1alpha1.PortMap
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pm))
			c := meta.FindStatusCondition(pm.Status.Conditions, v1alpha1.ConditionProgrammed)
			require.NotNil(t, c)
			require.Equal(t, v1alpha1.ReasonNodeNotReady, c.Reason, "%s: %s", pm.Name, c.Message)
			require.GreaterOrEqual(t, time.Since(start), programmed.ResumeGrace-time.Second, "%s written before the grace passed", pm.Name)
			notReady[pm.Name] = true
		case <-ctx.Done():
			t.Fatalf("%d of %d PortMaps written NodeNotReady", len(notReady), n)
		}
	}
}

// TestPrivilegedNodeStatusCompilesNothing: a Node's status update (its kubelet's, every
// few minutes from every node) changes nothing the cache keeps of a Node, so it compiles
// nothing; a Namespace's labels, which a class's namespaceSelector reads, do compile.
func TestPrivilegedNodeStatusCompilesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := startAPILab(t, ctx)
	create(t, ctx, l.dyn, v1alpha1.PortMapsResource, portMap("local", "public", 8080))
	compiles := func() int {
		rec := httptest.NewRecorder()
		metrics.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		m := regexp.MustCompile(`(?m)^kuport_compile_duration_seconds_count (\d+)$`).FindStringSubmatch(rec.Body.String())
		require.NotNil(t, m, "no compile count in /metrics")
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		return n
	}
	// Quiet: no compile for a few compile windows.
	settled := func() int {
		t.Helper()
		last := compiles()
		for quiet := 0; quiet < 10; {
			time.Sleep(100 * time.Millisecond)
			if n := compiles(); n != last {
				last, quiet = n, 0
			} else {
				quiet++
			}
		}
		return last
	}
	before := settled()
	for i := range 3 {
		node, err := l.kube.CoreV1().Nodes().Get(ctx, "edge-a", metav1.GetOptions{})
		require.NoError(t, err)
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			LastHeartbeatTime: metav1.Now(), Reason: "KubeletReady", Message: "heartbeat " + strconv.Itoa(i)}}
		_, err = l.kube.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	assert.Equal(t, before, settled(), "a Node's status updates compiled")

	ns, err := l.kube.CoreV1().Namespaces().Get(ctx, "games", metav1.GetOptions{})
	require.NoError(t, err)
	ns.Labels["team"] = "red"
	_, err = l.kube.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return compiles() > before }, 10*time.Second, 50*time.Millisecond,
		"a Namespace's labels changed and nothing compiled")
}
