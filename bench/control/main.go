// Command control measures kuport's control plane against kube-proxy's in one run (the
// figures are in BENCHMARKS.md): in the embedded lab (a real API server, the real
// kuport-controller and kuport-agent binaries), kube-proxy v1.36.3 runs in nftables mode on
// the same node as kuport's agent, with N NodePort Services of one endpoint each against
// kuport's N PortMaps. For each size it prints
//
//	BENCH control system=<kuport|kube-proxy> n=<N> change_to_kernel_ms_p50=<x> change_to_kernel_ms_p99=<x> full_sync_ms=<x> rss_mb=<x>
//
// and, for PortMaps applied at once into an empty lab (--bulk-runs times),
//
//	BENCH bulk n=<n> to_kernel_s=<x> to_programmed_s=<x> delete_to_kernel_s=<x>
//	BENCH bulk n=<n> floor_create_s=<x> floor_delete_s=<x> kuport_over_floor_programmed_s=<x> kuport_over_floor_delete_s=<x>
//
// the second with the same run's floor: what the API server alone needs for the same objects.
// Then, for one PortMap of a UDP range of --range-ports ports that keeps them, ending at 65535
// (coturn's 49152-65535 at the default 16,384), to a pod on another node than edge-a,
//
//	BENCH range ports=<n> first_apply_ms=na elements=<x> agent_rss_mb=<x> to_programmed_ms=<x>
//
// bench/datapath prints the same line for one agent without a lab, filling first_apply_ms,
// elements and agent_rss_mb; this bench fills elements, agent_rss_mb and to_programmed_ms.
// "In the kernel" is what this process reads from the node's nftables over netlink. See
// BENCHMARKS.md for what each figure measures. Run by bench/control.sh (root).
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/bench/labbench"
	"kuport.wlz.li/kuport/controller/apiclient"
	"kuport.wlz.li/kuport/lab"
)

const (
	node  = "edge-a" // the accepting node; kube-proxy runs here too
	iface = "enp1s0" // the class's interface on it
	class = "bench"

	kuportNS = "bench-kuport"
	kpNS     = "bench-kube-proxy"

	kuportTable  = "kuport"
	kuportFamily = nftables.TableFamilyINet
	dnatSet      = "dnat-ports"

	// Dialed ports: the sizes' PortMaps from sizeBase, the bulk's from bulkBase, kube-proxy's
	// NodePorts in nodePortRange, all disjoint.
	sizeBase      = 35000
	bulkBase      = 55000
	nodePortRange = "20000-34999"

	podIP   = "10.244.17.10" // the endpoint of every Service, on edge-a's pod CIDR
	podPort = 8080

	// The range's class, Service and PortMap (all named rangeName), and its pod on rangeNode.
	rangeName  = "range"
	rangeNode  = "worker-b"
	rangePodIP = "10.244.18.10" // on worker-b's pod CIDR
	// rangeHold is how long the agents hold the range before their memory is read: as
	// bench/datapath reads its agent's, 5 s past the Ack, reports (every 2 s in the lab) past.
	rangeHold = 5 * time.Second

	probeEvery = time.Millisecond
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench/control:", err)
		os.Exit(1)
	}
}

type bench struct {
	l *lab.Lab
	k *kernel
	// programmed watches kuportNS's PortMaps.
	programmed *labbench.ProgrammedWatch
	kp         *kubeProxy
	log        hclog.Logger
	flags      labbench.Flags
	settle     time.Duration
	// portMaps and services are how many of each exist (names pm-<i>, svc-<i>).
	portMaps, services int
	changes            int
	// profile is where the bulk's profiles go ("" none), each over profileSeconds.
	profile        string
	profileSeconds int
	// moved counts endpoint moves, so each gets a fresh address.
	moved int
}

