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
// the agent's validation (which refuses a program with one bad id whole); NodeIndex.Entry
// finds each entry by its id.
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
	// Every entry, long keys' included, is found by its id alone, with its mapping's key.
	for node, index := range r.Index {
		for key, mi := range index {
			for i := range mi.Entries {
				k, e := index.Entry(strings.Clone(mi.Entries[i].ID))
				assert.Equal(t, key, k, node)
				assert.Same(t, &mi.Entries[i], e, node)
			}
		}
	}
	for _, id := range []string{"demo/remote/nothing", "demo/remote", "demo", "", keyA + "/dnat/nowhere", "demo/gone/snat"} {
		k, e := wb.Entry(id)
		assert.Empty(t, k, id)
		assert.Nil(t, e, id)
	}
}

// TestUnusableLinkMTU: a link whose MTU would be unknown (neither end reports one) or below
// IPv4's 68 is not built, which the datapath would refuse with the node's whole program; the
// mapping says why.
func TestUnusableLinkMTU(t *testing.T) {
	for name, mtus := range map[string][2]uint32{"unknown": {0, 0}, "too small": {100, 1420}} {
		t.Run(name, func(t *testing.T) {
			s := world(mkPortMap("remote", 0, 3000, interfaces("enp1s0")))
			s.Agents["edge-a"].State.Interfaces[1].Mtu = mtus[0]
			s.Agents["worker-b"].State.Interfaces[0].Mtu = mtus[1]
			r := Compile(s)
			for node, p := range r.Programs {
				assert.Empty(t, p.GetLinks(), node)
				require.NoError(t, datapath.Validate(p), node)
			}
			prog := r.PortMaps[nsName("demo", "remote")].Status.Conditions[1]
			assert.Equal(t, "NodeNotReady", prog.Reason)
			assert.Contains(t, prog.Message, "node edge-a: link to worker-b would have MTU")
		})
	}
}
