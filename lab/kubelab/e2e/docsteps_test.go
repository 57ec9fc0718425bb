package e2e

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/lab/docblocks"
)

// stepArgs fills the install docs' placeholders: the tag installed and the one upgraded to.
type stepArgs struct {
	tag, newTag string
}

// stepCommands returns the commands of the docs/ block marked kubelab=step (docblocks.Step:
// the install, upgrade and uninstall of docs/install.md and docs/upgrade.md), one argument
// list per line, with only the docs' placeholders (<tag>, <new tag>) filled:
// the suite runs them as written, in an operator's checkout (kubelab.Checkout). Each line
// must be a kubectl or helm command.
func stepCommands(t *testing.T, step string, a stepArgs) [][]string {
	t.Helper()
	b, err := docblocks.Step(repoRoot, step)
	require.NoError(t, err)
	var out [][]string
	for _, line := range b.Commands {
		line = strings.NewReplacer("<tag>", a.tag, "<new tag>", a.newTag).Replace(line)
		args := strings.Fields(line)
		require.Contains(t, []string{"kubectl", "helm"}, args[0], "step %s: %q", step, line)
		require.NotContains(t, line, "<", "step %s: a placeholder the lab does not fill: %q", step, line)
		out = append(out, args)
	}
	return out
}

// runStep runs the docs' block of step (stepCommands) in the operator's checkout (e.checkout):
// kubectl is the lab's, helm the pinned binary (KUPORT_HELM), both on the lab's kubeconfig.
func (e *env) runStep(step string, a stepArgs) {
	e.t.Helper()
	for _, args := range stepCommands(e.t, step, a) {
		e.t.Logf("step %s: %s", step, strings.Join(args, " "))
		bin := e.l.Cluster.Kubectl()
		if args[0] == "helm" {
			bin = helmBin(e.t)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		c := exec.CommandContext(ctx, bin, args[1:]...)
		c.Dir = e.checkout
		c.Env = append(os.Environ(), "KUBECONFIG="+e.l.Cluster.Kubeconfig())
		out, err := c.CombinedOutput()
		cancel()
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
var steps = []string{"install", "upgrade", "uninstall", "helm-install", "helm-upgrade", "helm-uninstall",
	"upgrade-controller", "upgrade-agents", "rollback-controller"}

// TestDocSteps checks, without a lab, that every step the suite runs is one docs/ block that
// parses into kubectl and helm commands with every placeholder filled, that every docs/
// block marked kubelab= is one of those steps, and that the paths they name are the
// example install's, which kubelab.Checkout pins.
func TestDocSteps(t *testing.T) {
	a := stepArgs{tag: "v1", newTag: "v2"}
	for _, step := range steps {
		cmds := stepCommands(t, step, a)
		require.NotEmpty(t, cmds, step)
		for _, args := range cmds {
			for _, w := range args {
				if strings.HasPrefix(w, "examples/") || strings.HasPrefix(w, "deploy/") {
					_, err := os.Stat(repoRoot + "/" + w)
					require.NoError(t, err, "step %s names %s, which the repository does not hold", step, w)
				}
			}
		}
	}
	docs, err := docblocks.Docs(repoRoot)
	require.NoError(t, err)
	for _, b := range docs {
		if s, ok := b.Options["kubelab"]; ok {
			require.Contains(t, steps, s, "%s block %s: step %s is not run by this suite", b.File, b.Name, s)
		}
	}
	var upgrade []string
	for _, args := range stepCommands(t, "helm-upgrade", a) {
		if args[0] == "helm" {
			upgrade = args
		}
	}
	require.Equal(t, []string{"--set", "controller.image.tag=v2", "--set", "agent.image.tag=v2"}, upgrade[len(upgrade)-4:])
}
