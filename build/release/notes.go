// Package release reads what a release publishes beside its images: the notes, a version's
// section of CHANGELOG.md (Keep a Changelog: a "## [0.1.0] - 2026-12-06" heading per version,
// "## [Unreleased]" for what no tag holds yet).
package release

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// heading is a version's heading: "## [0.1.0] - 2026-12-06", "## [Unreleased]", "## v0.1.0".
var heading = regexp.MustCompile(`^##\s+\[?([^\]\s]+)\]?(?:\s+-\s+\S.*)?\s*$`)

// linkDef is a link reference definition, as Keep a Changelog lists the versions' compare
// links after the last section: it ends that section.
var linkDef = regexp.MustCompile(`^\[[^\]]+\]:\s`)

// inlineLink is a markdown inline link or image: the text part, then the target.
var inlineLink = regexp.MustCompile(`(\]\()([^)\s]+)`)

// Notes returns the body of version's section of a changelog, without its heading, trimmed.
// version matches the heading with or without a leading "v" ("v0.1.0" finds "## [0.1.0]"),
// "Unreleased" in any case. With base set, a relative link (docs/upgrade.md#v010) is
// made absolute against it, since release notes shown away from the repository cannot follow
// one. A missing or empty section is an error: a release is not published without notes.
func Notes(changelog, version, base string) (string, error) {
	want := normalize(version)
	if want == "" {
		return "", errors.New("no version given")
	}
	var body []string
	found := false
	for _, line := range strings.Split(changelog, "\n") {
		m := heading.FindStringSubmatch(line)
		if found && (m != nil || strings.HasPrefix(line, "# ") || linkDef.MatchString(line)) {
			break
		}
		if found {
			body = append(body, line)
		} else if m != nil && normalize(m[1]) == want {
			found = true
		}
	}
	if !found {
		return "", fmt.Errorf("no section for %s", version)
	}
	notes := strings.TrimSpace(strings.Join(body, "\n"))
	if notes == "" {
		return "", fmt.Errorf("the section for %s is empty", version)
	}
	if base != "" {
		notes = absoluteLinks(notes, base)
	}
	return notes + "\n", nil
}

// normalize is a version as headings and tags are compared: without a leading "v", lower case.
func normalize(v string) string {
	v = strings.ToLower(strings.TrimSpace(v))
	if len(v) > 1 && v[0] == 'v' && v[1] >= '0' && v[1] <= '9' {
		v = v[1:]
	}
	return v
}

// absoluteLinks prefixes base to every inline link target that has no scheme and is neither
// an anchor of the notes themselves nor an absolute path.
func absoluteLinks(md, base string) string {
	if !strings.HasSuffix(base, "/") {
		base += "/"
	}
	return inlineLink.ReplaceAllStringFunc(md, func(s string) string {
		m := inlineLink.FindStringSubmatch(s)
		target := m[2]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "#") ||
			strings.HasPrefix(target, "/") || strings.HasPrefix(target, "mailto:") {
			return s
		}
		return m[1] + base + strings.TrimPrefix(target, "./")
	})
}
