package compile

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// events drives a cluster through random changes, one snapshot after another, replacing
// each object it changes as an informer cache does (never mutating one).
type events struct {
	r    *rand.Rand
	s    *Snapshot
	next int
	// r6, when the nodes and pods have IPv6 (newEvents), draws which pods are dual-stack
	// apart from r, so the sequence of events is the IPv4 one's.
	r6 *rand.Rand
}

// newEvents starts a sequence drawn from seed in the lab's world with two classes: public,
// whose links share a wide subnet, and direct, which builds no links. With dual, edge-a and
// worker-b serve IPv6 and half the pods are dual-stack (step); without, the sequence is
// IPv4 only.
func newEvents(seed uint64, dual bool) *events {
	e := &events{r: rand.New(rand.NewPCG(seed, 13)), s: world()}
	if dual {
		e.r6 = rand.New(rand.NewPCG(seed, 6))
		serve6(e.s, "edge-a", "enp1s0", "2001:db8:a::9")
		serve6(e.s, "worker-b", "eth0", "2001:db8:b::2")
	}
	e.s.Classes["public"].Spec.ReturnPath.Vxlan.Subnet = "169.254.0.0/16"
	direct := mkClass("direct", 1, map[string][]string{"edge-a": {"enp1s0"}, "worker-b": {"eth0"}})
	direct.Spec.ReturnPath = v1alpha1.ReturnPath{Mode: v1alpha1.ReturnPathNone}
	e.s.Classes["direct"] = direct
	return e
}

// advance is step, with the statuses of a full compile written back when the step is the
// controller writing statuses: the next snapshot, the Changes from the one before as the
// informers' events would tell them, and what happened.
func (e *events) advance() (*Snapshot, *Changes, string) {
	prev := e.s
	s, what := e.step()
	if what == "statuses written" {
		e.writeBack(Compile(s))
		s = e.s
	}
	return s, changesBetween(prev, s), what
}

