package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestRun(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "pause")
	if err := os.WriteFile(src, []byte("pause"), 0o700); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "pause.tar")
	var stdout, stderr bytes.Buffer
	code := run([]string{"--name", "kuport.lab/pause:1", "--out", out, "--file", "/pause=" + src,
		"--entrypoint", "/pause", "--user", "65535:65535", "--label", "a=b=c", "--created", "86400", "--arch", "arm64"},
		&stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !regexp.MustCompile(`^kuport\.lab/pause:1 sha256:[0-9a-f]{64} sha256:[0-9a-f]{64}\n$`).Match(stdout.Bytes()) {
		t.Errorf("stdout %q", stdout.String())
	}
	img, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65535:65535" || len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/pause" ||
		len(c.Labels) != 1 || c.Labels["a"] != "b=c" || cf.Created.Unix() != 86400 || cf.Architecture != "arm64" {
		t.Errorf("config %+v", cf)
	}
}

// With --index, one image per --index-arch, each packing the file of its arch, goes into
// an index, printed after the tarball's line.
func TestRunIndex(t *testing.T) {
	dir := t.TempDir()
	for _, arch := range []string{"amd64", "arm64"} {
		if err := os.MkdirAll(filepath.Join(dir, arch), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, arch, "pause"), []byte("pause "+arch), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	out, index := filepath.Join(dir, "pause.tar"), filepath.Join(dir, "pause.oci")
	var stdout, stderr bytes.Buffer
	code := run([]string{"--name", "kuport.lab/pause:1", "--out", out, "--index", index,
		"--file", "/pause=" + filepath.Join(dir, "{arch}", "pause"), "--arch", "arm64",
		"--index-arch", "amd64", "--index-arch", "arm64"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !regexp.MustCompile(`^kuport\.lab/pause:1 sha256:[0-9a-f]{64} sha256:[0-9a-f]{64}\n` +
		`kuport\.lab/pause:1 sha256:[0-9a-f]{64} linux/amd64,linux/arm64\n$`).Match(stdout.Bytes()) {
		t.Errorf("stdout %q", stdout.String())
	}
	img, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cf, err := img.ConfigFile(); err != nil || cf.Architecture != "arm64" {
		t.Errorf("tarball config %+v, %v", cf, err)
	}
	idx, err := layout.ImageIndexFromPath(index)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := idx.IndexManifest(); err != nil || len(m.Manifests) != 1 || m.Manifests[0].Digest.String() != strings.Fields(stdout.String())[4] {
		t.Errorf("index.json %+v, %v", m, err)
	}
}

func TestRunUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--name", "kuport.lab/pause:1", "--out", "x.tar"},
		{"--name", "kuport.lab/pause:1", "--out", "x.tar", "--file", "/pause"},
		{"--name", "kuport.lab/pause:1", "--out", "x.tar", "--file", "/pause=x", "--label", "=v"},
		{"--name", "kuport.lab/pause:1", "--out", "x.tar", "--file", "/pause=x", "extra"},
		{"--name", "kuport.lab/pause:1", "--file", "/pause=x"},
		{"--name", "kuport.lab/pause:1", "--index", "x.oci", "--file", "/pause=x"},
		{"--name", "kuport.lab/pause:1", "--out", "x.tar", "--index-arch", "arm64", "--file", "/pause=x"},
		{"--bogus"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
}
