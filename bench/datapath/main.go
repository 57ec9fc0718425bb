// Command datapath measures kuport's datapath at several program sizes in one run (the
// figures are in BENCHMARKS.md): the product's Datapath applies N same-node TCP mappings on
// enp1s0 to a node namespace between a client namespace and a pod namespace, and traffic goes
// to the last mapping. Every size (and ranged size: N mappings of which R are 1,000-port
// ranges, traffic to the middle of the last range) is set up on a node of its own, all dialed
// from one client namespace; then their traffic is measured with the sizes in turn
// (labbench.Interleaved), and one BENCH line per size gives its figures; then come the
// dual-stack sizes, and one line for a single wide UDP range (its apply, its kernel elements and the agent holding it;
// bench/control.sh gives its time to Programmed=True in the lab).
// Run it as root through bench/datapath.sh.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"kuport.wlz.li/kuport/bench/labbench"
	"kuport.wlz.li/kuport/datapath"
	"kuport.wlz.li/kuport/datapath/datapathtest"
	"kuport.wlz.li/kuport/internal/fakecontroller"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

func main() {
	sizes := flag.String("mappings", "1,1000,10000", "program sizes, comma-separated; empty: none")
	agent := flag.String("agent", "", "kuport-agent binary (agent_rss_mb); empty: not measured")
	traffic := flag.Duration("traffic", 6*time.Second, "each size's share of each traffic figure's measurement")
	ranged := flag.String("ranged", "10000:100", "sizes with ranges, comma-separated mappings:ranges (1,000 ports each); empty: none")
	rangePorts := flag.Int("range-ports", 16384, "ports of the one wide UDP range measured; 0: none")
	dualStack := flag.String("dualstack", "1,10000", "dual-stack program sizes, comma-separated: IPv6 beside IPv4 traffic; empty: none")
	flag.Parse()
	// Every size is set up first, then measured with the sizes in turn: a size measured alone
	// moved by up to a tenth between runs, and the ratios between sizes are the figures
	// (BENCHMARKS.md, "Traffic figures in turn").
	l, err := newLab()
	if err != nil {
		fmt.Fprintf(os.Stderr, "lab: %v\n", err)
		os.Exit(1)
	}
	var all []*sized
	fail := func(what string, err error) {
		for _, z := range all {
			z.close()
		}
		l.close()
		fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
		os.Exit(1)
	}
	for _, s := range strings.Split(*sizes, ",") {
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		var z *sized
		if err == nil {
			z, err = setUp(l, n, 0, *agent)
		}
		if err != nil {
			fail("mappings="+s, err)
		}
		all = append(all, z)
	}
	for _, s := range strings.Split(*ranged, ",") {
		if s == "" {
			continue
		}
		var n, r int
		_, err := fmt.Sscanf(s, "%d:%d", &n, &r)
		if err == nil && (r < 1 || r > n) {
			err = fmt.Errorf("ranges %d of %d mappings", r, n)
		}
		var z *sized
		if err == nil {
			z, err = setUp(l, n, r, *agent)
		}
		if err != nil {
			fail("ranged="+s, err)
		}
		all = append(all, z)
	}
	if len(all) > 0 {
		targets := make([]string, len(all))
		for i, z := range all {
			targets[i] = z.target
		}
		figs, err := labbench.Interleaved(l.client, targets, *traffic)
		if err != nil {
			fail("traffic", err)
		}
		for i, z := range all {
			z.print(figs[i])
		}
	}
	for _, z := range all {
		z.close()
	}
	l.close()
	for _, s := range strings.Split(*dualStack, ",") {
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err == nil {
			err = measureDualStack(n, *agent, *traffic)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "dualstack=%s: %v\n", s, err)
			os.Exit(1)
		}
	}
	if *rangePorts > 0 {
		if err := measureRange(*rangePorts, *agent); err != nil {
			fmt.Fprintf(os.Stderr, "range-ports=%d: %v\n", *rangePorts, err)
			os.Exit(1)
		}
	}
}

// lab is a client namespace and the topologies it dials, each on a subnet of its own.
type lab struct {
	client     string
	topologies int
}

// labs counts the labs made, for unique namespace names.
var labs int