// step returns the next snapshot and what changed.
func (e *events) step() (*Snapshot, string) {
	prev := e.s
	s := *prev
	s.Classes, s.Services, s.EndpointSlices = maps.Clone(prev.Classes), maps.Clone(prev.Services), maps.Clone(prev.EndpointSlices)
	s.Nodes, s.Agents, s.PortMaps = maps.Clone(prev.Nodes), maps.Clone(prev.Agents), slices.Clone(prev.PortMaps)
	s.Now = prev.Now.Add(time.Duration(e.r.IntN(1500)) * time.Millisecond)
	e.s = &s
	pods := []struct{ node, ip string }{{"worker-b", "10.244.18.%d"}, {"edge-a", "10.244.17.%d"}, {"worker-c", "10.244.19.%d"}}
	pod := func(name string) discoveryv1.Endpoint {
		p := pods[e.r.IntN(len(pods))]
		if e.r.IntN(3) > 0 {
			p = pods[0] // most pods behind the one link, which they share
		}
		return mkEndpoint(name+"-0", fmt.Sprintf(p.ip, 2+e.r.IntN(40)), p.node)
	}
	// dual gives half the pods their IPv6 address too, in a slice of its own.
	dual := func(k types.NamespacedName, port int32, ep discoveryv1.Endpoint) {
		if e.r6 != nil && e.r6.IntN(2) == 0 {
			six := mkEndpoint(ep.TargetRef.Name, "fd00::"+ep.Addresses[0][len("10.244."):], *ep.NodeName)
			six.Addresses[0] = strings.ReplaceAll(six.Addresses[0], ".", ":")
			s.EndpointSlices[k] = append(s.EndpointSlices[k], mkSlice(discoveryv1.AddressTypeIPv6, port, six))
		}
	}
	switch n := e.r.IntN(20); {
	case n < 5:
		name := fmt.Sprintf("m%03d", e.next)
		e.next++
		port, ep := int32(3000+e.r.IntN(4)), pod(name)
		addService(&s, name, port, ep)
		dual(types.NamespacedName{Namespace: "demo", Name: name}, port, ep)
		var muts []func(*v1alpha1.PortMap)
		if s.Classes["direct"] != nil && e.r.IntN(10) == 0 {
			muts = append(muts, className("direct"))
		}
		s.PortMaps = append(s.PortMaps, mkPortMap(name, e.next, int32(20000+e.r.IntN(400)), muts...))
		return &s, "create " + name
	case n < 7 && len(s.PortMaps) > 0:
		i := e.r.IntN(len(s.PortMaps))
		name := s.PortMaps[i].Name
		s.PortMaps = slices.Delete(s.PortMaps, i, i+1)
		return &s, "delete " + name
	case n < 11 && len(s.PortMaps) > 0:
		pm := s.PortMaps[e.r.IntN(len(s.PortMaps))]
		k := types.NamespacedName{Namespace: "demo", Name: pm.Spec.ServiceRef.Name}
		if e.r.IntN(6) == 0 {
			s.EndpointSlices[k] = []*discoveryv1.EndpointSlice{mkSlice(discoveryv1.AddressTypeIPv4, 3000)}
			return &s, "no endpoint for " + k.Name
		}
		port, ep := int32(3000+e.r.IntN(4)), pod(k.Name)
		s.EndpointSlices[k] = []*discoveryv1.EndpointSlice{mkSlice(discoveryv1.AddressTypeIPv4, port, ep)}
		dual(k, port, ep)
		return &s, "endpoint move of " + k.Name
	case n < 12 && len(s.PortMaps) > 0:
		i := e.r.IntN(len(s.PortMaps))
		pm := s.PortMaps[i].DeepCopy()
		pm.Generation++
		pm.Spec.Port = int32(20000 + e.r.IntN(400))
		s.PortMaps[i] = pm
		return &s, "port change of " + pm.Name
	case n < 13 && s.Classes["direct"] != nil && e.r.IntN(2) == 0:
		// A class that builds no links: its mappings alone are recompiled.
		cl := s.Classes["direct"].DeepCopy()
		cl.Generation++
		cl.Spec.Ports.Reserved = []int32{8080, int32(20000 + e.r.IntN(400))}
		ifs := [][]string{{"enp1s0"}, {"enp1s0", "wt0"}, {"wt0"}}[e.r.IntN(3)]
		cl.Spec.Nodes["edge-a"] = v1alpha1.ClassNode{Interfaces: ifs}
		if e.r.IntN(2) == 0 {
			cl.Spec.Nodes["worker-b"] = v1alpha1.ClassNode{Interfaces: []string{"eth0"}}
		} else {
			delete(cl.Spec.Nodes, "worker-b")
		}
		cl.Spec.ServingMode = []v1alpha1.ServingMode{v1alpha1.ServingModeSingle, v1alpha1.ServingModeMulti}[e.r.IntN(2)]
		s.Classes["direct"] = cl
		return &s, "class edit of direct"
	case n < 13:
		cl := s.Classes["public"].DeepCopy()
		cl.Generation++
		cl.Spec.Ports.Reserved = []int32{8080, int32(20000 + e.r.IntN(400))}
		if e.r.IntN(2) == 0 {
			cl.Spec.Nodes["worker-c"] = v1alpha1.ClassNode{Interfaces: []string{"eth0"}}
		} else {
			delete(cl.Spec.Nodes, "worker-c")
		}
		s.Classes["public"] = cl
		return &s, "class edit"
	case n < 14:
		if s.Nodes["worker-c"] != nil {
			delete(s.Nodes, "worker-c")
			delete(s.Agents, "worker-c")
			return &s, "node loss of worker-c"
		}
		addNodes(&s, "worker-c")
		s.Agents["worker-c"] = mkAgent(iface("wt0", "100.64.93.160", 1420), iface("eth0", "198.18.0.3", 1500))
		return &s, "worker-c back"
	case n < 15:
		s.Now = s.Now.Add(time.Duration(e.r.IntN(30)) * time.Hour)
		return &s, "hours pass"
	case n < 16 && s.Agents["worker-c"] != nil:
		// Flannel on public's port on worker-c, a pod's node or (after a class edit) an
		// accepting one: no link of public reaches it while it runs.
		if len(s.Agents["worker-c"].State.Interfaces) > 2 {
			s.Agents["worker-c"] = mkAgent(iface("wt0", "100.64.93.160", 1420), iface("eth0", "198.18.0.3", 1500))
			return &s, "flannel gone from worker-c"
		}
		withTunnel(&s, "worker-c", tunnel("flannel.1", vxlan, 4790))
		return &s, "flannel on worker-c"
	}
	return &s, "statuses written"
}

