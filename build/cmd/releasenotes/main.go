// Command releasenotes prints one version's section of a changelog (package
// kuport.wlz.li/kuport/build/release): the notes of the GitHub release the release workflow
// (.github/workflows/release.yaml) publishes for a tag. `make release-notes` runs it.
//
//	releasenotes --version v0.1.0 [--base URL] CHANGELOG.md
//
// --base makes the section's relative links absolute against URL (the repository's tree at
// the tag). Exit status: 0 on success, 2 on a usage error, 1 when the changelog has no
// section for the version, or an empty one.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"

	"kuport.wlz.li/kuport/build/release"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("releasenotes", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	version := fs.String("version", "", "the version whose section to print (v0.1.0, 0.1.0 or Unreleased)")
	base := fs.String("base", "", "the URL the section's relative links are made absolute against")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		_, _ = fmt.Fprintln(stderr, "releasenotes:", err)
		return 2
	}
	if fs.NArg() != 1 || *version == "" {
		_, _ = fmt.Fprintln(stderr, "usage: releasenotes --version VERSION [--base URL] CHANGELOG.md")
		return 2
	}
	b, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "releasenotes:", err)
		return 1
	}
	notes, err := release.Notes(string(b), *version, *base)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "releasenotes: %s: %v\n", fs.Arg(0), err)
		return 1
	}
	_, _ = io.WriteString(stdout, notes)
	return 0
}
