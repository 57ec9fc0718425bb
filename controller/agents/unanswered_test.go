package agents

import (
	"testing"
	"time"
)

func TestJudge(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// s builds a history of reports 5 s apart from pairs (requests, replies).
	s := func(pairs ...uint64) []Sample {
		var out []Sample
		for i := 0; i+1 < len(pairs); i += 2 {
			out = append(out, Sample{At: t0.Add(time.Duration(i/2) * 5 * time.Second), Requests: pairs[i], Replies: pairs[i+1]})
		}
		return out
	}
	w := Window{Reports: 3, Duration: 10 * time.Second}
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * 5 * time.Second) }
	for _, tc := range []struct {
		name    string
		history []Sample
		want    Verdict
	}{
		{"empty", nil, Verdict{}},
		{"one report of requests", s(10, 0), Verdict{}},
		{"requests with replies", s(0, 0, 5, 5, 9, 9, 20, 18, 30, 25), Verdict{}},
		{"no requests: idle", s(0, 0, 0, 0, 0, 0, 0, 0, 0, 0), Verdict{}},
		{"idle after answered requests", s(0, 0, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4), Verdict{}},
		{"requests without replies for the window", s(0, 0, 3, 0, 5, 0, 7, 0), Verdict{Unanswered: true, Since: at(1), Requests: 7}},
		{"one request then silence, no reply", s(0, 0, 1, 0, 1, 0, 1, 0, 1, 0), Verdict{Unanswered: true, Since: at(1), Requests: 1}},
		{"not yet the window: two reports", s(0, 0, 3, 0, 5, 0), Verdict{}},
		{"answered earlier, unanswered since", s(0, 0, 4, 4, 6, 4, 8, 4, 9, 4), Verdict{Unanswered: true, Since: at(2), Requests: 5}},
		{"replies resume: clears", s(0, 0, 3, 0, 5, 0, 7, 0, 9, 1), Verdict{}},
		{"replies resume, then idle", s(0, 0, 3, 0, 5, 0, 7, 0, 9, 1, 9, 1, 9, 1, 9, 1), Verdict{}},
		{"counter reset (agent restart) is no alarm", s(0, 0, 100, 100, 200, 200, 3, 0, 6, 2, 9, 4), Verdict{}},
		{"reset mid-window starts over", s(0, 0, 3, 0, 5, 0, 2, 0, 4, 0), Verdict{}},
		{"reset of replies only starts over", s(10, 10, 20, 20, 21, 0, 22, 0), Verdict{}},
		{"unanswered stands across a reset until a reply", s(0, 0, 3, 0, 5, 0, 7, 0, 1, 0, 2, 0), Verdict{Unanswered: true, Since: at(1), Requests: 1}},
		{"unanswered across a reset clears on a reply", s(0, 0, 3, 0, 5, 0, 7, 0, 1, 0, 2, 1), Verdict{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Judge(tc.history, w); got != tc.want {
				t.Errorf("Judge = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestJudgeDuration: reports closer together than the window's duration (a state change
// sends one early) do not make requests unanswered sooner.
func TestJudgeDuration(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := Window{Reports: 3, Duration: 10 * time.Second}
	var h []Sample
	for i := range 5 {
		h = append(h, Sample{At: t0.Add(time.Duration(i) * 2 * time.Second), Requests: uint64(i)})
	}
	if v := Judge(h, w); v.Unanswered {
		t.Fatalf("unanswered after 8 s: %+v", v)
	}
	h = append(h, Sample{At: t0.Add(12 * time.Second), Requests: 6})
	if v := Judge(h, w); !v.Unanswered || v.Since != t0.Add(2*time.Second) || v.Requests != 6 {
		t.Fatalf("after 12 s: %+v, want unanswered since 2 s with 6 requests", v)
	}
}
