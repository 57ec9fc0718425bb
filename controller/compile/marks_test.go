package compile

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReturnMarkingAvoidsKnownUsers: the default return marking overlaps no known user of
// marks, routing tables or ip rule prefs (knownUsers, from
// docs/design/cni.md#marks-and-routing-tables-others-use), and Check passes it without a
// warning. Each case moves one default into one listed range (a bit of the user's marks added
// to the mask, the tables shifted onto the user's, a pref set to the user's): each must be
// reported naming that user, or the check could not fail.
func TestReturnMarkingAvoidsKnownUsers(t *testing.T) {
	warnings, err := DefaultReturnMarking.Check()
	require.NoError(t, err)
	assert.Empty(t, warnings, "the defaults overlap a known user")
	span := DefaultReturnMarking.LastTable - DefaultReturnMarking.FirstTable
	for _, u := range knownUsers {
		moved := map[string]ReturnMarking{}
		for bits := u.marks; bits != 0; bits &= bits - 1 {
			r := DefaultReturnMarking
			r.MarkMask |= bits & -bits
			moved[fmt.Sprintf("mark bit %#x", bits&-bits)] = r
		}
		for _, tr := range u.tables {
			for _, at := range []int64{tr[0], tr[1]} {
				r := DefaultReturnMarking
				r.FirstTable, r.LastTable = uint32(at), uint32(at)+span
				moved[fmt.Sprintf("tables from %d", at)] = r
			}
		}
		for _, p := range u.prefs {
			r := DefaultReturnMarking
			r.LoopGuardPref = p
			moved[fmt.Sprintf("loop guard pref %d", p)] = r
			r = DefaultReturnMarking
			r.DivertPref = p
			moved[fmt.Sprintf("divert pref %d", p)] = r
		}
		require.NotEmpty(t, moved, "%s lists nothing", u.name)
		for what, r := range moved {
			named := slices.ContainsFunc(r.overlaps(), func(o string) bool { return strings.HasPrefix(o, u.name+": ") })
			assert.True(t, named, "the default moved to %s of %s is not reported: %v", what, u.name, r.overlaps())
		}
	}
}

// TestReturnMarkingCheckReports: Check refuses what the datapath cannot work with, with the
// reason, and warns of an overlap it can.
func TestReturnMarkingCheckReports(t *testing.T) {
	r := DefaultReturnMarking
	r.FirstTable, r.LastTable = 200, 210
	warnings, err := r.Check()
	require.NoError(t, err)
	assert.Equal(t, []string{"Calico (IptablesMarkMask, RouteTableRanges, its WireGuard rule): tables 200-210",
		"Cilium (magic bits, identity, IPsec/WireGuard/VTEP tables, its rules): tables 200-202"}, warnings)
	r = DefaultReturnMarking
	r.MarkMask = 0x6
	_, err = r.Check()
	assert.ErrorContains(t, err, "return mark mask 0x6 has 2 bits, fewer than 3")
}
