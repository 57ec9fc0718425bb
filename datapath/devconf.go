package datapath

import (
	"encoding/binary"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// IPv4 device configuration goes over rtnetlink, not /proc/sys: an unprivileged container
// (deploy/agent.yaml) has /proc/sys mounted read-only, and rtnetlink needs only
// CAP_NET_ADMIN to write it (RTM_SETLINK) and nothing to read it (RTM_GETNETCONF).

const (
	// devconfRPFilter is IPV4_DEVCONF_RP_FILTER (linux/ip.h): inside IFLA_INET_CONF the
	// attribute type is the devconf index, 1-based.
	devconfRPFilter = 8
	// Attributes of RTM_GETNETCONF (linux/netconf.h), which golang.org/x/sys/unix lacks.
	netconfaIfindex    = 1
	netconfaForwarding = 2
	netconfaRPFilter   = 3
	// netconfaIfindexAll names the "all" settings, whose forwarding is net.ipv4.ip_forward.
	netconfaIfindexAll = -1
	// netconfMsgLen is struct netconfmsg (one family byte) padded to the netlink alignment.
	netconfMsgLen = 4
)

// routeRequest executes req on a NETLINK_ROUTE socket opened in the configured namespace
// and closed afterwards. For the agent's own namespace (netns.None()) no namespace is
// entered, so the agent never calls setns (CAP_SYS_ADMIN).
func (d *sockets) routeRequest(req *nl.NetlinkRequest, resType uint16) ([][]byte, error) {
	s, err := nl.GetNetlinkSocketAt(d.netns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open rtnetlink socket: %w", err)
	}
	defer s.Close()
	if err := s.SetSendTimeout(&nl.SocketTimeoutTv); err != nil {
		return nil, err
	}
	if err := s.SetReceiveTimeout(&nl.SocketTimeoutTv); err != nil {
		return nil, err
	}
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}
	return req.Execute(unix.NETLINK_ROUTE, resType)
}

// netconfMsg is struct netconfmsg for RTM_GETNETCONF, padded.
type netconfMsg [netconfMsgLen]byte

func (m netconfMsg) Len() int          { return len(m) }
func (m netconfMsg) Serialize() []byte { return m[:] }

// netconf reads one IPv4 setting (a netconfa* attribute) of the device with index
// ifindex, or of the "all" settings for netconfaIfindexAll.
func (d *sockets) netconf(ifindex int32, attr uint16) (uint32, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETNETCONF, 0)
	req.AddData(netconfMsg{unix.AF_INET})
	req.AddData(nl.NewRtAttr(netconfaIfindex, nl.Uint32Attr(uint32(ifindex))))
	msgs, err := d.routeRequest(req, unix.RTM_NEWNETCONF)
	if err != nil {
		return 0, fmt.Errorf("read ipv4 netconf of ifindex %d: %w", ifindex, err)
	}
	if len(msgs) != 1 || len(msgs[0]) < netconfMsgLen {
		return 0, fmt.Errorf("read ipv4 netconf of ifindex %d: %d answers", ifindex, len(msgs))
	}
	attrs, err := nl.ParseRouteAttr(msgs[0][netconfMsgLen:])
	if err != nil {
		return 0, fmt.Errorf("read ipv4 netconf of ifindex %d: %w", ifindex, err)
	}
	for _, a := range attrs {
		if a.Attr.Type == attr && len(a.Value) == 4 {
			return binary.NativeEndian.Uint32(a.Value), nil
		}
	}
	return 0, fmt.Errorf("read ipv4 netconf of ifindex %d: no attribute %d", ifindex, attr)
}

// rpFilter reads the rp_filter of the device with index ifindex.
func (d *sockets) rpFilter(ifindex int) (uint32, error) {
	return d.netconf(int32(ifindex), netconfaRPFilter)
}

// setRPFilter sets the rp_filter of the device with index ifindex: RTM_SETLINK carrying
// IFLA_AF_SPEC / AF_INET / IFLA_INET_CONF / IPV4_DEVCONF_RP_FILTER, which the kernel
// applies in inet_set_link_af.
func (d *sockets) setRPFilter(ifindex int, value uint32) error {
	d.log.Trace("set rp_filter", "ifindex", ifindex, "value", value)
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	req.AddData(msg)
	spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, nil)
	spec.AddRtAttr(unix.AF_INET, nil).AddRtAttr(unix.IFLA_INET_CONF, nil).
		AddRtAttr(devconfRPFilter, nl.Uint32Attr(value))
	req.AddData(spec)
	if _, err := d.routeRequest(req, 0); err != nil {
		return fmt.Errorf("set rp_filter %d: %w", value, err)
	}
	return nil
}

// ipForward reads net.ipv4.ip_forward (the "all" forwarding setting).
func (d *sockets) ipForward() (bool, error) {
	v, err := d.netconf(netconfaIfindexAll, netconfaForwarding)
	return v == 1, err
}
