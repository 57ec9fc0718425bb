package labtool

import (
	"bytes"
	"context"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProbeResultLine(t *testing.T) {
	for _, c := range []struct {
		res  ProbeResult
		line string
	}{
		{ProbeResult{PodSaw: "198.51.100.7", ReplyFrom: "203.0.113.9:3000"}, "pod_saw=198.51.100.7 reply_from=203.0.113.9:3000"},
		{ProbeResult{}, "pod_saw=none reply_from=none"},
		{ProbeResult{ReplyFrom: "192.0.2.2:3001"}, "pod_saw=none reply_from=192.0.2.2:3001"},
	} {
		assert.Equal(t, c.line, c.res.String())
		got, err := ParseProbeResult(c.line + "\n")
		require.NoError(t, err)
		assert.Equal(t, c.res, got)
	}
}

func TestParseProbeResultRejects(t *testing.T) {
	for _, line := range []string{
		"",
		"pod_saw=1.2.3.4",
		"reply_from=none pod_saw=none",
		"panic: boom\npod_saw=none reply_from=none",
	} {
		_, err := ParseProbeResult(line)
		assert.Error(t, err, "%q", line)
	}
}

func TestReply(t *testing.T) {
	peer := netip.MustParseAddr("198.51.100.7")
	assert.Equal(t, "saw=198.51.100.7\n", string(reply(peer, 6)))
	assert.Equal(t, "198.51.100.7", parseReply(reply(peer, 6)))
	assert.Len(t, reply(peer, 1400), 1400, "a large request draws a reply as large")
	assert.Equal(t, "198.51.100.7", parseReply(reply(peer, 1400)))
	assert.Empty(t, parseReply([]byte("xxxxx\n")))
	assert.Empty(t, parseReply([]byte("saw=not-an-ip\n")))
}

func TestSawLine(t *testing.T) {
	peer := netip.MustParseAddrPort("198.51.100.7:40123")
	assert.Equal(t, "saw 198.51.100.7:40123 udp 3001", sawLine(peer, "udp", 3001))
	assert.Equal(t, "listening tcp 3000", ListeningLine("tcp", 3000))
}

func TestPayload(t *testing.T) {
	assert.Equal(t, "\n", string(payload(1)))
	assert.Equal(t, "xxxxx\n", string(payload(6)))
	assert.Len(t, payload(1500), 1500)
}

// Usage errors are found before any socket is opened.
func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--proto", "sctp", "--to", "203.0.113.9:3000"},
		{"--to", "203.0.113.9"},
		{"--to", "[::ffff:203.0.113.9]:80"},
		{"--to", "[fe80::1%eth0]:80"},
		{"--to", "203.0.113.9:3000", "--timeout", "0s"},
		{"--to", "203.0.113.9:3000", "--proto", "udp", "--size", "70000"},
		{"--to", "203.0.113.9:3000", "--size", "0"},
		{"--to", "203.0.113.9:3000", "extra"},
		{"--bogus"},
		{"-h"},
	} {
		var out bytes.Buffer
		err := Probe(context.Background(), args, &out)
		assert.ErrorIs(t, err, ErrUsage, "probe %q", args)
		assert.Empty(t, out.String())
	}
	for _, args := range [][]string{
		{"--proto", "tcp"},
		{"--proto", "tcp", "--port", "70000"},
		{"--proto", "icmp", "--port", "3000"},
	} {
		err := Serve(context.Background(), args, &bytes.Buffer{})
		assert.ErrorIs(t, err, ErrUsage, "serve %q", args)
	}
}
