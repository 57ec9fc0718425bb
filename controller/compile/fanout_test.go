package compile

import (
	"fmt"
	"maps"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// fanoutWorld is bench/fanout's cluster: nodes nodes fan-0000... each accepting class public
// on eth0 (returnPath None) and reporting eth0 and eth1, and one mapping per node whose pod
// is on it; then extra mappings of class extra (returnPath Vxlan, the first 3 nodes
// accepting on eth0), their pods spread over every node; its statuses written back.
func fanoutWorld(nodes, extra int) *Snapshot {
	s := world()
	s.Nodes, s.Agents = map[string]*corev1.Node{}, map[string]*AgentState{}
	cl := mkClass("public", 0, nil)
	cl.Spec.ReturnPath = v1alpha1.ReturnPath{Mode: v1alpha1.ReturnPathNone}
	s.Classes["public"] = cl
	for i := range nodes {
		node := fmt.Sprintf("fan-%04d", i)
		addNodes(s, node)
		a := mkAgent(iface("eth0", fmt.Sprintf("10.200.%d.%d", i/250, 1+i%250), 1500),
			iface("eth1", fmt.Sprintf("10.201.%d.%d", i/250, 1+i%250), 1500))
		a.State.UnderlayInterface = "eth0"
		s.Agents[node] = a
		cl.Spec.Nodes[node] = v1alpha1.ClassNode{Interfaces: []string{"eth0"}}
		addService(s, node, 8081, mkEndpoint(node, fmt.Sprintf("10.202.%d.%d", i/250, 1+i%250), node))
		s.PortMaps = append(s.PortMaps, mkPortMap(node, i, int32(10000+i)))
	}
	x := mkClass("extra", 1, map[string][]string{"fan-0000": {"eth0"}, "fan-0001": {"eth0"}, "fan-0002": {"eth0"}})
	x.Spec.ReturnPath.Vxlan.Subnet = "169.254.0.0/16"
	s.Classes["extra"] = x
	for j := range extra {
		name, i := fmt.Sprintf("x-%05d", j), j%nodes
		addService(s, name, 8081, mkEndpoint(fmt.Sprintf("fan-%04d", i), fmt.Sprintf("10.202.%d.%d", i/250, 1+i%250), fmt.Sprintf("fan-%04d", i)))
		s.PortMaps = append(s.PortMaps, mkPortMap(name, nodes+j, int32(20000+j), className("extra")))
	}
	e := &events{s: s}
	e.writeBack(Compile(s))
	return e.s
}

// withInterfaces is s with class public naming ifs on every node (a new class object).
func withInterfaces(s *Snapshot, ifs ...string) *Snapshot {
	out := *s
	out.Classes = maps.Clone(s.Classes)
	cl := s.Classes["public"].DeepCopy()
	cl.Generation++
	for n := range cl.Spec.Nodes {
		cl.Spec.Nodes[n] = v1alpha1.ClassNode{Interfaces: ifs}
	}
	out.Classes["public"] = cl
	return &out
}

// BenchmarkCompileFanout measures bench/fanout's class change at 1,000 nodes, each accepting
// class public and holding one mapping's pod: the class gains eth1 on every node, so every
// node's program changes; with 1,000 mappings, and with 9,000 more of class extra
// (bench/fanout --mappings 10000).
//
//   - full: Compile of the changed snapshot;
//
//   - class-change: Incremental.CompileChanges told the class changed, the controller's compile
//     after the class's event (back and forth between the two snapshots): it recompiles the
//     class's 1,000 mappings (with 1,000 in all, a full compile is as cheap).
//
//     go test -run '^$' -bench CompileFanout -cpuprofile cpu.out -memprofile mem.out ./controller/compile/
func BenchmarkCompileFanout(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("mappings=%d", n), func(b *testing.B) { benchmarkFanout(b, n) })
	}
}

func benchmarkFanout(b *testing.B, n int) {
	settled := fanoutWorld(1000, n-1000)
	changed := withInterfaces(settled, "eth0", "eth1")
	res := Compile(changed)
	programmed := 0
	for _, r := range res.PortMaps {
		if meta.IsStatusConditionPresentAndEqual(r.Status.Conditions, v1alpha1.ConditionProgrammed, metav1.ConditionTrue) {
			programmed++
		}
	}
	if programmed != n || len(res.Programs) != 1000 || len(res.Programs["fan-0007"].DnatRules) < 2 {
		b.Fatalf("%d of %d mappings programmed, %d programs", programmed, n, len(res.Programs))
	}
	b.Run("full", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			Compile(changed)
		}
	})
	b.Run("class-change", func(b *testing.B) {
		var inc Incremental
		inc.CompileChanges(settled, nil)
		if !same(b, Compile(changed), inc.CompileChanges(changed, &Changes{Classes: map[string]bool{"public": true}})) {
			b.Fatal("the class change differs from a full compile")
		}
		inc.CompileChanges(settled, &Changes{Classes: map[string]bool{"public": true}})
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			s := settled
			if i%2 == 0 {
				s = changed
			}
			inc.CompileChanges(s, &Changes{Classes: map[string]bool{"public": true}})
		}
		if inc.Recompiled() != 1000 {
			b.Fatalf("%d mappings recompiled", inc.Recompiled())
		}
	})
}

// BenchmarkRetained measures what Incremental keeps live at bench/fanout's 10,000 mappings
// over 1,000 nodes (the goal: the controller within 300 MB; BENCHMARKS.md, "What compile
// keeps live"): per iteration a full compile of the settled snapshot, then class public's
// change told by Changes (timed: ns/op is the change's time); retained-MB is the heap live
// after a collection less the snapshots' own.
//
//	go test -run '^$' -bench Retained -benchtime 3x ./controller/compile/
func BenchmarkRetained(b *testing.B) {
	settled := fanoutWorld(1000, 9000)
	changed := withInterfaces(settled, "eth0", "eth1")
	ch := &Changes{Classes: map[string]bool{"public": true}}
	base := liveHeap()
	var retained uint64
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		var inc Incremental
		inc.CompileChanges(settled, nil)
		b.StartTimer()
		inc.CompileChanges(changed, ch)
		b.StopTimer()
		if inc.Recompiled() != 1000 {
			b.Fatalf("%d mappings recompiled, want the class's 1000", inc.Recompiled())
		}
		retained += liveHeap() - base
		runtime.KeepAlive(&inc)
	}
	b.ReportMetric(float64(retained)/float64(b.N)/1e6, "retained-MB")
}

// liveHeap is the heap's live bytes after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