func run(args []string) error {
	fs := flag.NewFlagSet("control", flag.ContinueOnError)
	var f labbench.Flags
	f.Register(fs)
	sizes := fs.String("n", "1000,10000", "comma-separated sizes N: mappings and NodePort Services, grown in this order")
	changes := fs.Int("changes", 10, "changes measured per system and size (p50 and p99 over them)")
	bulk := fs.Int("bulk", 1000, "PortMaps applied at once for the bulk line; 0 skips it")
	bulkRuns := fs.Int("bulk-runs", 1, "how many times the bulk and its floor run, one after the other")
	settle := fs.Duration("settle", 45*time.Minute, "the longest wait for all PortMaps to be Programmed, or for a change or sync to reach the kernel")
	profile := fs.String("profile", "", "directory to write the bulk's CPU profiles to (the controller runs with --pprof, kube-apiserver with --profiling): kube-apiserver's and the controller's from the first create and from the first delete, kube-apiserver's from the floor's (--profile-seconds each)")
	profileSeconds := fs.Int("profile-seconds", 3, "length of each profile")
	rangePorts := fs.Int("range-ports", 16384, "ports of the one UDP range PortMap measured after the bulk, ending at 65535; 0 skips it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var ns []int
	for s := range strings.SplitSeq(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || (len(ns) > 0 && n < ns[len(ns)-1]) {
			return fmt.Errorf("-n: want increasing sizes, got %q", *sizes)
		}
		ns = append(ns, n)
	}
	if ns[len(ns)-1]+*changes*len(ns) > bulkBase-sizeBase || *bulk > 65535-bulkBase || *changes < 1 || *rangePorts < 0 || *rangePorts > 65535 {
		return fmt.Errorf("sizes, changes, bulk or range ports out of range")
	}
	apiserverArgs := []string{"--service-node-port-range=" + nodePortRange}
	if *profile != "" {
		f.ControllerArgs = []string{"--pprof"}
		apiserverArgs = append(apiserverArgs, "--profiling=true")
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "bench", Output: os.Stderr, Level: hclog.Info})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	log.Info("starting the lab")
	l, err := labbench.Up(ctx, f, log, apiserverArgs...)
	if err != nil {
		return err
	}
	defer func() { _ = l.Close() }()
	b := &bench{l: l, log: log, flags: f, settle: *settle, changes: *changes, profile: *profile, profileSeconds: *profileSeconds}
	if b.k, err = openKernel(node); err != nil {
		return err
	}
	defer func() { _ = b.k.close() }()
	if b.kp, err = newKubeProxy(l, node, f.Dir); err != nil {
		return err
	}
	defer func() { _ = b.kp.close() }()
	if err := b.setup(ctx); err != nil {
		return err
	}
	if b.programmed, err = labbench.WatchProgrammed(ctx, l.Dyn, kuportNS); err != nil {
		return err
	}
	for range *bulkRuns {
		if *bulk == 0 {
			break
		}
		if err := b.bulk(ctx, *bulk); err != nil {
			return err
		}
	}
	if *rangePorts > 0 {
		if err := b.portRange(ctx, *rangePorts); err != nil {
			return fmt.Errorf("range-ports=%d: %w", *rangePorts, err)
		}
	}
	for _, n := range ns {
		if err := b.size(ctx, n); err != nil {
			return fmt.Errorf("n=%d: %w", n, err)
		}
	}
	return nil
}

// setup writes the class (edge-a accepting on enp1s0, no return path: every endpoint is on
// edge-a) and the one Service every PortMap maps to.
func (b *bench) setup(ctx context.Context) error {
	// The lab's API server can reset the first connections while it settles after start
	// (make test saw one reset of the first request): retry those only.
	settling := wait.Backoff{Steps: 8, Duration: 100 * time.Millisecond, Factor: 2}
	for _, ns := range []string{kuportNS, kpNS} {
		if err := retry.OnError(settling, utilnet.IsConnectionReset, func() error {
			return b.l.Cluster.EnsureNamespace(ctx, ns, nil)
		}); err != nil {
			return err
		}
	}
	err := b.l.ApplyClass(ctx, &v1alpha1.PortMapClass{
		ObjectMeta: metav1.ObjectMeta{Name: class},
		Spec: v1alpha1.PortMapClassSpec{
			Nodes:      map[string]v1alpha1.ClassNode{node: {Interfaces: []string{iface}}},
			ReturnPath: v1alpha1.ReturnPath{Mode: v1alpha1.ReturnPathNone},
		},
	})
	if err != nil {
		return err
	}
	return b.l.Expose(ctx, kuportNS, "pod", "p", corev1.ProtocolTCP, podPort, backend(kuportNS, node, podIP))
}

func backend(ns, podNode, ip string) lab.Backend {
	return lab.Backend{Pod: lab.Pod{Namespace: ns, Name: "pod", Node: podNode, IP: ip}, Ready: true}
}

func (b *bench) portMap(name string, port int) error {
	return b.l.ApplyPortMap(context.Background(), &v1alpha1.PortMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: kuportNS, Name: name},
		Spec: v1alpha1.PortMapSpec{
			ClassName: class, Protocol: v1alpha1.ProtocolTCP, Port: int32(port),
			ServiceRef: v1alpha1.ServiceRef{Name: "pod", Port: "p"},
		},
	})
}

// nodePortService creates svc-<i>, a NodePort Service with one endpoint on edge-a.
func (b *bench) nodePortService(ctx context.Context, i int) error {
	name := fmt.Sprintf("svc-%05d", i)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: kpNS, Name: name},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeNodePort,
			Ports: []corev1.ServicePort{{Name: "p", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(podPort)}},
		},
	}
	if _, err := b.l.Kube.CoreV1().Services(kpNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("service %s: %w", name, err)
	}
	return b.l.SetEndpoints(ctx, kpNS, name, "p", corev1.ProtocolTCP, podPort, backend(kpNS, node, podIP))
}

