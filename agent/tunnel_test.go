package agent

import (
	"testing"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"google.golang.org/protobuf/proto"

	"kuport.wlz.li/kuport/datapath"
	"kuport.wlz.li/kuport/internal/syncbuf"
	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestPrivilegedHelloReportsTunnelPorts runs the agent over the real datapath in a fresh
// namespace holding Flannel's device as Talos makes it (flannel.1, vxlan on UDP 4789): its
// Hello reports the device's kind and port, which the controller checks a class's vxlan
// port against, and reports no tunnel for the veth beside it.
func TestPrivilegedHelloReportsTunnelPorts(t *testing.T) {
	testenv.Privileged(t)
	d := newDriftNS(t)
	d.exec(t, "ip", "link", "add", "flannel.1", "type", "vxlan", "id", "1", "dstport", "4789", "dev", "wt0")
	conn, err := nftables.New(nftables.WithNetNSFd(int(d.ns)), datapath.NFTSocketOption())
	require.NoError(t, err)
	nl, err := netlink.NewHandleAt(d.ns)
	require.NoError(t, err)
	t.Cleanup(nl.Close)
	logs := &syncbuf.Buffer{}
	dp := datapath.New(datapath.Config{NFT: conn, Netlink: nl, NetNS: d.ns, Log: hclog.New(&hclog.LoggerOptions{Output: logs})})

	c, target := startController(t)
	startAgent(t, testConfig(dp, logs, target))
	s := c.NextSession(t)

	byName := map[string]*kuportv1.Interface{}
	for _, i := range s.Hello.GetState().GetInterfaces() {
		byName[i.GetName()] = i
	}
	require.Contains(t, byName, "flannel.1", "interfaces %v", byName)
	require.Equal(t, kuportv1.TunnelKind_TUNNEL_KIND_VXLAN, byName["flannel.1"].GetTunnel())
	require.Equal(t, uint32(4789), byName["flannel.1"].GetUdpPort())
	require.True(t, proto.Equal(&kuportv1.Interface{Name: "wt0", Addresses: []string{"100.64.93.150"}, Mtu: 1500},
		byName["wt0"]), "wt0 reported as %v", byName["wt0"])
}
