package labtool

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// StreamResult is what one stream measured. Sent counts requests, Received the replies
// that came back from the dialed address; MaxGap is the longest stretch, in milliseconds,
// between consecutive replies (the start and the end count as replies), so a datapath
// outage shows as a gap even when nothing is lost. Error is the first TCP failure ("" for
// none): a broken connection ends a TCP stream early.
type StreamResult struct {
	Sent, Received int
	MaxGapMillis   int64
	Error          string
}

// Lost is Sent less Received.
func (r StreamResult) Lost() int { return r.Sent - r.Received }

// String renders the one line stream prints:
// `sent=<n> received=<n> lost=<n> max_gap_ms=<n> error=<none|text>`.
func (r StreamResult) String() string {
	errText := orNone(strings.ReplaceAll(r.Error, " ", "_"))
	return fmt.Sprintf("sent=%d received=%d lost=%d max_gap_ms=%d error=%s", r.Sent, r.Received, r.Lost(), r.MaxGapMillis, errText)
}

// ParseStreamResult parses the line String renders; it fails on any other shape.
func ParseStreamResult(line string) (StreamResult, error) {
	var r StreamResult
	fields := strings.Fields(line)
	if len(fields) != 5 {
		return r, fmt.Errorf("stream output %q: want 5 fields", line)
	}
	want := []string{"sent", "received", "lost", "max_gap_ms", "error"}
	var nums [4]int64
	for i, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k != want[i] {
			return r, fmt.Errorf("stream output %q: field %d is not %s=", line, i+1, want[i])
		}
		if i == 4 {
			r.Error = fromNone(v)
			break
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return r, fmt.Errorf("stream output %q: %s: %w", line, k, err)
		}
		nums[i] = n
	}
	r.Sent, r.Received, r.MaxGapMillis = int(nums[0]), int(nums[1]), nums[3]
	if int64(r.Lost()) != nums[2] {
		return r, fmt.Errorf("stream output %q: lost is not sent - received", line)
	}
	return r, nil
}

// gapClock tracks the longest stretch between replies.
type gapClock struct {
	mu     sync.Mutex
	last   time.Time
	maxGap time.Duration
}

func (g *gapClock) tick(now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.maxGap = max(g.maxGap, now.Sub(g.last))
	g.last = now
}

// Stream runs `kuport-lab stream --proto tcp|udp --to IP:PORT [--interval 20ms]
// [--duration 10s]`: it sends one request every interval for duration and then writes one
// line, StreamResult.String(), to stdout. UDP sends each datagram from one unconnected
// socket and counts the replies whose source is the dialed address (a reply from another
// source is a datapath failure, not a success), waiting up to 5 s after its last datagram
// for the replies still in flight. TCP holds one connection, writes a line and waits up to
// 5 s for its reply before sending the next, so TCP's own retransmission counts as a gap,
// not a loss; a broken connection ends the stream with Error set. Errors: ErrUsage,
// failing to open the UDP socket, failing to write stdout.
func Stream(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("stream", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	proto := fs.String("proto", "udp", "tcp or udp")
	to := fs.String("to", "", "destination IPv4:port or [IPv6]:port")
	interval := fs.Duration("interval", 20*time.Millisecond, "time between requests")
	duration := fs.Duration("duration", 10*time.Second, "how long to send")
	if err := parseFlags(fs, args, "kuport-lab stream --proto tcp|udp --to IP:PORT [--interval 20ms] [--duration 10s]"); err != nil {
		return err
	}
	dst, err := parseDestination(*to)
	if err != nil {
		return err
	}
	if *interval <= 0 || *duration <= 0 {
		return fmt.Errorf("%w: --interval and --duration must be > 0", ErrUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	return printResult(stdout, *proto,
		func() StreamResult { return streamTCP(ctx, dst, *interval) },
		func() (StreamResult, error) { return streamUDP(ctx, dst, *interval) })
}

// streamUDP sends until ctx ends, then waits for the replies still in flight: until every
// datagram is answered or replyWait has passed. A late reply is not a lost one: a server
// starved of CPU on a loaded machine answers late.
func streamUDP(ctx context.Context, dst netip.AddrPort, interval time.Duration) (StreamResult, error) {
	pc, err := net.ListenPacket(network("udp", dst.Addr()), wildcard(dst.Addr(), 0))
	if err != nil {
		return StreamResult{}, fmt.Errorf("open udp socket: %w", err)
	}
	defer func() { _ = pc.Close() }()
	g := &gapClock{last: time.Now()}
	// want is the number of replies to wait for, unknown (-1) while sending. The reader
	// stops once it has them; if it already had them when want was set, the main loop
	// ends its read at once. Each side writes before it reads the other's, so one sees both.
	var received, want atomic.Int64
	want.Store(-1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			if w := want.Load(); w >= 0 && received.Load() >= w {
				return
			}
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if from.(*net.UDPAddr).AddrPort() == dst {
				g.tick(time.Now())
				received.Add(1)
			}
		}
	}()
	sent := 0
	req := payload(6)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for ctx.Err() == nil {
		if _, err := pc.WriteTo(req, net.UDPAddrFromAddrPort(dst)); err == nil {
			sent++
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	stopped := time.Now()
	want.Store(int64(sent))
	deadline := stopped.Add(replyWait)
	if received.Load() >= int64(sent) {
		deadline = stopped
	}
	if err := pc.SetReadDeadline(deadline); err != nil {
		return StreamResult{}, fmt.Errorf("udp read deadline: %w", err)
	}
	<-done
	g.tick(stopped)
	return StreamResult{Sent: sent, Received: int(received.Load()), MaxGapMillis: g.maxGap.Milliseconds()}, nil
}

// replyWait bounds the wait for one reply on a TCP stream, and for the replies in flight
// when a UDP stream stops sending.
const replyWait = 5 * time.Second

func streamTCP(ctx context.Context, dst netip.AddrPort, interval time.Duration) StreamResult {
	var res StreamResult
	var d net.Dialer
	c, err := d.DialContext(ctx, network("tcp", dst.Addr()), dst.String())
	if err != nil {
		res.Error = "dial: " + err.Error()
		return res
	}
	defer func() { _ = c.Close() }()
	g := &gapClock{last: time.Now()}
	r := bufio.NewReader(c)
	req := payload(6)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for ctx.Err() == nil {
		if err := c.SetDeadline(time.Now().Add(replyWait)); err != nil {
			res.Error = err.Error()
			break
		}
		if _, err := c.Write(req); err != nil {
			res.Error = "write: " + err.Error()
			break
		}
		res.Sent++
		if _, err := r.ReadString('\n'); err != nil {
			res.Error = "read: " + err.Error()
			break
		}
		res.Received++
		g.tick(time.Now())
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	g.tick(time.Now())
	res.MaxGapMillis = g.maxGap.Milliseconds()
	return res
}
