package controller

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

func TestSettledClasses(t *testing.T) {
	var s settledClasses
	obj, st := &v1alpha1.PortMapClass{}, &v1alpha1.PortMapClassStatus{}
	assert.False(t, s.known("a", obj, st, claimsEqual), "nothing known at first")

	s.set("a", obj, st, claimsEqual)
	assert.True(t, s.known("a", obj, st, claimsEqual))
	assert.False(t, s.known("a", obj, st, statusWritten), "only what was set is known")
	s.set("a", obj, st, statusWritten)
	assert.True(t, s.known("a", obj, st, claimsEqual), "the same pair keeps what it had")
	assert.True(t, s.known("a", obj, st, statusWritten))

	// A new cached object (an event) or a new compiled status is another pair: unknown, and
	// setting it forgets the old pair's.
	newObj, newSt := &v1alpha1.PortMapClass{}, &v1alpha1.PortMapClassStatus{}
	assert.False(t, s.known("a", newObj, st, claimsEqual))
	assert.False(t, s.known("a", obj, newSt, statusWritten))
	s.set("a", newObj, st, statusWritten)
	assert.False(t, s.known("a", newObj, st, claimsEqual))
	assert.False(t, s.known("a", obj, st, statusWritten))
	assert.False(t, s.known("b", newObj, st, statusWritten), "by class")

	s.set("b", obj, newSt, claimsEqual)
	s.keep(map[string]*v1alpha1.PortMapClassStatus{"b": newSt})
	assert.False(t, s.known("a", newObj, st, statusWritten), "a class compile no longer gives is forgotten")
	assert.True(t, s.known("b", obj, newSt, claimsEqual))
}
