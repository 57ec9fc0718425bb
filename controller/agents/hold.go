package agents

import (
	"time"

	"kuport.wlz.li/kuport/controller/programmed"
)

// The startup hold (docs/design/software.md#leadership): programs stay back until every node
// the classes name said Hello, or the hold times out.

// DefaultHold is how long after a controller start programs are held back while nodes that
// classes name have not said Hello yet (see Registry.Release).
const DefaultHold = 15 * time.Second

// Release ends the startup hold (docs/design/software.md#leadership: after a restart an agent
// that reconnects first must not be handed a program missing its peer's link, which would
// make it tear a live link down). unheard are the nodes the caller expects whose agents'
// state the programs it just stored were compiled without (programmed.Unheard): the hold
// lasts while Term(unheard, now).Holding(). It reports whether the hold is over; when the
// caller looks again is timing.Decide's (its Term's HoldUntil).
func (r *Registry) Release(unheard []string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return true
	}
	if r.termLocked(unheard, now).Holding() {
		r.log.Info("holding programs until every node said hello", "missing", unheard, "until", r.holdUntil)
		return false
	}
	r.released = true
	r.log.Info("releasing programs", "missing", unheard)
	for _, n := range r.nodes {
		if n.session != nil {
			wake(n.session)
		}
	}
	return true
}

// Term returns this term's startup hold as of now, with unheard as the nodes the last
// compile had no state from (programmed.Unheard).
func (r *Registry) Term(unheard []string, now time.Time) programmed.Term {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.termLocked(unheard, now)
}

func (r *Registry) termLocked(unheard []string, now time.Time) programmed.Term {
	return programmed.Term{Now: now, HoldUntil: r.holdUntil, Released: r.released, Unheard: unheard}
}
