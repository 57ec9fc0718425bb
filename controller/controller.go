// Package controller wires kuport's controller runtime (docs/design/software.md#shape):
// informers on PortMapClass, PortMap, Service, EndpointSlice, Node and Namespace (and the
// CNIs' settings, cni.go) feed one work queue; its worker keeps a compile.Snapshot of the
// caches and the agent registry up to date from the events, compiles it (compile.Incremental:
// what the events changed, equal to the pure compile.Compile; a burst's events together,
// compileWindow apart), hands the programs to the agents.Registry (which versions them and
// pushes them, or their deltas, to connected agents), and status workers write the statuses
// whose programmed.Decide verdict changed through the status package, rate-limited.
//
// It owns the work queue and the informers; it makes no datapath decision (compile does) and
// touches no kernel state.
package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/client-go/util/workqueue"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/metrics"
	"kuport.wlz.li/kuport/controller/programmed"
	"kuport.wlz.li/kuport/controller/status"
)

// Work queue keys: the queue deduplicates them, which debounces bursts of events.
const (
	// keyCompile: recompile, push changed programs, write every status.
	keyCompile = "compile"
	// keyStatus: rewrite the statuses of the mappings the registry touched (an agent
	// acknowledged a version).
	keyStatus = "status"
	// keyStatusAll: decide every PortMap's status again (the term's settling ended).
	keyStatusAll = "status-all"
	// keyClassStatus: write the class statuses put off behind a push (DefaultClassStatusWait).
	keyClassStatus = "class-status"
	// keyBurstHeld: queue the PortMap statuses put off behind a burst once it is over or they
	// waited burstHold (bursts.release).
	keyBurstHeld = "burst-held"
)

// DefaultClassStatusWait is the longest a class status write is put off behind the push of
// the compile it comes from (when its link claims are already recorded, nothing waits for it):
// the write goes out once every connected agent acknowledged, or after this long. A class
// of 1,000 nodes is a large write: kube-apiserver spent about 1.3 s of CPU on one in
// bench/fanout (its apiserver-cpu.pprof), which beside the push competes with the
// acknowledgements for the CPU (BENCHMARKS.md, "a class change at 1,000 agents").
const DefaultClassStatusWait = time.Second

// Status writes: by default at most DefaultStatusQPS a second (bursts of DefaultStatusBurst),
// by statusWorkers in parallel. client-go's default (5 a second) made 1,000 PortMaps applied
// at once take 198 s to all read Programmed=True (BENCHMARKS.md, "Control plane"); 4 workers
// at 200 a second still took 5 s after the last of them was created, each write waiting out
// its round trip to an API server busy with the creates. Sized so 1,000 at once leave in
// about a second.
const (
	DefaultStatusQPS   = 500
	DefaultStatusBurst = 1000
	statusWorkers      = 16
)

// resyncPeriod recompiles periodically even without events, so link claims age
// (unusedSince, LinkRetention) and a missed event heals.
const resyncPeriod = time.Minute

// DefaultLinkRetention is how long an unused link slot claim is kept
// (docs/design/api.md#links-and-slots: 24 h).
const DefaultLinkRetention = 24 * time.Hour

// Config configures a Controller.
type Config struct {
	// Kube reads core objects and writes Events.
	Kube kubernetes.Interface
	// Dynamic reads PortMapClasses and PortMaps and writes their status.
	Dynamic dynamic.Interface
	// Epoch stamps every program: the leadership term's epoch (package controller/leader),
	// higher for every later term (see agents.Config.Epoch).
	Epoch uint64
	// Start is when the controller started (startup hold); zero means now.
	Start time.Time
	// Hold bounds the startup hold (agents.DefaultHold when zero).
	Hold time.Duration
	// LinkRetention is how long an unused link claim is kept (DefaultLinkRetention when zero).
	LinkRetention time.Duration
	// OnEpochBehind is called when an agent holds a higher epoch than Epoch and so refuses
	// this controller's programs (agents.Config.OnEpochBehind). May be nil.
	OnEpochBehind func(floor uint64)
	// Unanswered is how long a node's requests must go without a reply before the mapping is
	// unanswered there (agents.DefaultUnansweredWindow when zero).
	Unanswered agents.Window
	// ClassStatusWait is the longest a class status write waits for the acknowledgements of
	// the push before it (DefaultClassStatusWait when zero).
	ClassStatusWait time.Duration
	// StatusQPS and StatusBurst limit the status writes (DefaultStatusQPS and
	// DefaultStatusBurst when zero); the clients' own limit must not be lower.
	StatusQPS   float32
	StatusBurst int
	// CNIDiscoverEvery is how often the API server is asked again for a CNI's resources it
	// did not serve (DefaultCNIDiscoverEvery when zero).
	CNIDiscoverEvery time.Duration
	// ReturnMarking is the return paths' mark bits, tables and rule prefs, checked by the
	// caller (compile.ReturnMarking.Check); compile.DefaultReturnMarking when zero.
	ReturnMarking compile.ReturnMarking
	// Log is the controller's logger; nil discards.
	Log hclog.Logger
}

