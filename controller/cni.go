package controller

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"kuport.wlz.li/kuport/controller/compile"
)

// Where the CNIs keep the settings compile reads (compile.CNI): Cilium's ConfigMap and
// CiliumNodeConfigs in its namespace, kube-system by default (the chart's RBAC grants that
// namespace only), its CiliumNodes, Calico's FelixConfigurations and ClusterInformation.
const (
	ciliumNamespace = "kube-system"
	ciliumConfigMap = "cilium-config"
)

// cniResource is a CNI's optional resource: the first of its versions the API server serves
// is watched; none served is no error (the CNI is not installed).
type cniResource struct {
	name     string
	versions []schema.GroupVersionResource
	// namespace limits the watch ("" for cluster-scoped resources).
	namespace string
	// keep is what the cache keeps of an object, so an update that changes none of it (a
	// CiliumNode's IPAM status, written often) recompiles nothing.
	keep func(u *unstructured.Unstructured) any
}

// cniResources: CiliumNodeConfig was cilium.io/v2alpha1 before cilium.io/v2; Calico's
// resources are crd.projectcalico.org/v1 custom resources, or projectcalico.org/v3 ones where
// Calico installs those instead (calico PR #10447).
var cniResources = []cniResource{
	{name: "ciliumnodes", versions: []schema.GroupVersionResource{{Group: "cilium.io", Version: "v2", Resource: "ciliumnodes"}},
		keep: func(*unstructured.Unstructured) any { return nil }},
	{name: "ciliumnodeconfigs", namespace: ciliumNamespace, versions: []schema.GroupVersionResource{
		{Group: "cilium.io", Version: "v2", Resource: "ciliumnodeconfigs"},
		{Group: "cilium.io", Version: "v2alpha1", Resource: "ciliumnodeconfigs"}},
		keep: keepSpec},
	{name: "felixconfigurations", versions: []schema.GroupVersionResource{
		{Group: "crd.projectcalico.org", Version: "v1", Resource: "felixconfigurations"},
		{Group: "projectcalico.org", Version: "v3", Resource: "felixconfigurations"}},
		keep: keepFelix},
	{name: "clusterinformations", versions: []schema.GroupVersionResource{
		{Group: "crd.projectcalico.org", Version: "v1", Resource: "clusterinformations"},
		{Group: "projectcalico.org", Version: "v3", Resource: "clusterinformations"}},
		keep: func(u *unstructured.Unstructured) any {
			v, _, _ := unstructured.NestedString(u.Object, "spec", "calicoVersion")
			return v
		}},
}

func keepSpec(u *unstructured.Unstructured) any {
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	return spec
}

// keepFelix keeps the FelixConfiguration fields compile reads.
func keepFelix(u *unstructured.Unstructured) any {
	var f compile.Felix
	if b, ok, _ := unstructured.NestedBool(u.Object, "spec", "bpfEnabled"); ok {
		f.BPFEnabled = &b
	}
	if b, ok, _ := unstructured.NestedBool(u.Object, "spec", "bpfHostConntrackBypass"); ok {
		f.BPFHostConntrackBypass = &b
	}
	return f
}

// kept is an object as a CNI resource's cache holds it: its metadata and what keep kept.
type kept struct {
	metav1.ObjectMeta
	value any
}

// GetObjectKind and DeepCopyObject make kept a runtime.Object for the informer's store; the
// store never copies it.
func (k *kept) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (k *kept) DeepCopyObject() runtime.Object   { c := *k; return &c }

// cniWatch watches the CNIs' settings: informers, started for the resources the API server
// serves; those it does not serve yet are looked for again every every (a CNI
// installed after kuport), never an error. It owns no decision: compile reads what it
// gathers (current).
type cniWatch struct {
	log  hclog.Logger
	disc discovery.DiscoveryInterface
	dyn  dynamic.Interface
	// every is how often discovery looks again for the resources not served.
	every    time.Duration
	onChange func()

	configMaps cache.SharedIndexInformer
	core       informers.SharedInformerFactory

	mu sync.Mutex
	// informers by resource name, once started.
	informers map[string]cache.SharedIndexInformer
	// cur is the CNI compile last got; nil after a change.
	cur   *compile.CNI
	dirty bool
}

