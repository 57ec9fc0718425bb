package datapath

import (
	"errors"
	"fmt"
	"slices"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Validate checks a whole program without touching the kernel: every entry Apply would
// refuse before writing anything (an invalid DNAT, SNAT or mark entry, an id used twice, a
// key another entry holds with other data, an invalid or repeated link, a return path that
// is invalid, repeats an id or table, or names a link the program lacks). It returns nil for
// a program Apply can write whole, else the join of one *EntryError per refused entry, each
// naming the entry by id (a link by name), in program order (see EntryErrors).
//
// It is the one place a program is validated: Apply skips exactly these entries and writes
// the rest, and the agent refuses a program Validate rejects whole, before calling Apply, so
// a peer cannot get part of an invalid program into the kernel.
func Validate(p *kuportv1.NodeProgram) error {
	_, errs := planTable(p)
	return validation(p, errs)
}

// Validate is the package's Validate through d's planner (incremental.go): a program that
// differs from the last one d planned in a few entries renders only those, and the Apply
// of it that follows renders nothing again. The agent validates with it. As with Apply, p
// must not be modified after the call.
func (d *Datapath) Validate(p *kuportv1.NodeProgram) error {
	d.lock()
	defer d.mu.Unlock()
	_, errs := d.plan(p)
	return validation(p, errs)
}

// validation joins the entries' errors with those of the links and return paths.
func validation(p *kuportv1.NodeProgram, entryErrs []error) error {
	_, _, linkErrs := planLinks(p)
	return errors.Join(append(slices.Clone(entryErrs), linkErrs...)...)
}

// planLinks validates the program's links and (planReturns) return paths: the valid
// links by name, the valid return paths in program order, and one *EntryError per invalid
// one.
func planLinks(p *kuportv1.NodeProgram) (links []*wantLink, returns []*wantReturn, errs []error) {
	names := map[string]bool{}
	for _, l := range p.GetLinks() {
		w, err := planLink(l)
		if err == nil && names[w.name] {
			err = fmt.Errorf("name used by another link")
		}
		names[l.GetName()] = true
		if err != nil {
			errs = append(errs, &EntryError{Kind: "link", ID: l.GetName(), Err: err})
			continue
		}
		links = append(links, w)
	}
	returns, rerrs := planReturns(p)
	return links, returns, append(errs, rerrs...)
}