// kuportCount is how many DNAT elements edge-a's kernel holds.
func (b *bench) kuportCount() (int, error) {
	return b.k.countElements(kuportFamily, kuportTable, dnatSet)
}

func (b *bench) waitCount(ctx context.Context, what string, count func() (int, error), want int, every time.Duration) error {
	last := -1
	err := labbench.WaitFor(ctx, what, every, b.settle, func() (bool, error) {
		n, err := count()
		last = n
		return n == want, err
	})
	if err != nil {
		return fmt.Errorf("%w (have %d of %d)", err, last, want)
	}
	return nil
}

// waitProgrammed waits until all want PortMaps of kuportNS are Programmed=True (as the
// bench's watch on them saw it, checked every 5 ms).
func (b *bench) waitProgrammed(ctx context.Context, want int) error {
	last := -1
	err := labbench.WaitFor(ctx, "PortMaps Programmed", 5*time.Millisecond, b.settle, func() (bool, error) {
		p, total := b.programmed.Count()
		last = p
		return p == want && total == want, nil
	})
	if err != nil {
		return fmt.Errorf("%w (%d of %d)", err, last, want)
	}
	return nil
}

// bulk applies n PortMaps at once into the empty lab, then deletes them at once. "At once" is
// as a GitOps tool applies a directory of them: every create issued from the start,
// labbench.Workers in flight at a time, so the API server's own pace is in the figures. Each
// figure counts from the first request; stderr gives the other reading too, from the last
// request's return (what the controller and the agent add after the API server has them all).
func (b *bench) bulk(ctx context.Context, n int) error {
	b.log.Info("bulk: applying PortMaps at once", "n", n)
	cpu0, err := b.cpu()
	if err != nil {
		return err
	}
	writes0, err := labbench.StatusWrites(ctx, b.l)
	if err != nil {
		return err
	}
	profiled := b.profileFrom(ctx, "create", true)
	start := time.Now()
	if err := b.createAtOnce("bulk", n); err != nil {
		return err
	}
	created := time.Now()
	cpuCreated, err := b.cpu()
	if err != nil {
		return err
	}
	if err := b.waitCount(ctx, "bulk in the kernel", b.kuportCount, n, 5*time.Millisecond); err != nil {
		return err
	}
	inKernel := time.Now()
	// Read once the kernel has them all, not at the last create: a read of /metrics there
	// would hold back the kernel's polls.
	writesInKernel, err := labbench.StatusWrites(ctx, b.l)
	if err != nil {
		return err
	}
	if err := b.waitProgrammed(ctx, n); err != nil {
		return err
	}
	programmed := time.Now()
	cpu1, err := b.cpu()
	if err != nil {
		return err
	}
	writes1, err := labbench.StatusWrites(ctx, b.l)
	if err != nil {
		return err
	}
	b.log.Info("bulk: created", "created_s", created.Sub(start).Seconds(),
		"portmap_status_writes", writes1.PortMaps-writes0.PortMaps, "class_status_writes", writes1.Classes-writes0.Classes,
		"portmap_status_writes_before_in_kernel", writesInKernel.PortMaps-writes0.PortMaps,
		"to_kernel_after_last_create_s", inKernel.Sub(created).Seconds(),
		"to_programmed_after_last_create_s", programmed.Sub(created).Seconds(),
		"cpu_s_api_server_etcd_creating", round2(cpuCreated.plane-cpu0.plane), "cpu_s_controller_creating", round2(cpuCreated.controller-cpu0.controller),
		"cpu_s_controller", round2(cpu1.controller-cpu0.controller), "cpu_s_api_server_etcd", round2(cpu1.plane-cpu0.plane),
		"cpu_s_agents", round2(cpu1.agents-cpu0.agents), "cpu_s_bench", round2(cpu1.bench-cpu0.bench))
	profiled()
	// The status the controller wrote, for the floor's PortMaps to carry.
	written, err := b.l.GetPortMap(ctx, kuportNS, "bulk-00000")
	if err != nil {
		return err
	}
	profiled = b.profileFrom(ctx, "delete", true)
	dstart := time.Now()
	if err := b.deleteAtOnce("bulk", n); err != nil {
		return err
	}
	deleted := time.Now()
	cpuDeleted, err := b.cpu()
	if err != nil {
		return err
	}
	if err := b.waitCount(ctx, "bulk gone from the kernel", b.kuportCount, 0, 5*time.Millisecond); err != nil {
		return err
	}
	gone := time.Now()
	profiled()
	b.log.Info("bulk: deleted", "deleted_s", deleted.Sub(dstart).Seconds(),
		"delete_to_kernel_after_last_delete_s", gone.Sub(deleted).Seconds(),
		"cpu_s_api_server_etcd_deleting", round2(cpuDeleted.plane-cpu1.plane), "cpu_s_controller_deleting", round2(cpuDeleted.controller-cpu1.controller),
		"cpu_s_agents_deleting", round2(cpuDeleted.agents-cpu1.agents), "cpu_s_bench_deleting", round2(cpuDeleted.bench-cpu1.bench))
	floorCreate, floorDelete, err := b.bulkFloor(ctx, n, written.Status)
	if err != nil {
		return err
	}
	toProgrammed, toGone := programmed.Sub(start).Seconds(), gone.Sub(dstart).Seconds()
	fmt.Printf("BENCH bulk n=%d to_kernel_s=%.2f to_programmed_s=%.2f delete_to_kernel_s=%.2f\n",
		n, inKernel.Sub(start).Seconds(), toProgrammed, toGone)
	fmt.Printf("BENCH bulk n=%d floor_create_s=%.2f floor_delete_s=%.2f kuport_over_floor_programmed_s=%.2f kuport_over_floor_delete_s=%.2f\n",
		n, floorCreate, floorDelete, toProgrammed-floorCreate, toGone-floorDelete)
	return nil
}

