// Package datapath turns a NodeProgram into kernel state on one node and reads that state
// back: the nftables table "ip kuport" (chains kup-pre, kup-post, kup-mangle), vxlan link
// devices named "kup-*", ip rules at prefs 101 and 102, and the routing tables a program
// names. It owns exactly those objects and touches nothing else (see README.md, the priority
// contract). It makes no decisions: every address, mark, table and name comes from the
// program.
//
// The nftables connection and netlink handle are injected, so the same code runs against
// the node's namespace or a test's fresh one.
package datapath
