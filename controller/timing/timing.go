// Package timing decides when the controller's workers act: one pure function, Decide, of
// where a worker is, the startup hold (programmed.Term), whether the classes record a
// compile's link claims, whether storing its programs changed any, the due times and the
// nodes that have not acknowledged their program yet. It returns what to write now, what to
// put off and when to look again (docs/design/software.md#scale and
// docs/design/api.md#when-status-is-written say why each wait exists).
//
// It holds no state, takes the time as a value and queues nothing: the compile worker
// (controller/worker.go) and the status workers (controller/statuses.go) gather the inputs,
// call Decide and act on the Decision.
package timing

import (
	"time"

	"kuport.wlz.li/kuport/controller/programmed"
)

const (
	// CompileWindow: compiles start at least this far apart. A change after a quiet spell
	// compiles at once; the events of a burst wait at most this long and leave together, as
	// one program version (BENCHMARKS.md, "Bulk and N = 10,000": a thousand PortMaps applied
	// at once otherwise reached the agent as hundreds of program versions). While a burst of
	// PortMap arrivals puts status writes off, the worker looks at it again this often.
	CompileWindow = 50 * time.Millisecond
	// ResyncPeriod: the worker compiles again this long after every compile even without
	// events, so link claims age (unusedSince, LinkRetention) and a missed event heals.
	ResyncPeriod = time.Minute
)

// Step is where a worker is when it asks Decide.
type Step int

const (
	// CompileAsked: the worker took a compile off its queue (an event, the resync, the
	// startup hold's end).
	CompileAsked Step = iota + 1
	// Compiled: it compiled; the programs are not stored yet.
	Compiled
	// Stored: it stored the compile's programs, and the registry pushes those that changed.
	Stored
	// ClassStatusAsked: an agent acknowledged a version, or the class statuses put off behind
	// a push fell due.
	ClassStatusAsked
	// BurstAsked: a status worker put a write off behind a burst of PortMap arrivals, or the
	// compile worker handed back the writes put off behind it.
	BurstAsked
	// StatusAsked: a status worker has a PortMap's verdict (programmed.Decide) to write.
	StatusAsked
)

// Input is what Decide reads; each field says at which steps it counts.
type Input struct {
	At  Step
	Now time.Time
	// LastCompile is when the last compile started; zero before the first (CompileAsked).
	LastCompile time.Time
	// Startup is the term's startup hold as of the compile's snapshot, Startup.Now (Compiled,
	// Stored): the times it bounds count from Startup.Now, not Now.
	Startup programmed.Term
	// FirstCompile: no compile came before this one; WasHolding: the one before found the
	// startup hold on (Stored).
	FirstCompile, WasHolding bool
	// ClaimsRecorded: every class's object records the link claims of the compile's class
	// status (Compiled, Stored).
	ClaimsRecorded bool
	// ProgramsChanged: storing the compile's programs changed some node's, whose push is
	// under way (Stored).
	ProgramsChanged bool
	// ClassStatusDue is when the class statuses put off behind an earlier push are written
	// even without its acknowledgements; zero when none is put off (Stored, ClassStatusAsked).
	ClassStatusDue time.Time
	// ClassStatusWait is the longest a class status write is put off behind a push (Stored).
	ClassStatusWait time.Duration
	// Unacknowledged counts the connected nodes that have not acknowledged their current
	// program: the push still under way (ClassStatusAsked).
	Unacknowledged int
	// BurstOn: a burst of PortMap arrivals is on and puts status writes off (BurstAsked).
	BurstOn bool
	// AckGrace is how long the verdict may wait for the acknowledgements it awaits
	// (programmed.Verdict.MayWait; 0: it may not), counted from AckWaitSince, when the
	// PortMap's verdict first could wait (StatusAsked).
	AckGrace     time.Duration
	AckWaitSince time.Time
}

// Statuses says which PortMaps' statuses the worker decides again after a compile.
type Statuses int

const (
	// StatusesNone: the startup hold keeps every status write back.
	StatusesNone Statuses = iota
	// StatusesChanged: those whose compiled result changed, and those the registry touched.
	StatusesChanged
	// StatusesAll: every PortMap's, after the first compile or the startup hold's end.
	StatusesAll
)