// writeBack records res's statuses in the objects whose status differs, as the controller's
// writes do.
func (e *events) writeBack(res *Result) {
	s := *e.s
	s.Classes, s.PortMaps = maps.Clone(s.Classes), slices.Clone(s.PortMaps)
	for name, st := range res.Classes {
		if equality.Semantic.DeepEqual(s.Classes[name].Status, *st) {
			continue
		}
		cl := s.Classes[name].DeepCopy()
		cl.Status = *st.DeepCopy()
		s.Classes[name] = cl
	}
	for i, pm := range s.PortMaps {
		if r := res.PortMaps[types.NamespacedName{Namespace: pm.Namespace, Name: pm.Name}]; r != nil && !equality.Semantic.DeepEqual(pm.Status, r.Status) {
			pm = pm.DeepCopy()
			pm.Status = *r.Status.DeepCopy()
			s.PortMaps[i] = pm
		}
	}
	e.s = &s
}

// TestIncrementalEqualsFull: after every step of random dual-stack event sequences (creates,
// deletes, endpoint moves, port and class edits, node loss, a tunnel on a class's port coming and
// going, time passing, statuses written back),
// Incremental's result equals a full compile of the same snapshot, and most changes to one
// mapping recompile that mapping alone.
func TestIncrementalEqualsFull(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			e := newEvents(seed, true)
			classEdits := 0
			var inc Incremental
			var prevGot *Result
			partial := 0
			for step := range 300 {
				s, ch, what := e.advance()
				want := Compile(s)
				got := inc.CompileChanges(s, ch)
				if !same(t, want, got) {
					t.Fatalf("step %d (%s): incremental differs from full (-full +incremental):\n%s", step, what,
						cmp.Diff(canonicalResult(want), canonicalResult(got)))
				}
				checkPrograms(t, got)
				if changed := inc.Changed(); changed != nil {
					for k, r := range got.PortMaps {
						if !slices.Contains(changed, k) && prevGot.PortMaps[k] != r {
							t.Fatalf("step %d (%s): %s changed but is not in Changed %v", step, what, k, changed)
						}
					}
				}
				prevGot = got
				if inc.Recompiled() < len(s.PortMaps) {
					partial++
					if what == "class edit of direct" && inc.Recompiled() > 0 {
						classEdits++
					}
					if what == "class edit of direct" {
						assert.Equal(t, len(inc.classMappings(map[string]*v1alpha1.PortMapClass{"direct": nil})), inc.Recompiled(), "step %d (%s) recompiles the class's mappings", step, what)
					} else if what != "statuses written" {
						assert.LessOrEqual(t, inc.Recompiled(), 2, "step %d (%s) recompiles only what it changed", step, what)
					}
				} else if testing.Verbose() {
					t.Logf("step %d (%s): full, %d conflicted, settled %v", step, what, len(inc.conflicted), inc.settled)
				}
			}
			assert.Greater(t, partial, 100, "incremental steps of 300")
			assert.Greater(t, classEdits, 0, "class edits compiled incrementally")
		})
	}
}

func canonicalResult(r *Result) any {
	return []any{r.Programs, byString(r.PortMaps), r.Classes, r.Index}
}

// TestIncrementalSharesUnchanged: a PortMap created among others recompiles it alone and
// leaves the other nodes' programs and the other mappings' results as they were.
func TestIncrementalSharesUnchanged(t *testing.T) {
	s := scaledWorld(20)
	s.Classes["public"].Spec.ReturnPath.Vxlan.Subnet = "169.254.0.0/16"
	var inc Incremental
	first := inc.CompileChanges(s, nil)
	e := &events{s: s}
	e.writeBack(first)
	settled := inc.CompileChanges(e.s, changesBetween(s, e.s))
	require.Equal(t, 20, inc.Recompiled(), "class statuses written: a full compile")

	next := *e.s
	next.PortMaps = slices.Clone(next.PortMaps)
	next.Services, next.EndpointSlices = maps.Clone(next.Services), maps.Clone(next.EndpointSlices)
	addService(&next, "late", 3000, mkEndpoint("late-0", "10.244.17.99", "edge-a"))
	next.PortMaps = append(next.PortMaps, mkPortMap("late", 30, 30000))
	got := inc.CompileChanges(&next, changesBetween(e.s, &next))
	assert.Equal(t, 1, inc.Recompiled())
	require.True(t, same(t, Compile(&next), got))
	assert.Same(t, settled.Programs["worker-b"], got.Programs["worker-b"], "a program the change leaves alone is shared")
	k := types.NamespacedName{Namespace: "demo", Name: "m00001"}
	assert.Same(t, settled.PortMaps[k], got.PortMaps[k])
	assert.NotSame(t, settled.Programs["edge-a"], got.Programs["edge-a"])
	assert.Len(t, settled.Programs["edge-a"].DnatRules, 40, "the previous result is not mutated")
}