// Controller runs the informers, the work queue and its worker.
type Controller struct {
	log             hclog.Logger
	linkRetention   time.Duration
	returnMarking   compile.ReturnMarking
	classStatusWait time.Duration
	reg             *agents.Registry
	writer          *status.Writer
	broadcaster     record.EventBroadcaster
	queue           workqueue.TypedRateLimitingInterface[string]
	// statuses holds the PortMaps whose status must be decided again; its workers write.
	statuses workqueue.TypedRateLimitingInterface[types.NamespacedName]

	core    informers.SharedInformerFactory
	dyn     dynamicinformer.DynamicSharedInformerFactory
	synced  []cache.InformerSynced
	classes cache.Indexer // *v1alpha1.PortMapClass
	pms     cache.Indexer // *v1alpha1.PortMap

	// cni watches the CNIs' settings compile reads (cni.go).
	cni *cniWatch

	services   corelisters.ServiceLister
	namespaces corelisters.NamespaceLister
	nodes      corelisters.NodeLister
	slices     discoverylisters.EndpointSliceLister

	// mu guards last and unheard: written by the compile worker, read by the status workers.
	mu sync.Mutex
	// inc compiles each snapshot from the one before, told what changed (compile worker only).
	inc compile.Incremental
	// changes are what the events changed since the last compile; snap is the snapshot kept
	// up to date from them, pmAt the index of each PortMap in snap.PortMaps, and fullAt when
	// snap was last listed whole (compile worker only, but changes).
	changes    changes
	snap       *compile.Snapshot
	pmAt       map[types.NamespacedName]int
	fullAt     time.Time
	sliceIndex cache.Indexer
	// last is the latest compile result.
	last *compile.Result
	// unheard are the nodes the startup hold waits for that last was compiled without.
	unheard []string
	// holding is true while the last compile found the startup hold on (compile worker only).
	holding bool
	// compiled is when the last compile started (compile worker only; compileWindow).
	compiled time.Time
	// classSettled remembers, by class, the cached object and compiled status last found
	// settled (compile worker only): see settledClasses.
	classSettled settledClasses
	// waits are the status writes put off for an acknowledgement (programmed.Verdict.MayWait).
	waits ackWaits
	// bursts are the PortMaps' arrivals and the status writes put off behind a burst of them.
	bursts bursts
	// classStatusDue is when the class statuses of last, put off behind its push, are written
	// even if agents have not acknowledged it; zero when none is put off (compile worker only).
	classStatusDue time.Time
	// stopping is set once Run's context ends.
	stopping atomic.Bool
	// pushes measures each program version's time from store to acknowledgement.
	pushes metrics.PushTracker
}

