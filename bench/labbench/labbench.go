// Package labbench is what the benchmarks share (bench/control, bench/fanout; bench/datapath,
// bench/link and bench/setlookup their namespaces, traffic and medians, netns.go and
// traffic.go): the embedded lab (package lab: a real API server, the real controller and agents in
// network namespaces) with API clients whose rate limit is raised for creating thousands of
// objects, concurrent creation, and the figures they print (percentiles, a process's
// resident memory and CPU time).
package labbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/procfs"
	"github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/lab"
)

// Client rate limits of the benchmarks' own API clients: creating 10,000 objects behind
// client-go's default 5 QPS would take half an hour.
const (
	clientQPS   = 2000
	clientBurst = 4000
	// Workers is how many objects are created at once.
	Workers = 32
)

// Flags are the lab's locations, shared by the benchmarks' command lines.
type Flags struct {
	K8sBin, Bin, Dir, Repo string
	Verbose                bool
	// ControllerArgs are added to the controller's flags (lab.Options.ControllerArgs); set by
	// a bench, not a flag.
	ControllerArgs []string
}

// Register adds the flags to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.K8sBin, "k8s-bin", "", "directory of etcd, kube-apiserver, kubectl and kube-proxy (lab/build-binaries.sh)")
	fs.StringVar(&f.Bin, "bin", "bin", "directory of kuport-controller, kuport-agent and kuport-lab (make build)")
	fs.StringVar(&f.Dir, "dir", "/var/tmp/kuport-bench", "the lab's state directory (etcd data, logs, sockets); emptied once the lab lock is held")
	fs.StringVar(&f.Repo, "repo", ".", "the repository root (deploy/crds, deploy/rbac.yaml)")
	fs.BoolVar(&f.Verbose, "v", false, "log the lab's progress to stderr")
}

// Up starts the lab (waiting for the machine-wide lab lock) with extra kube-apiserver flags
// and replaces its clients with ones whose rate limit is raised, so the lab's object helpers
// (ApplyPortMap, SetEndpoints, ...) run at the API server's pace. log receives progress.
func Up(ctx context.Context, f Flags, log hclog.Logger, apiserverArgs ...string) (*lab.Lab, error) {
	if f.K8sBin == "" {
		return nil, fmt.Errorf("--k8s-bin is required (the output of lab/build-binaries.sh)")
	}
	labLog := hclog.NewNullLogger()
	if f.Verbose {
		labLog = log.Named("lab")
	}
	l, err := lab.Up(ctx, lab.Options{
		Dir: f.Dir, K8sBin: f.K8sBin, Bin: f.Bin,
		CRDDir: filepath.Join(f.Repo, "deploy", "crds"), RBACFile: filepath.Join(f.Repo, "deploy", "rbac.yaml"),
		APIServerArgs: apiserverArgs, ControllerArgs: f.ControllerArgs, Log: labLog, Empty: true,
	})
	if err != nil {
		return nil, err
	}
	rc := l.Cluster.RESTConfig()
	rc.QPS, rc.Burst = clientQPS, clientBurst
	kube, err := kubernetes.NewForConfig(rc)
	if err == nil {
		l.Kube = kube
		l.Dyn, err = dynamic.NewForConfig(rc)
	}
	if err != nil {
		return nil, fmt.Errorf("bench clients: %w (and closing the lab: %v)", err, l.Close())
	}
	return l, nil
}

// InNS runs fn on a thread in network namespace name (/run/netns); the thread ends with it,
// so no other goroutine ever runs in the namespace. A socket fn opens stays in it.
func InNS(name string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		h, err := netns.GetFromName(name)
		if err == nil {
			defer func() { _ = h.Close() }()
			err = netns.Set(h)
		}
		if err == nil {
			err = fn()
		}
		done <- err
	}()
	return <-done
}

