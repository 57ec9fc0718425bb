package compile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/datapath"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// FuzzCompile decodes the fuzz bytes into a bounded snapshot (fuzzReader.snapshot: a few
// nodes, agent states, classes with their recorded link claims, namespaces, Services and
// EndpointSlices, PortMaps), including nonsense the API server would still accept, and
// checks compile's invariants on it (checkCompile).
func FuzzCompile(f *testing.F) {
	for _, seed := range fuzzSeeds {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkCompile(t, data)
	})
}

// fuzzSeeds are the lab's fixtures as fuzzReader.snapshot reads them (its first byte), and
// two of them dual-stack (the tenth byte: fuzzReader.dualStack); more seeds, and every
// crasher found, are in testdata/fuzz/FuzzCompile.
var fuzzSeeds = [][]byte{{0}, {1}, {2}, {3}, {1, 0, 0, 0, 0, 0, 0, 0, 0, 1}, {3, 0, 0, 0, 0, 0, 0, 0, 0, 1}}

// checkCompile compiles the snapshot data decodes to and checks, on every input:
//   - no panic, and the snapshot is not changed;
//   - determinism: the same snapshot, and an equal one decoded anew, compile alike;
//   - every mapping has Accepted and Programmed conditions with a reason and a message, and
//     Programmed=True only when Accepted=True;
//   - a refused mapping (Accepted=False) holds nothing: no entry in any node's program or
//     index, and the result for everything else is the same as if it did not exist;
//   - no (node, interface, protocol, port) is matched by the DNAT entries of two mappings;
//   - each node's index lists exactly its program's entries, and a mapping's Nodes are the
//     nodes whose index holds it;
//   - every entry's addresses are of its indexed Family, and the program's IPv4 entries with
//     its links and return paths pass the agent's validation (datapath.Validate) whole.
func checkCompile(t *testing.T, data []byte) {
	t.Helper()
	s := newFuzzReader(data).snapshot()
	r := Compile(s)
	if before := newFuzzReader(data).snapshot(); !same(t, before, s) {
		t.Fatalf("compile changed the snapshot (-before +after):\n%s", cmp.Diff(before, s, cmpOpts...))
	}
	if again := Compile(s); !same(t, r, again) {
		t.Fatalf("the same snapshot compiled twice differs:\n%s", cmp.Diff(r, again, cmpOpts...))
	}
	if fresh := Compile(newFuzzReader(data).snapshot()); !same(t, r, fresh) {
		t.Fatalf("an equal snapshot compiled differently:\n%s", cmp.Diff(r, fresh, cmpOpts...))
	}

	// The mappings compile keeps: the first of each namespace/name.
	keys := map[types.NamespacedName]int{}
	for i, pm := range s.PortMaps {
		k := types.NamespacedName{Namespace: pm.Namespace, Name: pm.Name}
		if _, ok := keys[k]; !ok {
			keys[k] = i
		}
	}
	if len(r.PortMaps) != len(keys) {
		t.Fatalf("%d results for %d mappings", len(r.PortMaps), len(keys))
	}
	var refused []int
	for k, i := range keys {
		res := r.PortMaps[k]
		if res == nil {
			t.Fatalf("no result for %s", k)
		}
		acc := meta.FindStatusCondition(res.Status.Conditions, v1alpha1.ConditionAccepted)
		prog := meta.FindStatusCondition(res.Status.Conditions, v1alpha1.ConditionProgrammed)
		for _, c := range []*metav1.Condition{acc, prog} {
			if c == nil || c.Reason == "" || c.Message == "" || (c.Status != metav1.ConditionTrue && c.Status != metav1.ConditionFalse) {
				t.Fatalf("%s: conditions %+v lack a reason or message", k, res.Status.Conditions)
			}
		}
		if prog.Status == metav1.ConditionTrue && acc.Status != metav1.ConditionTrue {
			t.Fatalf("%s: programmed but not accepted: %+v", k, res.Status.Conditions)
		}
		if acc.Status == metav1.ConditionFalse {
			if prog.Reason != v1alpha1.ReasonNotAccepted {
				t.Fatalf("%s: refused (%s) but Programmed says %s", k, acc.Reason, prog.Reason)
			}
			if len(res.Nodes) > 0 {
				t.Fatalf("%s: refused (%s) but carried by %v", k, acc.Reason, res.Nodes)
			}
			refused = append(refused, i)
		}
	}
	checkPrograms(t, r)
	// A refused mapping is judged as if it did not exist, and so is everything after it: take
	// out the first refused one, and nothing else changes.
	if len(refused) > 0 {
		i := slices.Min(refused)
		out := newFuzzReader(data).snapshot()
		gone := out.PortMaps[i]
		out.PortMaps = slices.Delete(out.PortMaps, i, i+1)
		if slices.ContainsFunc(out.PortMaps, func(pm *v1alpha1.PortMap) bool { return pm.Namespace == gone.Namespace && pm.Name == gone.Name }) {
			return // a duplicate would take its place
		}
		without := Compile(out)
		want := *r
		want.PortMaps = map[types.NamespacedName]*PortMapResult{}
		for k, v := range r.PortMaps {
			if k != (types.NamespacedName{Namespace: gone.Namespace, Name: gone.Name}) {
				want.PortMaps[k] = v
			}
		}
		if !same(t, &want, without) {
			t.Fatalf("refused mapping %s/%s (%s) changes the result of the others (-with +without):\n%s",
				gone.Namespace, gone.Name, meta.FindStatusCondition(r.PortMaps[types.NamespacedName{Namespace: gone.Namespace, Name: gone.Name}].Status.Conditions,
					v1alpha1.ConditionAccepted).Message, cmp.Diff(&want, without, cmpOpts...))
		}
	}
}

