package compile

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/datapath"
)

// TestLongNameFitsIDs: a PortMap name may have 253 bytes, an nftables comment 127. The key of
// a long one is cut and hashed so that every id of the mapping fits, and the program passes
// the agent's validation (which refuses a program with one bad id whole).
func TestLongNameFitsIDs(t *testing.T) {
	long := strings.Repeat("n", 253)
	ns := strings.Repeat("s", 63)
	pmA := mkPortMap(long, 0, 3002, service("remote"), className("intranet"))
	pmA.Namespace = ns
	pmB := mkPortMap(long[:252]+"m", 1, 3001, service("remote"), className("intranet"))
	pmB.Namespace = ns
	s := multiWorld()
	s.PortMaps = append(s.PortMaps, pmA, pmB)
	s.Namespaces[ns] = s.Namespaces["demo"].DeepCopy()
	s.Namespaces[ns].Name = ns
	k := s.Services[nsName("demo", "remote")].DeepCopy()
	k.Namespace = ns
	s.Services[nsName(ns, "remote")] = k
	s.EndpointSlices[nsName(ns, "remote")] = s.EndpointSlices[nsName("demo", "remote")]

	keyA, keyB := MappingKey(pmA), MappingKey(pmB)
	assert.Len(t, keyA, maxKeyLen)
	assert.NotEqual(t, keyA, keyB)
	assert.Equal(t, "demo/remote", MappingKey(s.PortMaps[0]), "a short key is the name")
	r := Compile(s)
	for node, p := range r.Programs {
		require.NoError(t, datapath.Validate(p), node)
	}
	wb := r.Index["worker-b"]
	require.Contains(t, wb, keyA)
	assert.Equal(t, long, wb[keyA].Mapping.Name)
	for _, e := range wb[keyA].Entries {
		assert.LessOrEqual(t, len(e.ID), 127, e.ID)
	}
}
