package labbench

import (
	"io"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"kuport.wlz.li/kuport/datapath"
)

// The traffic figures of bench/datapath and bench/link: a client in one network namespace
// dials target (a node's mapped port) and a pod's Serve answers.

// dialer bounds each connection attempt.
var dialer = net.Dialer{Timeout: 2 * time.Second}

// Serve runs a pod's TCP server: each connection is read to its end (throughput), or
// answered byte for byte (request/response and connection rate).
func Serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer func() { _ = c.Close() }()
			_, _ = io.Copy(c, c)
		}()
	}
}

// ServeIn runs Serve on addr:port in network namespace ns until stop.
func ServeIn(ns, addr string, port int) (stop func(), err error) {
	var l net.Listener
	if err := InNS(ns, func() (err error) {
		l, err = net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
		return err
	}); err != nil {
		return nil, err
	}
	go Serve(l)
	return func() { _ = l.Close() }, nil
}

// Median is the median of v, the mean of the middle two for an even count.
func Median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Throughput is one TCP flow's rate in Gbit/s from namespace ns to target over d.
func Throughput(ns, target string, d time.Duration) (gbps float64, err error) {
	err = InNS(ns, func() error {
		c, err := dialer.Dial("tcp", target)
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		go func() { _, _ = io.Copy(io.Discard, c) }()
		buf := make([]byte, 128<<10)
		var sent int64
		start := time.Now()
		for time.Since(start) < d {
			n, err := c.Write(buf)
			sent += int64(n)
			if err != nil {
				return err
			}
		}
		gbps = float64(sent) * 8 / time.Since(start).Seconds() / 1e9
		return nil
	})
	return gbps, err
}

// ConnRate is how many new connections a second, one after another, namespace ns opens to
// target over d.
func ConnRate(ns, target string, d time.Duration) (perS float64, err error) {
	err = InNS(ns, func() error {
		var conns int
		start := time.Now()
		for time.Since(start) < d {
			c, err := dialer.Dial("tcp", target)
			if err != nil {
				return err
			}
			_ = c.(*net.TCPConn).SetLinger(0)
			_ = c.Close()
			conns++
		}
		perS = float64(conns) / time.Since(start).Seconds()
		return nil
	})
	return perS, err
}

// RRP50 is the median in µs, over d, of connect + one-byte request + reply from namespace ns
// to target.
func RRP50(ns, target string, d time.Duration) (us float64, err error) {
	err = InNS(ns, func() error {
		var rtts []time.Duration
		one := []byte{'k'}
		start := time.Now()
		for time.Since(start) < d {
			t0 := time.Now()
			c, err := dialer.Dial("tcp", target)
			if err != nil {
				return err
			}
			if _, err := c.Write(one); err != nil {
				return err
			}
			if _, err := io.ReadFull(c, one); err != nil {
				return err
			}
			rtts = append(rtts, time.Since(t0))
			_ = c.(*net.TCPConn).SetLinger(0)
			_ = c.Close()
		}
		slices.Sort(rtts)
		us = float64(rtts[len(rtts)/2].Nanoseconds()) / 1e3
		return nil
	})
	return us, err
}

// NodeDatapath is the product's Datapath in network namespace name, as the agent opens it,
// its nftables connection (to read the kernel back) and what closes both.
func NodeDatapath(name string, log hclog.Logger) (*datapath.Datapath, *nftables.Conn, func(), error) {
	ns, err := netns.GetFromName(name)
	if err != nil {
		return nil, nil, nil, err
	}
	// Lasting, as the agent's: a socket per transaction costs an RCU grace period (8-30 ms)
	// when it closes after one that deleted an element (datapath.Config.NFT).
	conn, err := nftables.New(nftables.AsLasting(), nftables.WithNetNSFd(int(ns)), datapath.NFTSocketOption())
	if err != nil {
		_ = ns.Close()
		return nil, nil, nil, err
	}
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		_ = conn.CloseLasting()
		_ = ns.Close()
		return nil, nil, nil, err
	}
	closeAll := func() {
		nl.Close()
		_ = conn.CloseLasting()
		_ = ns.Close()
	}
	return datapath.New(datapath.Config{NFT: conn, Netlink: nl, NetNS: ns, Log: log}), conn, closeAll, nil
}
