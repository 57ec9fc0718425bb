// Command fanout opens many real agent streams against the real kuport-controller in the
// embedded lab and measures how fast a change that touches every node is acknowledged by all
// of them:
//
//	BENCH fanout agents=<N> ack_ms_p50=<x> ack_ms_p99=<x> controller_rss_mb=<x>
//
// Each agent is package agent's own Agent (the client of cmd/kuport-agent: TLS verifying
// the controller's generated CA, a ServiceAccount token bound to the node's agent Pod,
// reviewed by the controller with a TokenReview, Hello, programs and Acks, Reports), in this
// one process, for a Node object of its own, validating every program as the real agent does
// (datapath.Validate) and with a Datapath that applies nothing (it reports a zero counter
// per entry): the figure is the controller's and the wire's, not a kernel's. Every node
// accepts a class and serves one PortMap whose endpoint it holds; the change, a JSON merge
// patch of the class as kubectl sends it, adds a second interface to every node of the
// class, so every node's program changes.
// --mappings adds PortMaps of a second class accepting 3 nodes, their pods on every node
// (10,000 mappings with 1,000 agents). Run by bench/fanout.sh (root).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/agent"
	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/bench/labbench"
	kuportdp "kuport.wlz.li/kuport/datapath"
	"kuport.wlz.li/kuport/lab"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

const (
	namespace = "bench-fanout"
	class     = "fanout"
	// extraClass holds the PortMaps past --agents: it accepts extraNodes nodes.
	extraClass, extraNodes = "extra", 3
	extraPortBase          = 20000
	// Every node's interfaces: the class names eth0 at first, eth0 and eth1 after the change.
	first, second = "eth0", "eth1"
	podPort       = 8080
	portBase      = 10000
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench/fanout:", err)
		os.Exit(1)
	}
}

func nodeName(i int) string { return fmt.Sprintf("fan-%04d", i) }

// addr is node i's address number j (0: eth0, the Node's InternalIP; 1: eth1; 2: its pod).
func addr(i, j int) string { return fmt.Sprintf("10.%d.%d.%d", 200+j, i/250, 1+i%250) }