// DefaultCNIDiscoverEvery is how often the API server is asked again for a CNI's resources it
// did not serve: a CNI is installed rarely, and discovery is one cheap request per group.
const DefaultCNIDiscoverEvery = time.Minute

// cniSyncWait bounds the first compile's wait for the CNI informers' caches: an RBAC rule
// missing for one must not hold the controller up.
const cniSyncWait = 10 * time.Second

func newCNIWatch(kube kubernetes.Interface, dyn dynamic.Interface, every time.Duration, log hclog.Logger, onChange func()) (*cniWatch, error) {
	w := &cniWatch{log: log, disc: kube.Discovery(), dyn: dyn, every: every, onChange: onChange,
		informers: map[string]cache.SharedIndexInformer{}, dirty: true}
	// The one ConfigMap, by name: RBAC grants list and watch of it alone.
	w.core = informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(ciliumNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", ciliumConfigMap).String()
		}))
	w.configMaps = w.core.Core().V1().ConfigMaps().Informer()
	if err := w.configMaps.SetWatchErrorHandler(w.watchError("configmap " + ciliumNamespace + "/" + ciliumConfigMap)); err != nil {
		return nil, err
	}
	if _, err := w.configMaps.AddEventHandler(w.handler(func(o any) any {
		if cm, ok := o.(*corev1.ConfigMap); ok {
			return cm.Data
		}
		return nil
	})); err != nil {
		return nil, err
	}
	return w, nil
}

// handler marks the CNI changed on an add, a delete, or an update that changed what value
// reads of the object.
func (w *cniWatch) handler(value func(any) any) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.changed() },
		DeleteFunc: func(any) { w.changed() },
		UpdateFunc: func(old, o any) {
			if !equality.Semantic.DeepEqual(value(old), value(o)) {
				w.changed()
			}
		},
	}
}

func (w *cniWatch) changed() {
	w.mu.Lock()
	w.dirty = true
	w.mu.Unlock()
	w.onChange()
}

// watchError logs a resource's failing list or watch once at warn (a missing RBAC rule, the
// CRD deleted), then at debug: the reflector retries with backoff.
func (w *cniWatch) watchError(what string) cache.WatchErrorHandler {
	var once sync.Once
	return func(_ *cache.Reflector, err error) {
		logged := false
		once.Do(func() {
			logged = true
			w.log.Warn("cannot watch a CNI setting; kuport does not see it", "resource", what, "error", err)
		})
		if !logged {
			w.log.Debug("watch of a CNI setting failed", "resource", what, "error", err)
		}
	}
}

// start discovers the CNI resources served now and starts their informers and the
// ConfigMap's; then, until ctx ends, it looks again for those not served every w.every. It returns once the first discovery is done.
func (w *cniWatch) start(ctx context.Context) {
	w.core.Start(ctx.Done())
	w.discover(ctx)
	go func() {
		t := time.NewTicker(w.every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if w.discover(ctx) {
					return
				}
			}
		}
	}()
}

// discover starts the informer of every CNI resource the API server serves now; it reports
// whether every one is started.
func (w *cniWatch) discover(ctx context.Context) bool {
	all := true
	for _, r := range cniResources {
		w.mu.Lock()
		_, started := w.informers[r.name]
		w.mu.Unlock()
		if started {
			continue
		}
		gvr, ok := w.served(r)
		if !ok {
			all = false
			continue
		}
		inf := w.informer(r, gvr)
		w.mu.Lock()
		w.informers[r.name] = inf
		w.dirty = true
		w.mu.Unlock()
		go inf.Run(ctx.Done())
		w.log.Info("watching a CNI's settings", "resource", gvr.String())
	}
	return all
}

// served returns the first version of r the API server serves.
func (w *cniWatch) served(r cniResource) (schema.GroupVersionResource, bool) {
	for _, gvr := range r.versions {
		list, err := w.disc.ServerResourcesForGroupVersion(gvr.GroupVersion().String())
		if err != nil {
			if !apierrors.IsNotFound(err) {
				w.log.Debug("discovery of a CNI's resources failed", "groupVersion", gvr.GroupVersion().String(), "error", err)
			}
			continue
		}
		for _, res := range list.APIResources {
			if res.Name == gvr.Resource {
				return gvr, true
			}
		}
	}
	return schema.GroupVersionResource{}, false
}

