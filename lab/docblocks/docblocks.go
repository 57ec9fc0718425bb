// Package docblocks reads the shell blocks of kuport's markdown (docs/, and README.md's
// install) that tests run: a ```sh block preceded by a marker line
//
//	<!-- e2e: <name> [key=value ...] -->
//
// names the block, unique within its file, and says where it runs (the options below).
// Every test that runs the documentation's commands reads them here, so what operators read
// is what the tests ran, and no block in docs/ goes unmarked (TestDocsBlocksAreMarked).
//
// Options, read by the suites that run the blocks:
//
//   - node=<node>: run in that node of the namespace lab (ip netns exec), else in its root
//     namespace with lab/env sourced (kubectl, grpcurl);
//   - state=<state>: only on a lab the test has put into that state first (a host firewall
//     dropping forwarded packets, say), which the test then undoes;
//   - kubelab=<step>: not run in the namespace lab: the block is step <step> of the
//     kubelet-backed lab's install suite (lab/kubelab/e2e), which runs it command for
//     command (Step). README.md's block <name>, when it has one, is the same as step <name>.
package docblocks

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Block is one marked shell block.
type Block struct {
	// File is the markdown file, Name the marker's name.
	File, Name string
	// Options are the marker's key=value words.
	Options map[string]string
	// Commands are the block's command lines: a line ending in `\` joined with the next,
	// blank lines and comment lines (`#`) dropped.
	Commands []string
}

// marker is the line before a block that tests run.
var marker = regexp.MustCompile(`^<!-- e2e: (\S+)((?: [a-z]+=\S+)*) -->$`)

// Read returns every marked shell block of the markdown file path, in order. A ```sh block
// without a marker is returned with no Name when unmarked is true, and is an error
// otherwise; so is a malformed marker, a marker not followed by a ```sh block, or a
// name used twice.
func Read(path string, unmarked bool) ([]Block, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(b), "\n")
	var out []Block
	seen := map[string]bool{}
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		var blk *Block
		switch {
		case strings.HasPrefix(line, "<!-- e2e:"):
			m := marker.FindStringSubmatch(line)
			if m == nil {
				return nil, fmt.Errorf("%s:%d: malformed marker %q, want <!-- e2e: <name> [key=value ...] -->", path, i+1, line)
			}
			if i+1 >= len(lines) || lines[i+1] != "```sh" {
				return nil, fmt.Errorf("%s:%d: marker %q is not followed by a ```sh block", path, i+1, m[1])
			}
			if seen[m[1]] {
				return nil, fmt.Errorf("%s:%d: block name %q used twice", path, i+1, m[1])
			}
			seen[m[1]] = true
			blk = &Block{File: path, Name: m[1], Options: map[string]string{}}
			for _, kv := range strings.Fields(m[2]) {
				k, v, _ := strings.Cut(kv, "=")
				blk.Options[k] = v
			}
			i++
		case line == "```sh":
			if !unmarked {
				return nil, fmt.Errorf("%s:%d: a ```sh block without an <!-- e2e: <name> --> marker: no test runs it", path, i+1)
			}
			blk = &Block{File: path, Options: map[string]string{}}
		default:
			continue
		}
		end := i + 1
		for end < len(lines) && lines[end] != "```" {
			end++
		}
		if end == len(lines) {
			return nil, fmt.Errorf("%s:%d: unterminated ```sh block", path, i+1)
		}
		blk.Commands = commands(lines[i+1 : end])
		if len(blk.Commands) == 0 {
			return nil, fmt.Errorf("%s:%d: empty ```sh block", path, i+1)
		}
		out = append(out, *blk)
		i = end
	}
	return out, nil
}

// commands joins continuation lines and drops blank and comment lines.
func commands(lines []string) []string {
	var out []string
	cur := ""
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if cur == "" && (l == "" || strings.HasPrefix(l, "#")) {
			continue
		}
		if c, ok := strings.CutSuffix(l, `\`); ok {
			cur += strings.TrimSpace(c) + " "
			continue
		}
		out = append(out, cur+l)
		cur = ""
	}
	return out
}

// Get returns the block named name of the markdown file path.
func Get(path, name string) (Block, error) {
	blocks, err := Read(path, true)
	if err != nil {
		return Block{}, err
	}
	for _, b := range blocks {
		if b.Name == name {
			return b, nil
		}
	}
	return Block{}, fmt.Errorf("%s has no block <!-- e2e: %s -->", path, name)
}

// Docs returns every shell block of the markdown files under root/docs, each of which must
// be marked.
func Docs(root string) ([]Block, error) {
	var out []Block
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(p) != ".md" {
			return err
		}
		blocks, err := Read(p, false)
		out = append(out, blocks...)
		return err
	})
	return out, err
}

// Step returns the block of the markdown files under root/docs marked kubelab=step; there
// must be exactly one.
func Step(root, step string) (Block, error) {
	blocks, err := Docs(root)
	if err != nil {
		return Block{}, err
	}
	var found []Block
	for _, b := range blocks {
		if b.Options["kubelab"] == step {
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		return Block{}, fmt.Errorf("%d blocks under %s are marked kubelab=%s, want one", len(found), filepath.Join(root, "docs"), step)
	}
	return found[0], nil
}
