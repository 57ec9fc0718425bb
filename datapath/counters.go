package datapath

import (
	"slices"
	"strings"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Counters returns the packets and bytes the kernel counted for every program entry, one
// Counter per entry id (the comment of the elements that render it), sorted by id: the
// sum over the entry's elements (one per port) of the set they are in. A DNAT entry's
// kup-pre elements count its new flows, its kup-count-in and kup-count-out elements fill
// forwarded_in and forwarded_out. An element two entries share counts under the entry it
// carries the id of (compileTable), and the other reports none.
func (d *Datapath) Counters() ([]*kuportv1.Counter, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	kt, err := d.readKernel()
	if err != nil || kt == nil {
		return nil, err
	}
	l := kt.layout()
	t, _, counters := kt.view(l)
	byID := map[string]*kuportv1.Counter{}
	for _, s := range l.sets {
		for k, e := range t.elems[s.name] {
			c := counters[s.name][k]
			// A steering element counts the new flows its DNAT element counts again.
			if c == nil || e.id == "" || s.role == roleSteer {
				continue
			}
			ctr := byID[e.id]
			if ctr == nil {
				ctr = &kuportv1.Counter{Id: e.id}
				byID[e.id] = ctr
			}
			switch s.role {
			case roleCountIn:
				if ctr.ForwardedIn == nil {
					ctr.ForwardedIn = &kuportv1.Traffic{}
				}
				ctr.ForwardedIn.Packets += c.Packets
				ctr.ForwardedIn.Bytes += c.Bytes
			case roleCountOut:
				if ctr.ForwardedOut == nil {
					ctr.ForwardedOut = &kuportv1.Traffic{}
				}
				ctr.ForwardedOut.Packets += c.Packets
				ctr.ForwardedOut.Bytes += c.Bytes
			default:
				ctr.Packets += c.Packets
				ctr.Bytes += c.Bytes
			}
		}
	}
	out := make([]*kuportv1.Counter, 0, len(byID))
	for _, c := range byID {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *kuportv1.Counter) int { return strings.Compare(a.Id, b.Id) })
	return out, nil
}