func (w *cniWatch) informer(r cniResource, gvr schema.GroupVersionResource) cache.SharedIndexInformer {
	inf := dynamicinformer.NewFilteredDynamicInformer(w.dyn, gvr, r.namespace, 0, cache.Indexers{}, nil).Informer()
	// Errors: only before the informer runs, which it does not yet.
	_ = inf.SetTransform(func(o any) (any, error) {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			return o, nil
		}
		return &kept{ObjectMeta: metav1.ObjectMeta{Name: u.GetName(), Namespace: u.GetNamespace(),
			Labels: u.GetLabels(), ResourceVersion: u.GetResourceVersion()}, value: r.keep(u)}, nil
	})
	_ = inf.SetWatchErrorHandler(w.watchError(gvr.String()))
	_, _ = inf.AddEventHandler(w.handler(func(o any) any {
		if k, ok := o.(*kept); ok {
			return k.value
		}
		return nil
	}))
	return inf
}

// waitSynced waits, at most cniSyncWait, for the caches of the informers started.
func (w *cniWatch) waitSynced(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, cniSyncWait)
	defer cancel()
	synced := []cache.InformerSynced{w.configMaps.HasSynced}
	w.mu.Lock()
	for _, inf := range w.informers {
		synced = append(synced, inf.HasSynced)
	}
	w.mu.Unlock()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		w.log.Warn("the CNI's settings are not all read yet; compiling without them until they are")
	}
}

// current returns what compile reads of the CNIs: the same value until something changed,
// so a snapshot's CNI compares by identity (compile.Snapshot.CNI).
func (w *cniWatch) current() *compile.CNI {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.dirty {
		return w.cur
	}
	w.dirty = false
	cni := &compile.CNI{}
	if obj, ok, _ := w.configMaps.GetStore().GetByKey(ciliumNamespace + "/" + ciliumConfigMap); ok {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			cni.Cilium = &compile.Cilium{Config: cm.Data}
		}
	}
	if c := cni.Cilium; c != nil {
		// Until its cache is synced, which nodes run Cilium is unknown (every node counts),
		// and the next call looks again.
		if inf := w.informers["ciliumnodes"]; inf != nil && !inf.HasSynced() {
			w.dirty = true
		} else if inf != nil {
			c.Nodes = map[string]bool{}
			for _, o := range inf.GetStore().List() {
				if k, ok := o.(*kept); ok {
					c.Nodes[k.Name] = true
				}
			}
		}
		for _, k := range w.list("ciliumnodeconfigs") {
			spec, _ := k.value.(map[string]any)
			cnc := compile.CiliumNodeConfig{Name: k.Name}
			if d, ok, _ := unstructured.NestedStringMap(spec, "defaults"); ok {
				cnc.Defaults = d
			}
			if sel, ok, _ := unstructured.NestedMap(spec, "nodeSelector"); ok {
				var ls metav1.LabelSelector
				if runtime.DefaultUnstructuredConverter.FromUnstructured(sel, &ls) == nil {
					cnc.Selector = &ls
				}
			}
			c.NodeConfigs = append(c.NodeConfigs, cnc)
		}
	}
	if felix := w.list("felixconfigurations"); len(felix) > 0 {
		cni.Calico = &compile.Calico{Felix: map[string]compile.Felix{}}
		for _, k := range felix {
			cni.Calico.Felix[k.Name], _ = k.value.(compile.Felix)
		}
		for _, k := range w.list("clusterinformations") {
			if k.Name == "default" {
				cni.Calico.Version, _ = k.value.(string)
			}
		}
	}
	if cni.Cilium == nil && cni.Calico == nil {
		cni = nil
	}
	w.cur = cni
	return cni
}

// list returns the cached objects of a CNI resource (none when it is not watched). Called
// with w.mu held.
func (w *cniWatch) list(name string) []*kept {
	inf := w.informers[name]
	if inf == nil {
		return nil
	}
	var out []*kept
	for _, o := range inf.GetStore().List() {
		if k, ok := o.(*kept); ok {
			out = append(out, k)
		}
	}
	return out
}
