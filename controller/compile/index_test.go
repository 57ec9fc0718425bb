package compile

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

// TestIndex checks each node's index of what its program holds per mapping: the entries
// under their ids with what each counts, the links and return paths, and the serving node.
func TestIndex(t *testing.T) {
	remote := types.NamespacedName{Namespace: "demo", Name: "remote"}
	dnat := func(m, i string) Entry {
		return Entry{ID: m + "/dnat/" + i, Name: "dnat/" + i, Kind: KindDNAT, Direction: DirectionIn, Interface: i,
			Family: FamilyIPv4}
	}
	overLink := func(m, i string) Entry {
		e := dnat(m, i)
		e.OverLink = true
		return e
	}
	other := func(m, name string, kind EntryKind, dir string) Entry {
		return Entry{ID: m + "/" + name, Name: name, Kind: kind, Direction: dir, Family: FamilyIPv4}
	}
	snat := func(m string) Entry { return other(m, "snat", KindSNAT, DirectionIn) }
	snatReply := func(m string) Entry { return other(m, "snat-reply", KindSNAT, DirectionOut) }
	refused := world(mkPortMap("local", 0, 3000), mkPortMap("lost", 1, 3001, className("nowhere")))
	cases := []struct {
		name string
		s    *Snapshot
		want map[string]NodeIndex
	}{{
		name: "same node",
		s:    world(mkPortMap("local", 0, 3000)),
		want: map[string]NodeIndex{
			"edge-a": {"demo/local": {
				Mapping: types.NamespacedName{Namespace: "demo", Name: "local"}, ServingNode: "edge-a",
				Entries: []Entry{dnat("demo/local", "enp1s0"), dnat("demo/local", "wt0"), snat("demo/local")},
			}},
			"worker-b": {}, "worker-c": {},
		},
	}, {
		name: "cross node, its link and return path",
		s:    world(mkPortMap("remote", 0, 3000, interfaces("enp1s0"))),
		want: map[string]NodeIndex{
			"edge-a": {"demo/remote": {
				Mapping: remote, ServingNode: "edge-a",
				Entries: []Entry{dnat("demo/remote", "enp1s0"), snat("demo/remote")},
				Links:   []string{linkToWorkerB},
			}},
			"worker-b": {"demo/remote": {
				Mapping: remote, ServingNode: "edge-a",
				Entries: []Entry{other("demo/remote", "ct-restore", KindMark, DirectionOut),
					other("demo/remote", "ct-save/"+linkToEdgeA, KindMark, DirectionIn), overLink("demo/remote", linkToEdgeA),
					snat("demo/remote"), snatReply("demo/remote")},
				Links:       []string{linkToEdgeA},
				ReturnPaths: []string{linkToEdgeA + "/return"},
			}},
			"worker-c": {},
		},
	}, {
		name: "Multi, two forwarders",
		s:    multiWorld(),
		want: map[string]NodeIndex{
			"edge-a": {"demo/remote": {
				Mapping: remote, ServingNode: "edge-a",
				Entries: []Entry{dnat("demo/remote", "enp1s0"), snat("demo/remote")},
				Links:   []string{intranetToWB},
			}},
			"worker-c": {"demo/remote": {
				Mapping: remote, ServingNode: "edge-a",
				Entries: []Entry{dnat("demo/remote", "eth0"), snat("demo/remote")},
				Links:   []string{intranetToWB},
			}},
			"worker-b": {"demo/remote": {
				Mapping: remote, ServingNode: "edge-a",
				Entries: []Entry{
					other("demo/remote", "ct-restore", KindMark, DirectionOut),
					other("demo/remote", "ct-save/"+intranetToEA, KindMark, DirectionIn),
					other("demo/remote", "ct-save/"+intranetToWC, KindMark, DirectionIn),
					overLink("demo/remote", intranetToEA), overLink("demo/remote", intranetToWC),
					snat("demo/remote"), snatReply("demo/remote"),
				},
				Links:       []string{intranetToEA, intranetToWC},
				ReturnPaths: []string{intranetToEA + "/return", intranetToWC + "/return"},
			}},
		},
	}, {
		name: "refused, no entries",
		s:    refused,
		want: map[string]NodeIndex{
			"edge-a": {"demo/local": {
				Mapping: types.NamespacedName{Namespace: "demo", Name: "local"}, ServingNode: "edge-a",
				Entries: []Entry{dnat("demo/local", "enp1s0"), dnat("demo/local", "wt0"), snat("demo/local")},
			}},
			"worker-b": {}, "worker-c": {},
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Compile(tc.s)
			if d := cmp.Diff(tc.want, r.Index); d != "" {
				t.Errorf("index (-want +got):\n%s", d)
			}
			checkIndexMatchesPrograms(t, r)
		})
	}
	if st := Compile(refused).PortMaps[types.NamespacedName{Namespace: "demo", Name: "lost"}]; len(st.Nodes) != 0 {
		t.Errorf("refused mapping carried by %v", st.Nodes)
	}
}

