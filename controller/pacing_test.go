package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/types"
)

func TestAckWaits(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a, b := types.NamespacedName{Namespace: "n", Name: "a"}, types.NamespacedName{Namespace: "n", Name: "b"}
	var w ackWaits
	assert.Equal(t, t0, w.start(a, t0, true), "first wait: from now")
	assert.Equal(t, t0, w.start(a, t0.Add(400*time.Millisecond), true), "counted from the first")
	assert.Equal(t, t0.Add(400*time.Millisecond), w.start(b, t0.Add(400*time.Millisecond), true), "per PortMap")
	assert.Equal(t, t0, w.start(a, t0.Add(2*time.Second), true), "still waiting: from the first")
	assert.Zero(t, w.start(a, t0.Add(3*time.Second), false), "may not wait")
	assert.Equal(t, t0.Add(4*time.Second), w.start(a, t0.Add(4*time.Second), true), "a new wait starts over")
	w.forget(b)
	assert.Equal(t, t0.Add(5*time.Second), w.start(b, t0.Add(5*time.Second), true), "forgotten")
}

func TestBursts(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	a, b, c := types.NamespacedName{Namespace: "n", Name: "a"}, types.NamespacedName{Namespace: "n", Name: "b"}, types.NamespacedName{Namespace: "n", Name: "c"}
	var bs bursts
	for i := range burstArrivals - 1 {
		bs.arrived(ms(i))
	}
	assert.False(t, bs.putOff(a, ms(10)), "one arrival short of a burst: written")
	keys, over := bs.release(ms(10))
	assert.True(t, over)
	assert.Empty(t, keys, "nothing put off")

	bs.arrived(ms(10))
	assert.True(t, bs.putOff(a, ms(20)), "a burst: put off")
	assert.True(t, bs.putOff(a, ms(30)), "and again")
	assert.True(t, bs.putOff(b, ms(30)), "any PortMap")
	keys, over = bs.release(ms(30))
	assert.False(t, over, "the burst is on")
	assert.Empty(t, keys, "none put off burstMaxPutOff")

	// Arrivals slower than a burst starts keep it on while they are less than burstQuiet
	// apart, past a's and b's burstMaxPutOff.
	last := 10
	for last < 2200 {
		last += 200
		bs.arrived(ms(last))
	}
	assert.True(t, bs.putOff(c, ms(last-100)), "still a burst")
	keys, over = bs.release(ms(20).Add(burstMaxPutOff))
	assert.False(t, over)
	assert.Equal(t, []types.NamespacedName{a}, keys, "a put off burstMaxPutOff (counted from its first put-off): handed back")
	assert.False(t, bs.putOff(a, ms(20).Add(burstMaxPutOff)), "and written from now on though the burst is on")
	keys, _ = bs.release(ms(30).Add(burstMaxPutOff))
	assert.Equal(t, []types.NamespacedName{b}, keys, "b put off burstMaxPutOff")
	assert.True(t, bs.putOff(c, ms(last)), "c still put off")

	keys, over = bs.release(ms(last).Add(burstQuiet - time.Millisecond))
	assert.False(t, over, "within burstQuiet of the last arrival")
	assert.Empty(t, keys)
	keys, over = bs.release(ms(last).Add(burstQuiet))
	assert.True(t, over)
	assert.Equal(t, []types.NamespacedName{c}, keys, "the burst over: every PortMap still put off")
	assert.False(t, bs.putOff(c, ms(last).Add(burstQuiet)), "no burst: written")
	keys, _ = bs.release(ms(last).Add(burstQuiet))
	assert.Empty(t, keys, "released once")

	// The next burst puts a off again.
	for i := range burstArrivals {
		bs.arrived(ms(5000 + i))
	}
	assert.True(t, bs.putOff(a, ms(5010)), "a new burst puts a off again")

	// A burst nothing released (no status was put off behind it) is over all the same: one
	// arrival a second later is not a burst.
	var quiet bursts
	for i := range burstArrivals {
		quiet.arrived(ms(i))
	}
	quiet.arrived(ms(1000))
	assert.False(t, quiet.putOff(a, ms(1001)), "one create after a burst: written")
}