// changesBetween is what an informer's events would tell of the step from a to b.
func changesBetween(a, b *Snapshot) *Changes {
	ch := &Changes{PortMaps: map[types.NamespacedName]*v1alpha1.PortMap{}, Services: map[types.NamespacedName]bool{},
		Classes: map[string]bool{}}
	ch.Others = !sameOthers(a, b) || a.LinkRetention != b.LinkRetention
	for _, name := range slices.Concat(slices.Collect(maps.Keys(a.Classes)), slices.Collect(maps.Keys(b.Classes))) {
		if a.Classes[name] != b.Classes[name] {
			ch.Classes[name] = true
		}
	}
	byKey := func(s *Snapshot) map[types.NamespacedName]*v1alpha1.PortMap {
		out := map[types.NamespacedName]*v1alpha1.PortMap{}
		for _, pm := range s.PortMaps {
			out[types.NamespacedName{Namespace: pm.Namespace, Name: pm.Name}] = pm
		}
		return out
	}
	pa, pb := byKey(a), byKey(b)
	for k, pm := range pb {
		if pa[k] != pm {
			ch.PortMaps[k] = pm
		}
	}
	for k := range pa {
		if _, ok := pb[k]; !ok {
			ch.PortMaps[k] = nil
		}
	}
	for _, k := range slices.Concat(slices.Collect(maps.Keys(a.Services)), slices.Collect(maps.Keys(b.Services)),
		slices.Collect(maps.Keys(a.EndpointSlices)), slices.Collect(maps.Keys(b.EndpointSlices))) {
		if a.Services[k] != b.Services[k] || !slices.Equal(a.EndpointSlices[k], b.EndpointSlices[k]) {
			ch.Services[k] = true
		}
	}
	return ch
}

// TestIncrementalTunnelPod: removing the one mapping whose link to a pod's node was refused
// for a tunnel on the class's port changes the class's status (here to the subnet a later
// mapping to that pod found exhausted), though the links it needed are still needed.
func TestIncrementalTunnelPod(t *testing.T) {
	s := multiWorld()
	s.PortMaps = []*v1alpha1.PortMap{
		mkPortMap("remote", 0, 3000, className("intranet"), interfaces("enp1s0")),
		mkPortMap("late", 1, 3001, className("intranet"), service("remote")),
	}
	s.Classes["intranet"].Spec.ReturnPath.Vxlan.Subnet = "169.254.79.0/31"
	withTunnel(s, "worker-b", tunnel("flannel.1", vxlan, 4790))
	var inc Incremental
	e := &events{s: s}
	e.writeBack(inc.CompileChanges(s, nil))
	settled := inc.CompileChanges(e.s, changesBetween(s, e.s))
	require.Equal(t, v1alpha1.ReasonVxlanPortConflict, settled.Classes["intranet"].Conditions[0].Reason)

	next := *e.s
	next.PortMaps = next.PortMaps[1:]
	want := Compile(&next)
	require.Equal(t, v1alpha1.ReasonSubnetExhausted, want.Classes["intranet"].Conditions[0].Reason)
	if got := inc.CompileChanges(&next, changesBetween(e.s, &next)); !same(t, want, got) {
		t.Fatalf("incremental differs from full (-full +incremental):\n%s", cmp.Diff(canonicalResult(want), canonicalResult(got), cmpOpts...))
	}
}

// sameOthers reports whether everything but PortMaps, Services, EndpointSlices and
// PortMapClasses is the very same in a and b (the CNI's settings included).
func sameOthers(a, b *Snapshot) bool {
	if len(a.Agents) != len(b.Agents) {
		return false
	}
	for n, x := range a.Agents {
		y, ok := b.Agents[n]
		if !ok || (x == nil) != (y == nil) || x != nil && x.State != y.State {
			return false
		}
	}
	return a.CNI == b.CNI && samePointers(a.Nodes, b.Nodes) && samePointers(a.Namespaces, b.Namespaces)
}

func samePointers[K comparable, V any](a, b map[K]*V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		if y, ok := b[k]; !ok || x != y {
			return false
		}
	}
	return true
}