func run(args []string) error {
	fs := flag.NewFlagSet("fanout", flag.ContinueOnError)
	var f labbench.Flags
	f.Register(fs)
	n := fs.Int("agents", 1000, "agents (and nodes, and PortMaps of the class that changes)")
	total := fs.Int("mappings", 0, "PortMaps in all (0: one per agent); those past --agents are of class "+extraClass+", which accepts the first 3 nodes (returnPath Vxlan), their pods spread over every node")
	profile := fs.String("profile", "", "directory to write profiles to (the controller runs with --pprof, kube-apiserver with --profiling): the controller's cpu.pprof and kube-apiserver's apiserver-cpu.pprof over the change (--profile-seconds), the controller's heap.pprof, heap.txt (with runtime.MemStats) and goroutine.pprof after the last ack")
	profileSeconds := fs.Int("profile-seconds", 5, "length of cpu.pprof")
	settle := fs.Duration("settle", 30*time.Minute, "the longest wait for every agent to connect and every PortMap to be Programmed, and for the change's acks")
	quiet := fs.Duration("quiet", time.Minute, "then the longest wait for the controller, kube-apiserver and etcd to be done with the connections (under 0.1 s of CPU in a second): the change is measured alone")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 1 || *n > 50000 {
		return fmt.Errorf("--agents: 1 to 50000")
	}
	if *total == 0 {
		*total = *n
	}
	if *total < *n || *total-*n > 30000 {
		return fmt.Errorf("--mappings: --agents to --agents+30000")
	}
	if *profile != "" {
		f.ControllerArgs = []string{"--pprof"}
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "bench", Output: os.Stderr, Level: hclog.Info})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	log.Info("starting the lab")
	var apiserverArgs []string
	if *profile != "" {
		apiserverArgs = []string{"--profiling=true"}
	}
	l, err := labbench.Up(ctx, f, log, apiserverArgs...)
	if err != nil {
		return err
	}
	defer func() { _ = l.Close() }()
	// A controller that exits (one that lost its Lease on a loaded machine does) ends every
	// wait at once, not after --settle.
	ctx, exited := context.WithCancelCause(ctx)
	defer exited(nil)
	go func() {
		select {
		case <-l.ReplicaDone(0):
			exited(fmt.Errorf("the controller exited; see %s", l.ReplicaLog(0)))
		case <-ctx.Done():
		}
	}()

	log.Info("creating nodes, agent identities, services and the class", "n", *n)
	start := time.Now()
	if err := l.Cluster.EnsureNamespace(ctx, namespace, nil); err != nil {
		return err
	}
	err = labbench.Parallel(0, *n, func(i int) error {
		node := nodeName(i)
		if err := l.CreateNode(ctx, node, addr(i, 0)); err != nil {
			return err
		}
		if err := l.AddAgentIdentity(ctx, node); err != nil {
			return err
		}
		if err := l.MintAgentToken(ctx, node); err != nil {
			return err
		}
		pod := lab.Pod{Namespace: namespace, Name: node, Node: node, IP: addr(i, 2)}
		return l.Expose(ctx, namespace, node, "p", corev1.ProtocolTCP, podPort, lab.Backend{Pod: pod, Ready: true})
	})
	if err != nil {
		return err
	}
	nodes := map[string]v1alpha1.ClassNode{}
	for i := range *n {
		nodes[nodeName(i)] = v1alpha1.ClassNode{Interfaces: []string{first}}
	}
	err = l.ApplyClass(ctx, &v1alpha1.PortMapClass{
		ObjectMeta: metav1.ObjectMeta{Name: class},
		Spec:       v1alpha1.PortMapClassSpec{Nodes: nodes, ReturnPath: v1alpha1.ReturnPath{Mode: v1alpha1.ReturnPathNone}},
	})
	if err != nil {
		return err
	}
	err = labbench.Parallel(0, *n, func(i int) error {
		return l.ApplyPortMap(ctx, &v1alpha1.PortMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: nodeName(i)},
			Spec: v1alpha1.PortMapSpec{ClassName: class, Protocol: v1alpha1.ProtocolTCP, Port: int32(portBase + i),
				ServiceRef: v1alpha1.ServiceRef{Name: nodeName(i), Port: "p"}},
		})
	})
	if err != nil {
		return err
	}
	if err := createExtra(ctx, l, *n, *total); err != nil {
		return err
	}
	log.Info("objects created", "s", time.Since(start).Seconds())

	runCtx, stopAgents := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopAgents()
	dps := make([]*datapath, *n)
	for i := range *n {
		dps[i] = &datapath{index: i}
		a, err := agent.New(agent.Config{
			NodeName: nodeName(i), AgentVersion: "bench-fanout",
			Targets:    []string{"unix://" + filepath.Join(f.Dir, lab.ReplicaSocket(0))},
			CAFile:     filepath.Join(f.Dir, lab.ControllerCAFile),
			ServerName: lab.ControllerServerName,
			TokenFile:  l.AgentTokenFile(nodeName(i)),
			Datapath:   dps[i],
			// The real agent's receive path: each program validated whole before Apply. Its
			// Config.Applied, agent.FreeOSMemory, collects only after 16 MiB were allocated,
			// which a real agent's program of two entries never reaches; counted over the
			// one heap of 1,000 agents here it would force collections they never make.
			Validate:    kuportdp.Validate,
			EntryErrors: kuportdp.EntryErrors,
		})
		if err != nil {
			return err
		}
		wg.Go(func() { _ = a.Run(runCtx) })
	}
	err = labbench.WaitFor(ctx, "every PortMap Programmed", time.Second, *settle, func() (bool, error) {
		p, all, err := labbench.CountProgrammed(ctx, l.Dyn, namespace)
		log.Debug("programmed", "n", p, "of", all)
		return p == *total && all == *total, err
	})
	if err != nil {
		return err
	}
	log.Info("every agent connected and every PortMap Programmed", "s", time.Since(start).Seconds())

	pid := l.ReplicaPid(0)
	// The control plane's CPU over the change too (etcd and kube-apiserver): on the lab's
	// shared cores it is taken from the controller and the agents.
	planeCPU := func() (float64, error) { return labbench.CPUOf(l.Cluster.Pids()...) }
	// Every PortMap Programmed is not yet a steady state: the controller still writes the
	// agents' connection Events (1,000 of them, one at a time) and the API server serves
	// them. The change is measured once they are done.
	quietStart, last := time.Now(), -1.0
	err = labbench.WaitFor(ctx, "a quiet controller and control plane", time.Second, *quiet, func() (bool, error) {
		plane, err := planeCPU()
		if err != nil {
			return false, err
		}
		ctl, err := labbench.CPUSeconds(pid)
		if err != nil {
			return false, err
		}
		used := plane + ctl - last
		if last < 0 {
			used = math.Inf(1)
		}
		last = plane + ctl
		log.Debug("controller and control plane", "cpu_s_in_last_s", used)
		return used < 0.1, nil
	})
	if err != nil {
		log.Warn("measuring anyway", "error", err)
	}
	log.Info("quiet", "waited_s", time.Since(quietStart).Seconds())
	// usage is the CPU seconds so far of the controller, of the API server and etcd, and of
	// this process (its 1,000 agents).
	usage := func() (ctl, plane, self float64, err error) {
		if ctl, err = labbench.CPUSeconds(pid); err != nil {
			return
		}
		if plane, err = planeCPU(); err != nil {
			return
		}
		self, err = labbench.CPUSeconds(os.Getpid())
		return
	}
	ctl0, plane0, self0, err := usage()
	if err != nil {
		return err
	}
	writes0, err := labbench.StatusWrites(ctx, l)
	if err != nil {
		return err
	}
	// The change as an operator's kubectl sends it: a merge patch of the nodes' interfaces.
	both := map[string]v1alpha1.ClassNode{}
	for i := range *n {
		both[nodeName(i)] = v1alpha1.ClassNode{Interfaces: []string{first, second}}
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"nodes": both}})
	if err != nil {
		return err
	}
	profiled := func() {}
	if *profile != "" {
		profiled = labbench.ProfileFrom(ctx, log, l, *profile, *profileSeconds, "apiserver-cpu.pprof", "cpu.pprof")
	}
	change := time.Now()
	if err := l.PatchClass(ctx, class, patch); err != nil {
		return err
	}
	log.Info("class updated", "ms", time.Since(change).Milliseconds(), "patch_bytes", len(patch))
	var acks []time.Duration
	err = labbench.WaitFor(ctx, "every agent applying the change", 10*time.Millisecond, *settle, func() (bool, error) {
		acks = acks[:0]
		for _, dp := range dps {
			if t := dp.changedAt(); !t.IsZero() {
				acks = append(acks, t.Sub(change))
			}
		}
		return len(acks) == *n, nil
	})
	if err != nil {
		return fmt.Errorf("%w (%d of %d)", err, len(acks), *n)
	}
	ctl1, plane1, self1, err := usage()
	if err != nil {
		return err
	}
	rss, err := labbench.RSSMB(pid)
	if err != nil {
		return err
	}
	acked := time.Now()
	writes1, err := labbench.StatusWrites(ctx, l)
	if err != nil {
		return err
	}
	log.Info("change acknowledged by all", "controller_cpu_s", ctl1-ctl0, "apiserver_etcd_cpu_s", plane1-plane0,
		"bench_cpu_s", self1-self0, "portmap_status_writes", writes1.PortMaps-writes0.PortMaps,
		"class_status_writes", writes1.Classes-writes0.Classes)
	if *profile != "" {
		labbench.SaveProfile(log, *profile, "heap.pprof", labbench.ControllerProfile("heap?gc=1"))
		labbench.SaveProfile(log, *profile, "heap.txt", labbench.ControllerProfile("heap?debug=1")) // ends with runtime.MemStats: stacks, idle and released
		labbench.SaveProfile(log, *profile, "goroutine.pprof", labbench.ControllerProfile("goroutine"))
		profiled()
	}
	// The writes the change brought after its acks too.
	time.Sleep(time.Until(acked.Add(5 * time.Second)))
	writes2, err := labbench.StatusWrites(ctx, l)
	if err != nil {
		return err
	}
	log.Info("status writes 5 s after the last ack", "portmap_status_writes", writes2.PortMaps-writes0.PortMaps,
		"class_status_writes", writes2.Classes-writes0.Classes)
	fmt.Printf("BENCH fanout agents=%d ack_ms_p50=%.1f ack_ms_p99=%.1f controller_rss_mb=%.1f\n",
		*n, labbench.Percentile(acks, 50), labbench.Percentile(acks, 99), rss)
	return nil
}

