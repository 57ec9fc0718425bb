package timing

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"kuport.wlz.li/kuport/controller/programmed"
)

func TestDecide(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	holdUntil := t0.Add(15 * time.Second)
	// holding: a node the classes name has not been heard; settling: the hold released, its
	// time not over; settled: both over.
	holding := programmed.Term{Now: t0.Add(5 * time.Second), HoldUntil: holdUntil, Unheard: []string{"worker-b"}}
	settling := programmed.Term{Now: t0.Add(5 * time.Second), HoldUntil: holdUntil, Released: true}
	settled := programmed.Term{Now: t0.Add(time.Hour), HoldUntil: holdUntil, Released: true}
	due := t0.Add(time.Hour + time.Second)
	// stored is a compile stored after the hold, claims recorded and no program changed.
	stored := func(f func(*Input)) Input {
		in := Input{At: Stored, Now: t0.Add(time.Hour), Startup: settled, ClaimsRecorded: true, ClassStatusWait: time.Second}
		f(&in)
		return in
	}
	for _, tc := range []struct {
		name string
		in   Input
		want Decision
	}{
		{"first compile: at once", Input{At: CompileAsked, Now: t0}, Decision{Compile: true}},
		{"a compile after a quiet spell: at once", Input{At: CompileAsked, Now: ms(1000), LastCompile: t0}, Decision{Compile: true}},
		{"a burst: the compile waits out the window", Input{At: CompileAsked, Now: ms(20), LastCompile: t0},
			Decision{CompileAfter: 30 * time.Millisecond}},
		{"now exactly at the window's end: at once", Input{At: CompileAsked, Now: ms(50), LastCompile: t0}, Decision{Compile: true}},

		{"startup hold: no class status before the programs", Input{At: Compiled, Startup: holding}, Decision{}},
		{"claims not recorded: class statuses first", Input{At: Compiled, Startup: settled}, Decision{WriteClassStatuses: true}},
		{"claims recorded: nothing before the programs", Input{At: Compiled, Startup: settled, ClaimsRecorded: true}, Decision{}},
		{"hold timed out: claims first", Input{At: Compiled, Startup: with(holding, func(t *programmed.Term) { t.Now = holdUntil })},
			Decision{WriteClassStatuses: true}},

		{"startup hold: nothing written, compile again at its timeout, decide every status then",
			stored(func(in *Input) { in.Startup, in.ProgramsChanged = holding, true }),
			Decision{CompileAfter: 10 * time.Second, StatusAllAfter: 10 * time.Second}},
		{"startup hold with a put-off: it keeps its due time",
			stored(func(in *Input) { in.Startup, in.ClassStatusDue = holding, due }),
			Decision{ClassStatusDue: due, CompileAfter: 10 * time.Second, StatusAllAfter: 10 * time.Second}},
		{"several due times, the earliest: the resync before a longer startup hold",
			stored(func(in *Input) {
				in.Startup = with(holding, func(t *programmed.Term) { t.HoldUntil = t.Now.Add(2 * ResyncPeriod) })
			}),
			Decision{CompileAfter: ResyncPeriod, StatusAllAfter: 2 * ResyncPeriod}},
		{"the hold released: every status, settling still bounded",
			stored(func(in *Input) { in.Startup, in.WasHolding = settling, true }),
			Decision{WriteClassStatuses: true, Statuses: StatusesAll, CompileAfter: ResyncPeriod, StatusAllAfter: 10 * time.Second}},
		{"now exactly at the hold's end: settled, nothing left to decide then",
			stored(func(in *Input) { in.Startup = with(holding, func(t *programmed.Term) { t.Now = holdUntil }) }),
			Decision{WriteClassStatuses: true, Statuses: StatusesChanged, CompileAfter: ResyncPeriod}},
		{"first compile: every status", stored(func(in *Input) { in.FirstCompile = true }),
			Decision{WriteClassStatuses: true, Statuses: StatusesAll, CompileAfter: ResyncPeriod}},
		{"nothing pushed, nothing put off: class statuses now", stored(func(*Input) {}),
			Decision{WriteClassStatuses: true, Statuses: StatusesChanged, CompileAfter: ResyncPeriod}},
		{"a push: class statuses put off behind it", stored(func(in *Input) { in.ProgramsChanged = true }),
			Decision{ClassStatusDue: t0.Add(time.Hour + time.Second), Statuses: StatusesChanged, CompileAfter: ResyncPeriod,
				ClassStatusAfter: time.Second}},
		{"another push: the earlier put-off keeps its due time",
			stored(func(in *Input) { in.ProgramsChanged, in.ClassStatusDue = true, t0.Add(time.Hour+500*time.Millisecond) }),
			Decision{ClassStatusDue: t0.Add(time.Hour + 500*time.Millisecond), Statuses: StatusesChanged, CompileAfter: ResyncPeriod}},
		{"no push, an earlier put-off: left to its acknowledgements",
			stored(func(in *Input) { in.ClassStatusDue = due }),
			Decision{ClassStatusDue: due, Statuses: StatusesChanged, CompileAfter: ResyncPeriod}},
		{"claims written first: nothing put off after the push",
			stored(func(in *Input) { in.ClaimsRecorded, in.ProgramsChanged = false, true }),
			Decision{Statuses: StatusesChanged, CompileAfter: ResyncPeriod}},

		{"nothing pending: nothing written, no look again", Input{At: ClassStatusAsked, Now: t0, Unacknowledged: 3}, Decision{}},
		{"an unacknowledged node: the put-off waits until its due time",
			Input{At: ClassStatusAsked, Now: due.Add(-300 * time.Millisecond), ClassStatusDue: due, Unacknowledged: 1},
			Decision{ClassStatusAfter: 300 * time.Millisecond}},
		{"every node acknowledged: written before its due time",
			Input{At: ClassStatusAsked, Now: due.Add(-300 * time.Millisecond), ClassStatusDue: due},
			Decision{WriteClassStatuses: true}},
		{"now exactly at the due time: written though a node has not acknowledged",
			Input{At: ClassStatusAsked, Now: due, ClassStatusDue: due, Unacknowledged: 1}, Decision{WriteClassStatuses: true}},

		{"a burst on: look at it again a window later", Input{At: BurstAsked, BurstOn: true}, Decision{BurstAfter: CompileWindow}},
		{"the burst over: no look again", Input{At: BurstAsked}, Decision{}},

		{"a verdict that may not wait: written", Input{At: StatusAsked, Now: t0}, Decision{WriteStatus: true}},
		{"awaiting an unacknowledged node: put off for the whole grace",
			Input{At: StatusAsked, Now: t0, AckGrace: time.Second, AckWaitSince: t0}, Decision{StatusAfter: time.Second}},
		{"still awaiting it: put off what is left of the grace, counted from the first wait",
			Input{At: StatusAsked, Now: ms(400), AckGrace: time.Second, AckWaitSince: t0}, Decision{StatusAfter: 600 * time.Millisecond}},
		{"now exactly at the grace's end: written",
			Input{At: StatusAsked, Now: ms(1000), AckGrace: time.Second, AckWaitSince: t0}, Decision{WriteStatus: true}},
		{"long past the grace: written", Input{At: StatusAsked, Now: ms(2000), AckGrace: time.Second, AckWaitSince: t0},
			Decision{WriteStatus: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Decide(tc.in)); diff != "" {
				t.Errorf("Decide (-want +got):\n%s", diff)
			}
		})
	}
}

func with(t programmed.Term, f func(*programmed.Term)) programmed.Term { f(&t); return t }