// New builds a Controller and its agents.Registry; nothing runs until Run.
func New(cfg Config) (*Controller, error) {
	log := cfg.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	start := cfg.Start
	if start.IsZero() {
		start = time.Now()
	}
	retention := cfg.LinkRetention
	if retention == 0 {
		retention = DefaultLinkRetention
	}
	scheme := runtime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(scheme), v1alpha1.AddToScheme(scheme)); err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	broadcaster := record.NewBroadcaster()
	c := &Controller{
		log:             log,
		linkRetention:   retention,
		returnMarking:   cfg.ReturnMarking,
		classStatusWait: cmp.Or(cfg.ClassStatusWait, DefaultClassStatusWait),
		broadcaster:     broadcaster,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "kuport"}),
		// Per PortMap backoff alone: the writes' own limiter bounds the rate, and the default
		// controller limiter's shared 10 a second would queue a thousand conflicts for 100 s.
		statuses: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](5*time.Millisecond, 10*time.Second),
			workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "kuport-status"}),
		core: informers.NewSharedInformerFactoryWithOptions(cfg.Kube, 0, informers.WithTransform(lean)),
		dyn:  dynamicinformer.NewDynamicSharedInformerFactory(cfg.Dynamic, 0),
	}
	recorder := broadcaster.NewRecorder(scheme, corev1.EventSource{Component: "kuport-controller"})
	c.writer = status.NewWriter(cfg.Dynamic, recorder,
		flowcontrol.NewTokenBucketRateLimiter(cmp.Or(cfg.StatusQPS, DefaultStatusQPS), cmp.Or(cfg.StatusBurst, DefaultStatusBurst)))
	c.reg = agents.NewRegistry(agents.Config{
		Epoch: cfg.Epoch, Start: start, Hold: cfg.Hold, Log: log.Named("agents"),
		OnAck: func(node string, version uint64) { c.pushes.Acked(node, version, time.Now()) },
		OnChange: func(ch agents.Change) {
			if ch == agents.Acked {
				c.queue.Add(keyStatus)
			} else {
				c.pushes.Observe(c.reg.Nodes(), time.Now())
				c.queue.Add(keyCompile)
			}
		},
		OnEpochBehind: cfg.OnEpochBehind,
		Unanswered:    cfg.Unanswered,
		OnUnanswered: func(ch agents.UnansweredChange) {
			c.recordAnswers(ch, cmp.Or(cfg.Unanswered, agents.DefaultUnansweredWindow))
		},
		OnAgent: func(node string, connected bool, agentVersion string) {
			c.recordAgentEvent(recorder, node, connected, agentVersion)
		},
	})
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cfg.Kube.CoreV1().Events("")})

	// Every event recompiles; each handler also records what it changed (compile.Changes).
	on := func(record func(any)) cache.ResourceEventHandlerFuncs {
		return cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { record(o); c.queue.Add(keyCompile) },
			UpdateFunc: func(old, o any) { record(old); record(o); c.queue.Add(keyCompile) },
			DeleteFunc: func(o any) { record(o); c.queue.Add(keyCompile) },
		}
	}
	other := func(any) { c.changes.other() }
	// The core objects are lean (lean): an update that changed none of what the cache keeps
	// (a Node's status, a Service's spec, an EndpointSlice's hints) changes nothing compile
	// reads. A Node's alone listed and compiled everything: its kubelet writes its status
	// every few minutes, 1,000 Nodes a few times a second.
	onLean := func(record func(any)) cache.ResourceEventHandlerFuncs {
		h := on(record)
		update := h.UpdateFunc
		h.UpdateFunc = func(old, o any) {
			if !sameButVersion(old, o) {
				update(old, o)
			}
		}
		return h
	}
	slicesInf := c.core.Discovery().V1().EndpointSlices().Informer()
	if err := slicesInf.AddIndexers(cache.Indexers{sliceByService: serviceOfSlice}); err != nil {
		return nil, fmt.Errorf("endpointslice indexer: %w", err)
	}
	c.sliceIndex = slicesInf.GetIndexer()
	for inf, h := range map[cache.SharedIndexInformer]cache.ResourceEventHandler{
		c.core.Core().V1().Services().Informer():   onLean(c.changes.service),
		c.core.Core().V1().Namespaces().Informer(): onLean(other),
		c.core.Core().V1().Nodes().Informer():      onLean(other),
		slicesInf:                                  onLean(c.changes.slice),
	} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return nil, fmt.Errorf("event handler: %w", err)
		}
		c.synced = append(c.synced, inf.HasSynced)
	}
	c.services = c.core.Core().V1().Services().Lister()
	c.namespaces = c.core.Core().V1().Namespaces().Lister()
	c.nodes = c.core.Core().V1().Nodes().Lister()
	c.slices = c.core.Discovery().V1().EndpointSlices().Lister()

	var err error
	// A change of the CNI's settings recompiles everything: it may change any node's rows.
	if c.cni, err = newCNIWatch(cfg.Kube, cfg.Dynamic, cmp.Or(cfg.CNIDiscoverEvery, DefaultCNIDiscoverEvery), log.Named("cni"), func() {
		c.changes.other()
		c.queue.Add(keyCompile)
	}); err != nil {
		return nil, fmt.Errorf("cni watch: %w", err)
	}
	if c.classes, err = c.typedInformer(v1alpha1.PortMapClassesResource, toTyped[v1alpha1.PortMapClass], on(c.changes.class)); err != nil {
		return nil, err
	}
	// A PortMap's own event also decides its status again: its recorded status or its
	// generation, which Decide reads, may be what changed. One created, deleted or whose spec
	// changed has arrived (bursts); the echo of a status write has not.
	pmHandler := cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { c.bursts.arrived(time.Now()); c.changes.portMap(o); c.portMapEvent(o) },
		UpdateFunc: func(old, o any) {
			if generationChanged(old, o) {
				c.bursts.arrived(time.Now())
			}
			c.changes.portMap(o)
			c.portMapEvent(o)
		},
		DeleteFunc: func(o any) { c.bursts.arrived(time.Now()); c.changes.portMap(o); c.queue.Add(keyCompile) },
	}
	if c.pms, err = c.typedInformer(v1alpha1.PortMapsResource, toTyped[v1alpha1.PortMap], pmHandler); err != nil {
		return nil, err
	}
	return c, nil
}