// same compares two snapshots or results by their JSON, which prints every exported field
// and map keys sorted: cmp.Diff, used for the message only, took four fifths of each input.
func same(t testing.TB, a, b any) bool {
	t.Helper()
	return bytes.Equal(canonical(t, a), canonical(t, b))
}

func canonical(t testing.TB, v any) []byte {
	t.Helper()
	switch x := v.(type) {
	case *Snapshot:
		v = []any{x.Now, x.LinkRetention, x.Classes, x.PortMaps, byString(x.Services), byString(x.EndpointSlices),
			x.Namespaces, x.Nodes, x.Agents}
	case *Result:
		v = []any{x.Programs, byString(x.PortMaps), x.Classes, x.Index}
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// byString keys a map by its keys' "<namespace>/<name>", which JSON can print.
func byString[V any](m map[types.NamespacedName]V) map[string]V {
	out := make(map[string]V, len(m))
	for k, v := range m {
		out[k.String()] = v
	}
	return out
}

// checkPrograms checks each node's program against its index, the mappings' results and
// the agent's validation.
func checkPrograms(t *testing.T, r *Result) {
	t.Helper()
	carriers := map[types.NamespacedName][]string{}
	for node, p := range r.Programs {
		idx, ok := r.Index[node]
		if !ok {
			t.Fatalf("node %s has a program and no index", node)
		}
		// Entries by id, with their mapping, from the program.
		inProgram := map[string]string{}
		add := func(id, mapping string) {
			if _, dup := inProgram[id]; dup {
				t.Fatalf("node %s: id %s twice", node, id)
			}
			inProgram[id] = mapping
		}
		type slot struct {
			iface string
			proto kuportv1.Protocol
		}
		dnats := map[slot][]*kuportv1.DnatRule{}
		for _, e := range p.GetDnatRules() {
			add(e.GetId(), e.GetMapping())
			k := slot{e.GetInInterface(), e.GetProtocol()}
			for _, o := range dnats[k] {
				if o.GetMapping() != e.GetMapping() && o.GetPorts().GetFirst() <= e.GetPorts().GetLast() &&
					e.GetPorts().GetFirst() <= o.GetPorts().GetLast() {
					t.Fatalf("node %s: %s ports %d-%d on %s held by %s and %s", node, e.GetProtocol(), e.GetPorts().GetFirst(),
						e.GetPorts().GetLast(), e.GetInInterface(), o.GetMapping(), e.GetMapping())
				}
			}
			dnats[k] = append(dnats[k], e)
		}
		for _, e := range p.GetSnatRules() {
			add(e.GetId(), e.GetMapping())
		}
		for _, e := range p.GetMarkRules() {
			add(e.GetId(), e.GetMapping())
		}
		indexed := map[string]string{}
		for key, mi := range idx {
			if key != MappingKey(&v1alpha1.PortMap{ObjectMeta: metav1.ObjectMeta{Namespace: mi.Mapping.Namespace, Name: mi.Mapping.Name}}) {
				t.Fatalf("node %s: index key %s holds %s", node, key, mi.Mapping)
			}
			res := r.PortMaps[mi.Mapping]
			if res == nil {
				t.Fatalf("node %s: index holds unknown mapping %s", node, key)
			}
			if !meta.IsStatusConditionTrue(res.Status.Conditions, v1alpha1.ConditionAccepted) {
				t.Fatalf("node %s: refused mapping %s holds entries %v", node, key, mi.Entries)
			}
			for _, e := range mi.Entries {
				indexed[e.ID] = key
			}
			carriers[mi.Mapping] = append(carriers[mi.Mapping], node)
		}
		if d := cmp.Diff(inProgram, indexed); d != "" {
			t.Fatalf("node %s: index and program differ (-program +index):\n%s", node, d)
		}
		checkFamilies(t, p, idx)
		if err := datapath.Validate(p); err != nil {
			t.Fatalf("node %s: the agent would refuse the program: %v", node, errors.Join(err))
		}
	}
	for k, res := range r.PortMaps {
		got := carriers[k]
		slices.Sort(got)
		if !slices.Equal(got, res.Nodes) && !(len(got) == 0 && len(res.Nodes) == 0) {
			t.Fatalf("%s: Nodes %v, indexed on %v", k, res.Nodes, got)
		}
	}
}

// checkFamilies checks that every entry of p has addresses of the family its index entry
// says.
func checkFamilies(t *testing.T, p *kuportv1.NodeProgram, idx NodeIndex) {
	t.Helper()
	family := func(id string, addrs ...string) {
		_, e := idx.Entry(id)
		for _, a := range addrs {
			if ip, err := netip.ParseAddr(a); a != "" && (err != nil || ip.Is4() != (e.Family == FamilyIPv4)) {
				t.Fatalf("entry %s of family %d has address %q", id, e.Family, a)
			}
		}
	}
	for _, e := range p.DnatRules {
		family(e.Id, e.MatchDestination, e.ToAddress, e.StandIn)
	}
	for _, e := range p.SnatRules {
		family(e.Id, e.Address)
	}
	for _, e := range p.MarkRules {
		family(e.Id, e.Address)
	}
}

// fuzzReader reads a snapshot from fuzz bytes: every choice is one byte (zero once the bytes
// run out), so the fuzzer's mutations change the snapshot's structure, not only its values.
type fuzzReader struct {
	b []byte
	i int
}

func newFuzzReader(b []byte) *fuzzReader { return &fuzzReader{b: b} }

func (r *fuzzReader) byte() byte {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return r.b[r.i-1]
}

// n is a choice in [0, n).
func (r *fuzzReader) n(n int) int { return int(r.byte()) % n }

func (r *fuzzReader) bool() bool { return r.byte()&1 == 1 }

func pick[T any](r *fuzzReader, from []T) T { return from[r.n(len(from))] }

// subset picks up to max values of from (repeats possible), nil when none.
func subset[T any](r *fuzzReader, from []T, max int) []T {
	n := r.n(max + 1)
	var out []T
	for range n {
		out = append(out, pick(r, from))
	}
	return out
}

// The pools values come from: the lab's names, edge values and nonsense the API server
// takes (its schema does not validate an address a Service's slice or an agent reports, nor
// check a class's nodes against Node objects).
var (
	fuzzNodes      = []string{"edge-a", "worker-b", "worker-c", "ghost"}
	fuzzIfaces     = []string{"enp1s0", "wt0", "eth0", "nope"}
	fuzzAddrs      = []string{"203.0.113.9", "100.64.93.143", "100.64.93.150", "192.0.2.2", "", "::1", "garbage", "100.64.93.150", "0.0.0.0"}
	fuzzMTUs       = []uint32{1500, 1420, 0, 40, 9000}
	fuzzClasses    = []string{"public", "intranet", "junk"}
	fuzzNamespaces = []string{"demo", "other"}
	fuzzNames      = []string{"remote", "local", "a", "web", strings.Repeat("long", 50)}
	fuzzPorts      = []int32{3000, 3001, 1, 65535, 0, 8080, 27015, 1024, -1, 3002}
	fuzzPodPorts   = []int32{3000, 27015, 1, 65535, 0, -3, 70000, 4000}
	fuzzPodAddrs   = []string{"10.244.18.107", "10.244.17.7", "10.244.19.9", "10.244.18.108", "fd00::1", "", "bogus"}
	fuzzSubnets    = []string{"", "169.254.77.0/24", "169.254.79.0/24", "169.254.77.0/31", "169.254.77.0/30", "169.254.77.0/32", "fd00::/64", "junk", "169.254.77.5/24"}
	fuzzVNIs       = []int32{0, 4242, 4300, 1<<24 - 1, 1<<24 - 2, 1} // the schema takes 1-16777215
	fuzzVxlanPorts = []int32{0, 4790, 8472, 4791}
	fuzzPortNames  = []string{"http", "metrics", ""}
	fuzzAddrs6     = []string{"2001:db8:a::9", "2001:db8:b::2", "fe80::1", "garbage", "", "10.0.0.1", "2001:DB8:C::3"}
	fuzzPodAddrs6  = []string{"fd00:18::107", "fd00:17::7", "fd00::1", "FD00::2", "10.244.18.107", "bogus", "fe80::1%eth0"}
	fuzzPods       = []string{"pod-0", "pod-1", "pod-2", "local-0", "remote-0"}
	fuzzSubnets6   = []string{"", "fd64:f5ac:e961::/112", "fd64:f5ac:e961::/127", "fd64:f5ac:e961::/126", "fd64::/128",
		"169.254.77.0/24", "junk", "fd64:f5ac:e961::5/112", "::/0", "fd64:f5ac:e962::/112"}
)

// snapshot reads the whole snapshot. Its first byte picks the base: nothing, or one of the
// lab's fixtures (the founding shapes, Multi, two classes), on which the rest adds and
// replaces agents, classes, Services and mappings.
func (r *fuzzReader) snapshot() *Snapshot {
	var s *Snapshot
	switch r.n(4) {
	case 1:
		s = world(mkPortMap("local", 0, 3000), mkPortMap("remote", 1, 3001, interfaces("enp1s0")))
	case 2:
		s = multiWorld()
	case 3:
		s = world(mkPortMap("remote", 0, 3000), mkPortMap("local", 1, 3000, className("intranet"), proto(v1alpha1.ProtocolUDP)))
		s.Classes["intranet"] = intranet(1, map[string][]string{"edge-a": {"wt0"}, "worker-c": {"eth0"}})
	default:
		s = &Snapshot{
			Now:            now,
			LinkRetention:  24 * time.Hour,
			Classes:        map[string]*v1alpha1.PortMapClass{},
			Services:       map[types.NamespacedName]*corev1.Service{},
			EndpointSlices: map[types.NamespacedName][]*discoveryv1.EndpointSlice{},
			Namespaces:     map[string]*corev1.Namespace{},
			Nodes:          map[string]*corev1.Node{},
			Agents:         map[string]*AgentState{},
		}
	}
	s.Now = s.Now.Add(time.Duration(r.n(4)) * 12 * time.Hour)
	// Node objects and agents: a bit each to flip (add or remove a Node, replace or remove an
	// agent).
	nodeBits, agentBits := r.byte(), r.byte()
	for i, n := range fuzzNodes {
		if nodeBits&(1<<i) != 0 {
			if s.Nodes[n] != nil {
				delete(s.Nodes, n)
			} else {
				s.Nodes[n] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}
			}
		}
		if agentBits&(1<<i) != 0 {
			if a := r.agent(); a != nil {
				s.Agents[n] = a
			} else {
				delete(s.Agents, n)
			}
		}
	}
	nsBits := r.byte()
	for i, n := range fuzzNamespaces {
		if nsBits&(1<<i) != 0 {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}
			if nsBits&(4<<i) != 0 {
				ns.Labels = map[string]string{"team": "a"}
			}
			s.Namespaces[n] = ns
		}
	}
	for range r.n(4) {
		name := pick(r, fuzzClasses)
		s.Classes[name] = r.class(name)
	}
	for range r.n(4) {
		r.service(s)
	}
	for range r.n(7) {
		s.PortMaps = append(s.PortMaps, r.portMap())
	}
	// Tunnel devices last, so the committed corpus decodes to the snapshots it always did.
	for range r.n(4) {
		r.tunnel(s)
	}
	// IPv6 after them, for the same reason.
	r.dualStack(s)
	return s
}