// Decision is Decide's answer. The durations say when a worker's queue hands it the key again,
// counted from Now (from Startup.Now for what the startup hold bounds); zero: no need.
type Decision struct {
	// Compile: compile now (CompileAsked).
	Compile bool
	// WriteStatus: write the PortMap's verdict now (StatusAsked).
	WriteStatus bool
	// WriteClassStatuses: write the class statuses now: at Compiled before the programs are
	// stored (they carry link claims the classes do not record, and no program may use a
	// claim before it is recorded); at Stored the compile's, nothing being put off; at
	// ClassStatusAsked those put off behind a push.
	WriteClassStatuses bool
	// ClassStatusDue is the put-off's due time from now on; zero when none is put off
	// (Stored).
	ClassStatusDue time.Time
	// Statuses are the PortMap statuses to decide again (Stored).
	Statuses Statuses
	// CompileAfter: the compile's window (CompileAsked), or the startup hold's timeout and the
	// resync, whichever comes first (Stored).
	CompileAfter time.Duration
	// StatusAllAfter: the settling the startup hold bounds ends then; every status is decided
	// again (Stored).
	StatusAllAfter time.Duration
	// ClassStatusAfter: the class statuses put off behind a push are due then.
	ClassStatusAfter time.Duration
	// BurstAfter: look at the status writes put off behind a burst again then.
	BurstAfter time.Duration
	// StatusAfter: the PortMap's verdict, put off for acknowledgements, is written then
	// unless one comes first (StatusAsked).
	StatusAfter time.Duration
}

// Decide decides what a worker writes now, what it puts off and when it looks again, at the
// step in.At:
//   - CompileAsked: compile now after a quiet spell, else once CompileWindow has passed since
//     the last compile started, so a burst's events leave together;
//   - Compiled: while the startup hold is on nothing is written; otherwise the class
//     statuses go before the programs when the classes do not record their claims;
//   - Stored: the compile's class statuses are put off behind the push its programs made
//     (until every connected agent acknowledged it, ClassStatusWait at the latest; an
//     earlier put-off keeps its due time, so a stream of pushes cannot starve it), else
//     written now; the worker compiles again at the startup hold's timeout or ResyncPeriod,
//     and decides every status again when the settling the hold bounds is over;
//   - ClassStatusAsked: the class statuses put off are written once no connected node has the
//     push unacknowledged, or at their due time;
//   - BurstAsked: while a burst is on, look at it again every CompileWindow;
//   - StatusAsked: a PortMap's verdict that may wait for acknowledgements is put off until
//     AckGrace has passed since it first could (the acknowledgement's True, written at
//     once, normally comes first), else written now.
func Decide(in Input) Decision {
	switch in.At {
	case CompileAsked:
		if in.LastCompile.IsZero() {
			return Decision{Compile: true}
		}
		wait := in.LastCompile.Add(CompileWindow).Sub(in.Now)
		return Decision{Compile: wait <= 0, CompileAfter: max(wait, 0)}
	case Compiled:
		return Decision{WriteClassStatuses: !in.Startup.Holding() && !in.ClaimsRecorded}
	case Stored:
		return stored(in)
	case ClassStatusAsked:
		switch {
		case in.ClassStatusDue.IsZero():
			return Decision{}
		case in.Now.Before(in.ClassStatusDue) && in.Unacknowledged > 0:
			return Decision{ClassStatusAfter: in.ClassStatusDue.Sub(in.Now)}
		}
		return Decision{WriteClassStatuses: true}
	case BurstAsked:
		if in.BurstOn {
			return Decision{BurstAfter: CompileWindow}
		}
	case StatusAsked:
		if wait := in.AckWaitSince.Add(in.AckGrace).Sub(in.Now); in.AckGrace > 0 && wait > 0 {
			return Decision{StatusAfter: wait}
		}
		return Decision{WriteStatus: true}
	}
	return Decision{}
}

// stored is Decide at Stored.
func stored(in Input) Decision {
	term := in.Startup
	d := Decision{ClassStatusDue: in.ClassStatusDue, CompileAfter: ResyncPeriod}
	if term.Now.Before(term.HoldUntil) {
		// Settling ends with the hold: what it kept must be decided again then.
		d.StatusAllAfter = term.HoldUntil.Sub(term.Now)
	}
	if term.Holding() {
		d.CompileAfter = min(d.CompileAfter, term.HoldUntil.Sub(term.Now))
		return d
	}
	d.Statuses = StatusesChanged
	if in.FirstCompile || in.WasHolding {
		d.Statuses = StatusesAll
	}
	if !in.ClaimsRecorded {
		return d // written before the programs were stored
	}
	if in.ProgramsChanged && d.ClassStatusDue.IsZero() {
		d.ClassStatusDue = in.Now.Add(in.ClassStatusWait)
		d.ClassStatusAfter = in.ClassStatusWait
	}
	d.WriteClassStatuses = d.ClassStatusDue.IsZero()
	return d
}
