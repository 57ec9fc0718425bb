package docblocks

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var repoRoot = func() string { r, _ := filepath.Abs("../.."); return r }()

// knownOptions are the marker options some suite acts on (package doc).
var knownOptions = []string{"node", "state", "kubelab"}

func TestRead(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "x.md")
		require.NoError(t, os.WriteFile(p, []byte(s), 0o644))
		return p
	}
	p := write("text\n<!-- e2e: a node=edge-a state=firewall -->\n```sh\n# a comment\nnft list \\\n  tables\n\nip rule   # trailing\n```\n\n```sh\nunmarked\n```\n")
	blocks, err := Read(p, true)
	require.NoError(t, err)
	require.Len(t, blocks, 2)
	assert.Equal(t, Block{File: p, Name: "a", Options: map[string]string{"node": "edge-a", "state": "firewall"},
		Commands: []string{"nft list tables", "ip rule   # trailing"}}, blocks[0])
	assert.Equal(t, []string{"unmarked"}, blocks[1].Commands)
	_, err = Read(p, false)
	assert.ErrorContains(t, err, "x.md:11: a ```sh block without")

	for src, want := range map[string]string{
		"<!-- e2e: a -->\ntext\n":                                          "not followed by a ```sh block",
		"<!-- e2e: a b -->\n```sh\nx\n```\n":                               "malformed marker",
		"<!-- e2e: a -->\n```sh\nx\n":                                      "unterminated",
		"<!-- e2e: a -->\n```sh\n# only\n```\n":                            "empty",
		"<!-- e2e: a -->\n```sh\nx\n```\n<!-- e2e: a -->\n```sh\ny\n```\n": `"a" used twice`,
	} {
		_, err := Read(write(src), false)
		assert.ErrorContains(t, err, want, src)
	}
	_, err = Get(write("<!-- e2e: a -->\n```sh\nx\n```\n"), "b")
	assert.ErrorContains(t, err, "no block <!-- e2e: b -->")
}

// TestDocsBlocksAreMarked checks that every shell block in docs/ is marked for a suite that
// runs it, with options a suite knows and a name no other docs block has, that a kubelab=
// step is one block's alone, and that every marked README.md block is the same as the step
// of its name.
func TestDocsBlocksAreMarked(t *testing.T) {
	blocks, err := Docs(repoRoot)
	require.NoError(t, err)
	require.NotEmpty(t, blocks)
	names := map[string]string{}
	steps := map[string]Block{}
	for _, b := range blocks {
		if other, dup := names[b.Name]; dup {
			t.Errorf("block %s in %s and %s", b.Name, other, b.File)
		}
		names[b.Name] = b.File
		for k := range b.Options {
			assert.Contains(t, knownOptions, k, "%s block %s: unknown option", b.File, b.Name)
		}
		if s, ok := b.Options["kubelab"]; ok {
			if other, dup := steps[s]; dup {
				t.Errorf("kubelab=%s marks %s block %s and %s block %s", s, other.File, other.Name, b.File, b.Name)
			}
			steps[s] = b
			assert.Len(t, b.Options, 1, "%s block %s: kubelab= runs in the kubelet-backed lab only", b.File, b.Name)
		}
		for _, c := range b.Commands {
			assert.False(t, strings.Contains(c, "<") && b.Options["kubelab"] == "" && !strings.Contains(c, "<<"),
				"%s block %s: placeholder in %q: the lab runs it as written", b.File, b.Name, c)
		}
	}
	readme, err := Read(filepath.Join(repoRoot, "README.md"), true)
	require.NoError(t, err)
	marked := 0
	for _, rb := range readme {
		if rb.Name == "" {
			continue
		}
		marked++
		step, ok := steps[rb.Name]
		if assert.True(t, ok, "README.md block %s: no docs/ block is marked kubelab=%s", rb.Name, rb.Name) {
			assert.Equal(t, step.Commands, rb.Commands, "README.md block %s differs from %s block %s", rb.Name, step.File, step.Name)
		}
	}
	assert.NotZero(t, marked, "README.md's install block is not marked")
	assert.True(t, slices.ContainsFunc(blocks, func(b Block) bool { return b.Options["node"] != "" }))
}

func TestStep(t *testing.T) {
	b, err := Step(repoRoot, "install")
	require.NoError(t, err)
	assert.Equal(t, "kubectl apply -k examples/install/", b.Commands[0])
	_, err = Step(repoRoot, "no-such-step")
	assert.ErrorContains(t, err, "0 blocks")
}

// link is a markdown link's target.
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestLinksResolve checks that every relative link of README.md, CONTRIBUTING.md and the
// markdown under docs/ names a file of the repository, so a page or a code comment that
// cites one can be followed from a clone.
func TestLinksResolve(t *testing.T) {
	files := []string{filepath.Join(repoRoot, "README.md"), filepath.Join(repoRoot, "CONTRIBUTING.md")}
	require.NoError(t, filepath.WalkDir(filepath.Join(repoRoot, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Ext(p) == ".md" {
			files = append(files, p)
		}
		return err
	}))
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") {
				continue
			}
			_, err := os.Stat(filepath.Join(filepath.Dir(f), target))
			assert.NoError(t, err, "%s links to %s", f, m[1])
		}
	}
}
