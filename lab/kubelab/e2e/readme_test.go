package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeCommands returns the commands of the README block marked `<!-- e2e: name -->`, one
// argument list per line, with deploy/cleanup/ and deploy/ replaced by the kustomizations
// the lab pins (the lab overlay of deploy/ and a pinned deploy/cleanup), so the suite runs
// exactly what the README tells operators. Each line must be a kubectl command.
func readmeCommands(t *testing.T, name, deploy, cleanup string) [][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "<!-- e2e: "+name+" -->\n```sh\n")
	require.True(t, ok, "README has no e2e block %q", name)
	block, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	var out [][]string
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		args := strings.Fields(line)
		require.NotEmpty(t, args)
		require.Equal(t, "kubectl", args[0], "README %s: %q", name, line)
		for i, a := range args {
			switch a {
			case "deploy/cleanup/":
				args[i] = cleanup
			case "deploy/":
				args[i] = deploy
			}
		}
		out = append(out, args[1:])
	}
	return out
}

// runReadme runs the README block name (readmeCommands).
func (e *env) runReadme(name, deploy, cleanup string) {
	e.t.Helper()
	for _, args := range readmeCommands(e.t, name, deploy, cleanup) {
		e.t.Logf("README %s: kubectl %s", name, strings.Join(args, " "))
		e.kubectl(args...)
	}
}
