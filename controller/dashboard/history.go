package dashboard

import (
	"encoding/json"
	"math"
	"strconv"
	"sync"
	"time"
)

// historyStep is the history's resolution and historyLen its length: 15 minutes of one
// value every 5 s, 180 float32 a series. A mapping keeps two series (packets/s in and out
// at its accepting interfaces), a link end two (rx and tx packets/s): about 1.5 KiB each
// once its values vary, a few bytes while they are unknown and then 0 (an idle mapping's or
// link's: flat) (BENCHMARKS.md, "dashboard").
const (
	historyStep = 5 * time.Second
	historyLen  = 180
)

// history is a fixed-length ring of recent values per series, one slot per historyStep,
// all series sharing the slots' times. Memory is historyLen float32 a series that varied
// and series come and go with what the registry holds: bounded by the mappings and links.
// Safe for concurrent use.
type history struct {
	mu     sync.Mutex
	headAt time.Time // time of the newest slot (a multiple of historyStep); zero: none yet
	head   int       // index of the newest slot
	series map[string]hseries
}

// hseries is one series of the history: its ring, or while it is flat (every value so
// far unknown, then 0, as an idle mapping's are) only how many of the newest slots are 0.
type hseries struct {
	ring  *[historyLen]float32 // nil while flat
	zeros int                  // flat: the newest zeros slots are 0, the older unknown
}

// record writes values (NaN: unknown) into the slot of now, opening the slots since the
// previous record as unknown. Series absent from values are dropped: their mapping or link
// is gone.
func (h *history) record(values map[string]float64, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	slot := now.Truncate(historyStep)
	steps := 0 // slots opened
	switch {
	case h.headAt.IsZero():
		h.headAt = slot
	case slot.After(h.headAt):
		steps = min(int(slot.Sub(h.headAt)/historyStep), historyLen)
		for range steps {
			h.head = (h.head + 1) % historyLen
			for _, s := range h.series {
				if s.ring != nil {
					s.ring[h.head] = float32(math.NaN())
				}
			}
		}
		h.headAt = slot
	case slot.Before(h.headAt):
		return // the clock went back: keep what is there
	}
	next := make(map[string]hseries, len(values))
	for k, v := range values {
		next[k] = h.series[k].write(float32(v), h.head, steps)
	}
	h.series = next
}

// write returns s with v in the newest slot, head, after steps slots were opened (unknown)
// since s was last written (a series absent from a record is dropped, so every series was
// written at the previous head). A flat series stays flat while it can.
func (s hseries) write(v float32, head, steps int) hseries {
	if s.ring == nil {
		nan := v != v
		switch {
		case steps == 0 && v == 0: // the newest slot rewritten
			return hseries{zeros: max(s.zeros, 1)}
		case steps == 0 && nan && s.zeros == 0:
			return s
		case v == 0 && (s.zeros == 0 || steps == 1):
			return hseries{zeros: min(s.zeros+1, historyLen)}
		case nan && (s.zeros == 0 || steps == historyLen):
			return hseries{}
		}
		s.ring = s.materialize(head, steps)
	}
	s.ring[head] = v
	return s
}

// materialize returns flat s's ring once head is the newest slot, steps slots after the
// newest s knows of: its zeros end steps slots before head, every other slot is unknown.
func (s hseries) materialize(head, steps int) *[historyLen]float32 {
	r := new([historyLen]float32)
	for i := range r {
		r[i] = float32(math.NaN())
	}
	for i := range min(s.zeros, historyLen-steps) {
		r[(head-steps-i+2*historyLen)%historyLen] = 0
	}
	return r
}

// get returns the series of each key (nil for a key with none) and the time of their
// newest slot, oldest value first.
func (h *history) get(keys ...string) ([]Series, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Series, len(keys))
	for i, k := range keys {
		s, ok := h.series[k]
		if !ok {
			continue
		}
		out[i] = make(Series, historyLen)
		if s.ring == nil {
			for j := range historyLen - s.zeros {
				out[i][j] = float32(math.NaN())
			}
			continue
		}
		n := copy(out[i], s.ring[h.head+1:])
		copy(out[i][n:], s.ring[:h.head+1])
	}
	return out, h.headAt
}

// Series is a history's values, oldest first, one every historyStep up to History.End;
// NaN (null in JSON) is unknown: not sampled, or no rate yet.
type Series []float32

// MarshalJSON writes the values with NaN as null.
func (s Series) MarshalJSON() ([]byte, error) {
	if s == nil {
		return []byte("null"), nil
	}
	b := make([]byte, 0, 6*len(s)+2)
	b = append(b, '[')
	for i, v := range s {
		if i > 0 {
			b = append(b, ',')
		}
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			b = append(b, "null"...)
			continue
		}
		b = strconv.AppendFloat(b, float64(v), 'f', -1, 32)
	}
	return append(b, ']'), nil
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *Series) UnmarshalJSON(b []byte) error {
	var vs []*float32
	if err := json.Unmarshal(b, &vs); err != nil {
		return err
	}
	if vs == nil {
		*s = nil
		return nil
	}
	*s = make(Series, len(vs))
	for i, v := range vs {
		(*s)[i] = float32(math.NaN())
		if v != nil {
			(*s)[i] = *v
		}
	}
	return nil
}

// History is the recent rates of a mapping (packets/s in and out at its accepting
// interfaces: requests from clients, replies to them) or of a link end (packets/s received
// and sent by its device), one value every StepSeconds up to End.
type History struct {
	StepSeconds float64   `json:"stepSeconds"`
	End         time.Time `json:"end"`
	In          Series    `json:"in,omitempty"`
	Out         Series    `json:"out,omitempty"`
}