// createAtOnce creates PortMaps <prefix>-00000 to n-1 on the bulk's ports, labbench.Workers
// at a time; deleteAtOnce deletes them so.
func (b *bench) createAtOnce(prefix string, n int) error {
	return labbench.Parallel(0, n, func(i int) error { return b.portMap(fmt.Sprintf("%s-%05d", prefix, i), bulkBase+i) })
}

func (b *bench) deleteAtOnce(prefix string, n int) error {
	return labbench.Parallel(0, n, func(i int) error {
		return b.l.DeletePortMap(context.Background(), kuportNS, fmt.Sprintf("%s-%05d", prefix, i))
	})
}

// bulkFloor is the API server's own pace for the bulk: the same n PortMaps created, issued
// the same way, then each given the status the controller wrote in the bulk (status, written
// as kuport-controller, so the stored objects are as large as the bulk's, managedFields
// included, through the controller's client), then deleted, with kuport's controller and agents stopped (no watch of them, none
// of their CPU beside the API server's). It logs how long each step took and returns the
// creates and status writes together (against the bulk's to_programmed_s) and the deletes
// (against its delete_to_kernel_s). It starts kuport again and returns once a PortMap is
// programmed and removed through it.
func (b *bench) bulkFloor(ctx context.Context, n int, status v1alpha1.PortMapStatus) (create, del float64, err error) {
	const prefix = "floor"
	if err := b.stopKuport(); err != nil {
		return 0, 0, err
	}
	created, cpuCreating, err := b.floorTimed(ctx, "floor-create", func() error { return b.createAtOnce(prefix, n) })
	if err != nil {
		return 0, 0, err
	}
	// The controller's own client, under its name (the managedFields entry's manager), and
	// one list for every one's resourceVersion.
	rc := b.l.Cluster.RESTConfig()
	rc.QPS, rc.Burst, rc.UserAgent = 2000, 4000, "kuport-controller"
	client, err := apiclient.NewForConfig(rc)
	if err != nil {
		return 0, 0, err
	}
	list, err := client.PortMaps().ListWithContext(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, err
	}
	var stored []*v1alpha1.PortMap
	for i, pm := range list.(*v1alpha1.PortMapList).Items {
		if strings.HasPrefix(pm.Name, prefix+"-") {
			stored = append(stored, &list.(*v1alpha1.PortMapList).Items[i])
		}
	}
	if len(stored) != n {
		return 0, 0, fmt.Errorf("floor: listed %d of the %d PortMaps to carry a status", len(stored), n)
	}
	written, cpuWriting, err := b.floorTimed(ctx, "floor-status-write", func() error {
		return labbench.Parallel(0, n, func(i int) error {
			stored[i].Status = status
			return client.UpdatePortMapStatus(ctx, stored[i])
		})
	})
	if err != nil {
		return 0, 0, fmt.Errorf("floor status writes: %w", err)
	}
	deleted, cpuDeleting, err := b.floorTimed(ctx, "floor-delete", func() error { return b.deleteAtOnce(prefix, n) })
	if err != nil {
		return 0, 0, err
	}
	b.log.Info("bulk floor: the same PortMaps created, given the controller's status and deleted, kuport stopped",
		"created_s", created, "status_written_s", written, "deleted_s", deleted,
		"cpu_s_api_server_etcd_creating", cpuCreating, "cpu_s_api_server_etcd_writing", cpuWriting,
		"cpu_s_api_server_etcd_deleting", cpuDeleting)
	return created + written, deleted, b.startKuport(ctx)
}