// datapath is a node that applies nothing: it reports eth0 and eth1 with addresses, a zero
// counter for every entry of the program it was given (as a real agent reports one per entry,
// which the controller's registry and dashboard hold), and notes when it was first given a
// program that DNATs on eth1 (the change). The agent sends the Ack as soon as Apply returns.
type datapath struct {
	index    int
	mu       sync.Mutex
	changed  time.Time
	counters []*kuportv1.Counter
}

func (d *datapath) Apply(p *kuportv1.NodeProgram) error {
	var counters []*kuportv1.Counter
	changed := false
	for _, r := range p.GetDnatRules() {
		changed = changed || r.GetInInterface() == second
		counters = append(counters, &kuportv1.Counter{Id: r.GetId(), ForwardedIn: &kuportv1.Traffic{}, ForwardedOut: &kuportv1.Traffic{}})
	}
	for _, r := range p.GetSnatRules() {
		counters = append(counters, &kuportv1.Counter{Id: r.GetId()})
	}
	for _, r := range p.GetMarkRules() {
		counters = append(counters, &kuportv1.Counter{Id: r.GetId()})
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if changed && d.changed.IsZero() {
		d.changed = time.Now()
	}
	d.counters = counters
	return nil
}

func (d *datapath) changedAt() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.changed
}