// generationChanged reports whether an update of a PortMap changed its generation (its spec).
func generationChanged(old, o any) bool {
	a, okA := old.(*v1alpha1.PortMap)
	b, okB := o.(*v1alpha1.PortMap)
	return !okA || !okB || a.Generation != b.Generation
}

// portMapEvent recompiles and decides the PortMap's status again.
func (c *Controller) portMapEvent(obj any) {
	c.queue.Add(keyCompile)
	if pm, ok := obj.(*v1alpha1.PortMap); ok {
		c.statuses.Add(types.NamespacedName{Namespace: pm.Namespace, Name: pm.Name})
	}
}

// Event reasons on a Node when its agent's stream comes and goes.
const (
	ReasonAgentConnected    = "AgentConnected"
	ReasonAgentDisconnected = "AgentDisconnected"
)

// recordAgentEvent records on the Node that its agent connected (Normal) or disconnected
// (Warning: the node keeps its kernel state but gets no new program). A node without a Node
// object in the cache gets no Event.
func (c *Controller) recordAgentEvent(recorder record.EventRecorder, node string, connected bool, agentVersion string) {
	n, err := c.nodes.Get(node)
	if err != nil || c.stopping.Load() {
		// Streams that end because this controller stops are no news about the agents.
		return
	}
	if connected {
		recorder.Eventf(n, corev1.EventTypeNormal, ReasonAgentConnected, "kuport agent %s connected", agentVersion)
		return
	}
	recorder.Event(n, corev1.EventTypeWarning, ReasonAgentDisconnected,
		"kuport agent disconnected; the node keeps its last program in the kernel but gets no new one")
}

// recordAnswers records on the PortMap that a node's DNAT entry of it turned unanswered, or
// answered again (status.Writer.RequestsEvent), and queues its status, whose unanswered rows
// say the same. A PortMap gone from the cache gets no Event.
func (c *Controller) recordAnswers(ch agents.UnansweredChange, w agents.Window) {
	obj, ok, err := c.pms.GetByKey(ch.Mapping)
	if err != nil || !ok || c.stopping.Load() {
		return
	}
	pm, ok := obj.(*v1alpha1.PortMap)
	if !ok {
		return
	}
	// Its status's unanswered rows change with the verdict.
	c.statuses.Add(types.NamespacedName{Namespace: pm.Namespace, Name: pm.Name})
	v := ch.Verdict
	if !v.Unanswered {
		v = ch.Was
	}
	c.writer.RequestsEvent(pm, status.Answers{Node: ch.Node, Interface: ch.Interface, Unanswered: ch.Verdict.Unanswered,
		Requests: v.Requests, Since: v.Since, Window: fmt.Sprintf("%d reports and %s", w.Reports, w.Duration)})
}

// typedInformer starts a dynamic informer whose cache holds typed objects (converted once, on
// arrival) and returns its indexer.
func (c *Controller) typedInformer(gvr schema.GroupVersionResource, transform cache.TransformFunc, h cache.ResourceEventHandler) (cache.Indexer, error) {
	inf := c.dyn.ForResource(gvr).Informer()
	if err := inf.SetTransform(transform); err != nil {
		return nil, fmt.Errorf("%s informer: %w", gvr.Resource, err)
	}
	if _, err := inf.AddEventHandler(h); err != nil {
		return nil, fmt.Errorf("%s event handler: %w", gvr.Resource, err)
	}
	c.synced = append(c.synced, inf.HasSynced)
	return inf.GetIndexer(), nil
}