// dualStack adds IPv6: optionally the dual-stack lab (edge-a and worker-b serving IPv6, the
// fixtures' pods with IPv6 addresses), then nodes' IPv6 addresses and forwarding, IPv6
// slices and classes' subnet6.
func (r *fuzzReader) dualStack(s *Snapshot) {
	if r.bool() {
		for node, pairs := range map[string][]string{"edge-a": {"enp1s0", "2001:db8:a::9"}, "worker-b": {"eth0", "2001:db8:b::2"}} {
			if a := s.Agents[node]; a != nil && a.State != nil {
				serve6(s, node, pairs...)
			}
		}
		for _, name := range []string{"local", "remote"} {
			if s.Services[types.NamespacedName{Namespace: "demo", Name: name}] != nil {
				addSlice6(s, name, 3000, mkEndpoint("local-0", "fd00:17::7", "edge-a"),
					mkEndpoint("remote-0", "fd00:18::107", "worker-b"))
			}
		}
	}
	for range r.n(4) {
		a := s.Agents[pick(r, fuzzNodes)]
		if a == nil || a.State == nil {
			continue
		}
		a.State.Ipv6Forward = r.byte()%4 != 0
		for _, i := range a.State.Interfaces {
			for range r.n(3) {
				i.Addresses6 = append(i.Addresses6, pick(r, fuzzAddrs6))
			}
		}
	}
	for range r.n(3) {
		k := types.NamespacedName{Namespace: pick(r, fuzzNamespaces), Name: pick(r, fuzzNames)}
		if s.Services[k] == nil {
			continue
		}
		sl := mkSlice(discoveryv1.AddressTypeIPv6, pick(r, fuzzPodPorts))
		for range r.n(4) {
			e := mkEndpoint(pick(r, fuzzPods), pick(r, fuzzPodAddrs6), pick(r, fuzzNodes))
			if r.n(4) == 0 {
				e.TargetRef = nil
			}
			sl.Endpoints = append(sl.Endpoints, e)
		}
		s.EndpointSlices[k] = append(s.EndpointSlices[k], sl)
	}
	for _, name := range fuzzClasses {
		if cl := s.Classes[name]; cl != nil && r.bool() {
			cl.Spec.ReturnPath.Vxlan.Subnet6 = pick(r, fuzzSubnets6)
		}
	}
}

