package datapath

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"google.golang.org/protobuf/proto"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestPlanLinkSourcePorts: a link names no source ports (the kernel's) or a range the kernel
// takes, low below high.
func TestPlanLinkSourcePorts(t *testing.T) {
	base := goldenPrograms(t)["remote-worker-b"].GetLinks()[0]
	for _, c := range []struct {
		low, high uint32
		ok        bool
	}{{0, 0, true}, {49152, 65535, true}, {1, 2, true}, {0, 65535, false}, {49152, 0, false},
		{5000, 5000, false}, {6000, 5000, false}, {49152, 65536, false}} {
		l := proto.CloneOf(base)
		l.SourcePortLow, l.SourcePortHigh = c.low, c.high
		w, err := planLink(l)
		if !c.ok {
			assert.Error(t, err, "%d-%d", c.low, c.high)
			continue
		}
		require.NoError(t, err, "%d-%d", c.low, c.high)
		v := w.vxlan()
		assert.Equal(t, []int{int(c.low), int(c.high)}, []int{v.PortLow, v.PortHigh})
		assert.True(t, v.UDPCSum && v.Learning, "checksums and learning on")
	}
}

// TestFakeLinkSettingsRepaired: a device whose source ports, UDP checksum or learning differ
// from kuport's is replaced by one with them, and the next Apply writes nothing; one with the
// kernel's source ports (an older agent's) is kept, and so is a device with source ports
// under a program without them (an older controller's).
func TestFakeLinkSettingsRepaired(t *testing.T) {
	base := goldenPrograms(t)["remote-worker-b"]
	name := base.GetLinks()[0].GetName()
	for _, c := range []struct {
		name   string
		change func(v *netlink.Vxlan)
	}{
		{"source ports", func(v *netlink.Vxlan) { v.PortLow, v.PortHigh = 32768, 61000 }},
		{"udp checksum", func(v *netlink.Vxlan) { v.UDPCSum = false }},
		{"learning", func(v *netlink.Vxlan) { v.Learning = false }},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := newFakeKernel("100.64.93.150")
			dp := k.datapath(t)
			require.NoError(t, dp.Apply(base))
			want := k.dump(t)
			before, err := k.LinkByName(name)
			require.NoError(t, err)
			c.change(k.links[k.linkByIndex(before.Attrs().Index)].(*netlink.Vxlan))
			require.NotEqual(t, want, k.dump(t))

			require.NoError(t, dp.Apply(base))
			after, err := k.LinkByName(name)
			require.NoError(t, err)
			assert.NotEqual(t, before.Attrs().Index, after.Attrs().Index, "replaced")
			assert.Equal(t, want, k.dump(t))
			require.NoError(t, dp.Apply(base))
			assert.Zero(t, dp.lastChanges, "the repaired device is kept")
		})
	}
}

func TestFakeLinkSourcePortsAdopted(t *testing.T) {
	base := goldenPrograms(t)["remote-worker-b"]
	name := base.GetLinks()[0].GetName()
	older := proto.CloneOf(base)
	older.Links[0].SourcePortLow, older.Links[0].SourcePortHigh = 0, 0
	for _, c := range []struct {
		name        string
		first, next *kuportv1.NodeProgram
	}{{"an older agent's device", older, base}, {"an older controller's program", base, older}} {
		t.Run(c.name, func(t *testing.T) {
			k := newFakeKernel("100.64.93.150")
			dp := k.datapath(t)
			require.NoError(t, dp.Apply(c.first))
			before, err := k.LinkByName(name)
			require.NoError(t, err)
			require.NoError(t, dp.Apply(c.next))
			assert.Zero(t, dp.lastChanges, "nothing written")
			after, err := k.LinkByName(name)
			require.NoError(t, err)
			assert.Equal(t, before, after, "the device kept as it is")
		})
	}
}