// Parallel calls fn(i) for every i in [from, to) on Workers goroutines and returns the first
// error; the others still run to the end.
func Parallel(from, to int, fn func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan int)
	)
	for range Workers {
		wg.Go(func() {
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := from; i < to; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// Percentile is the p-th percentile (0 < p <= 100, nearest rank) of ds in milliseconds;
// NaN for none.
func Percentile(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return math.NaN()
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return Ms(s[min(max(rank, 1), len(s))-1])
}

// Ms is d in milliseconds.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// RSSMB is the resident memory of process pid in MB as every bench figure counts it: MiB
// (2^20 bytes), VmRSS from /proc/<pid>/status.
func RSSMB(pid int) (float64, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, fmt.Errorf("rss of %d: %w", pid, err)
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, fmt.Errorf("rss of %d: %w", pid, err)
	}
	return float64(st.VmRSS) / (1 << 20), nil
}

// CPUSeconds is the user and system CPU time process pid has used (/proc/<pid>/stat).
func CPUSeconds(pid int) (float64, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, fmt.Errorf("cpu of %d: %w", pid, err)
	}
	st, err := p.Stat()
	if err != nil {
		return 0, fmt.Errorf("cpu of %d: %w", pid, err)
	}
	return st.CPUTime(), nil
}

// CPUOf is the user and system CPU time the processes pids have used, summed.
func CPUOf(pids ...int) (float64, error) {
	var sum float64
	for _, p := range pids {
		s, err := CPUSeconds(p)
		if err != nil {
			return 0, err
		}
		sum += s
	}
	return sum, nil
}

// Programmed reports whether a PortMap (as the dynamic client returns it) has condition
// Programmed=True for its current generation.
func Programmed(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok || m["type"] != v1alpha1.ConditionProgrammed {
			continue
		}
		gen, _ := m["observedGeneration"].(int64)
		return m["status"] == "True" && (gen == 0 || gen == u.GetGeneration())
	}
	return false
}

// CountProgrammed lists the PortMaps of namespace (in pages) and counts those Programmed.
func CountProgrammed(ctx context.Context, dyn dynamic.Interface, namespace string) (programmed, total int, err error) {
	list, err := dyn.Resource(v1alpha1.PortMapsResource).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, fmt.Errorf("list portmaps: %w", err)
	}
	for i := range list.Items {
		if Programmed(&list.Items[i]) {
			programmed++
		}
	}
	return programmed, len(list.Items), nil
}

// ProgrammedWatch keeps, from an informer on one namespace's PortMaps, which exist and which
// are Programmed: at 10,000 PortMaps a list a second would cost the API server and the bench
// more CPU than the controller whose settling they wait for.
type ProgrammedWatch struct {
	mu         sync.Mutex
	programmed map[string]bool
}

// WatchProgrammed starts a ProgrammedWatch on namespace's PortMaps until ctx ends and
// returns once its cache has synced.
func WatchProgrammed(ctx context.Context, dyn dynamic.Interface, namespace string) (*ProgrammedWatch, error) {
	w := &ProgrammedWatch{programmed: map[string]bool{}}
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, namespace, nil)
	inf := f.ForResource(v1alpha1.PortMapsResource).Informer()
	set := func(o any) {
		if u, ok := o.(*unstructured.Unstructured); ok {
			w.mu.Lock()
			w.programmed[u.GetName()] = Programmed(u)
			w.mu.Unlock()
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, o any) { set(o) },
		DeleteFunc: func(o any) {
			if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o); err == nil {
				_, name, _ := cache.SplitMetaNamespaceKey(key)
				w.mu.Lock()
				delete(w.programmed, name)
				w.mu.Unlock()
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("portmap informer: %w", err)
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("portmap informer: %w", context.Cause(ctx))
	}
	return w, nil
}

// Count is how many PortMaps exist and how many of them are Programmed, as last seen.
func (w *ProgrammedWatch) Count() (programmed, total int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.programmed {
		if p {
			programmed++
		}
	}
	return programmed, len(w.programmed)
}

// WaitFor polls cond every interval until it is true, errors, or timeout passes (an error
// naming what).
func WaitFor(ctx context.Context, what string, interval, timeout time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			if cause := context.Cause(ctx); !errors.Is(cause, context.DeadlineExceeded) {
				return fmt.Errorf("%s: %w", what, cause)
			}
			return fmt.Errorf("%s: not within %s", what, timeout)
		case <-t.C:
		}
	}
}
