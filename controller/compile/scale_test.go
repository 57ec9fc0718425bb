package compile

import (
	"fmt"
	"maps"
	"testing"

	gproto "google.golang.org/protobuf/proto"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// clusterWorld is a cluster of nodes nodes: edge-a accepts class public (subnet
// 169.254.0.0/16, room for every link) on enp1s0 and wt0, the others are workers
// node-000, node-001, ...; n TCP mappings from port 10000 up, each to its own Service and pod,
// the pods spread over edge-a and the workers in turn, so edge-a holds a link to every worker.
func clusterWorld(n, nodes int) *Snapshot {
	s := world()
	delete(s.Agents, "worker-b")
	delete(s.Agents, "worker-c")
	delete(s.Nodes, "worker-b")
	delete(s.Nodes, "worker-c")
	s.Classes["public"].Spec.ReturnPath.Vxlan.Subnet = "169.254.0.0/16"
	workers := make([]string, nodes-1)
	for w := range workers {
		workers[w] = fmt.Sprintf("node-%03d", w)
		addNodes(s, workers[w])
		s.Agents[workers[w]] = mkAgent(iface("wt0", fmt.Sprintf("100.65.%d.%d", w/250, 1+w%250), 1420), iface("eth0", "192.0.2.2", 1500))
	}
	for i := range n {
		name, port := fmt.Sprintf("m%05d", i), int32(10000+i)
		node := "edge-a"
		if w := i % nodes; w > 0 {
			node = workers[w-1]
		}
		ip := fmt.Sprintf("10.%d.%d.%d", i%nodes, i/nodes/250, 2+i/nodes%250)
		addService(s, name, port, mkEndpoint(name+"-0", ip, node))
		s.PortMaps = append(s.PortMaps, mkPortMap(name, i, port))
	}
	return s
}

// BenchmarkCompileCluster measures, at 10,000 mappings over 200 nodes with every status
// written back (bench/compile.sh prints it as BENCH compile):
//
//   - full: Compile of the whole snapshot;
//
//   - change: Incremental.CompileChanges after one mapping's endpoint moved to another pod
//     (back and forth between two snapshots), told the Service changed: the controller's
//     compile after an EndpointSlice event.
//
//     go test -run '^$' -bench CompileCluster ./controller/compile/
func BenchmarkCompileCluster(b *testing.B) {
	e := &events{s: clusterWorld(10000, 200)}
	e.writeBack(Compile(e.s))
	settled := e.s
	res := Compile(settled)
	programmed := 0
	for _, r := range res.PortMaps {
		if meta.IsStatusConditionPresentAndEqual(r.Status.Conditions, v1alpha1.ConditionProgrammed, metav1.ConditionTrue) {
			programmed++
		}
	}
	if programmed != 10000 || len(res.Programs) != 200 {
		b.Fatalf("%d of 10000 mappings programmed, %d programs", programmed, len(res.Programs))
	}
	b.Run("full", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			Compile(settled)
		}
	})
	b.Run("change", func(b *testing.B) { benchmarkChange(b, settled) })
}

// moveEndpoint returns a copy of s in which the first endpoint of Service demo/name has moved
// to another pod, and the Service's key.
func moveEndpoint(s *Snapshot, name string) (*Snapshot, types.NamespacedName) {
	moved := *s
	moved.EndpointSlices = maps.Clone(s.EndpointSlices)
	k := types.NamespacedName{Namespace: "demo", Name: name}
	sl := moved.EndpointSlices[k][0].DeepCopy()
	sl.Endpoints[0].Addresses = []string{"10.1.250.250"}
	moved.EndpointSlices[k] = []*discoveryv1.EndpointSlice{sl}
	return &moved, k
}

// benchmarkChange moves one mapping's endpoint back and forth.
func benchmarkChange(b *testing.B, settled *Snapshot) {
	{
		moved, k := moveEndpoint(settled, "m05001")
		var inc Incremental
		compile := func(s *Snapshot) *Result {
			return inc.CompileChanges(s, &Changes{Services: map[types.NamespacedName]bool{k: true}})
		}
		inc.CompileChanges(settled, nil)
		if !same(b, Compile(moved), compile(moved)) || inc.Recompiled() != 1 {
			b.Fatalf("the move recompiled %d mappings, or differs from a full compile", inc.Recompiled())
		}
		compile(settled)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			s := settled
			if i%2 == 0 {
				s = moved
			}
			compile(s)
		}
		if inc.Recompiled() != 1 {
			b.Fatalf("%d mappings recompiled", inc.Recompiled())
		}
		// What the move puts on the wire: deltas to the nodes whose program changed.
		b.StopTimer()
		before, after := Compile(settled), Compile(moved)
		wire, whole := 0, 0
		for node, p := range after.Programs {
			whole += gproto.Size(p)
			if !gproto.Equal(p, before.Programs[node]) {
				wire += gproto.Size(kuportv1.Delta(before.Programs[node], p))
			}
		}
		b.ReportMetric(float64(wire), "wire_bytes")
		b.ReportMetric(float64(whole), "programs_bytes")
	}
}

// TestOneChangeOnTheWire: one endpoint moving among 1,000 mappings over 20 nodes changes the
// pod node's program alone, and its delta carries the moved mapping's entries alone: under
// 1 % of the programs' bytes.
func TestOneChangeOnTheWire(t *testing.T) {
	s := clusterWorld(1000, 20)
	moved, _ := moveEndpoint(s, "m00501")
	before, after := Compile(s), Compile(moved)
	var changed []string
	whole := 0
	for node, p := range after.Programs {
		whole += gproto.Size(p)
		if !gproto.Equal(p, before.Programs[node]) {
			changed = append(changed, node)
		}
	}
	if len(changed) != 1 || changed[0] != "node-000" {
		t.Fatalf("programs changed: %v", changed)
	}
	d := kuportv1.Delta(before.Programs["node-000"], after.Programs["node-000"])
	// The moved mapping's entries that name the pod address change (its ct-save, keyed by
	// the link's address, does not); no other mapping's entry travels.
	var mappings []string
	for _, r := range d.Changed.DnatRules {
		mappings = append(mappings, r.GetMapping())
	}
	for _, r := range d.Changed.SnatRules {
		mappings = append(mappings, r.GetMapping())
	}
	for _, r := range d.Changed.MarkRules {
		mappings = append(mappings, r.GetMapping())
	}
	entries := len(after.Index["node-000"]["demo/m00501"].Entries)
	if len(mappings) == 0 || len(mappings) > entries || len(d.Removed) != 0 {
		t.Fatalf("the delta carries %d rules and removes %v; the mapping has %d entries", len(mappings), d.Removed, entries)
	}
	for _, m := range mappings {
		if m != "demo/m00501" {
			t.Fatalf("the delta carries an entry of %s", m)
		}
	}
	if delta := gproto.Size(d); delta*100 > whole {
		t.Fatalf("the delta is %d bytes of %d", delta, whole)
	}
}
