// Package testenv holds the one gate of kuport's privileged tests, those that touch the real
// kernel (network namespaces, nftables, netlink, /run): they run only when
// KUPORT_PRIVILEGED=1, which `make test` sets, so `go test ./...` runs anywhere without
// root. It imports only the standard library, so any package's tests can use it.
package testenv

import (
	"os"
	"testing"
)

// Privileged skips t unless KUPORT_PRIVILEGED=1.
func Privileged(t testing.TB) {
	t.Helper()
	if os.Getenv("KUPORT_PRIVILEGED") != "1" {
		t.Skip("needs root (network namespaces, nftables, /run): set KUPORT_PRIVILEGED=1")
	}
}
