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
// once a value other than unknown or 0 arrives, 32 bytes until then (an idle mapping's or
// link's) (BENCHMARKS.md, "dashboard").
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

// hseries is one series of the history: its ring, or while every value it holds is
// unknown or 0 (an idle mapping's or link's: flat) only which slots are 0, a bit each.
type hseries struct {
	ring  *[historyLen]float32 // nil while flat
	zeros [(historyLen + 63) / 64]uint64
}

// record writes values (NaN: unknown) into the slot of now, opening the slots since the
// previous record as unknown. Series absent from values are dropped: their mapping or link
// is gone.
func (h *history) record(values map[string]float64, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	slot := now.Truncate(historyStep)
	switch {
	case h.headAt.IsZero():
		h.headAt = slot
	case slot.After(h.headAt):
		steps := min(int(slot.Sub(h.headAt)/historyStep), historyLen)
		for range steps {
			h.head = (h.head + 1) % historyLen
			for k, s := range h.series {
				s.open(h.head)
				h.series[k] = s
			}
		}
		h.headAt = slot
	case slot.Before(h.headAt):
		return // the clock went back: keep what is there
	}
	next := make(map[string]hseries, len(values))
	for k, v := range values {
		s := h.series[k] // a new series: unknown before it began
		s.write(h.head, float32(v))
		next[k] = s
	}
	h.series = next
}

// open makes slot i unknown.
func (s *hseries) open(i int) {
	if s.ring != nil {
		s.ring[i] = float32(math.NaN())
		return
	}
	s.zeros[i/64] &^= 1 << (i % 64)
}

// write sets slot i to v; a flat series stays flat while v is unknown or 0.
func (s *hseries) write(i int, v float32) {
	if s.ring == nil {
		switch {
		case v == 0:
			s.zeros[i/64] |= 1 << (i % 64)
			return
		case v != v:
			s.zeros[i/64] &^= 1 << (i % 64)
			return
		}
		ring := new([historyLen]float32)
		for j := range ring {
			ring[j] = s.value(j)
		}
		s.ring = ring
	}
	s.ring[i] = v
}

// value returns slot i's value.
func (s *hseries) value(i int) float32 {
	if s.ring != nil {
		return s.ring[i]
	}
	if s.zeros[i/64]&(1<<(i%64)) != 0 {
		return 0
	}
	return float32(math.NaN())
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
		for j := range historyLen {
			out[i][j] = s.value((h.head + 1 + j) % historyLen)
		}
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
