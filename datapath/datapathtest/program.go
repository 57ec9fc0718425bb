// Package datapathtest builds the programs the datapath's and the agent's benchmarks, and
// bench/datapath, apply: one builder, so their figures are of the same program.
package datapathtest

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Program is edge-a's program for n same-node TCP mappings arriving on iface: ports 10000
// up, each to its own pod address (PodAddr), a DNAT entry steered to its pod address (as the
// compiler emits it: its translation, its steering, which counts its requests, and its reply
// counting) and the request's identity SNAT per mapping, 4n set elements.
func Program(n int, iface string) *kuportv1.NodeProgram {
	p := &kuportv1.NodeProgram{Node: "edge-a", Version: 1, Epoch: 1,
		DnatRules: make([]*kuportv1.DnatRule, 0, n), SnatRules: make([]*kuportv1.SnatRule, 0, n)}
	for i := range n {
		key, pod, port := fmt.Sprintf("bench/m%05d", i), PodAddr(i), uint32(10000+i)
		ports := &kuportv1.PortRange{First: port, Last: port}
		p.DnatRules = append(p.DnatRules, &kuportv1.DnatRule{Id: key + "/dnat/" + iface, Mapping: key, InInterface: iface,
			Protocol: kuportv1.Protocol_PROTOCOL_TCP, Ports: ports, ToAddress: pod, ToPort: port, StandIn: pod})
		p.SnatRules = append(p.SnatRules, &kuportv1.SnatRule{Id: key + "/snat", Mapping: key, Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
			Address: pod, Protocol: kuportv1.Protocol_PROTOCOL_TCP, Ports: ports})
	}
	return p
}

// PodAddr is mapping i's pod address in Program: 10.244.17.2 up, 250 a /24.
func PodAddr(i int) string { return fmt.Sprintf("10.244.%d.%d", 17+i/250, 2+i%250) }

// rangesPerIface is how many 1,000-port ranges fit on one interface in RangedProgram: ports
// 20000-64999, above the single ports.
const rangesPerIface = 45

// RangedProgram is Program with its last ranges mappings 1,000-port TCP ranges that keep
// their ports: the last one on iface at RangedPort, the others 45 an interface, on iface
// and on names after it (enp2s0 ... for enp1s0), which need not exist. Its single ports are
// Program's.
func RangedProgram(n, ranges int, iface string) *kuportv1.NodeProgram {
	p := Program(n, iface)
	for j := range ranges {
		i := n - ranges + j
		k := ranges - 1 - j // the last range first on iface
		in := iface
		if k >= rangesPerIface {
			in = fmt.Sprintf("enp%ds0", 1+k/rangesPerIface)
		}
		first := uint32(20000 + k%rangesPerIface*1000)
		ports := &kuportv1.PortRange{First: first, Last: first + 999}
		d, s := p.DnatRules[i], p.SnatRules[i]
		d.Id, d.InInterface, d.Ports, d.ToPort = d.Mapping+"/dnat/"+in, in, ports, first
		s.Ports = ports
	}
	return p
}

// RangedPort is the port RangedProgram's last mapping serves in the middle of its range
// (the range keeps its ports: the pod listens on it too).
const RangedPort = 20500

// RangeProgram is edge-a's program for one UDP mapping of ports ports that keeps them,
// ending at 65535 (16,384 is coturn's 49152-65535), arriving on iface to PodAddr(0): its
// DNAT entry, steered, and its identity SNAT.
func RangeProgram(ports int, iface string) *kuportv1.NodeProgram {
	p := Program(1, iface)
	first := uint32(65536 - ports)
	r := &kuportv1.PortRange{First: first, Last: 65535}
	d, s := p.DnatRules[0], p.SnatRules[0]
	d.Protocol, d.Ports, d.ToPort = kuportv1.Protocol_PROTOCOL_UDP, r, first
	s.Protocol, s.Ports = kuportv1.Protocol_PROTOCOL_UDP, r
	return p
}

// DualStackProgram is Program with each mapping's IPv6 side beside it: a DNAT entry to its
// pod's IPv6 address (PodAddr6) and that address's identity SNAT, on the same port, 8n set
// elements.
func DualStackProgram(n int, iface string) *kuportv1.NodeProgram {
	p := Program(n, iface)
	for i := range n {
		d := proto.Clone(p.DnatRules[i]).(*kuportv1.DnatRule)
		s := proto.Clone(p.SnatRules[i]).(*kuportv1.SnatRule)
		pod := PodAddr6(i)
		d.Id, d.ToAddress, d.StandIn = d.Mapping+"/dnat6/"+iface, pod, pod
		s.Id, s.Address = s.Mapping+"/snat6", pod
		p.DnatRules, p.SnatRules = append(p.DnatRules, d), append(p.SnatRules, s)
	}
	return p
}

// PodAddr6 is mapping i's pod IPv6 address in DualStackProgram, in fd00:10:244::/48 with
// PodAddr's numbers.
func PodAddr6(i int) string { return fmt.Sprintf("fd00:10:244:%d::%d", 17+i/250, 2+i%250) }