// toTyped converts an unstructured kuport object into *T, without its managedFields
// (as lean); anything else passes unchanged (tombstones, already converted objects).
func toTyped[T any](obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	u.SetManagedFields(nil)
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		return nil, fmt.Errorf("convert %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return out, nil
}

// Registry returns the agent registry the gRPC server serves.
func (c *Controller) Registry() *agents.Registry { return c.reg }

// Run starts the informers, waits for their caches, then compiles on every event until ctx
// ends. It returns an error only if the caches never sync.
func (c *Controller) Run(ctx context.Context) error {
	defer c.broadcaster.Shutdown()
	defer c.stopping.Store(true)
	context.AfterFunc(ctx, func() { c.stopping.Store(true) })
	defer c.queue.ShutDown()
	defer c.statuses.ShutDown()
	c.core.Start(ctx.Done())
	c.dyn.Start(ctx.Done())
	defer c.core.Shutdown()
	defer c.dyn.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("informer caches did not sync: %w", context.Cause(ctx))
	}
	c.log.Info("caches synced", "epoch", c.reg.Epoch())
	// The CNIs' settings are optional: their informers wait a bounded time, never forever.
	c.cni.start(ctx)
	c.cni.waitSynced(ctx)
	c.queue.Add(keyCompile)
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
		c.statuses.ShutDown()
	}()
	var wg sync.WaitGroup
	for range statusWorkers {
		wg.Go(func() {
			for c.processStatus(ctx) {
			}
		})
	}
	for c.processNext(ctx) {
	}
	c.statuses.ShutDown()
	wg.Wait()
	return nil
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	var err error
	switch key {
	case keyCompile:
		now := time.Now()
		if wait := compileDelay(c.compiled, now, compileWindow); wait > 0 {
			// A burst: this compile takes what the window gathers.
			c.queue.AddAfter(keyCompile, wait)
			break
		}
		c.compiled = now
		err = c.compile(ctx)
	case keyStatus:
		c.decideAgain(c.reg.Touched())
		err = c.writePutOffClassStatuses(ctx, time.Now())
	case keyStatusAll:
		c.decideAll()
	case keyClassStatus:
		err = c.writePutOffClassStatuses(ctx, time.Now())
	case keyBurstHeld:
		keys, over := c.bursts.release(time.Now())
		if !over {
			c.queue.AddAfter(keyBurstHeld, compileWindow)
		}
		if len(keys) > 0 {
			c.log.Debug("writing the statuses put off behind a burst", "portmaps", len(keys), "burst_over", over)
		}
		for _, k := range keys {
			c.statuses.Add(k)
		}
	}
	if err != nil {
		// A conflict only means the cache had not yet seen our own last write: routine.
		log := c.log.Warn
		if isOnlyConflicts(err) {
			log = c.log.Debug
		}
		log("sync failed, retrying", "key", key, "error", err)
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// isOnlyConflicts reports whether err, possibly joined, holds nothing but API conflicts.
func isOnlyConflicts(err error) bool {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if !isOnlyConflicts(e) {
				return false
			}
		}
		return true
	}
	return apierrors.IsConflict(err)
}