// stopKuport stops the controller and every node's agent (SIGTERM: the kernels keep their
// tables); startKuport starts them again and returns once a PortMap created then reaches
// edge-a's kernel and Programmed, and its delete the kernel, so what follows does not wait
// out the agents' reconnection or the controller's startup hold.
func (b *bench) stopKuport() error {
	if err := b.l.StopController(false); err != nil {
		return err
	}
	for _, n := range b.l.Net.Nodes() {
		if err := b.l.StopAgent(n.Name, false); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) startKuport(ctx context.Context) error {
	if err := b.l.StartController(); err != nil {
		return err
	}
	for _, n := range b.l.Net.Nodes() {
		if err := b.l.StartAgent(n.Name); err != nil {
			return err
		}
	}
	const name = "bulk-ready"
	if err := b.portMap(name, bulkBase); err != nil {
		return err
	}
	if err := b.waitCount(ctx, "kuport up again", b.kuportCount, b.portMaps+1, 10*time.Millisecond); err != nil {
		return err
	}
	if err := b.waitProgrammed(ctx, b.portMaps+1); err != nil {
		return err
	}
	if err := b.l.DeletePortMap(ctx, kuportNS, name); err != nil {
		return err
	}
	return b.waitCount(ctx, "kuport up again", b.kuportCount, b.portMaps, 10*time.Millisecond)
}

// floorTimed runs fn under kube-apiserver's profile what (profileFrom) and returns how long
// it took and the CPU seconds the API server and etcd spent meanwhile.
func (b *bench) floorTimed(ctx context.Context, what string, fn func() error) (seconds, cpu float64, err error) {
	cpu0, err := labbench.CPUOf(b.l.Cluster.Pids()...)
	if err != nil {
		return 0, 0, err
	}
	profiled := b.profileFrom(ctx, what, false)
	start := time.Now()
	err = fn()
	seconds = time.Since(start).Seconds()
	defer profiled()
	if err != nil {
		return 0, 0, err
	}
	cpu1, err := labbench.CPUOf(b.l.Cluster.Pids()...)
	return seconds, round2(cpu1 - cpu0), err
}

// profileFrom starts, when --profile is set, kube-apiserver's CPU profile (and the
// controller's, with controller) over the next profileSeconds, written to
// <what>-apiserver-cpu.pprof and <what>-controller-cpu.pprof (labbench.ProfileFrom); the
// function it returns waits for them.
func (b *bench) profileFrom(ctx context.Context, what string, controller bool) (wait func()) {
	if b.profile == "" {
		return func() {}
	}
	controllerFile := ""
	if controller {
		controllerFile = what + "-controller-cpu.pprof"
	}
	return labbench.ProfileFrom(ctx, b.log, b.l, b.profile, b.profileSeconds, what+"-apiserver-cpu.pprof", controllerFile)
}

// portRange measures one PortMap of a UDP range of ports ports that keeps them, ending at
// 65535, to a pod on rangeNode: edge-a DNATs it into the link to rangeNode, whose elements
// take it to the pod (docs/design/datapath.md#port-ranges). It prints the range line: create
// to Programmed=True as a watch on it saw it, the elements edge-a's table inet kuport gained,
// and edge-a's agent's memory after rangeHold. Stderr gets the elements per set of both
// nodes, every agent's memory before and holding it, and the delete until edge-a's table is
// back to what it held before.
func (b *bench) portRange(ctx context.Context, ports int) error {
	first := int32(65536 - ports)
	b.log.Info("range: one PortMap of a UDP range to a pod on another node", "ports", ports, "first", first, "pod_node", rangeNode)
	if err := b.waitAgentsCaughtUp(ctx); err != nil {
		return err
	}
	// A class of its own with a return path: bench's builds no link, its endpoints all on edge-a.
	err := b.l.ApplyClass(ctx, &v1alpha1.PortMapClass{
		ObjectMeta: metav1.ObjectMeta{Name: rangeName},
		Spec: v1alpha1.PortMapClassSpec{
			Nodes:      map[string]v1alpha1.ClassNode{node: {Interfaces: []string{iface}}},
			ReturnPath: v1alpha1.ReturnPath{Mode: v1alpha1.ReturnPathVxlan},
		},
	})
	if err != nil {
		return err
	}
	// The slice's port is the range's first: the pod receives on the port dialed.
	if err := b.l.Expose(ctx, kuportNS, rangeName, "p", corev1.ProtocolUDP, first, backend(kuportNS, rangeNode, rangePodIP)); err != nil {
		return err
	}
	serving, err := openKernel(rangeNode)
	if err != nil {
		return err
	}
	defer func() { _ = serving.close() }()
	before, err := b.k.tableElements(kuportFamily, kuportTable)
	if err != nil {
		return err
	}
	emptyRSS, err := b.agentsRSS()
	if err != nil {
		return err
	}

	programmedAt, stop, err := b.watchProgrammed(ctx, rangeName)
	if err != nil {
		return err
	}
	start := time.Now()
	err = b.l.ApplyPortMap(ctx, &v1alpha1.PortMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: kuportNS, Name: rangeName},
		Spec: v1alpha1.PortMapSpec{
			ClassName: rangeName, Protocol: v1alpha1.ProtocolUDP, Port: first, EndPort: ptr.To[int32](65535),
			ServiceRef: v1alpha1.ServiceRef{Name: rangeName, Port: "p"},
		},
	})
	if err != nil {
		stop()
		return err
	}
	programmed, err := programmedAt()
	stop()
	if err != nil {
		return err
	}
	toProgrammed := programmed.Sub(start)
	accepting, err := b.k.tableElements(kuportFamily, kuportTable)
	if err != nil {
		return err
	}
	servingSets, err := serving.tableElements(kuportFamily, kuportTable)
	if err != nil {
		return err
	}
	time.Sleep(rangeHold)
	rss, err := b.agentsRSS()
	if err != nil {
		return err
	}

	deleted := time.Now()
	if err := b.l.DeletePortMap(ctx, kuportNS, rangeName); err != nil {
		return err
	}
	count := func() (int, error) {
		sets, err := b.k.tableElements(kuportFamily, kuportTable)
		return total(sets), err
	}
	if err := b.waitCount(ctx, "range gone from edge-a's kernel", count, total(before), 5*time.Millisecond); err != nil {
		return err
	}
	gone := time.Since(deleted)
	// The sizes that follow expect the lab as setup left it.
	if err := b.l.Unexpose(ctx, kuportNS, rangeName); err != nil {
		return err
	}
	if err := b.l.DeleteClass(ctx, rangeName); err != nil {
		return err
	}
	b.log.Info("range", "ports", ports, "to_programmed_ms", labbench.Ms(toProgrammed), "delete_to_kernel_ms", labbench.Ms(gone),
		"accepting_node_sets", accepting, "accepting_node_sets_before", before, "serving_node_sets", servingSets,
		"agent_rss_mb_empty", emptyRSS, "agent_rss_mb_holding", rss)
	fmt.Printf("BENCH range ports=%d first_apply_ms=na elements=%d agent_rss_mb=%.1f to_programmed_ms=%.1f\n",
		ports, total(accepting)-total(before), rss[node], labbench.Ms(toProgrammed))
	return nil
}

