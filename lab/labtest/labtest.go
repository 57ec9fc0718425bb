// Package labtest gates tests that need the lab's real control plane: they run only as
// root with KUPORT_PRIVILEGED=1, and then must not pass silently when the binaries are
// missing.
package labtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"kuport.wlz.li/kuport/internal/testenv"
)

// K8sBin returns KUPORT_LAB_BIN, the dir holding the lab's etcd, kube-apiserver and kubectl
// (the output of lab/build-binaries.sh, which `make test` sets). It skips the test unless
// KUPORT_PRIVILEGED=1, and fails it when the binaries are not there.
func K8sBin(t testing.TB) string {
	t.Helper()
	testenv.Privileged(t)
	bin := os.Getenv("KUPORT_LAB_BIN")
	for _, b := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(bin, b)); bin == "" || err != nil {
			t.Fatalf("KUPORT_LAB_BIN=%q has no %s; set it to the output of lab/build-binaries.sh", bin, b)
		}
	}
	return bin
}

// KuportBin returns the dir holding kuport's own binaries (kuport-controller, kuport-agent,
// kuport-lab): KUPORT_BIN, which `make test` sets, or else a fresh build of
// kuport.wlz.li/kuport/cmd/... into a temporary dir.
func KuportBin(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("KUPORT_BIN"); bin != "" {
		return bin
	}
	bin := t.TempDir()
	out, err := exec.Command("go", "build", "-o", bin+"/", "kuport.wlz.li/kuport/cmd/...").CombinedOutput()
	if err != nil {
		t.Fatalf("build kuport binaries: %v\n%s", err, out)
	}
	return bin
}
