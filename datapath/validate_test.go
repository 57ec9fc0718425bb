package datapath

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestValidate: a golden program is valid; each invalid entry is refused by its id, links
// and return paths included, and the valid entries are not.
func TestValidate(t *testing.T) {
	for name, p := range goldenPrograms(t) {
		assert.NoError(t, Validate(p), name)
	}
	p := proto.CloneOf(goldenPrograms(t)["static-worker-b"])
	p.Links = append(p.Links, proto.CloneOf(p.Links[0]))
	p.ReturnPaths = append(p.ReturnPaths, &kuportv1.ReturnPath{Id: "lost/return", Link: "kup-00000000", Mark: 9, Table: 209,
		PeerUnderlay: "100.64.93.143", PeerLinkAddress: "169.254.77.0"},
		&kuportv1.ReturnPath{Link: "kup-dcc4266d", Mark: 10, Table: 210, PeerUnderlay: "100.64.93.143", PeerLinkAddress: "169.254.77.0"})
	p.MarkRules[0].Mark = 0
	got := map[string]string{}
	for _, e := range EntryErrors(Validate(p)) {
		got[e.GetId()] = e.GetMessage()
	}
	require.Len(t, got, 4, "%v", got)
	assert.Equal(t, "mark demo/remote/mark: mark is 0", got["demo/remote/mark"])
	assert.Equal(t, "link kup-dcc4266d: name used by another link", got["kup-dcc4266d"])
	assert.Equal(t, "return path lost/return: link kup-00000000 is not in the program", got["lost/return"])
	assert.Contains(t, got[""], "return path : id must be 1-127 bytes")
}
