// Package datapath turns a NodeProgram into kernel state on one node and reads that state
// back: the nftables table "ip kuport" (chains kup-pre, kup-post, kup-mangle), vxlan link
// devices named "kup-*", ip rules at prefs 101 and 102, and the routing tables a program
// names. It owns exactly those objects and touches nothing else (see README.md, the priority
// contract), except that when its DNAT rules change it deletes the conntrack entries of
// flows that still follow the old rules (conntrack.go). It makes no decisions: every
// address, mark, table and name comes from the program.
//
// The nftables connection and netlink handle are injected, so the same code runs against
// the node's namespace or a test's fresh one.
//
// A program's rules have one internal form (rule) with four maps onto it: the program
// entries compile into it, it encodes into nftables expressions, kernel rules decode back
// into it, and it prints as the nft text that Render, Dump and the golden files in
// testdata/ share. Apply compares kernel and program by that text, so it changes only
// what differs; moving dispatch into nftables maps at scale (DESIGN.md, Scale) changes
// only this file set.
//
// Use:
//
//	dp := datapath.New(datapath.Config{NFT: conn, Netlink: handle, NetNS: netns.None(), Log: log})
//	err := dp.Apply(program)              // idempotent; nil when all is in the kernel
//	ack.Errors = datapath.EntryErrors(err) // per-entry failures, by id
package datapath