// checkIndexMatchesPrograms checks that every node's index names exactly its program's rules,
// each under its own mapping, and links and return paths the program holds.
func checkIndexMatchesPrograms(t *testing.T, r *Result) {
	t.Helper()
	for node, p := range r.Programs {
		owner := map[string]string{}
		for _, d := range p.DnatRules {
			owner[d.Id] = d.Mapping
		}
		for _, s := range p.SnatRules {
			owner[s.Id] = s.Mapping
		}
		for _, m := range p.MarkRules {
			owner[m.Id] = m.Mapping
		}
		links, returns := map[string]bool{}, map[string]bool{}
		for _, l := range p.Links {
			links[l.Name] = true
		}
		for _, rp := range p.ReturnPaths {
			returns[rp.Id] = true
		}
		indexed := 0
		for key, mi := range r.Index[node] {
			if mi.Mapping.String() != key {
				t.Errorf("%s: index key %s holds mapping %s", node, key, mi.Mapping)
			}
			for _, e := range mi.Entries {
				indexed++
				if owner[e.ID] != key {
					t.Errorf("%s: %s indexes %s, which the program gives to %q", node, key, e.ID, owner[e.ID])
				}
			}
			for _, l := range mi.Links {
				if !links[l] {
					t.Errorf("%s: %s uses link %s the program lacks", node, key, l)
				}
			}
			for _, rp := range mi.ReturnPaths {
				if !returns[rp] {
					t.Errorf("%s: %s uses return path %s the program lacks", node, key, rp)
				}
			}
		}
		if indexed != len(owner) {
			t.Errorf("%s: index has %d entries, program %d", node, indexed, len(owner))
		}
	}
}

// TestIndexServingNode: the index carries the serving node compile chose
// (docs/design/api.md#portmap): the endpoint's node when it accepts, else the class's first
// accepting node by name.
func TestIndexServingNode(t *testing.T) {
	podAccepts := multiWorld()
	podAccepts.Classes["intranet"] = multiClass(map[string][]string{"edge-a": {"enp1s0"}, "worker-b": {"eth0"}})
	podElsewhere := multiWorld()
	podElsewhere.Classes["intranet"] = multiClass(map[string][]string{"worker-c": {"eth0"}, "edge-a": {"enp1s0"}})
	for _, tc := range []struct {
		name string
		s    *Snapshot
		want string
	}{
		{"single, remote pod", world(mkPortMap("remote", 0, 3000)), "edge-a"},
		{"multi, pod on an accepting node", podAccepts, "worker-b"},
		{"multi, pod elsewhere", podElsewhere, "edge-a"},
	} {
		r := Compile(tc.s)
		carried := r.PortMaps[types.NamespacedName{Namespace: "demo", Name: "remote"}].Nodes
		if len(carried) == 0 {
			t.Fatalf("%s: no node carries demo/remote", tc.name)
		}
		for _, node := range carried {
			if got := r.Index[node]["demo/remote"].ServingNode; got != tc.want {
				t.Errorf("%s: %s indexes serving node %q, want %q", tc.name, node, got, tc.want)
			}
		}
	}
}
