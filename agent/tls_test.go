package agent

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/internal/fakecontroller"
	"kuport.wlz.li/kuport/internal/syncbuf"
)

// testServerName is the name the test controllers' certificate is valid for, and the agents'
// Config.ServerName (their targets are unix sockets).
const testServerName = "kuport-controller.test"

var (
	// controllerCert is the test controllers' serving certificate, signed by the CA whose
	// certificate is in controllerCAFile, which testConfig's agents trust.
	controllerCert   tls.Certificate
	controllerCAFile string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kuport-agent-test-")
	if err == nil {
		controllerCAFile = filepath.Join(dir, "ca.crt")
		controllerCert, err = fakecontroller.Cert(testServerName, controllerCAFile)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "test CA:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// TestRefusesControllerItCannotVerify: a controller whose certificate is signed by another CA,
// or names another server, gets no Hello (and so neither the token nor the node's state);
// the agent logs why and moves on to the next target, whose certificate verifies.
func TestRefusesControllerItCannotVerify(t *testing.T) {
	otherCA, err := fakecontroller.Cert(testServerName, "")
	require.NoError(t, err)
	otherName, err := fakecontroller.Cert("kuport-controller.elsewhere", "")
	require.NoError(t, err)
	badCA, otherCATarget := startControllerWith(t, otherCA)
	badName, otherNameTarget := startControllerWith(t, otherName)
	good, goodTarget := startController(t)

	logs := &syncbuf.Buffer{}
	cfg := testConfig(newFakeDatapath(), logs, otherCATarget, otherNameTarget, goodTarget)
	startAgent(t, cfg)
	s := good.NextSession(t)
	assert.Equal(t, "edge-a", s.Hello.GetNode())
	assert.Contains(t, logs.String(), "certificate signed by unknown authority")
	assert.Contains(t, logs.String(), "not "+testServerName)
	assert.Empty(t, badCA.Sessions(), "a controller of another CA got a stream")
	assert.Empty(t, badName.Sessions(), "a controller of another name got a stream")
}

// TestCAFileReadOnEveryConnect: an agent whose CA file is not there yet (the kubelet has not
// mounted the ConfigMap) logs it and connects once the file appears.
func TestCAFileReadOnEveryConnect(t *testing.T) {
	c, target := startController(t)
	logs := &syncbuf.Buffer{}
	cfg := testConfig(newFakeDatapath(), logs, target)
	cfg.CAFile = filepath.Join(t.TempDir(), "ca.crt")
	startAgent(t, cfg)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "read controller CA") }, waitFor, 10*time.Millisecond)
	ca, err := os.ReadFile(controllerCAFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cfg.CAFile, ca, 0o600))
	c.NextSession(t)
}
