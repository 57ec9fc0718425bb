package controller

import "kuport.wlz.li/kuport/api/v1alpha1"

// settledClasses remembers what was last found of each class's status against the cached
// object, so that a compile that changed neither (the same compiled status, by pointer:
// compile.Incremental keeps an untouched class's; the same cached object: no event since)
// does not compare them again. Comparing a class status of 1,000 node rows
// (equality.Semantic, by reflection) once for every compile the agents' acknowledgements and
// the PortMaps' status echoes set off cost much of the controller's CPU over a class change
// (BENCHMARKS.md, "Figures moved out of code comments").
type settledClasses map[string]settledClass

type settledClass struct {
	obj *v1alpha1.PortMapClass
	st  *v1alpha1.PortMapClassStatus
	// what holds of the pair.
	what settledWhat
}

type settledWhat uint8

const (
	// claimsEqual: the object records the status's link claims (Controller.claimsRecorded).
	claimsEqual settledWhat = 1 << iota
	// statusWritten: status.Writer.Class found the status written, by this Writer or before
	// (it wrote it, or found nothing to write), and finds so again for the same pair.
	statusWritten
)

// known reports whether what holds of the class's pair (obj, st).
func (s settledClasses) known(name string, obj *v1alpha1.PortMapClass, st *v1alpha1.PortMapClassStatus, what settledWhat) bool {
	p, ok := s[name]
	return ok && p.obj == obj && p.st == st && p.what&what != 0
}

// set records that what holds of the pair (obj, st), forgetting what held of another pair.
func (s *settledClasses) set(name string, obj *v1alpha1.PortMapClass, st *v1alpha1.PortMapClassStatus, what settledWhat) {
	if *s == nil {
		*s = settledClasses{}
	}
	p := (*s)[name]
	if p.obj != obj || p.st != st {
		p = settledClass{obj: obj, st: st}
	}
	p.what |= what
	(*s)[name] = p
}

// keep forgets the classes compile no longer gives a status.
func (s settledClasses) keep(classes map[string]*v1alpha1.PortMapClassStatus) {
	for name := range s {
		if classes[name] == nil {
			delete(s, name)
		}
	}
}
