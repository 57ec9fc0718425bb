package labtool

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/internal/syncbuf"
)

func TestStreamResultLine(t *testing.T) {
	for _, c := range []struct {
		res  StreamResult
		line string
	}{
		{StreamResult{Sent: 10, Received: 10, MaxGapMillis: 21}, "sent=10 received=10 lost=0 max_gap_ms=21 error=none"},
		{StreamResult{Sent: 4, Received: 3, MaxGapMillis: 5000, Error: "read: i/o timeout"}, "sent=4 received=3 lost=1 max_gap_ms=5000 error=read:_i/o_timeout"},
	} {
		assert.Equal(t, c.line, c.res.String())
		got, err := ParseStreamResult(c.line)
		require.NoError(t, err)
		assert.Equal(t, c.res.Sent, got.Sent)
		assert.Equal(t, c.res.Received, got.Received)
		assert.Equal(t, c.res.MaxGapMillis, got.MaxGapMillis)
		assert.Equal(t, c.res.Error == "", got.Error == "")
	}
	for _, bad := range []string{"", "sent=1 received=1 lost=1 max_gap_ms=0 error=none", "pod_saw=none reply_from=none"} {
		_, err := ParseStreamResult(bad)
		assert.Error(t, err, "%q", bad)
	}
}

// A stream against the lab's own server on loopback gets every reply, over both protocols.
func TestStreamAgainstServe(t *testing.T) {
	for _, proto := range []string{"tcp", "udp"} {
		t.Run(proto, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			port, _ := startServe(ctx, t, proto)
			var out bytes.Buffer
			require.NoError(t, Stream(ctx, []string{"--proto", proto, "--to", fmt.Sprintf("127.0.0.1:%d", port),
				"--interval", "5ms", "--duration", "200ms"}, &out))
			res, err := ParseStreamResult(out.String())
			require.NoError(t, err)
			assert.Positive(t, res.Sent)
			assert.Zero(t, res.Lost(), out.String())
			assert.Empty(t, res.Error)
		})
	}
}

// Serve answers on both families at one port, and a probe reaches it over either: the pod
// saw the probe's own loopback address.
func TestProbeBothFamilies(t *testing.T) {
	for _, proto := range []string{"tcp", "udp"} {
		t.Run(proto, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			port, served := startServe(ctx, t, proto)
			for _, lo := range []string{"127.0.0.1", "::1"} {
				dst := netip.AddrPortFrom(netip.MustParseAddr(lo), uint16(port)).String()
				var out bytes.Buffer
				require.NoError(t, Probe(ctx, []string{"--proto", proto, "--to", dst}, &out))
				assert.Equal(t, ProbeResult{PodSaw: lo, ReplyFrom: dst}.String()+"\n", out.String())
			}
			assert.Contains(t, served.String(), "saw [::1]:")
		})
	}
}

// A UDP stream counts a reply that comes after it stopped sending, within replyWait, and
// one that never comes as lost; it stops waiting as soon as every datagram is answered.
func TestStreamUDPLateReplies(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answer   bool
		delay    time.Duration
		atLeast  time.Duration
		lessThan time.Duration
	}{
		// Every reply lands 1.5 s after its datagram, so all arrive after the 200 ms of
		// sending: a one-second wait counted them all lost.
		{name: "late", answer: true, delay: 1500 * time.Millisecond, atLeast: 1500 * time.Millisecond, lessThan: replyWait},
		{name: "never", answer: false, atLeast: replyWait, lessThan: 2 * replyWait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
			require.NoError(t, err)
			defer pc.Close()
			go func() {
				buf := make([]byte, 1500)
				for {
					_, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					if tc.answer {
						time.AfterFunc(tc.delay, func() { _, _ = pc.WriteTo(reply(netip.MustParseAddr("127.0.0.1"), 0), from) })
					}
				}
			}()
			start := time.Now()
			var out bytes.Buffer
			require.NoError(t, Stream(context.Background(), []string{"--proto", "udp", "--to", pc.LocalAddr().String(),
				"--interval", "20ms", "--duration", "200ms"}, &out))
			took := time.Since(start)
			res, err := ParseStreamResult(out.String())
			require.NoError(t, err)
			require.Positive(t, res.Sent)
			if tc.answer {
				assert.Zero(t, res.Lost(), out.String())
			} else {
				assert.Equal(t, res.Sent, res.Lost(), out.String())
			}
			assert.GreaterOrEqual(t, took, tc.atLeast, "the stream waited for the replies in flight")
			assert.Less(t, took, tc.lessThan, "the stream stopped waiting")
		})
	}
}

func freePort(t *testing.T, proto string) int {
	t.Helper()
	if proto == "udp" {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		require.NoError(t, err)
		defer pc.Close()
		return pc.LocalAddr().(*net.UDPAddr).Port
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startServe runs Serve on a free port of proto until ctx ends and returns the port once it
// listens, with what Serve writes.
func startServe(ctx context.Context, t *testing.T, proto string) (int, *syncbuf.Buffer) {
	t.Helper()
	port := freePort(t, proto)
	served := &syncbuf.Buffer{}
	go func() { _ = Serve(ctx, []string{"--proto", proto, "--port", fmt.Sprint(port)}, served) }()
	require.Eventually(t, func() bool {
		return strings.Contains(served.String(), ListeningLine(proto, port))
	}, 5*time.Second, 10*time.Millisecond)
	return port, served
}
