package agents

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/controller/compile"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// fanoutShape is bench/fanout --mappings 10000's cluster as the registry sees it: 3
// accepting nodes holding 9,000 mappings' entries each (a DNAT entry with its forwarded
// counts, an SNAT and a ct-restore entry per mapping) and 997 serving nodes holding 10 each
// (a DNAT entry over a link with its forwarded counts, an SNAT and a ct-save entry).
const (
	fanoutNodes     = 1000
	fanoutAccepting = 3
	fanoutBig       = 9000 // mappings on an accepting node
	fanoutSmall     = 10   // mappings on a serving node
)

// fanoutNode returns node i's index and, marshalled as an agent sends it, a Report with a
// counter at 0 for every entry, as an idle cluster's (DNAT entries with forwarded in and out).
func fanoutNode(i int) (compile.NodeIndex, []byte) {
	index := compile.NodeIndex{}
	rep := &kuportv1.Report{}
	mappings, iface := fanoutSmall, fmt.Sprintf("kup-%08x", i)
	if i < fanoutAccepting {
		mappings, iface = fanoutBig, "enp1s0"
	}
	for j := range mappings {
		name := fmt.Sprintf("pm-%05d", (i*fanoutSmall+j)%10000)
		key := "fanout/" + name
		mi := &compile.MappingIndex{Mapping: types.NamespacedName{Namespace: "fanout", Name: name}, ServingNode: "node-0000"}
		for _, e := range []compile.Entry{
			{Name: "dnat/" + iface, Kind: compile.KindDNAT, Direction: compile.DirectionIn, Interface: iface},
			{Name: "snat", Kind: compile.KindSNAT, Direction: compile.DirectionIn},
			{Name: "ct-restore", Kind: compile.KindMark, Direction: compile.DirectionOut},
		} {
			e.ID = key + "/" + e.Name
			mi.Entries = append(mi.Entries, e)
			c := &kuportv1.Counter{Id: e.ID}
			if e.Kind == compile.KindDNAT {
				c.ForwardedIn, c.ForwardedOut = &kuportv1.Traffic{}, &kuportv1.Traffic{}
			}
			rep.Counters = append(rep.Counters, c)
		}
		index[key] = mi
	}
	wire, err := proto.Marshal(rep)
	if err != nil {
		panic(err)
	}
	return index, wire
}

// received is wire unmarshalled as the agent stream receives a Report.
func received(b testing.TB, wire []byte) *kuportv1.Report {
	rep := &kuportv1.Report{}
	if err := proto.Unmarshal(wire, rep); err != nil {
		b.Fatal(err)
	}
	return rep
}

// cpuTime is the process's CPU time so far, user and system: on a shared machine the
// time of a call is better told by it than by the wall clock.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapMB is the live heap after a collection, in MB.
func heapMB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / 1e6
}

// BenchmarkReportsRetained measures what the latest Reports of bench/fanout's 1,000 agents
// keep in a real Registry (retained_MB: the live heap with every node's report taken, less
// the heap before, counters and unanswered trackers included), the Trackers kept
// (trackers), and the time, process CPU time (the collector's included) and allocations of
// one report call of an accepting node (ns/op, cpu_ms/op, B/op).
func BenchmarkReportsRetained(b *testing.B) {
	r := NewRegistry(Config{Epoch: 1, Start: t0})
	programs := map[string]*kuportv1.NodeProgram{}
	index := map[string]compile.NodeIndex{}
	wires := map[string][]byte{}
	for i := range fanoutNodes {
		name := fmt.Sprintf("node-%04d", i)
		programs[name] = &kuportv1.NodeProgram{}
		index[name], wires[name] = fanoutNode(i)
	}
	r.SetPrograms(programs, index)
	sessions := map[string]*session{}
	for name := range programs {
		sessions[name] = r.connect(&kuportv1.Hello{Node: name})
	}
	programs, index = nil, nil
	clock := t0
	r.now = func() time.Time { return clock }

	before := heapMB()
	for name, s := range sessions {
		r.report(s, received(b, wires[name]))
	}
	retained := heapMB() - before
	trackers := 0
	for _, n := range r.nodes {
		trackers += len(n.answers)
	}

	big, rep := sessions["node-0000"], received(b, wires["node-0000"])
	b.ReportAllocs()
	start := cpuTime(b)
	for b.Loop() {
		clock = clock.Add(10 * time.Second)
		r.report(big, rep)
	}
	cpu := cpuTime(b) - start
	// After the loop: b.Loop's start resets the metrics reported before it.
	b.ReportMetric(retained, "retained_MB")
	b.ReportMetric(float64(trackers), "trackers")
	b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu_ms/op")
	runtime.KeepAlive(r)
}