// waitAgentsCaughtUp waits until every node's agent is connected and has acknowledged the
// program the controller holds for it: startKuport waits for edge-a's alone, and a mapping
// created while rangeNode's agent still reconnects would wait for it.
func (b *bench) waitAgentsCaughtUp(ctx context.Context) error {
	url := "http://" + lab.ControllerHTTPAddr + "/metrics"
	last := "no /metrics read"
	err := labbench.WaitFor(ctx, "every agent caught up", 10*time.Millisecond, b.settle, func() (bool, error) {
		v, err := readAgentVersions(ctx, url)
		if err != nil {
			last = err.Error() // the controller may not listen yet
			return false, nil
		}
		last = fmt.Sprintf("%d connected, programs %v, acknowledged %v", v.connected, v.program, v.acked)
		if v.connected != len(b.l.Net.Nodes()) {
			return false, nil
		}
		for _, n := range b.l.Net.Nodes() {
			if v.acked[n.Name] != v.program[n.Name] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w (%s)", err, last)
	}
	return nil
}

// agentVersions is what the controller's /metrics says of the agents: how many are
// connected, and by node the version of its program and the one its agent acknowledged.
type agentVersions struct {
	connected      int
	program, acked map[string]float64
}

func readAgentVersions(ctx context.Context, url string) (agentVersions, error) {
	var v agentVersions
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return v, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return v, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("%s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return v, fmt.Errorf("%s: %w", url, err)
	}
	byNode := func(name string) map[string]float64 {
		m := map[string]float64{}
		for _, s := range families[name].GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "node" {
					m[l.GetValue()] = s.GetGauge().GetValue()
				}
			}
		}
		return m
	}
	for _, s := range families["kuport_agents_connected"].GetMetric() {
		v.connected = int(s.GetGauge().GetValue())
	}
	v.program, v.acked = byNode("kuport_node_program_version"), byNode("kuport_node_acked_version")
	return v, nil
}

// total is the elements of every set.
func total(sets map[string]int) int {
	n := 0
	for _, c := range sets {
		n += c
	}
	return n
}

// agentsRSS is each node's agent's resident memory in MB (labbench.RSSMB).
func (b *bench) agentsRSS() (map[string]float64, error) {
	rss := map[string]float64{}
	for _, n := range b.l.Net.Nodes() {
		mb, err := labbench.RSSMB(b.l.AgentPid(n.Name))
		if err != nil {
			return nil, err
		}
		rss[n.Name] = math.Round(mb*10) / 10
	}
	return rss, nil
}

// cpuUse is the CPU seconds so far of the lab's processes: kuport's controller, the API
// server with etcd, kuport's agents, and this process (the bench's own clients).
type cpuUse struct{ controller, plane, agents, bench float64 }

// round2 rounds CPU seconds to hundredths (the clock's tick) for the log.
func round2(s float64) float64 { return math.Round(s*100) / 100 }