// tunnel adds a tunnel device to a node's agent state: a CNI's, kuport's own, or one with no
// kind or port, on a port classes use or not.
func (r *fuzzReader) tunnel(s *Snapshot) {
	node := pick(r, fuzzNodes)
	dev := tunnel(pick(r, []string{"flannel.1", "cilium_geneve", linkToWorkerB, "wt0"}), kuportv1.TunnelKind(r.n(3)),
		pick(r, []uint32{4790, 4789, 8472, 6081, 0}))
	if a := s.Agents[node]; a != nil && a.State != nil {
		withTunnel(s, node, dev)
	}
}

func (r *fuzzReader) agent() *AgentState {
	r.byte() // once the agent's connection, which compile does not read: the corpus keeps its meaning
	a := &AgentState{State: &kuportv1.NodeState{
		UnderlayInterface: pick(r, []string{"wt0", "eth0", "", "nope"}), IpForward: r.byte()%4 != 0}}
	for range r.n(4) {
		i := &kuportv1.Interface{Name: pick(r, fuzzIfaces), Mtu: pick(r, fuzzMTUs)}
		for range r.n(3) {
			i.Addresses = append(i.Addresses, pick(r, fuzzAddrs))
		}
		a.State.Interfaces = append(a.State.Interfaces, i)
	}
	switch r.byte() % 16 {
	case 0:
		a.State = nil
	case 1:
		return nil
	}
	return a
}

