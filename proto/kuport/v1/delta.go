package kuportv1

import (
	"fmt"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Delta is the ProgramDelta from base to next: next's own fields, the list elements added or
// changed (compared by identity first, then by content) and the keys of those removed. It
// reads every field of NodeProgram by reflection, so a field added to the program travels in
// deltas too; a keyed list is diffed through its typed accessors (keyedLists), which every
// keyed list has (TestKeyedListsCoverEveryList). A list is diffed when both programs hold it
// sorted by key (id, else name), as compile emits them, and sent whole otherwise.
func Delta(base, next *NodeProgram) *ProgramDelta {
	d := &ProgramDelta{BaseVersion: base.GetVersion(), Changed: &NodeProgram{}, Removed: map[string]*Keys{}}
	nb, nn, nc := base.ProtoReflect(), next.ProtoReflect(), d.Changed.ProtoReflect()
	fields := nn.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if !f.IsList() || f.Message() == nil {
			if nn.Has(f) {
				nc.Set(f, nn.Get(f))
			}
			continue
		}
		if ops, keyed := keyedLists[f.Name()]; keyed {
			if removed, ok := ops.diff(base, next, d.Changed); ok {
				if len(removed) > 0 {
					d.Removed[string(f.Name())] = &Keys{Keys: removed}
				}
				continue
			}
		}
		// Sent whole: Apply rebuilds a keyed list sorted by key.
		if !listsEqual(nb.Get(f).List(), nn.Get(f).List()) {
			nc.Set(f, nn.Get(f))
			d.Replaced = append(d.Replaced, string(f.Name()))
		}
	}
	return d
}

// Apply returns the program d makes of base, which must be the program of d's base version;
// base is not modified (the result shares its unchanged elements). A keyed list is merged
// through its typed accessors (keyedLists), not element by element through reflection, which
// cost most of a one-mapping delta (BENCHMARKS.md, "The agent's path for one change at 10,000").
func (d *ProgramDelta) Apply(base *NodeProgram) (*NodeProgram, error) {
	if base.GetVersion() != d.GetBaseVersion() {
		return nil, fmt.Errorf("delta to version %d is from version %d, not %d", d.GetChanged().GetVersion(), d.GetBaseVersion(), base.GetVersion())
	}
	out := &NodeProgram{}
	nb, nc, no := base.ProtoReflect(), d.GetChanged().ProtoReflect(), out.ProtoReflect()
	fields := no.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if !f.IsList() || f.Message() == nil {
			if nc.Has(f) {
				no.Set(f, nc.Get(f))
			}
			continue
		}
		replaced := slices.Contains(d.GetReplaced(), string(f.Name()))
		ops, keyed := keyedLists[f.Name()]
		if !keyed || replaced || !nc.Has(f) && d.GetRemoved()[string(f.Name())] == nil {
			// Unkeyed lists only ever travel whole, and a list the delta does not touch is
			// base's as it is, in its order: base's stands unless replaced.
			src := nb
			if replaced {
				src = nc
			}
			if src.Has(f) {
				no.Set(f, src.Get(f))
			}
			continue
		}
		ops.merge(base, d.GetChanged(), out, d.GetRemoved()[string(f.Name())].GetKeys())
	}
	return out, nil
}

// keyedLists are the typed accessors of each keyed list of NodeProgram, by its field name: the
// lists whose elements are known by an id, else a name (TestKeyedListsCoverEveryList). Any
// other list travels whole.
var keyedLists = map[protoreflect.Name]listOps{
	"dnat_rules":   keyedList((*NodeProgram).GetDnatRules, func(p *NodeProgram, l []*DnatRule) { p.DnatRules = l }, (*DnatRule).GetId),
	"snat_rules":   keyedList((*NodeProgram).GetSnatRules, func(p *NodeProgram, l []*SnatRule) { p.SnatRules = l }, (*SnatRule).GetId),
	"mark_rules":   keyedList((*NodeProgram).GetMarkRules, func(p *NodeProgram, l []*MarkRule) { p.MarkRules = l }, (*MarkRule).GetId),
	"links":        keyedList((*NodeProgram).GetLinks, func(p *NodeProgram, l []*Link) { p.Links = l }, (*Link).GetName),
	"return_paths": keyedList((*NodeProgram).GetReturnPaths, func(p *NodeProgram, l []*ReturnPath) { p.ReturnPaths = l }, (*ReturnPath).GetId),
}

