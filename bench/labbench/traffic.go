package labbench

import (
	"fmt"
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

// Throughput is one TCP flow's rate in Gbit/s from namespace ns to target over d, from its
// connect until the server's echo has ended.
func Throughput(ns, target string, d time.Duration) (gbps float64, err error) {
	err = InNS(ns, func() error {
		start := time.Now()
		sent, err := flow(target, d)
		gbps = gbitPerS(sent, time.Since(start))
		return err
	})
	return gbps, err
}

// gbitPerS is the rate of bytes sent over d, in Gbit/s.
func gbitPerS(bytes int64, d time.Duration) float64 { return float64(bytes) * 8 / d.Seconds() / 1e9 }

// RRP50 is the median in µs, over d, of connect + one-byte request + reply from namespace ns
// to target.
func RRP50(ns, target string, d time.Duration) (us float64, err error) {
	err = InNS(ns, func() error {
		var rtts []time.Duration
		for start := time.Now(); time.Since(start) < d; {
			rtt, err := requestReply(target)
			if err != nil {
				return err
			}
			rtts = append(rtts, rtt)
		}
		us = p50us(rtts)
		return nil
	})
	return us, err
}

// Figures are one target's traffic figures: one TCP flow's rate in Gbit/s, new connections
// a second, and the p50 in µs of connect + one-byte request + reply.
type Figures struct{ TCPGbps, ConnPerS, RRP50us float64 }

// slice is how long each of Interleaved's flows sends.
const slice = 200 * time.Millisecond

// Interleaved takes every target's Figures from namespace ns, the targets in turn within
// each figure: one request/response, one new connection, one flow of slice to each target
// before the next to any. A change in the machine's speed then falls on every target alike,
// which blocks of seconds each did not allow (BENCHMARKS.md, "Traffic figures in turn").
// Each target is given about d of each figure.
func Interleaved(ns string, targets []string, d time.Duration) ([]Figures, error) {
	figs := make([]Figures, len(targets))
	err := InNS(ns, func() error {
		rtts := make([][]time.Duration, len(targets))
		if err := inTurn(targets, d, func(i int, target string) error {
			rtt, err := requestReply(target)
			rtts[i] = append(rtts[i], rtt)
			return err
		}); err != nil {
			return fmt.Errorf("request/response: %w", err)
		}
		conns, connTime := make([]int, len(targets)), make([]time.Duration, len(targets))
		if err := inTurn(targets, d, func(i int, target string) error {
			t0 := time.Now()
			c, err := dialer.Dial("tcp", target)
			if err != nil {
				return err
			}
			closeNow(c)
			conns[i]++
			connTime[i] += time.Since(t0)
			return nil
		}); err != nil {
			return fmt.Errorf("connection rate: %w", err)
		}
		sent, flowTime := make([]int64, len(targets)), make([]time.Duration, len(targets))
		if err := inTurn(targets, d, func(i int, target string) error {
			t0 := time.Now()
			n, err := flow(target, min(slice, d))
			sent[i] += n
			flowTime[i] += time.Since(t0)
			return err
		}); err != nil {
			return fmt.Errorf("throughput: %w", err)
		}
		for i := range targets {
			figs[i] = Figures{
				TCPGbps:  gbitPerS(sent[i], flowTime[i]),
				ConnPerS: float64(conns[i]) / connTime[i].Seconds(),
				RRP50us:  p50us(rtts[i]),
			}
		}
		return nil
	})
	return figs, err
}

// inTurn calls each, for every target in turn, until the targets have had d each.
func inTurn(targets []string, d time.Duration, each func(i int, target string) error) error {
	total := d * time.Duration(len(targets))
	for start := time.Now(); time.Since(start) < total; {
		for i, t := range targets {
			if err := each(i, t); err != nil {
				return fmt.Errorf("%s: %w", t, err)
			}
		}
	}
	return nil
}

// requestReply connects to target, sends a byte, reads it back and closes: it returns the
// time from the connect to the reply.
func requestReply(target string) (time.Duration, error) {
	t0 := time.Now()
	c, err := dialer.Dial("tcp", target)
	if err != nil {
		return 0, err
	}
	defer closeNow(c)
	one := []byte{'k'}
	if _, err := c.Write(one); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(c, one); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// p50us is the median of rtts in µs.
func p50us(rtts []time.Duration) float64 {
	s := slices.Sorted(slices.Values(rtts))
	return float64(s[len(s)/2].Nanoseconds()) / 1e3
}

// flow sends to target for d and returns the bytes sent once the server's echo of them has
// ended: a flow's tail never falls into the next target's turn.
func flow(target string, d time.Duration) (int64, error) {
	c, err := dialer.Dial("tcp", target)
	if err != nil {
		return 0, err
	}
	defer func() { _ = c.Close() }()
	drained := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, c)
		drained <- err
	}()
	buf := make([]byte, 128<<10)
	var sent int64
	for start := time.Now(); time.Since(start) < d; {
		n, err := c.Write(buf)
		sent += int64(n)
		if err != nil {
			return sent, err
		}
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return sent, err
	}
	return sent, <-drained
}

// closeNow closes c with a reset, as a client done with it: no TIME_WAIT left behind.
func closeNow(c net.Conn) {
	_ = c.(*net.TCPConn).SetLinger(0)
	_ = c.Close()
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
