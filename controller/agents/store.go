package agents

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"kuport.wlz.li/kuport/controller/compile"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// The program store: SetPrograms versions compile's programs per node, and per mapping the
// version at which its entries last changed (what an acknowledgement must reach).

// mappingVersion is the program version at which one mapping's entries on a node last changed.
type mappingVersion struct {
	version uint64
	digest  [sha256.Size]byte
	// index is compile's index of the mapping the digest was taken of: the entry ids, link
	// names and return path ids the mapping uses (uses), never nil.
	index *compile.MappingIndex
}

// uses reports whether id is one of the mapping's entry ids, link names or return path ids
// on the node (a handful: a scan of the index, which holds them once for every node).
func (mv *mappingVersion) uses(id string) bool {
	mi := mv.index
	return slices.ContainsFunc(mi.Entries, func(e compile.Entry) bool { return e.ID == id }) ||
		slices.Contains(mi.Links, id) || slices.Contains(mi.ReturnPaths, id)
}

// idList returns what uses accepts, sorted and without repeats.
func (mv *mappingVersion) idList() []string {
	mi := mv.index
	out := make([]string, 0, len(mi.Entries)+len(mi.Links)+len(mi.ReturnPaths))
	for _, e := range mi.Entries {
		out = append(out, e.ID)
	}
	out = append(append(out, mi.Links...), mi.ReturnPaths...)
	slices.Sort(out)
	return slices.Compact(out)
}

// SetPrograms stores compile's programs (content only: their version and epoch are
// ignored) and their index (compile.Result.Index), which says which entries, links and
// return paths of each program are a mapping's. A program given again by identity (the same
// pointer as last time) is taken as unchanged with its index: compile's results are never
// mutated. A node whose content differs from what it holds gets version previous+1 and, when
// its agent is connected and the startup hold is over, the new program is pushed. A node that
// had a program and is absent from programs gets an empty one (its agent clears its rules).
// It returns the names of the nodes whose program changed, sorted.
func (r *Registry) SetPrograms(programs map[string]*kuportv1.NodeProgram, index map[string]compile.NodeIndex) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var changed []string
	for name, n := range r.nodes {
		if _, ok := programs[name]; ok {
			continue
		}
		switch {
		case n.program != nil && !isEmpty(n.program):
			n.input = nil
			if r.storeLocked(name, n, &kuportv1.NodeProgram{}, nil) {
				changed = append(changed, name)
			}
		case n.session == nil:
			// A node compile no longer names (its Node object is gone), with nothing to
			// clear and no agent connected, is forgotten: ListNodes stops showing it.
			delete(r.nodes, name)
		}
	}
	for name, p := range programs {
		n := r.nodeLocked(name)
		if p != nil && p == n.input {
			// The very program stored last time (compile.Incremental shares what it did not
			// recompile): unchanged, with its index, and not worth a clone and a comparison.
			continue
		}
		n.input = p
		if p == nil {
			p = &kuportv1.NodeProgram{}
		}
		if r.storeLocked(name, n, p, index[name]) {
			changed = append(changed, name)
		}
	}
	slices.Sort(changed)
	if len(changed) > 0 {
		r.log.Debug("programs changed", "nodes", changed, "epoch", r.epoch)
	}
	return changed
}