// compile runs compile.Incremental on a fresh snapshot, records the class statuses (the link
// slot and table claims), hands the programs to the registry, ends the startup hold when it
// may, and queues the PortMaps whose status may have changed: those whose compiled result
// differs from the last compile's and those the registry touched (every one when the hold
// ends).
func (c *Controller) compile(ctx context.Context) error {
	snap, changed, err := c.nextSnapshot()
	if err != nil {
		return err
	}
	start := time.Now()
	res := c.inc.CompileChanges(snap, changed)
	metrics.ObserveCompile(time.Since(start))
	metrics.SetRefusals(res.PortMaps)
	// Claims are persisted before any kernel may use them, so a restart or a failed write
	// can never renumber a live link: no program leaves until its claims are recorded. When
	// the class statuses carry no claim the classes do not record already, the programs
	// leave first and the statuses follow their acknowledgement (DefaultClassStatusWait: a
	// class status of 1,000 node rows took the API server most of a second to write). While
	// the startup hold keeps programs back, nothing is written either:
	// compile has not heard every node, so its statuses would say "no agent has connected"
	// of nodes whose kernels still hold the previous leader's programs.
	unheard := programmed.Unheard(snap)
	term := c.reg.Term(unheard, snap.Now)
	wasHolding := c.holding
	c.holding = term.Holding()
	compiled := time.Now()
	writeFirst := !c.holding && !c.claimsRecorded(res)
	if writeFirst {
		if err := c.writeClassStatuses(ctx, res); err != nil {
			// The retry lists and compiles whole: this compile's changes are not lost.
			c.snap = nil
			return err
		}
	}
	stored := time.Now()
	nodes := c.reg.SetPrograms(res.Programs, res.Index)
	if len(nodes) > 0 {
		c.log.Debug("compiled", "whole", c.inc.Changed() == nil, "recompiled", c.inc.Recompiled(), "programs_changed", len(nodes),
			"claims_first", writeFirst, "compile_ms", compiled.Sub(start).Milliseconds(),
			"store_ms", time.Since(stored).Milliseconds(), "from_compile_ms", time.Since(compiled).Milliseconds())
	}
	if !c.holding && !writeFirst {
		// The push goes first: the acknowledgements (keyStatus) or the wait write the
		// statuses, the latest compile's then. A write already put off keeps its time, so a
		// stream of pushes cannot starve it.
		if len(nodes) > 0 && c.classStatusDue.IsZero() {
			c.classStatusDue = time.Now().Add(c.classStatusWait)
			c.queue.AddAfter(keyClassStatus, c.classStatusWait)
		}
		if c.classStatusDue.IsZero() {
			if err := c.writeClassStatuses(ctx, res); err != nil {
				c.snap = nil
				return err
			}
		}
	}
	c.pushes.Observe(c.reg.Nodes(), time.Now())
	if released, wait := c.reg.Release(unheard, snap.Now); !released {
		c.queue.AddAfter(keyCompile, wait)
	}
	// After an incremental compile only the PortMaps it names may have changed: the status
	// decisions cost O(the change) too.
	dirty := c.inc.Changed()
	c.mu.Lock()
	prev := c.last
	c.last, c.unheard = res, unheard
	c.mu.Unlock()
	c.queue.AddAfter(keyCompile, resyncPeriod)
	if snap.Now.Before(term.HoldUntil) {
		// Settling ends with the hold: what it kept must be decided again then.
		c.queue.AddAfter(keyStatusAll, term.HoldUntil.Sub(snap.Now))
	}
	if c.holding {
		return nil
	}
	if prev == nil || wasHolding {
		c.decideAll()
		return nil
	}
	if dirty == nil {
		dirty = slices.Collect(maps.Keys(res.PortMaps))
	}
	for _, k := range dirty {
		// Incremental shares the results it did not recompute: identity first.
		if r, old := res.PortMaps[k], prev.PortMaps[k]; r != nil && old != r && (old == nil || !equality.Semantic.DeepEqual(old, r)) {
			c.statuses.Add(k)
		}
	}
	c.decideAgain(c.reg.Touched())
	return nil
}

// decideAgain queues the PortMaps of the mappings named (MappingKeys) for their status.
func (c *Controller) decideAgain(mappings []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		return
	}
	for _, m := range mappings {
		if k, ok := c.last.Keys[m]; ok {
			c.statuses.Add(k)
		}
	}
}

// decideAll queues every PortMap of the last compile for its status.
func (c *Controller) decideAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		return
	}
	for k := range c.last.PortMaps {
		c.statuses.Add(k)
	}
}

// processStatus writes the status of one queued PortMap; a failed write (a conflict: the
// cache had not seen a write yet) is retried rate-limited.
func (c *Controller) processStatus(ctx context.Context) bool {
	key, quit := c.statuses.Get()
	if quit {
		return false
	}
	defer c.statuses.Done(key)
	if err := c.writeStatus(ctx, key); err != nil {
		log := c.log.Warn
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) || ctx.Err() != nil {
			log = c.log.Debug
		}
		log("status write failed, retrying", "portmap", key, "error", err)
		c.statuses.AddRateLimited(key)
		return true
	}
	c.statuses.Forget(key)
	return true
}