func (b *bench) cpu() (cpuUse, error) {
	var u cpuUse
	var err error
	agents := []int{}
	for _, n := range b.l.Net.Nodes() {
		if p := b.l.AgentPid(n.Name); p > 0 {
			agents = append(agents, p)
		}
	}
	if u.controller, err = labbench.CPUSeconds(b.l.ReplicaPid(0)); err != nil {
		return u, err
	}
	if u.plane, err = labbench.CPUOf(b.l.Cluster.Pids()...); err != nil {
		return u, err
	}
	if u.agents, err = labbench.CPUOf(agents...); err != nil {
		return u, err
	}
	u.bench, err = labbench.CPUSeconds(os.Getpid())
	return u, err
}

// size grows both systems to n and measures them.
func (b *bench) size(ctx context.Context, n int) error {
	b.log.Info("creating objects", "n", n, "portmaps_from", b.portMaps, "services_from", b.services)
	start := time.Now()
	if err := labbench.Parallel(b.services, n, func(i int) error { return b.nodePortService(ctx, i) }); err != nil {
		return err
	}
	b.services = n
	if err := labbench.Parallel(b.portMaps, n, func(i int) error { return b.portMap(fmt.Sprintf("pm-%05d", i), sizeBase+i) }); err != nil {
		return err
	}
	b.portMaps = max(b.portMaps, n)
	b.log.Info("objects created", "s", time.Since(start).Seconds())

	// kuport first: kube-proxy does not run (not yet, or stopped after the last size), so it
	// takes no CPU.
	if err := b.waitCount(ctx, "kuport's elements", b.kuportCount, b.portMaps, time.Second); err != nil {
		return err
	}
	if err := b.waitProgrammed(ctx, b.portMaps); err != nil {
		return err
	}
	b.log.Info("kuport settled", "n", b.portMaps, "s", time.Since(start).Seconds())
	kuportSync, err := b.kuportFullSync(ctx)
	if err != nil {
		return err
	}
	kuport, programmed, err := b.kuportChanges(ctx)
	if err != nil {
		return err
	}
	b.log.Info("kuport change to Programmed=True", "n", n, "ms_p50", labbench.Percentile(programmed, 50), "ms_p99", labbench.Percentile(programmed, 99))
	// The controller's memory with the n mappings, read before kube-proxy's full sync: on a
	// loaded machine the controller has lost its Lease during it (and exits, as a replica that
	// loses the leadership does; the lab restarts none).
	ctlRSS, err := labbench.RSSMB(b.l.ReplicaPid(0))
	if err != nil {
		return err
	}
	b.log.Info("kuport-controller", "n", n, "rss_mb", ctlRSS)

	kpSync, err := b.kubeProxyFullSync(ctx, n)
	if err != nil {
		return err
	}
	kp, err := b.kubeProxyChanges(ctx, n)
	if err != nil {
		return err
	}

	agentRSS, err := labbench.RSSMB(b.l.AgentPid(node))
	if err != nil {
		return err
	}
	kpRSS, err := labbench.RSSMB(b.kp.proc.Pid())
	if err != nil {
		return err
	}
	// Stopped until its next full sync: the next size's creates and kuport's measurements
	// then run without it re-syncing the node on every Service created (its tables stay).
	if err := b.kp.stop(); err != nil {
		return err
	}
	line := "BENCH control system=%s n=%d change_to_kernel_ms_p50=%.1f change_to_kernel_ms_p99=%.1f full_sync_ms=%.0f rss_mb=%.1f\n"
	fmt.Printf(line, "kuport", n, labbench.Percentile(kuport, 50), labbench.Percentile(kuport, 99), labbench.Ms(kuportSync), agentRSS)
	fmt.Printf(line, "kube-proxy", n, labbench.Percentile(kp, 50), labbench.Percentile(kp, 99), labbench.Ms(kpSync), kpRSS)
	return nil
}

// kuportFullSync restarts edge-a's agent into a kernel without its table (a rebooted node)
// and times it until every DNAT element is back.
func (b *bench) kuportFullSync(ctx context.Context) (time.Duration, error) {
	if err := b.l.StopAgent(node, false); err != nil {
		return 0, err
	}
	if err := b.k.deleteTables(kuportTable); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := b.l.StartAgent(node); err != nil {
		return 0, err
	}
	if err := b.waitCount(ctx, "kuport's full sync", b.kuportCount, b.portMaps, 10*time.Millisecond); err != nil {
		return 0, err
	}
	d := time.Since(start)
	b.log.Info("kuport full sync", "ms", labbench.Ms(d))
	// Its reconnect rewrites nothing in the API, but let the controller see the ack.
	return d, b.waitProgrammed(ctx, b.portMaps)
}

