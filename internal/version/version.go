// Package version holds what the build stamped into a kuport binary, its version and the
// commit it was built from (the Makefile's LDFLAGS), for --version and the agents' Hello.
package version

import (
	"fmt"
	"runtime"
)

// Version and Commit are set at build time:
// -ldflags "-X kuport.wlz.li/kuport/internal/version.Version=v0.1.0 -X kuport.wlz.li/kuport/internal/version.Commit=<sha>".
var (
	Version = "dev"
	Commit  = "unknown"
)

// String is program's --version line: its version, commit, Go version and platform, e.g.
// "kuport-agent v0.1.0 commit 6d9c387… go1.26.8 linux/arm64".
func String(program string) string {
	return fmt.Sprintf("%s %s commit %s %s %s/%s", program, Version, Commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
