package main

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/controller/servingcert"
)

// TestLeaderElectionFlagsAreChecked: durations client-go's leader election cannot work with
// stop the controller before it campaigns or serves.
func TestLeaderElectionFlagsAreChecked(t *testing.T) {
	err := run(append([]string{"--kubeconfig", unreachableKubeconfig(t), "--grpc-listen", "127.0.0.1:0",
		"--lease-duration", "10s", "--renew-deadline", "10s"}, certFlags(t)...))
	require.ErrorContains(t, err, "leader election")
}

// TestAgentServiceAccountIsChecked: a malformed --agent-service-account stops the controller
// before it serves.
func TestAgentServiceAccountIsChecked(t *testing.T) {
	err := run([]string{"--kubeconfig", unreachableKubeconfig(t), "--grpc-listen", "127.0.0.1:0",
		"--agent-service-account", "kuport-agent"})
	require.ErrorContains(t, err, "--agent-service-account")
}

// TestTLSFlagsAreChecked: a certificate file without its key, or one that cannot be read, stops
// the controller before it serves; the Secret it would use instead needs the API server.
func TestTLSFlagsAreChecked(t *testing.T) {
	kubeconfig := unreachableKubeconfig(t)
	err := run([]string{"--kubeconfig", kubeconfig, "--grpc-listen", "127.0.0.1:0", "--tls-cert-file", "tls.crt"})
	require.ErrorContains(t, err, "--tls-cert-file and --tls-key-file go together")
	err = run([]string{"--kubeconfig", kubeconfig, "--grpc-listen", "127.0.0.1:0",
		"--tls-cert-file", filepath.Join(t.TempDir(), "tls.crt"), "--tls-key-file", filepath.Join(t.TempDir(), "tls.key")})
	require.ErrorContains(t, err, "serving certificate")
	err = run([]string{"--kubeconfig", kubeconfig, "--grpc-listen", "127.0.0.1:0"})
	require.ErrorContains(t, err, "serving certificate secret kuport-system/kuport-controller-tls")
}

// TestReturnMarkingFlags: a return marking the datapath cannot work with stops the controller
// before it serves, naming the flags and the reason; one overlapping a known user starts with
// a warning naming the user; the default starts without one.
func TestReturnMarkingFlags(t *testing.T) {
	err := run([]string{"--kubeconfig", unreachableKubeconfig(t), "--grpc-listen", "127.0.0.1:0", "--return-tables", "250-260"})
	require.ErrorContains(t, err, "--return-rule-prefs: return tables 250-260 hold the kernel's tables 253-255")
	for _, c := range []struct {
		mask, tables, prefs string
		err, warning        string
	}{
		{mask: "0x301f", tables: "27505-27631", prefs: "101,102"},
		{mask: "0x301f", tables: "200-210", prefs: "101,102", warning: "Cilium"},
		{mask: "0x3000001f", tables: "27505-27631", prefs: "101,102", warning: "Calico"},
		{mask: "0x30ff", tables: "27505-27631", prefs: "101,102", err: "the identity SNAT's translated bit"},
		{mask: "0x1", tables: "27505-27631", prefs: "101,102", err: "fewer than"},
		{mask: "zz", tables: "27505-27631", prefs: "101,102", err: "--return-mark-mask"},
		{mask: "0x301f", tables: "27505", prefs: "101,102", err: "--return-tables"},
		{mask: "0x301f", tables: "27505-27631", prefs: "102,101", err: "the loop guard must come first"},
		{mask: "0x301f", tables: "27505-27631", prefs: "101", err: "--return-rule-prefs"},
	} {
		var logs strings.Builder
		_, err := returnMarking(c.mask, c.tables, c.prefs, hclog.New(&hclog.LoggerOptions{Output: &logs}))
		if c.err != "" {
			require.ErrorContains(t, err, c.err, "%+v", c)
			continue
		}
		require.NoError(t, err, "%+v", c)
		if c.warning == "" {
			require.Empty(t, logs.String(), "%+v", c)
		} else {
			require.Contains(t, logs.String(), "[WARN]", "%+v", c)
			require.Contains(t, logs.String(), c.warning, "%+v", c)
		}
	}
}

// certFlags writes a serving certificate and key and returns the flags naming them, so the
// controller starts without the API server.
func certFlags(t *testing.T) []string {
	flags, _ := certFlagsCA(t)
	return flags
}

// certFlagsCA is certFlags, also returning the PEM certificate of the CA that signed the
// serving certificate, issued for kuport-controller.test.
func certFlagsCA(t *testing.T) (flags []string, ca []byte) {
	t.Helper()
	b, err := servingcert.Generate([]string{"kuport-controller.test"}, time.Now())
	require.NoError(t, err)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	require.NoError(t, os.WriteFile(cert, b.Cert, 0o600))
	require.NoError(t, os.WriteFile(key, b.Key, 0o600))
	return []string{"--tls-cert-file", cert, "--tls-key-file", key}, b.CACert
}

// unreachableKubeconfig writes a kubeconfig naming an API server nobody listens on.
func unreachableKubeconfig(t *testing.T) string {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600))
	return kubeconfig
}

// TestHTTPLoopbackIsChecked: --http-loopback-listen serves without authentication, so an
// address other than a loopback one stops the controller before it serves.
func TestHTTPLoopbackIsChecked(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:9091", ":9091", "localhost:9091", "10.0.0.1:9091", "[::]:9091", "127.0.0.1"} {
		err := run([]string{"--kubeconfig", unreachableKubeconfig(t), "--grpc-listen", "127.0.0.1:0", "--http-loopback-listen", addr})
		require.ErrorContains(t, err, "--http-loopback-listen", addr)
	}
	for _, addr := range []string{"127.0.0.1:9091", "127.0.0.2:0", "[::1]:9091"} {
		require.NoError(t, checkLoopback(addr), addr)
	}
}

// TestHTTPListeners: --http-listen serves TLS with the serving certificate and refuses a
// request without a token; --http-loopback-listen serves the same handlers in plain HTTP.
// The API server is unreachable, so the controller campaigns until the test stops it.
func TestHTTPListeners(t *testing.T) {
	secure, loopback := freeAddr(t), freeAddr(t)
	flags, ca := certFlagsCA(t)
	done := make(chan error, 1)
	go func() {
		done <- run(append([]string{"--kubeconfig", unreachableKubeconfig(t), "--grpc-listen", "127.0.0.1:0",
			"--http-listen", secure, "--http-loopback-listen", loopback}, flags...))
	}()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(ca))
	tlsClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "kuport-controller.test"}}}
	var resp *http.Response
	require.Eventually(t, func() bool {
		var err error
		resp, err = tlsClient.Get("https://" + secure + "/metrics")
		return err == nil
	}, 10*time.Second, 50*time.Millisecond)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	resp, err := http.Get("http://" + loopback + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), "go_goroutines")

	// Go's TLS server answers plain HTTP with 400 and nothing else.
	resp, err = http.Get("http://" + secure + "/metrics")
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.NotContains(t, string(body), "go_goroutines")

	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGINT))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the controller did not stop on SIGINT")
	}
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = lis.Close() }()
	return lis.Addr().String()
}
