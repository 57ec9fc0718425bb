package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"testing"

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

func TestRunUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--name", "kuport.lab/pause:1", "--out", "x.tar"},
		{"--name", "kuport.lab/pause:1", "--out", "x.tar", "--file", "/pause"},
		{"--name", "kuport.lab/pause:1", "--out", "x.tar", "--file", "/pause=x", "--label", "=v"},
		{"--name", "kuport.lab/pause:1", "--out", "x.tar", "--file", "/pause=x", "extra"},
		{"--bogus"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
}