func (r *fuzzReader) class(name string) *v1alpha1.PortMapClass {
	cl := mkClass(name, r.n(4)-1, nil)
	cl.Spec.ServingMode = pick(r, []v1alpha1.ServingMode{v1alpha1.ServingModeSingle, v1alpha1.ServingModeMulti, ""})
	for range r.n(4) {
		cl.Spec.Nodes[pick(r, fuzzNodes)] = v1alpha1.ClassNode{Interfaces: subset(r, fuzzIfaces, 3)}
	}
	cl.Spec.Ports = v1alpha1.PortPolicy{Min: pick(r, []int32{1024, 0, 1, 3001, 65535}), Max: pick(r, []int32{65535, 0, 3000, 1024, 27015}),
		Reserved: subset(r, []int32{8080, 3000, 0, 65535, 3001}, 2)}
	cl.Spec.ReturnPath.Mode = pick(r, []v1alpha1.ReturnPathMode{v1alpha1.ReturnPathVxlan, v1alpha1.ReturnPathNone, ""})
	cl.Spec.ReturnPath.Vxlan = v1alpha1.VxlanConfig{VNI: pick(r, fuzzVNIs), Port: pick(r, fuzzVxlanPorts), Subnet: pick(r, fuzzSubnets)}
	switch r.n(4) {
	case 1:
		cl.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
	case 2:
		cl.Spec.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: "Bogus"}}}
	case 3:
		cl.Spec.NamespaceSelector = &metav1.LabelSelector{}
	}
	// Recorded claims, as an earlier compile (or anyone with write access to status) left them.
	for range r.n(4) {
		a, b := pick(r, fuzzNodes), pick(r, fuzzNodes)
		ls := claimOf(a, b, int32(r.n(6))-1, pick(r, fuzzSubnets), nil)
		if r.bool() {
			ls.UnusedSince = &metav1.Time{Time: now.Add(-time.Duration(r.n(4)) * 12 * time.Hour)}
		}
		for range r.n(3) {
			ls.Ends = append(ls.Ends, v1alpha1.LinkEnd{Node: pick(r, fuzzNodes), Table: pick(r, []int32{27505, 27506, 27507, 201, 200, 0, 254})})
		}
		cl.Status.Links = append(cl.Status.Links, ls)
	}
	if r.bool() {
		cl.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ClassConditionReady, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonValid, LastTransitionTime: created(0)}}
	}
	return cl
}

