// Package datapath turns a NodeProgram into kernel state on one node and reads that state
// back: the nftables table "ip kuport" (its chains, rules and sets), vxlan link
// devices named "kup-*", ip rules at prefs 101 and 102, and the routing tables a program
// names. It owns exactly those objects and touches nothing else (see README.md, the priority
// contract), except that when its DNAT elements change it deletes the conntrack entries
// of flows that still follow the old ones (conntrack.go). It makes no decisions: every
// address, mark, table and name comes from the program.
//
// The nftables connection and netlink handle are injected, so the same code runs against
// the node's namespace or a test's fresh one; the sockets the datapath opens itself, in
// Config.NetNS, ask for the nftables ruleset generation (gen.go, on first use) and, once
// Watch is called, listen for changes to what it owns (watch.go).
//
// The table's layout (layout.go) is the same for every program: a few rules, each looking
// up one set, so the per-packet cost does not grow with the number of mappings. The
// program's entries are planned into the sets' elements (entries.go, elements.go), which Render,
// Dump and the golden files in testdata/ print as nft lists them. Apply writes only the
// elements that differ (nftwrite.go), and reads the table only when the ruleset generation says
// someone else may have changed it (sync.go, gen.go).
//
// Use:
//
//	dp := datapath.New(datapath.Config{NFT: conn, Netlink: handle, NetNS: netns.None(), Log: log})
//	err := dp.Apply(program)              // idempotent; nil when all is in the kernel
//	ack.Errors = datapath.EntryErrors(err) // per-entry failures, by id
package datapath