// listOps diffs and merges one keyed list.
type listOps struct {
	// diff sets out's list to next's elements added or changed since base, in key order, and
	// returns the keys of base's elements next lacks; false, and nothing set, when either
	// list is not sorted by key.
	diff func(base, next, out *NodeProgram) (removed []string, ok bool)
	// merge sets out's list to base's with removed's keys taken out and changed's elements
	// in, sorted by key.
	merge func(base, changed, out *NodeProgram, removed []string)
}

// keyedList is the listOps of the list read with get, written with set, known by key.
func keyedList[T proto.Message](get func(*NodeProgram) []T, set func(*NodeProgram, []T), key func(T) string) listOps {
	return listOps{
		diff: func(base, next, out *NodeProgram) ([]string, bool) {
			bl, nl := get(base), get(next)
			if !sorted(bl, key) || !sorted(nl, key) {
				return nil, false
			}
			var removed []string
			var changed []T
			for i, j := 0, 0; i < len(bl) || j < len(nl); {
				var kb, kn string
				if i < len(bl) {
					kb = key(bl[i])
				}
				if j < len(nl) {
					kn = key(nl[j])
				}
				switch {
				case j >= len(nl) || i < len(bl) && kb < kn:
					removed = append(removed, kb)
					i++
				case i >= len(bl) || kn < kb:
					changed = append(changed, nl[j])
					j++
				default:
					if any(bl[i]) != any(nl[j]) && !proto.Equal(bl[i], nl[j]) {
						changed = append(changed, nl[j])
					}
					i, j = i+1, j+1
				}
			}
			if len(changed) > 0 {
				set(out, changed)
			}
			return removed, true
		},
		merge: func(base, changed, out *NodeProgram, removed []string) {
			bl, cl := get(base), get(changed)
			merged, ok := mergeSorted(bl, cl, removed, key)
			if !ok {
				merged = mergeByKey(bl, cl, removed, key)
			}
			if len(merged) > 0 {
				set(out, merged)
			}
		},
	}
}

// mergeSorted is base with removed's keys taken out and changed's elements in, by key, in one
// walk of both lists: the sender diffs a list only when both programs hold it sorted by key,
// and Delta emits changed in key order. ok is false, and the result meaningless, when the
// merge does not come out strictly increasing (the lists were not sorted).
func mergeSorted[T any](base, changed []T, removed []string, key func(T) string) (out []T, ok bool) {
	gone := make(map[string]bool, len(removed))
	for _, k := range removed {
		gone[k] = true
	}
	out = make([]T, 0, len(base)+len(changed))
	last := ""
	add := func(k string, v T) bool {
		if len(out) > 0 && k <= last {
			return false
		}
		out, last = append(out, v), k
		return true
	}
	for i, j := 0, 0; i < len(base) || j < len(changed); {
		var kb, kc string
		if i < len(base) {
			kb = key(base[i])
		}
		if j < len(changed) {
			kc = key(changed[j])
		}
		switch {
		case j >= len(changed) || i < len(base) && kb < kc:
			if !gone[kb] && !add(kb, base[i]) {
				return nil, false
			}
			i++
		default:
			// changed's element, replacing base's of the same key.
			if !add(kc, changed[j]) {
				return nil, false
			}
			if i < len(base) && kb == kc {
				i++
			}
			j++
		}
	}
	return out, true
}

// mergeByKey is mergeSorted for lists in any order: the result sorted by key.
func mergeByKey[T any](base, changed []T, removed []string, key func(T) string) []T {
	merged := make(map[string]T, len(base)+len(changed))
	for _, v := range base {
		merged[key(v)] = v
	}
	for _, k := range removed {
		delete(merged, k)
	}
	for _, v := range changed {
		merged[key(v)] = v
	}
	keys := slices.Sorted(maps.Keys(merged))
	out := make([]T, 0, len(keys))
	for _, k := range keys {
		out = append(out, merged[k])
	}
	return out
}

// sorted reports whether l's keys strictly increase.
func sorted[T any](l []T, key func(T) string) bool {
	for i := 1; i < len(l); i++ {
		if key(l[i-1]) >= key(l[i]) {
			return false
		}
	}
	return true
}

// sameMessage compares two list elements by identity, then by content.
func sameMessage(a, b protoreflect.Value) bool {
	am, bm := a.Message().Interface(), b.Message().Interface()
	return am == bm || proto.Equal(am, bm)
}

func listsEqual(a, b protoreflect.List) bool {
	if a.Len() != b.Len() {
		return false
	}
	for i := range a.Len() {
		if !sameMessage(a.Get(i), b.Get(i)) {
			return false
		}
	}
	return true
}