// kuportChanges creates one PortMap at a time and times it until its element is in the
// kernel and until it is Programmed=True.
func (b *bench) kuportChanges(ctx context.Context) (toKernel, toProgrammed []time.Duration, err error) {
	for range b.changes {
		// A second after the last change, or after the full sync whose status writes (every
		// PortMap False, then True again) may still be retrying conflicts.
		time.Sleep(time.Second)
		i := b.portMaps
		name := fmt.Sprintf("pm-%05d", i)
		port := sizeBase + i
		programmedAt, stop, err := b.watchProgrammed(ctx, name)
		if err != nil {
			return nil, nil, err
		}
		start := time.Now()
		if err := b.portMap(name, port); err != nil {
			stop()
			return nil, nil, err
		}
		b.portMaps++
		key := dnatKey(iface, uint16(port))
		err = labbench.WaitFor(ctx, "PortMap "+name+" in the kernel", probeEvery, b.settle, func() (bool, error) {
			return b.k.hasElement(kuportFamily, kuportTable, dnatSet, key)
		})
		if err != nil {
			stop()
			return nil, nil, err
		}
		toKernel = append(toKernel, time.Since(start))
		programmed, err := programmedAt()
		stop()
		if err != nil {
			return nil, nil, err
		}
		toProgrammed = append(toProgrammed, programmed.Sub(start))
		b.log.Info("kuport change", "portmap", name, "to_kernel_ms", labbench.Ms(toKernel[len(toKernel)-1]),
			"to_programmed_ms", labbench.Ms(toProgrammed[len(toProgrammed)-1]))
	}
	return toKernel, toProgrammed, nil
}

// watchProgrammed watches PortMap name of kuportNS from now on: programmedAt waits up to the
// settle time for it to be Programmed=True and returns when the watch saw it so; stop ends
// the watch.
func (b *bench) watchProgrammed(ctx context.Context, name string) (programmedAt func() (time.Time, error), stop func(), err error) {
	w, err := b.l.Dyn.Resource(v1alpha1.PortMapsResource).Namespace(kuportNS).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return nil, nil, fmt.Errorf("watch %s: %w", name, err)
	}
	programmed := make(chan time.Time, 1)
	go func() {
		for ev := range w.ResultChan() {
			if u, ok := ev.Object.(*unstructured.Unstructured); ok && ev.Type != watch.Error && labbench.Programmed(u) {
				programmed <- time.Now()
				return
			}
		}
	}()
	programmedAt = func() (time.Time, error) {
		select {
		case t := <-programmed:
			return t, nil
		case <-time.After(b.settle):
			return time.Time{}, fmt.Errorf("PortMap %s not Programmed within %s", name, b.settle)
		}
	}
	return programmedAt, w.Stop, nil
}

// kubeProxyFullSync (re)starts kube-proxy with no table of its own and times it until its
// NodePort map holds every Service.
func (b *bench) kubeProxyFullSync(ctx context.Context, n int) (time.Duration, error) {
	if err := b.kp.stop(); err != nil {
		return 0, err
	}
	if err := b.k.deleteTables(kubeProxyTable); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := b.kp.start(b.flags.K8sBin); err != nil {
		return 0, err
	}
	count := func() (int, error) { return b.k.countElements(kubeProxyFamily, kubeProxyTable, nodePortsMap) }
	if err := b.waitCount(ctx, "kube-proxy's full sync", count, n, 50*time.Millisecond); err != nil {
		return 0, fmt.Errorf("%w (log: %s)", err, filepath.Join(b.flags.Dir, "kube-proxy.log"))
	}
	d := time.Since(start)
	b.log.Info("kube-proxy full sync", "ms", labbench.Ms(d))
	return d, nil
}

// kubeProxyChanges moves one Service's endpoint at a time to a fresh address and times it
// until kube-proxy's hairpin element of the new endpoint is in the kernel (written in the
// same transaction as the service chain's DNAT to it).
func (b *bench) kubeProxyChanges(ctx context.Context, n int) ([]time.Duration, error) {
	var out []time.Duration
	for k := range b.changes {
		// kube-proxy's minSyncPeriod (1 s) after its last sync (the full sync, or the last
		// change): a change sooner would wait for it.
		time.Sleep(1100 * time.Millisecond)
		i := (k*n/b.changes + n/(2*b.changes)) % n
		name := fmt.Sprintf("svc-%05d", i)
		b.moved++
		ip := netip.AddrFrom4([4]byte{10, 244, byte(100 + b.moved/250), byte(1 + b.moved%250)})
		key := hairpinKey(ip, podPort)
		start := time.Now()
		if err := b.l.SetEndpoints(ctx, kpNS, name, "p", corev1.ProtocolTCP, podPort, backend(kpNS, node, ip.String())); err != nil {
			return nil, err
		}
		err := labbench.WaitFor(ctx, "kube-proxy's endpoint "+ip.String()+" of "+name, probeEvery, b.settle, func() (bool, error) {
			return b.k.hasElement(kubeProxyFamily, kubeProxyTable, hairpinSet, key)
		})
		if err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
		b.log.Info("kube-proxy change", "service", name, "to_kernel_ms", labbench.Ms(out[len(out)-1]))
	}
	return out, nil
}