func newLab() (*lab, error) {
	labs++
	l := &lab{client: "kupbench-client-" + strconv.Itoa(os.Getpid()) + "-" + strconv.Itoa(labs)}
	in := labbench.In
	if err := labbench.Run([]string{"ip", "netns", "add", l.client},
		// No duplicate address detection on any device made after: with it, a new device's
		// first IPv6 neighbour discovery may go unanswered for a second (lab/netlab does the
		// same).
		in(l.client, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0"),
		in(l.client, "ip", "link", "set", "lo", "up")); err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

func (l *lab) close() { labbench.DeleteNS(l.client) }

// topology is a node namespace with enp1s0 towards the lab's client namespace and
// cilium_host towards a pod namespace that holds the last mapping's pod address. The i-th
// topology of a lab is at 198.18.i.9 and 2001:db8:i::9, the client's eth<i> at .7 and ::7.
type topology struct{ node, client, pod, addr, addr6 string }

// add builds a topology with the last mapping's pod at pod, and at pod6 when not empty: then
// the client, the node and the pod have IPv6 addresses too, and the client routes to the
// pods through the node (a lab's only such topology: the pods' addresses repeat).
func (l *lab) add(pod, pod6 string) (*topology, error) {
	i := l.topologies
	l.topologies++
	suffix := strconv.Itoa(os.Getpid()) + "-" + strconv.Itoa(labs) + "-" + strconv.Itoa(i)
	t := &topology{node: "kupbench-node-" + suffix, client: l.client, pod: "kupbench-pod-" + suffix,
		addr: fmt.Sprintf("198.18.%d.9", i), addr6: fmt.Sprintf("2001:db8:%d::9", i)}
	clientAddr, clientAddr6, eth := fmt.Sprintf("198.18.%d.7", i), fmt.Sprintf("2001:db8:%d::7", i), fmt.Sprintf("eth%d", i)
	in := labbench.In
	steps := [][]string{
		{"ip", "netns", "add", t.node}, {"ip", "netns", "add", t.pod},
		in(t.node, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0"),
		in(t.pod, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0"),
		in(t.node, "ip", "link", "set", "lo", "up"),
		in(t.node, "sysctl", "-qw", "net.ipv4.ip_forward=1"),
		in(t.node, "ip", "link", "add", "enp1s0", "type", "veth", "peer", "name", eth, "netns", t.client),
		in(t.node, "ip", "addr", "add", t.addr+"/24", "dev", "enp1s0"),
		in(t.node, "ip", "link", "set", "enp1s0", "up"),
		in(t.node, "ip", "link", "add", "cilium_host", "type", "veth", "peer", "name", "eth0", "netns", t.pod),
		in(t.node, "ip", "addr", "add", "10.244.17.1/24", "dev", "cilium_host"),
		in(t.node, "ip", "link", "set", "cilium_host", "up"),
		in(t.node, "ip", "route", "add", "10.244.0.0/16", "dev", "cilium_host"),
		in(t.client, "ip", "addr", "add", clientAddr+"/24", "dev", eth),
		in(t.client, "ip", "link", "set", eth, "up"),
		in(t.pod, "ip", "link", "set", "lo", "up"),
		in(t.pod, "ip", "addr", "add", pod+"/16", "dev", "eth0"),
		in(t.pod, "ip", "link", "set", "eth0", "up"),
		in(t.pod, "ip", "route", "add", "default", "via", "10.244.17.1"),
	}
	if pod6 != "" {
		steps = append(steps,
			in(t.node, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"),
			in(t.node, "ip", "addr", "add", t.addr6+"/64", "dev", "enp1s0", "nodad"),
			in(t.node, "ip", "addr", "add", "fd00:10:244::1/48", "dev", "cilium_host", "nodad"),
			in(t.client, "ip", "addr", "add", clientAddr6+"/64", "dev", eth, "nodad"),
			in(t.pod, "ip", "addr", "add", pod6+"/48", "dev", "eth0", "nodad"),
			in(t.pod, "ip", "-6", "route", "add", "default", "via", "fd00:10:244::1"),
			// The pods straight from the client, for measureDualStack's baseline.
			in(t.client, "ip", "route", "add", "10.244.0.0/16", "via", t.addr),
			in(t.client, "ip", "-6", "route", "add", "fd00:10:244::/48", "via", t.addr6))
	}
	if err := labbench.Run(steps...); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

func (t *topology) close() { labbench.DeleteNS(t.node, t.pod) }

// lastField is the integer field name of the last Apply summary the log recorded (-1 when
// there is none): kernel_writes, in_kernel_us, took_us.
func lastField(log *bytes.Buffer, name string) int {
	m := regexp.MustCompile(name+`=(\d+)`).FindAllStringSubmatch(log.String(), -1)
	if len(m) == 0 {
		return -1
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

func lastWrites(log *bytes.Buffer) int { return lastField(log, "kernel_writes") }

// node is the product's Datapath on a topology's node namespace, its debug log kept.
type node struct {
	dp   *datapath.Datapath
	conn *nftables.Conn
	log  bytes.Buffer
	done func()
}

func newNode(t *topology) (*node, error) {
	nd := &node{}
	var err error
	nd.dp, nd.conn, nd.done, err = labbench.NodeDatapath(t.node, hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: &nd.log}))
	return nd, err
}

// sized is one program size set up on a topology of its own, with its figures but the
// traffic's (setUp) and the address and port its traffic dials.
type sized struct {
	// name begins the BENCH line, applied its figures after the traffic's.
	name, applied, target string
	n                     int
	done                  []func()
}

// setUp applies n mappings, the last ranges of them 1,000-port ranges
// (datapathtest.RangedProgram) with the traffic to the last range, or none, on a topology of
// lab l it leaves standing, and takes every figure but the traffic's.
func setUp(l *lab, n, ranges int, agent string) (z *sized, err error) {
	p, port := datapathtest.Program(n, "enp1s0"), 10000+n-1
	if ranges > 0 {
		p, port = datapathtest.RangedProgram(n, ranges, "enp1s0"), datapathtest.RangedPort
	}
	t, err := l.add(datapathtest.PodAddr(n-1), "")
	if err != nil {
		return nil, err
	}
	z = &sized{name: "datapath", n: n, target: net.JoinHostPort(t.addr, strconv.Itoa(port)), done: []func(){t.close}}
	if ranges > 0 {
		z.name = fmt.Sprintf("datapath_ranges ranges=%d", ranges)
	}
	defer func() {
		if err != nil {
			z.close()
		}
	}()
	closePod, err := labbench.ServeIn(t.pod, datapathtest.PodAddr(n-1), port)
	if err != nil {
		return nil, err
	}
	z.done = append(z.done, closePod)
	nd, err := newNode(t)
	if err != nil {
		return nil, err
	}
	z.done = append(z.done, nd.done)
	dp, log := nd.dp, &nd.log

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	if err := dp.Apply(p); err != nil {
		return nil, err
	}
	first := time.Since(start)
	runtime.ReadMemStats(&after)
	allocMB := float64(after.TotalAlloc-before.TotalAlloc) / 1e6

	const resyncs = 5
	start = time.Now()
	for range resyncs {
		if err := dp.Apply(p); err != nil {
			return nil, err
		}
		if w := lastWrites(log); w != 0 {
			return nil, fmt.Errorf("an unchanged program wrote %d times", w)
		}
	}
	resync := time.Since(start) / resyncs

	// The agent watches for drift while it applies (cmd/kuport-agent), which lets a change
	// that keeps the links and return paths skip reading them (datapath.Apply).
	ctx, stop := context.WithCancel(context.Background())
	z.done = append(z.done, stop)
	if _, err := dp.Watch(ctx); err != nil {
		return nil, err
	}
	time.Sleep(500 * time.Millisecond)  // the first apply's notifications read
	if err := dp.Apply(p); err != nil { // a resync: reads what the watch now covers
		return nil, err
	}

	// One mapping (the middle one) retargeted to another pod and back, taken as the agent
	// takes a program it received (agent.handleProgram: Validate, SameProgram against the
	// current one, Apply): change_ms until the kernel holds it (Apply's in_kernel_us: the
	// transaction committed, links and return paths synced), the whole with the conntrack
	// sweep after it on stderr.
	moved := proto.Clone(p).(*kuportv1.NodeProgram)
	mid := n / 2
	moved.Version++
	moved.DnatRules[mid].ToAddress, moved.DnatRules[mid].StandIn, moved.SnatRules[mid].Address = "10.244.250.1", "10.244.250.1", "10.244.250.1"
	back := proto.Clone(p).(*kuportv1.NodeProgram)
	back.Version += 2
	const changes = 4
	var change, whole time.Duration
	writes := 0
	cur := p
	for i := range changes {
		next := moved
		if i%2 == 1 {
			next = back
		}
		start = time.Now()
		if err := dp.Validate(next); err != nil {
			return nil, err
		}
		if datapath.SameProgram(next, cur) {
			return nil, errors.New("the changed program is the same")
		}
		before := time.Since(start)
		if err := dp.Apply(next); err != nil {
			return nil, err
		}
		cur = next
		whole += time.Since(start)
		change += before + time.Duration(lastField(log, "in_kernel_us"))*time.Microsecond
		writes = lastWrites(log)
	}
	change /= changes
	whole /= changes
	fmt.Fprintf(os.Stderr, "mappings=%d change: in the kernel after %.1f ms, Apply with the conntrack sweep %.1f ms\n", n, ms(change), ms(whole))

	rss, err := agentRSSText(agent, t.node, back)
	if err != nil {
		return nil, err
	}
	z.applied = fmt.Sprintf("first_apply_ms=%.1f resync_ms=%.1f change_ms=%.1f change_writes=%d apply_alloc_mb=%.1f agent_rss_mb=%s",
		ms(first), ms(resync), ms(change), writes, allocMB, rss)
	return z, nil
}

// print prints the size's BENCH line.
func (z *sized) print(f labbench.Figures) {
	fmt.Printf("BENCH %s mappings=%d tcp_gbps=%.2f conn_per_s=%.0f rr_p50_us=%.0f %s\n", z.name, z.n, f.TCPGbps, f.ConnPerS, f.RRP50us, z.applied)
}

// close stops what the size runs and deletes its namespaces, in the reverse of their order.
func (z *sized) close() {
	for i := len(z.done) - 1; i >= 0; i-- {
		z.done[i]()
	}
}

// measureRange prints the figures of one UDP mapping of ports ports that keeps them
// (datapathtest.RangeProgram): its first Apply, the elements the kernel then holds, and the
// resident memory of the agent holding it (the empty agent's on stderr). It fills
// first_apply_ms, elements and agent_rss_mb; to_programmed_ms needs a controller and its lab,
// so it is "na" here and bench/control.sh prints it (with its own elements and agent_rss_mb,
// and first_apply_ms "na").
func measureRange(ports int, agent string) error {
	p := datapathtest.RangeProgram(ports, "enp1s0")
	l, err := newLab()
	if err != nil {
		return err
	}
	defer l.close()
	t, err := l.add(datapathtest.PodAddr(0), "")
	if err != nil {
		return err
	}
	defer t.close()
	emptyRSS, err := agentRSSText(agent, t.node, &kuportv1.NodeProgram{Node: p.Node, Version: 1, Epoch: 1})
	if err != nil {
		return fmt.Errorf("empty %w", err)
	}
	nd, err := newNode(t)
	if err != nil {
		return err
	}
	defer nd.done()
	first, elements, err := nd.firstApply(p)
	if err != nil {
		return err
	}
	rss, err := agentRSSText(agent, t.node, p)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "range-ports=%d: an agent holding an empty program: %s MB\n", ports, emptyRSS)
	fmt.Printf("BENCH range ports=%d first_apply_ms=%.1f elements=%d agent_rss_mb=%s to_programmed_ms=na\n", ports, ms(first), elements, rss)
	return nil
}

// measureDualStack prints the figures of n dual-stack mappings
// (datapathtest.DualStackProgram), traffic to the last one over IPv6 and, in turn with it,
// over IPv4: its first Apply, the elements the kernel then holds, and the agent holding it;
// then a line of the same traffic routed to the pod's addresses, which no rule translates,
// taken in the same turns.
func measureDualStack(n int, agent string, d time.Duration) error {
	p, port := datapathtest.DualStackProgram(n, "enp1s0"), 10000+n-1
	l, err := newLab()
	if err != nil {
		return err
	}
	defer l.close()
	t, err := l.add(datapathtest.PodAddr(n-1), datapathtest.PodAddr6(n-1))
	if err != nil {
		return err
	}
	defer t.close()
	for _, addr := range []string{datapathtest.PodAddr(n - 1), datapathtest.PodAddr6(n - 1)} {
		closePod, err := labbench.ServeIn(t.pod, addr, port)
		if err != nil {
			return err
		}
		defer closePod()
	}
	nd, err := newNode(t)
	if err != nil {
		return err
	}
	defer nd.done()
	first, elements, err := nd.firstApply(p)
	if err != nil {
		return err
	}
	// The node's addresses, then the kernel's own difference between the families: the pod's
	// addresses, routed by the node and translated by nothing.
	var targets []string
	for _, addr := range []string{t.addr6, t.addr, datapathtest.PodAddr6(n - 1), datapathtest.PodAddr(n - 1)} {
		targets = append(targets, net.JoinHostPort(addr, strconv.Itoa(port)))
	}
	f, err := labbench.Interleaved(l.client, targets, d)
	if err != nil {
		return err
	}
	rss, err := agentRSSText(agent, t.node, p)
	if err != nil {
		return err
	}
	fmt.Printf("BENCH datapath_ipv6 mappings=%d tcp_gbps=%.2f conn_per_s=%.0f rr_p50_us=%.0f ipv4_tcp_gbps=%.2f ipv4_conn_per_s=%.0f ipv4_rr_p50_us=%.0f first_apply_ms=%.1f elements=%d agent_rss_mb=%s\n",
		n, f[0].TCPGbps, f[0].ConnPerS, f[0].RRP50us, f[1].TCPGbps, f[1].ConnPerS, f[1].RRP50us, ms(first), elements, rss)
	fmt.Printf("BENCH datapath_ipv6_routed mappings=%d tcp_gbps=%.2f conn_per_s=%.0f rr_p50_us=%.0f ipv4_tcp_gbps=%.2f ipv4_conn_per_s=%.0f ipv4_rr_p50_us=%.0f\n",
		n, f[2].TCPGbps, f[2].ConnPerS, f[2].RRP50us, f[3].TCPGbps, f[3].ConnPerS, f[3].RRP50us)
	return nil
}

// firstApply applies p to the node's empty kernel and returns how long that took and the
// elements the kernel then holds.
func (nd *node) firstApply(p *kuportv1.NodeProgram) (time.Duration, int, error) {
	start := time.Now()
	if err := nd.dp.Apply(p); err != nil {
		return 0, 0, err
	}
	first := time.Since(start)
	elements, err := countElements(nd.conn)
	return first, elements, err
}

// agentRSSText is agentRSS as the BENCH lines print it: "n/a" without an agent.
func agentRSSText(agent, node string, program *kuportv1.NodeProgram) (string, error) {
	if agent == "" {
		return "n/a", nil
	}
	mb, err := agentRSS(agent, node, program)
	if err != nil {
		return "", fmt.Errorf("agent: %w", err)
	}
	return fmt.Sprintf("%.1f", mb), nil
}

// countElements counts the elements of every set of table inet kuport.
func countElements(conn *nftables.Conn) (int, error) {
	sets, err := conn.GetSets(&nftables.Table{Name: "kuport", Family: nftables.TableFamilyINet})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range sets {
		es, err := conn.GetSetElements(s)
		if err != nil {
			return 0, err
		}
		n += len(es)
	}
	return n, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// agentRSS runs the real agent in the node namespace holding program (which the kernel
// already holds), waits for its Ack and 5 s of resyncs and reports past it (one each a
// second), and returns its resident memory in MB.
func agentRSS(agent, node string, program *kuportv1.NodeProgram) (float64, error) {
	dir, err := os.MkdirTemp("", "kupbench-")
	if err != nil {
		return 0, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	sock := filepath.Join(dir, "controller.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return 0, err
	}
	// The agent speaks TLS only: serve a certificate of a fresh CA, which the agent trusts.
	const serverName = "kuport-controller.bench"
	caFile := filepath.Join(dir, "ca.crt")
	cert, err := fakecontroller.Cert(serverName, caFile)
	if err != nil {
		return 0, err
	}
	// The controller serves one program to the agent and reports its first Ack.
	ctrl := fakecontroller.New(fakecontroller.Options{Program: program})
	stop := ctrl.Serve(lis, credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}))
	defer stop()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", node, agent, "--node-name", "edge-a", "--controller", "unix://"+sock,
		"--controller-ca-file", caFile, "--controller-server-name", serverName,
		"--token-file", "", "--inspect-listen", "", "--epoch-file", "", "--resync-interval", "1s", "--report-interval", "1s", "--log-level", "warn")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	select {
	case ack := <-ctrl.Acks():
		if len(ack.GetErrors()) > 0 {
			return 0, fmt.Errorf("ack with errors: %v", ack.GetErrors())
		}
	case <-time.After(60 * time.Second):
		return 0, fmt.Errorf("no ack: %s", out.String())
	}
	time.Sleep(5 * time.Second) // resyncs and reports (each reads every element's counter)
	return labbench.RSSMB(cmd.Process.Pid)
}
