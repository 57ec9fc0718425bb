package release

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const changelog = `# Changelog

Preamble with a [link](docs/x.md).

## [Unreleased]

### Added

- next thing

## [0.2.0] - 2026-12-20

### Changed

- the [upgrade](docs/upgrade.md#v020) and [site](https://example.com/a) and [here](#top)
- ![diagram](./docs/a.png) and [root](/README.md)

## v0.1.0

- first

[Unreleased]: https://example.com/compare/v0.2.0...HEAD
[0.2.0]: https://example.com/compare/v0.1.0...v0.2.0
`

func TestNotes(t *testing.T) {
	for _, tc := range []struct {
		version, base, want string
	}{
		{"Unreleased", "", "### Added\n\n- next thing\n"},
		{"unreleased", "", "### Added\n\n- next thing\n"},
		{"v0.2.0", "", "### Changed\n\n- the [upgrade](docs/upgrade.md#v020) and [site](https://example.com/a) and [here](#top)\n" +
			"- ![diagram](./docs/a.png) and [root](/README.md)\n"},
		{"0.2.0", "https://github.com/kuport/kuport/blob/v0.2.0", "### Changed\n\n" +
			"- the [upgrade](https://github.com/kuport/kuport/blob/v0.2.0/docs/upgrade.md#v020) and [site](https://example.com/a) and [here](#top)\n" +
			"- ![diagram](https://github.com/kuport/kuport/blob/v0.2.0/docs/a.png) and [root](/README.md)\n"},
		// The last section ends at the link reference definitions.
		{"v0.1.0", "", "- first\n"},
		{"0.1.0", "", "- first\n"},
	} {
		got, err := Notes(changelog, tc.version, tc.base)
		if assert.NoError(t, err, tc.version) {
			assert.Equal(t, tc.want, got, tc.version)
		}
	}
}

func TestNotesRefuses(t *testing.T) {
	for version, want := range map[string]string{
		"v0.3.0": "no section for v0.3.0",
		"0.2":    "no section for 0.2",
		"":       "no version given",
		"v":      "no section for v",
	} {
		_, err := Notes(changelog, version, "")
		assert.ErrorContains(t, err, want, version)
	}
	_, err := Notes("## [Unreleased]\n\n## [0.1.0]\n\n- first\n", "Unreleased", "")
	assert.ErrorContains(t, err, "the section for Unreleased is empty")
}

// repoRoot is the repository's top, two directories up from this package.
var repoRoot = filepath.Join("..", "..")

// inlineTarget is an inline link's target in markdown.
var inlineTarget = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// headingText is a markdown heading's text.
var headingText = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*$`)

// slug is the anchor GitHub gives a heading: lower case, spaces to hyphens, every other
// character but letters, digits, '-' and '_' dropped.
func slug(h string) string {
	h = regexp.MustCompile(`[^\p{L}\p{N} _-]`).ReplaceAllString(strings.ToLower(h), "")
	return strings.ReplaceAll(h, " ", "-")
}

// TestChangelog checks the repository's CHANGELOG.md: it keeps an Unreleased section, every
// relative link in it names a file and a heading of the repository, and every version
// docs/upgrade.md files notes under has a section with notes, so the rename a release makes
// cannot leave the two apart.
func TestChangelog(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "CHANGELOG.md"))
	require.NoError(t, err)
	cl := string(b)
	assert.Regexp(t, `(?m)^## \[Unreleased\]$`, cl)

	for _, m := range inlineTarget.FindAllStringSubmatch(cl, -1) {
		target, anchor, _ := strings.Cut(m[1], "#")
		if strings.Contains(target, "://") || target == "" {
			continue
		}
		md, err := os.ReadFile(filepath.Join(repoRoot, target))
		if !assert.NoError(t, err, "CHANGELOG.md links to %s", m[1]) || anchor == "" {
			continue
		}
		found := false
		for _, h := range headingText.FindAllStringSubmatch(string(md), -1) {
			found = found || slug(h[1]) == anchor
		}
		assert.True(t, found, "CHANGELOG.md links to %s: no such heading", m[1])
	}

	b, err = os.ReadFile(filepath.Join(repoRoot, "docs", "upgrade.md"))
	require.NoError(t, err)
	_, byVersion, ok := strings.Cut(string(b), "\n## Notes by version\n")
	require.True(t, ok, "docs/upgrade.md has no section Notes by version")
	byVersion, _, _ = strings.Cut(byVersion, "\n## ")
	versions := regexp.MustCompile(`(?m)^### (.+?)\s*$`).FindAllStringSubmatch(byVersion, -1)
	require.NotEmpty(t, versions, "docs/upgrade.md files no note under a version")
	for _, v := range versions {
		_, err := Notes(cl, v[1], "")
		assert.NoError(t, err, "docs/upgrade.md files notes under %s", v[1])
	}
}
