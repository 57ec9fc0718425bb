package compile

import (
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// classEdits are the classes an update replaces: by name, the new object. Only a class that
// builds no links before and after (a returnPath other than Vxlan, no link claim recorded)
// is edited in place; its mappings are then recompiled like changed PortMaps, and any
// conflict with another class's mappings, or among its own, falls back to a full compile.
type classEdits map[string]*v1alpha1.PortMapClass

// changedClasses returns the classes ch says changed from the previous snapshot to s, or ok
// false when one cannot be edited in place: created or deleted, or building links before or
// after.
func (inc *Incremental) changedClasses(s *Snapshot, ch *Changes) (classEdits, bool) {
	c := inc.c
	edits := classEdits{}
	for name := range ch.Classes {
		obj, old := s.Classes[name], c.classes[name]
		if obj == nil || old == nil || !linkless(old.obj) || !linkless(obj) || len(old.claims) > 0 ||
			!obj.CreationTimestamp.Equal(&old.obj.CreationTimestamp) {
			return nil, false
		}
		edits[name] = obj
	}
	return edits, true
}

// linkless: the class builds no links and records no claim.
func linkless(cl *v1alpha1.PortMapClass) bool {
	return cl.Spec.ReturnPath.Mode.OrDefault() != v1alpha1.ReturnPathVxlan && len(cl.Status.Links) == 0
}

// classMappings are the PortMaps of the edited classes, recompiled with the dirty ones.
func (inc *Incremental) classMappings(edits classEdits) []types.NamespacedName {
	if len(edits) == 0 {
		// Most updates edit no class: no scan of every plan.
		return nil
	}
	var out []types.NamespacedName
	for k, p := range inc.plans {
		if _, ok := edits[p.pm.Spec.ClassName]; ok {
			out = append(out, k)
		}
	}
	return out
}

// apply puts the edited classes in the compiler's state, in place of the old ones (their
// mappings are removed already).
func (edits classEdits) apply(c *compiler) {
	for name, obj := range edits {
		ci := newClassInfo(name, obj, c.nodes)
		c.classes[name] = ci
		i := slices.IndexFunc(c.classOrder, func(x *classInfo) bool { return x.name == name })
		c.classOrder[i] = ci
	}
}

// statuses writes the edited classes' statuses into r (a copy of the previous result's) and
// records what the next update reads of all classes' (settled, classStamped).
func (edits classEdits) statuses(inc *Incremental, r *Result) {
	if len(edits) == 0 {
		return
	}
	c := inc.c
	r.Classes = maps.Clone(r.Classes)
	for name := range edits {
		r.Classes[name] = c.classStatus(c.classes[name])
	}
	inc.settled, inc.classStamped = true, false
	for _, ci := range c.classOrder {
		inc.classStamped = inc.classStamped || stampedConditions(ci.obj.Status.Conditions, r.Classes[ci.name].Conditions)
		inc.settled = inc.settled && equality.Semantic.DeepEqual(ci.obj.Status.Links, r.Classes[ci.name].Links)
	}
}