func (r *fuzzReader) service(s *Snapshot) {
	k := types.NamespacedName{Namespace: pick(r, fuzzNamespaces), Name: pick(r, fuzzNames)}
	s.Services[k] = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}
	var slices []*discoveryv1.EndpointSlice
	for range r.n(3) {
		sl := &discoveryv1.EndpointSlice{AddressType: pick(r, []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4,
			discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN})}
		for range r.n(4) {
			p := discoveryv1.EndpointPort{Name: ptr.To(pick(r, fuzzPortNames)), Port: ptr.To(pick(r, fuzzPodPorts))}
			switch r.n(4) {
			case 1:
				p.Protocol = ptr.To(corev1.ProtocolTCP)
			case 2:
				p.Protocol = ptr.To(corev1.ProtocolUDP)
			case 3:
				p.Protocol = ptr.To(corev1.ProtocolSCTP)
			}
			if r.byte()%8 == 0 {
				p.Name, p.Port = nil, nil
			}
			sl.Ports = append(sl.Ports, p)
		}
		for range r.n(4) {
			e := mkEndpoint(fmt.Sprintf("pod-%d", r.n(3)), pick(r, fuzzPodAddrs), pick(r, fuzzNodes))
			switch r.n(8) {
			case 1:
				e.Conditions.Ready = nil
			case 2:
				e.Conditions.Ready = ptr.To(false)
			case 3:
				e.Conditions.Terminating = ptr.To(true)
			case 4:
				e.NodeName = nil
			case 5:
				e.TargetRef = nil
			case 6:
				e.Addresses = append(e.Addresses, pick(r, fuzzPodAddrs))
			}
			sl.Endpoints = append(sl.Endpoints, e)
		}
		if r.byte()%8 == 0 {
			sl = nil
		}
		slices = append(slices, sl)
	}
	s.EndpointSlices[k] = slices
}

func (r *fuzzReader) portMap() *v1alpha1.PortMap {
	name := pick(r, fuzzNames)
	pm := mkPortMap(name, r.n(4), pick(r, fuzzPorts))
	pm.Namespace = pick(r, fuzzNamespaces)
	pm.Spec.ClassName = pick(r, append(fuzzClasses, "missing"))
	pm.Spec.Protocol = pick(r, []v1alpha1.Protocol{v1alpha1.ProtocolTCP, v1alpha1.ProtocolUDP, v1alpha1.ProtocolTCP, "SCTP"})
	if r.bool() {
		pm.Spec.EndPort = ptr.To(pm.Spec.Port + pick(r, []int32{0, 1, 2, 100, 511, 512, 600, -1, 70000}))
	}
	pm.Spec.Interfaces = subset(r, fuzzIfaces, 2)
	pm.Spec.ServiceRef = v1alpha1.ServiceRef{Name: pick(r, fuzzNames), Port: pick(r, fuzzPortNames)}
	switch r.n(4) {
	case 1:
		pm.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonValid, LastTransitionTime: created(1)}}
	case 2:
		pm.Status.Endpoint = &v1alpha1.EndpointStatus{Node: pick(r, fuzzNodes), Address: pick(r, fuzzPodAddrs)}
	}
	return pm
}
