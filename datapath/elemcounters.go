package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Element counters, read with little garbage. The agent reports every entry's counters
// (Counters) every ReportInterval; google/nftables decodes each element of a dump into a
// SetElement with its key, data, comment and expressions, garbage that set the agent's
// resident memory (BENCHMARKS.md, "Figures moved out of code comments"). So Counters dumps
// each set itself (NFT_MSG_GETSETELEM, as nft and the library send it) and walks the
// answer's attributes in place, in a buffer it keeps: per element only its key and its
// counter.

// nftaSetElemExpressions is NFTA_SET_ELEM_EXPRESSIONS, the list of an element's expressions
// (the kernel sends NFTA_SET_ELEM_EXPR when there is one).
const nftaSetElemExpressions = 0x11

// errYielded is setCounters' answer when its yield stopped the read.
var errYielded = errors.New("the element read gave way")

// setCounters calls fn with the key and counter of every element of set that has a counter.
// key is valid during the call only. yield is asked between two reads of the answer: when it
// says so, setCounters returns errYielded, the answer's rest left on the socket for drain.
func (d *sockets) setCounters(fam nftables.TableFamily, table, set string, fn func(key []byte, packets, bytes uint64), yield func() bool) error {
	if err := d.drain(); err != nil {
		return err
	}
	c, err := d.nftSocket()
	if err != nil {
		return err
	}
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte(table + "\x00")},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: []byte(set + "\x00")},
	})
	if err != nil {
		return err
	}
	req, err := c.Send(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM), Flags: netlink.Request | netlink.Dump},
		Data:   append([]byte{byte(fam), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		return fmt.Errorf("list elements of set %s: %w", set, err)
	}
	d.dumping, d.dumpSeq = true, req.Header.Sequence
	for {
		done, err := d.readDump(fn)
		if err != nil {
			return fmt.Errorf("list elements of set %s: %w", set, err)
		}
		if done {
			return nil
		}
		if yield() {
			return errYielded
		}
	}
}

// drain reads and drops the rest of a dump setCounters stopped: the kernel takes no other
// dump on the socket before one ends.
func (d *sockets) drain() error {
	for d.dumping {
		if _, err := d.readDump(nil); err != nil {
			return fmt.Errorf("drain an element dump: %w", err)
		}
	}
	return nil
}

// readDump reads once from the socket of the dump in progress and calls fn (nil: none) for
// its elements: whether the dump ended. The answer is read into one buffer kept for the next
// read (a dump's messages are at most 32 KiB each, the kernel's cap), where the library
// would allocate every message. A read that fails before the dump's end leaves the socket
// in no known state: it is closed, and the next use opens another.
func (d *sockets) readDump(fn func(key []byte, packets, bytes uint64)) (done bool, err error) {
	defer func() {
		if err != nil && !done {
			d.dumping = false
			d.nfConn.Close()
			d.nfConn = nil
		}
	}()
	rc, err := d.nfConn.SyscallConn()
	if err != nil {
		return false, err
	}
	if d.dumpBuf == nil {
		d.dumpBuf = make([]byte, 64<<10)
	}
	var n int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), d.dumpBuf, 0)
		return rerr != unix.EAGAIN
	}); err != nil {
		return false, err
	}
	if rerr != nil {
		return false, rerr
	}
	done, err = dumpMessages(d.dumpBuf[:n], d.dumpSeq, fn)
	if done {
		d.dumping = false
	}
	return done, err
}

// dumpMessages reads the netlink messages of one read of an element dump (sequence seq):
// whether the dump ended, and its error.
func dumpMessages(b []byte, seq uint32, fn func(key []byte, packets, bytes uint64)) (bool, error) {
	for len(b) >= unix.NLMSG_HDRLEN {
		n := int(binary.NativeEndian.Uint32(b))
		if n < unix.NLMSG_HDRLEN || n > len(b) {
			return false, fmt.Errorf("a netlink message of %d bytes in %d", n, len(b))
		}
		typ, mseq, data := binary.NativeEndian.Uint16(b[4:]), binary.NativeEndian.Uint32(b[8:]), b[unix.NLMSG_HDRLEN:n]
		b = b[min((n+3)&^3, len(b)):]
		if mseq != seq {
			continue
		}
		switch typ {
		case unix.NLMSG_DONE, unix.NLMSG_ERROR:
			if len(data) >= 4 {
				if errno := int32(binary.NativeEndian.Uint32(data)); errno != 0 {
					return true, unix.Errno(-errno)
				}
			}
			return true, nil
		case unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSETELEM:
			if len(data) < 4 {
				continue
			}
			eachAttr(data[4:], func(typ uint16, b []byte) {
				if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
					return
				}
				eachAttr(b, func(typ uint16, b []byte) {
					if typ == unix.NFTA_LIST_ELEM {
						if key, packets, bytes, ok := elemCounter(b); ok && fn != nil {
							fn(key, packets, bytes)
						}
					}
				})
			})
		}
	}
	return false, nil
}

// elemCounter reads an element's key and counter; false when it lacks either.
func elemCounter(b []byte) (key []byte, packets, bytes uint64, ok bool) {
	var counted bool
	eachAttr(b, func(typ uint16, b []byte) {
		switch typ {
		case unix.NFTA_SET_ELEM_KEY:
			eachAttr(b, func(typ uint16, b []byte) {
				if typ == unix.NFTA_DATA_VALUE {
					key = b
				}
			})
		case unix.NFTA_SET_ELEM_EXPR:
			packets, bytes, counted = exprCounter(b)
		case nftaSetElemExpressions:
			eachAttr(b, func(typ uint16, b []byte) {
				if typ == unix.NFTA_LIST_ELEM && !counted {
					packets, bytes, counted = exprCounter(b)
				}
			})
		}
	})
	return key, packets, bytes, counted && key != nil
}

// exprCounter reads a counter expression's packets and bytes; false for another expression.
func exprCounter(b []byte) (packets, bytes uint64, ok bool) {
	var data []byte
	eachAttr(b, func(typ uint16, b []byte) {
		switch typ {
		case unix.NFTA_EXPR_NAME:
			ok = string(b) == "counter\x00"
		case unix.NFTA_EXPR_DATA:
			data = b
		}
	})
	if !ok {
		return 0, 0, false
	}
	eachAttr(data, func(typ uint16, b []byte) {
		if len(b) != 8 {
			return
		}
		switch typ {
		case unix.NFTA_COUNTER_PACKETS:
			packets = binary.BigEndian.Uint64(b)
		case unix.NFTA_COUNTER_BYTES:
			bytes = binary.BigEndian.Uint64(b)
		}
	})
	return packets, bytes, true
}

// eachAttr calls fn with the type (flags masked) and payload of each netlink attribute in b.
func eachAttr(b []byte, fn func(typ uint16, b []byte)) {
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[4:n])
		b = b[min((n+3)&^3, len(b)):]
	}
}
