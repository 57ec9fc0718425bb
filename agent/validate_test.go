package agent

import (
	"testing"

	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/datapath"
	"kuport.wlz.li/kuport/internal/syncbuf"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestInvalidProgramRefusedWhole: a program with one invalid entry among valid ones never
// reaches the datapath; its Ack names the entry, and the previous program stays current.
func TestInvalidProgramRefusedWhole(t *testing.T) {
	c, target := startController(t)
	dp := newFakeDatapath()
	cfg := testConfig(dp, &syncbuf.Buffer{}, target)
	cfg.Validate, cfg.EntryErrors = datapath.Validate, datapath.EntryErrors
	startAgent(t, cfg)

	s := c.NextSession(t)
	good := program(1, 1, 27015)
	s.Send(t, good)
	requireProtoEqual(t, &kuportv1.Ack{Version: 1, Epoch: 1}, s.NextAck(t))

	bad := program(2, 1, 27016)
	bad.DnatRules = append(bad.DnatRules, &kuportv1.DnatRule{Id: "games/bad/dnat/wt0", Mapping: "games/bad",
		InInterface: "wt0", Protocol: kuportv1.Protocol_PROTOCOL_UDP, Ports: &kuportv1.PortRange{First: 1, Last: 1},
		ToAddress: "fd00::1", ToPort: 1, StandIn: "10.244.17.5"})
	s.Send(t, bad)
	ack := s.NextAck(t)
	require.Equal(t, uint64(2), ack.GetVersion())
	require.Len(t, ack.GetErrors(), 1)
	require.Equal(t, "games/bad/dnat/wt0", ack.GetErrors()[0].GetId())
	require.Contains(t, ack.GetErrors()[0].GetMessage(), `stand_in "10.244.17.5" is not an IPv6 address`)
	applied, applies := dp.snapshot()
	require.Equal(t, 1, applies, "the invalid program never reached the datapath")
	requireProtoEqual(t, good, applied)
	// The good program is still current: the same content again is acknowledged unapplied.
	again := program(3, 1, 27015)
	s.Send(t, again)
	requireProtoEqual(t, &kuportv1.Ack{Version: 3, Epoch: 1}, s.NextAck(t))
	_, applies = dp.snapshot()
	require.Equal(t, 1, applies)
}
