package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// kernel reads one node namespace's nftables from this process: "in the kernel" is what
// these calls see, not what an agent or kube-proxy says it wrote.
type kernel struct {
	ns  netns.NsHandle
	nft *nftables.Conn
	// elem asks for single set elements by key (NFT_MSG_GETSETELEM without a dump): one
	// element looked up in a set of 10,000 costs what it costs in a set of 10, where
	// GetSetElements dumps them all (about 100 ms at 10,000).
	elem *netlink.Conn
}

func openKernel(node string) (*kernel, error) {
	ns, err := netns.GetFromPath(filepath.Join("/run/netns", node))
	if err != nil {
		return nil, fmt.Errorf("namespace %s: %w", node, err)
	}
	k := &kernel{ns: ns}
	if k.nft, err = nftables.New(nftables.WithNetNSFd(int(ns)), nftables.AsLasting()); err == nil {
		k.elem, err = netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns)})
	}
	if err != nil {
		_ = k.close()
		return nil, fmt.Errorf("nftables in %s: %w", node, err)
	}
	return k, nil
}

func (k *kernel) close() error {
	var errs []error
	if k.nft != nil {
		errs = append(errs, k.nft.CloseLasting())
	}
	if k.elem != nil {
		errs = append(errs, k.elem.Close())
	}
	return errors.Join(append(errs, k.ns.Close())...)
}

// hasElement reports whether set of table (family ip) holds an element with key (the
// concatenation as the set stores it).
func (k *kernel) hasElement(fam nftables.TableFamily, table, set string, key []byte) (bool, error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(ae *netlink.AttributeEncoder) error {
		ae.Nested(unix.NFTA_LIST_ELEM, func(ae *netlink.AttributeEncoder) error {
			ae.Nested(unix.NFTA_SET_ELEM_KEY, func(ae *netlink.AttributeEncoder) error {
				ae.Bytes(unix.NFTA_DATA_VALUE, key)
				return nil
			})
			return nil
		})
		return nil
	})
	attrs, err := ae.Encode()
	if err != nil {
		return false, err
	}
	_, err = k.elem.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM), Flags: netlink.Request},
		Data:   append([]byte{byte(fam), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if errors.Is(err, unix.ENOENT) {
		return false, nil // no such element, set or table
	}
	return err == nil, err
}

// countElements is the number of elements of set in table (of family fam); 0 when the table
// or the set is absent.
func (k *kernel) countElements(fam nftables.TableFamily, table, set string) (int, error) {
	s, err := k.nft.GetSetByName(&nftables.Table{Name: table, Family: fam}, set)
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("set %s of %s: %w", set, table, err)
	}
	elems, err := k.nft.GetSetElements(s)
	if err != nil {
		// The set went between the two reads (an empty program deletes the table): the
		// library's error for it does not wrap ENOENT, so look again.
		if _, gone := k.nft.GetSetByName(s.Table, set); errors.Is(gone, unix.ENOENT) {
			return 0, nil
		}
		return 0, fmt.Errorf("elements of %s: %w", set, err)
	}
	return len(elems), nil
}

// tableElements is the number of elements of each set of table (of family fam); none when
// the table is absent (an empty program deletes it).
func (k *kernel) tableElements(fam nftables.TableFamily, table string) (map[string]int, error) {
	sets, err := k.nft.GetSets(&nftables.Table{Name: table, Family: fam})
	if err != nil {
		// The library's error for an absent table does not wrap ENOENT: look for the table.
		tables, lerr := k.nft.ListTablesOfFamily(fam)
		if lerr == nil && !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == table }) {
			return nil, nil
		}
		return nil, fmt.Errorf("sets of %s: %w", table, err)
	}
	n := map[string]int{}
	for _, s := range sets {
		if n[s.Name], err = k.countElements(fam, table, s.Name); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// deleteTables deletes the named tables of family ip, ip6 and inet that exist.
func (k *kernel) deleteTables(name string) error {
	tables, err := k.nft.ListTables()
	if err != nil {
		return fmt.Errorf("list tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == name && (t.Family == nftables.TableFamilyIPv4 || t.Family == nftables.TableFamilyIPv6 || t.Family == nftables.TableFamilyINet) {
			k.nft.DelTable(t)
		}
	}
	if err := k.nft.Flush(); err != nil {
		return fmt.Errorf("delete table %s: %w", name, err)
	}
	return nil
}

// dnatKey is the key of kuport's dnat-ports element for a TCP port dialed on iface
// (iifname . meta l4proto . th dport, each padded to 4 bytes; datapath/README.md).
func dnatKey(iface string, port uint16) []byte {
	key := make([]byte, unix.IFNAMSIZ+4+4)
	copy(key, iface)
	key[unix.IFNAMSIZ] = unix.IPPROTO_TCP
	binary.BigEndian.PutUint16(key[unix.IFNAMSIZ+4:], port)
	return key
}
