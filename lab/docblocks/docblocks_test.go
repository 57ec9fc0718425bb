package docblocks

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var repoRoot = func() string { r, _ := filepath.Abs("../.."); return r }()

// knownOptions are the marker options some suite acts on (package doc).
var knownOptions = []string{"node", "state", "readme"}

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
// runs it, with options a suite knows and a name no other docs block has, and that a block
// standing for a README block (readme=) has exactly its commands.
func TestDocsBlocksAreMarked(t *testing.T) {
	blocks, err := Docs(repoRoot)
	require.NoError(t, err)
	require.NotEmpty(t, blocks)
	names := map[string]string{}
	for _, b := range blocks {
		if other, dup := names[b.Name]; dup {
			t.Errorf("block %s in %s and %s", b.Name, other, b.File)
		}
		names[b.Name] = b.File
		for k := range b.Options {
			assert.Contains(t, knownOptions, k, "%s block %s: unknown option", b.File, b.Name)
		}
		if r, ok := b.Options["readme"]; ok {
			rb, err := Get(filepath.Join(repoRoot, "README.md"), r)
			require.NoError(t, err)
			assert.Equal(t, rb.Commands, b.Commands, "%s block %s differs from README block %s", b.File, b.Name, r)
			assert.Len(t, b.Options, 1, "%s block %s: readme= runs where the README block runs", b.File, b.Name)
		}
		for _, c := range b.Commands {
			assert.False(t, strings.Contains(c, "<") && b.Options["readme"] == "" && !strings.Contains(c, "<<"),
				"%s block %s: placeholder in %q: the lab runs it as written", b.File, b.Name, c)
		}
	}
	// The founding document points at these pages by name.
	for _, f := range []string{"reading-the-numbers.md", "decisions/README.md"} {
		_, err := os.Stat(filepath.Join(repoRoot, "docs", f))
		assert.NoError(t, err)
	}
	assert.True(t, slices.ContainsFunc(blocks, func(b Block) bool { return b.Options["node"] != "" }))
}