// storeLocked stores p's content as n's program if it differs, with its index, and wakes n's
// stream. The stored program shares p's lists (compile never mutates a result, and nothing
// here does), and a mapping whose *compile.MappingIndex is the one stored before keeps its
// digest without one (compile.Incremental shares it only while the mapping's entries are the
// same): a change of one mapping among 10,000 on a node then costs no clone, no comparison
// and no digest of the others.
func (r *Registry) storeLocked(name string, n *node, p *kuportv1.NodeProgram, index compile.NodeIndex) bool {
	next := &kuportv1.NodeProgram{Node: name, Epoch: r.epoch, DnatRules: p.DnatRules, SnatRules: p.SnatRules,
		MarkRules: p.MarkRules, Links: p.Links, ReturnPaths: p.ReturnPaths, ReturnMarking: p.ReturnMarking}
	prev := n.program
	n.index = index
	if prev != nil {
		next.Version = prev.Version
		if sameProgram(next, prev) {
			// Unchanged: the new, equal lists take the place of the old (a new object, never
			// a stored one mutated) in the program, the stream's base and the mappings'
			// index, so a full compile's equal programs are held once, not beside the old.
			n.program = next
			if n.session != nil && n.session.base == prev {
				n.session.base = next
			}
			for m, mi := range index {
				if old := n.mappings[m]; old != nil {
					old.index = mi
				}
			}
			return false
		}
	}
	next.Version++
	n.program = next
	// A mapping's digest covers the links and return paths it uses: kept only while both
	// lists are the very same.
	sharedPaths := prev != nil && sameList(next.Links, prev.Links) && sameList(next.ReturnPaths, prev.ReturnPaths)
	for m := range n.mappings {
		if _, ok := index[m]; !ok {
			delete(n.mappings, m)
			r.touched[m] = true
		}
	}
	for m, mi := range index {
		old := n.mappings[m]
		if sharedPaths && old != nil && old.index == mi {
			continue
		}
		d := digestMapping(next, mi)
		if old != nil && old.digest == d.digest {
			old.index = mi
			continue
		}
		d.version = next.Version
		n.mappings[m] = d
		r.touched[m] = true
	}
	if r.released && n.session != nil {
		wake(n.session)
	}
	return true
}

// sameProgram reports whether two programs have the same content, comparing shared entries
// by identity first.
func sameProgram(a, b *kuportv1.NodeProgram) bool {
	return a.Node == b.Node && a.Version == b.Version && a.Epoch == b.Epoch &&
		equalList(a.DnatRules, b.DnatRules) && equalList(a.SnatRules, b.SnatRules) && equalList(a.MarkRules, b.MarkRules) &&
		equalList(a.Links, b.Links) && equalList(a.ReturnPaths, b.ReturnPaths) && proto.Equal(a.ReturnMarking, b.ReturnMarking)
}

func equalList[T proto.Message](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if any(a[i]) != any(b[i]) && !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// sameList reports whether two lists are the very same (one backing array, one length).
func sameList[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

func isEmpty(p *kuportv1.NodeProgram) bool {
	return len(p.DnatRules)+len(p.SnatRules)+len(p.MarkRules)+len(p.Links)+len(p.ReturnPaths) == 0
}

// digestMapping digests one mapping of a program's index: its entries, links and return
// paths as compile indexed them, so a change to any of them gives the mapping a new version.
func digestMapping(p *kuportv1.NodeProgram, mi *compile.MappingIndex) *mappingVersion {
	mv := &mappingVersion{index: mi}
	h := sha256.New()
	add := func(id string, m proto.Message) {
		// Deterministic marshalling of one message cannot fail for a valid message; a
		// failure still changes the digest, so it is never mistaken for "unchanged".
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			b = []byte(err.Error())
		}
		h.Write(binary.AppendUvarint(nil, uint64(len(b))))
		h.Write(b)
	}
	for _, e := range mi.Entries {
		switch e.Kind {
		case compile.KindDNAT:
			add(e.ID, find(p.DnatRules, e.ID, (*kuportv1.DnatRule).GetId))
		case compile.KindSNAT:
			add(e.ID, find(p.SnatRules, e.ID, (*kuportv1.SnatRule).GetId))
		case compile.KindMark:
			add(e.ID, find(p.MarkRules, e.ID, (*kuportv1.MarkRule).GetId))
		default:
			add(e.ID, nil)
		}
	}
	for _, name := range mi.Links {
		add(name, find(p.Links, name, (*kuportv1.Link).GetName))
	}
	for _, id := range mi.ReturnPaths {
		add(id, find(p.ReturnPaths, id, (*kuportv1.ReturnPath).GetId))
	}
	h.Sum(mv.digest[:0])
	return mv
}

// find returns the element of list whose key is id (nil if none): by binary search, as
// compile sorts every list by it, else by a scan.
func find[T proto.Message](list []T, id string, key func(T) string) proto.Message {
	if i, ok := slices.BinarySearchFunc(list, id, func(x T, id string) int { return strings.Compare(key(x), id) }); ok {
		return list[i]
	}
	for _, x := range list {
		if key(x) == id {
			return x
		}
	}
	return nil
}