// writeStatus decides the PortMap's Programmed condition (programmed.Decide over the last
// compile's result and the registry's acks) and writes its status when it changed; a verdict
// that only awaits an acknowledgement waits for it as long as Verdict.MayWait says.
func (c *Controller) writeStatus(ctx context.Context, key types.NamespacedName) error {
	c.mu.Lock()
	last, unheard := c.last, c.unheard
	c.mu.Unlock()
	if last == nil {
		return nil // the first compile queues every PortMap
	}
	res := last.PortMaps[key]
	obj, ok, err := c.pms.GetByKey(key.String())
	if res == nil || err != nil || !ok {
		c.waits.forget(key)
		return nil
	}
	pm := obj.(*v1alpha1.PortMap)
	now := time.Now()
	if c.bursts.hold(key, now) {
		c.queue.AddAfter(keyBurstHeld, compileWindow) // which queues key again
		return nil
	}
	in := programmed.Input{
		Term:       c.reg.Term(unheard, now),
		Compiled:   meta.FindStatusCondition(res.Status.Conditions, v1alpha1.ConditionProgrammed),
		Recorded:   meta.FindStatusCondition(pm.Status.Conditions, v1alpha1.ConditionProgrammed),
		Generation: pm.Generation,
		Nodes:      c.reg.Acks(compile.MappingKey(pm), res.Nodes),
	}
	v := programmed.Decide(in)
	if wait := c.waits.delay(key, now, v.MayWait(in)); wait > 0 {
		// The acknowledgement queues key again, and its True is written at once.
		c.statuses.AddAfter(key, wait)
		return nil
	}
	written, err := c.writer.PortMap(ctx, pm, res, v, c.reg.UnansweredNodes(key.String()))
	if written && v.Programmed != nil {
		c.log.Debug("status written", "portmap", key, "programmed", v.Programmed.Status, "reason", v.Programmed.Reason)
	}
	return err
}

// claimsRecorded reports whether every class's compiled link claims are those its cached
// object records.
func (c *Controller) claimsRecorded(res *compile.Result) bool {
	for name, st := range res.Classes {
		obj, ok, err := c.classes.GetByKey(name)
		if err != nil || !ok {
			return false
		}
		cls := obj.(*v1alpha1.PortMapClass)
		if c.classSettled.known(name, cls, st, claimsEqual) {
			continue
		}
		if !equality.Semantic.DeepEqual(cls.Status.Links, st.Links) {
			return false
		}
		c.classSettled.set(name, cls, st, claimsEqual)
	}
	return true
}

// writePutOffClassStatuses writes the class statuses of the last compile that were put off
// behind its push, once no connected agent has the push unacknowledged or at classStatusDue.
func (c *Controller) writePutOffClassStatuses(ctx context.Context, now time.Time) error {
	if c.classStatusDue.IsZero() {
		return nil
	}
	if now.Before(c.classStatusDue) && c.reg.Unacknowledged() > 0 {
		// The queue keeps a key's earliest time only: an earlier put-off's may have been it.
		c.queue.AddAfter(keyClassStatus, c.classStatusDue.Sub(now))
		return nil
	}
	return c.writeClassStatuses(ctx, c.last)
}

// writeClassStatuses writes every PortMapClass status of res that differs from the cached
// object; errors (conflicts included) are joined so the key retries. Nothing stays put off
// after it succeeds.
func (c *Controller) writeClassStatuses(ctx context.Context, res *compile.Result) error {
	c.classSettled.keep(res.Classes)
	var errs []error
	for name, st := range res.Classes {
		obj, ok, err := c.classes.GetByKey(name)
		if err != nil || !ok {
			continue
		}
		cls := obj.(*v1alpha1.PortMapClass)
		if c.classSettled.known(name, cls, st, statusWritten) {
			continue
		}
		written, err := c.writer.Class(ctx, cls, st)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if written {
			c.log.Debug("class status written", "class", name, "put_off", !c.classStatusDue.IsZero())
		}
		c.classSettled.set(name, cls, st, statusWritten)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	c.classStatusDue = time.Time{}
	return nil
}

// PortMaps lists the cached PortMaps.
func (c *Controller) PortMaps() []*v1alpha1.PortMap { return cached[v1alpha1.PortMap](c.pms) }

// PortMapClasses lists the cached PortMapClasses.
func (c *Controller) PortMapClasses() []*v1alpha1.PortMapClass {
	return cached[v1alpha1.PortMapClass](c.classes)
}

// cached lists the *T objects of an indexer holding typed objects (see toTyped).
func cached[T any](idx cache.Indexer) []*T {
	var out []*T
	for _, o := range idx.List() {
		if t, ok := o.(*T); ok {
			out = append(out, t)
		}
	}
	return out
}
