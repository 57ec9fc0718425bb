// Package controller wires kuport's controller runtime (docs/design/software.md#shape):
// informers on PortMapClass, PortMap, Service, EndpointSlice, Node and Namespace (and the
// CNIs' settings, cni.go) feed one work queue; its worker keeps a compile.Snapshot of the
// caches and the agent registry up to date from the events, compiles it (compile.Incremental:
// what the events changed, equal to the pure compile.Compile), hands the programs to the
// agents.Registry (which versions them and pushes them, or their deltas, to connected agents),
// and status workers write the statuses whose programmed.Decide verdict changed through the
// status package, rate-limited. When the workers compile, write and look again is
// timing.Decide's.
//
// It owns the work queue and the informers; it makes no datapath decision (compile does) and
// touches no kernel state.
package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
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
	"kuport.wlz.li/kuport/controller/apiclient"
	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/metrics"
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
	// keyBurstPutOff: queue the PortMap statuses put off behind a burst once it is over or they
	// waited burstMaxPutOff (bursts.release).
	keyBurstPutOff = "burst-put-off"
)

// DefaultLinkRetention is how long an unused link slot claim is kept
// (docs/design/api.md#links-and-slots: 24 h).
const DefaultLinkRetention = 24 * time.Hour

// Config configures a Controller.
type Config struct {
	// Kube reads core objects and writes Events.
	Kube kubernetes.Interface
	// Kuport reads PortMapClasses and PortMaps and writes their status.
	Kuport *apiclient.Client
	// Dynamic reads the CNIs' settings (cni.go).
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

	core informers.SharedInformerFactory
	// typed are the informers of kuport's objects (typedInformer).
	typed   []cache.SharedIndexInformer
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
	// compiled is when the last compile started (compile worker only; timing.CompileWindow).
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
	}
	recorder := broadcaster.NewRecorder(scheme, corev1.EventSource{Component: "kuport-controller"})
	c.writer = status.NewWriter(cfg.Kuport, recorder,
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
	if c.classes, err = c.typedInformer(cfg.Kuport.PortMapClasses(), &v1alpha1.PortMapClass{}, on(c.changes.class)); err != nil {
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
	if c.pms, err = c.typedInformer(cfg.Kuport.PortMaps(), &v1alpha1.PortMap{}, pmHandler); err != nil {
		return nil, err
	}
	return c, nil
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
	defer c.core.Shutdown()
	var typed sync.WaitGroup
	defer typed.Wait()
	typedCtx, stopTyped := context.WithCancel(ctx)
	defer stopTyped()
	for _, inf := range c.typed {
		typed.Go(func() { inf.RunWithContext(typedCtx) })
	}
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
