package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRun(t *testing.T) {
	cl := filepath.Join(t.TempDir(), "CHANGELOG.md")
	require.NoError(t, os.WriteFile(cl, []byte("# Changelog\n\n## [0.1.0] - 2026-12-06\n\n- see [upgrade](docs/upgrade.md#010)\n"), 0o644))
	for _, tc := range []struct {
		args         []string
		code         int
		stdout, errs string
	}{
		{[]string{"--version", "v0.1.0", cl}, 0, "- see [upgrade](docs/upgrade.md#010)\n", ""},
		{[]string{"--version", "v0.1.0", "--base", "https://github.com/kuport/kuport/blob/v0.1.0/", cl}, 0,
			"- see [upgrade](https://github.com/kuport/kuport/blob/v0.1.0/docs/upgrade.md#010)\n", ""},
		{[]string{"--version", "v0.2.0", cl}, 1, "", "no section for v0.2.0"},
		{[]string{"--version", "v0.1.0", cl + ".missing"}, 1, "", "no such file"},
		{[]string{cl}, 2, "", "usage"},
		{[]string{"--version", "v0.1.0"}, 2, "", "usage"},
		{[]string{"--bogus"}, 2, "", "unknown flag"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		assert.Equal(t, tc.code, code, "%q: %s", tc.args, stderr.String())
		assert.Equal(t, tc.stdout, stdout.String(), "%q", tc.args)
		assert.Contains(t, stderr.String(), tc.errs, "%q", tc.args)
	}
}