func (d *datapath) Counters() ([]*kuportv1.Counter, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.counters, nil
}

func (d *datapath) LinkStats() ([]*kuportv1.LinkStats, error) { return nil, nil }

func (d *datapath) NodeState(string) (*kuportv1.NodeState, error) {
	return &kuportv1.NodeState{
		Interfaces: []*kuportv1.Interface{
			{Name: first, Addresses: []string{addr(d.index, 0)}, Mtu: 1500},
			{Name: second, Addresses: []string{addr(d.index, 1)}, Mtu: 1500},
		},
		UnderlayInterface: first,
		IpForward:         true,
	}, nil
}

// createExtra creates the PortMaps n to total-1, of class extraClass (accepting the first
// extraNodes nodes on eth0, returnPath Vxlan, servingMode Single), each with a Service of its
// own whose endpoint is node i%n's pod, so the accepting node holds a link to nearly every
// node and every node's program carries some of them.
func createExtra(ctx context.Context, l *lab.Lab, n, total int) error {
	if total == n {
		return nil
	}
	nodes := map[string]v1alpha1.ClassNode{}
	for i := range min(extraNodes, n) {
		nodes[nodeName(i)] = v1alpha1.ClassNode{Interfaces: []string{first}}
	}
	err := l.ApplyClass(ctx, &v1alpha1.PortMapClass{
		ObjectMeta: metav1.ObjectMeta{Name: extraClass},
		Spec: v1alpha1.PortMapClassSpec{Nodes: nodes, ReturnPath: v1alpha1.ReturnPath{Mode: v1alpha1.ReturnPathVxlan,
			Vxlan: v1alpha1.VxlanConfig{Subnet: "169.254.0.0/16"}}},
	})
	if err != nil {
		return err
	}
	return labbench.Parallel(n, total, func(i int) error {
		name, node := fmt.Sprintf("x-%05d", i-n), i%n
		pod := lab.Pod{Namespace: namespace, Name: nodeName(node), Node: nodeName(node), IP: addr(node, 2)}
		if err := l.Expose(ctx, namespace, name, "p", corev1.ProtocolTCP, podPort, lab.Backend{Pod: pod, Ready: true}); err != nil {
			return err
		}
		return l.ApplyPortMap(ctx, &v1alpha1.PortMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec: v1alpha1.PortMapSpec{ClassName: extraClass, Protocol: v1alpha1.ProtocolTCP, Port: int32(extraPortBase + i - n),
				ServiceRef: v1alpha1.ServiceRef{Name: name, Port: "p"}},
		})
	})
}
