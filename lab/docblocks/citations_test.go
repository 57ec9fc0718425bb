package docblocks

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// citation is a markdown file a comment cites, with its section anchor if any:
// docs/design/datapath.md#the-link-device, datapath/README.md, BENCHMARKS.md.
var citation = regexp.MustCompile(`(?:^|[^\w./-])((?:[\w-]+/)*[\w-]+\.md)(#[\w-]+)?`)

// outside matches what a comment must not cite: the design notes kept beside the repository
// before docs/design held them, and issue numbers, which a clone cannot follow. A citation
// split across comment lines ("(issue\n// 11)") counts too.
var outside = regexp.MustCompile(`(?:^|[^/\w])(DESIGN\.md|API\.md|\.\./shared/|notes/[\w-]+\.md|seed-datapath|founding\s+(?://\s*|#\s*)?document|[Ii]ssue\s*(?://\s*|#\s*)?#?[0-9]+)`)

// heading is a markdown heading line.
var heading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)

// anchors returns the section anchors of a markdown file as GitHub derives them from its
// headings: lower case, spaces to hyphens, every other character but letters, digits, '-'
// and '_' dropped.
func anchors(md string) map[string]bool {
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(md, -1) {
		s := drop.ReplaceAllString(strings.ToLower(m[1]), "")
		out[strings.ReplaceAll(s, " ", "-")] = true
	}
	return out
}

// comments returns the comments of a source file, one a line: a Go file's as go/parser reads
// them, any other file's lines that start with '#' or "//".
func comments(file, text string) string {
	var out []string
	if filepath.Ext(file) == ".go" {
		f, err := parser.ParseFile(token.NewFileSet(), file, text, parser.ParseComments)
		if err != nil {
			return text
		}
		for _, g := range f.Comments {
			for _, c := range g.List {
				out = append(out, c.Text)
			}
		}
		return strings.Join(out, "\n")
	}
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "#") || strings.HasPrefix(l, "//") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// checkCitations returns what is wrong with the citations in one source file's text: a
// citation outside the repository anywhere in it (a test's name too), or a cited markdown
// file or section anchor in a comment that does not exist. A bare name (README.md) resolves against the repository's root or the file's
// directory.
func checkCitations(root, file, text string) []string {
	var bad []string
	for _, m := range outside.FindAllStringSubmatch(text, -1) {
		bad = append(bad, fmt.Sprintf("%s cites %q, outside the repository", file, m[1]))
	}
	for _, m := range citation.FindAllStringSubmatch(comments(file, text), -1) {
		target, anchor := m[1], strings.TrimPrefix(m[2], "#")
		var b []byte
		var err error
		for _, dir := range []string{root, filepath.Join(root, filepath.Dir(file))} {
			if b, err = os.ReadFile(filepath.Join(dir, target)); err == nil {
				break
			}
		}
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("%s cites %s, which does not exist", file, target))
		case anchor != "" && !anchors(string(b))[anchor]:
			bad = append(bad, fmt.Sprintf("%s cites %s#%s, a section %s does not have", file, target, anchor, target))
		}
	}
	return bad
}

// TestCommentsCiteTheRepository checks every Go, proto, shell, YAML and Makefile source of the
// repository: a comment (or test name) that cites a document cites a markdown file of the
// repository, with a section anchor its headings give, and none cites a document kept outside
// it or an issue number.
func TestCommentsCiteTheRepository(t *testing.T) {
	exts := map[string]bool{".go": true, ".proto": true, ".sh": true, ".yaml": true, ".yml": true}
	self, err := filepath.Abs("citations_test.go")
	require.NoError(t, err)
	checked := 0
	require.NoError(t, filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// bin/ is build output (the previous release's source among it: make images-prev).
			if n := d.Name(); p != repoRoot && (strings.HasPrefix(n, ".") || n == "node_modules" || p == filepath.Join(repoRoot, "bin")) {
				return filepath.SkipDir
			}
			return nil
		}
		if p == self || !(exts[filepath.Ext(p)] || d.Name() == "Makefile") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, p)
		for _, problem := range checkCitations(repoRoot, rel, string(b)) {
			t.Error(problem)
		}
		checked++
		return nil
	}))
	assert.Greater(t, checked, 100, "the walk found the repository's sources")
}

// TestCheckCitations: the check reports each kind of bad citation, so the walk above can fail.
func TestCheckCitations(t *testing.T) {
	for text, want := range map[string]string{
		"// see DESIGN.md, Shape":                   `cites "DESIGN.md"`,
		"// (API.md: 24 h)":                         `cites "API.md"`,
		"// (../shared/notes/cni.md)":               `cites "../shared/"`,
		"// (notes/real-node.md)":                   `cites "notes/real-node.md"`,
		"// the founding document's form":           `cites "founding document"`,
		"// the founding\n// document's form":       "outside the repository",
		"// (issue 13)":                             `cites "issue 13"`,
		"// in one run (issue\n// 11): the product": "outside the repository",
		"# Issue 5's bound":                         `cites "Issue 5"`,
		"// (docs/design/nope.md)":                  "docs/design/nope.md, which does not exist",
		"// (docs/design/datapath.md#no-such-one)":  "a section docs/design/datapath.md does not have",
	} {
		assert.Contains(t, strings.Join(checkCitations(repoRoot, "x.go", text), "\n"), want, text)
	}
	for _, ok := range []string{
		"// (docs/design/datapath.md#the-link-device)",
		"// (docs/design/api.md#status-and-conditions; BENCHMARKS.md)",
		"// datapath/README.md#the-priority-contract",
		"// docs/reference/api.md and the founding project's classes",
		`byID["demo/shared/ct-save/kup-2"]`,
	} {
		assert.Empty(t, checkCitations(repoRoot, "x.go", ok), ok)
	}
}
