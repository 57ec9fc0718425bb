package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/lab/docblocks"
)

// stepArgs says what the lab runs in place of the install docs' paths and placeholders: the
// kustomizations the lab pins in place of the example overlay's (the lab overlay of deploy/
// and a pinned deploy/cleanup), the
// chart with the lab's values (lab/kubelab/helm-values.yaml, the chart's form of the lab
// overlay), the image tag installed and the one upgraded to.
type stepArgs struct {
	deploy, cleanup, tag, newTag string
}

// labImageRepo is the repository the lab's images carry (make images' IMAGE_REPO default),
// for the docs' <repository>.
const labImageRepo = "ghcr.io/kuport"

// stepCommands returns the commands of the docs/ block marked kubelab=step (docblocks.Step:
// the install, upgrade and uninstall of docs/install.md and docs/upgrade.md, README.md's
// install among them), one argument list per line, with the docs' paths and placeholders
// replaced as stepArgs says, so the suite runs exactly what the docs tell operators. Each
// line must be a kubectl or helm command.
func stepCommands(t *testing.T, step string, a stepArgs) [][]string {
	t.Helper()
	b, err := docblocks.Step(repoRoot, step)
	require.NoError(t, err)
	var out [][]string
	for _, line := range b.Commands {
		var args []string
		line = strings.NewReplacer("<tag>", a.tag, "<new tag>", a.newTag, "<repository>", labImageRepo).Replace(line)
		for _, w := range strings.Fields(line) {
			switch w {
			case "examples/install/cleanup/":
				w = a.cleanup
			case "examples/install/":
				w = a.deploy
			case "deploy/helm/kuport":
				args = append(args, filepath.Join(repoRoot, w), "-f", filepath.Join(repoRoot, "lab/kubelab/helm-values.yaml"))
				continue
			case "deploy/helm/kuport/crds/":
				w = filepath.Join(repoRoot, w)
			}
			args = append(args, w)
		}
		require.Contains(t, []string{"kubectl", "helm"}, args[0], "step %s: %q", step, line)
		require.NotContains(t, strings.Join(args, " "), "<", "step %s: a placeholder the lab does not fill: %q", step, line)
		out = append(out, args)
	}
	return out
}

// runStep runs the docs' block of step (stepCommands): kubectl through the lab's kubectl,
// helm through the pinned helm binary (KUPORT_HELM) on the lab's kubeconfig.
func (e *env) runStep(step string, a stepArgs) {
	e.t.Helper()
	for _, args := range stepCommands(e.t, step, a) {
		e.t.Logf("step %s: %s", step, strings.Join(args, " "))
		if args[0] == "kubectl" {
			e.kubectl(args[1:]...)
			continue
		}
		c := exec.CommandContext(context.Background(), helmBin(e.t), args[1:]...)
		c.Env = append(os.Environ(), "KUBECONFIG="+e.l.Cluster.Kubeconfig())
		out, err := c.CombinedOutput()
		require.NoError(e.t, err, "%s", out)
	}
}

// helmBin is KUPORT_HELM, the helm binary the Makefile pins (`make test` sets it).
func helmBin(t *testing.T) string {
	t.Helper()
	h := os.Getenv("KUPORT_HELM")
	if _, err := os.Stat(h); h == "" || err != nil {
		t.Fatalf("KUPORT_HELM=%q is not the helm binary; `make test` sets it (make tools builds it)", h)
	}
	return h
}

// steps are the docs' kubelab= blocks TestPrivilegedInstall runs.
var steps = []string{"install", "upgrade", "uninstall", "helm-install", "helm-upgrade", "helm-uninstall"}

// TestDocSteps checks, without a lab, that every step the suite runs is one docs/ block that
// parses into kubectl and helm commands with every path and placeholder filled, and that
// every docs/ block marked kubelab= is one of those steps.
func TestDocSteps(t *testing.T) {
	a := stepArgs{deploy: "/overlay", cleanup: "/cleanup", tag: "v1", newTag: "v2"}
	for _, step := range steps {
		require.NotEmpty(t, stepCommands(t, step, a), step)
	}
	docs, err := docblocks.Docs(repoRoot)
	require.NoError(t, err)
	for _, b := range docs {
		if s, ok := b.Options["kubelab"]; ok {
			require.Contains(t, steps, s, "%s block %s: step %s is not run by this suite", b.File, b.Name, s)
		}
	}
	helm := stepCommands(t, "helm-install", a)[1]
	require.Equal(t, []string{"helm", "install", "kuport", filepath.Join(repoRoot, "deploy/helm/kuport"), "-f",
		filepath.Join(repoRoot, "lab/kubelab/helm-values.yaml"), "-n", "kuport-system", "--take-ownership",
		"--set", "controller.image.repository=ghcr.io/kuport/kuport-controller", "--set", "controller.image.tag=v1",
		"--set", "agent.image.repository=ghcr.io/kuport/kuport-agent", "--set", "agent.image.tag=v1"}, helm)
	upgrade := stepCommands(t, "helm-upgrade", a)[1]
	require.Equal(t, []string{"--set", "controller.image.tag=v2", "--set", "agent.image.tag=v2"}, upgrade[len(upgrade)-4:])
}
