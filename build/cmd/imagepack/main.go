// Command imagepack packs static binaries into a one-layer image tarball (package
// kuport.wlz.li/kuport/build/imagepack) and prints "NAME DIGEST ID": the image's manifest
// digest (what a registry serves once it is pushed) and its config digest (the image ID, the
// same after `ctr images import`). `make images` runs it.
//
//	imagepack --name REGISTRY/REPO:TAG --out FILE --file PATH=SRC [--file ...]
//	          [--user UID:GID] [--entrypoint ARG ...] [--label KEY=VALUE ...]
//	          [--created UNIX-SECONDS] [--arch GOARCH]
//
// Every --file is packed at PATH in the image with mode 0755. --created (default 0, the
// Unix epoch) is every timestamp in the image.
//
// Exit status: 0 on success, 2 on a usage error, 1 on any other error.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"kuport.wlz.li/kuport/build/imagepack"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	spec, out, err := parse(args, stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "imagepack:", err)
		return 2
	}
	d, err := imagepack.Build(spec, out)
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "imagepack:", err)
		return 1
	}
	_, _ = fmt.Fprintln(stdout, spec.Name, d.Manifest, d.ID)
	return 0
}

func parse(args []string, stderr io.Writer) (imagepack.ImageSpec, string, error) {
	fs := pflag.NewFlagSet("imagepack", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var spec imagepack.ImageSpec
	fs.StringVar(&spec.Name, "name", "", "the image's tag, REGISTRY/REPO:TAG")
	out := fs.String("out", "", "the tarball to write")
	files := fs.StringArray("file", nil, "PATH=SRC: pack the host file SRC at PATH, mode 0755 (repeatable)")
	fs.StringVar(&spec.User, "user", "", "the config's User, UID:GID")
	fs.StringArrayVar(&spec.Entrypoint, "entrypoint", nil, "one argument of the config's Entrypoint (repeatable)")
	labels := fs.StringArray("label", nil, "KEY=VALUE: a config label (repeatable)")
	created := fs.Int64("created", 0, "every timestamp in the image, in Unix seconds (make passes SOURCE_DATE_EPOCH)")
	fs.StringVar(&spec.Architecture, "arch", runtime.GOARCH, "the GOARCH the files were built for")
	if err := fs.Parse(args); err != nil {
		return spec, "", err
	}
	if fs.NArg() > 0 {
		return spec, "", fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if spec.Name == "" || *out == "" || len(*files) == 0 {
		return spec, "", errors.New("--name, --out and --file are required")
	}
	spec.Files = map[string]imagepack.File{}
	for _, f := range *files {
		dst, src, ok := strings.Cut(f, "=")
		if !ok || dst == "" || src == "" {
			return spec, "", fmt.Errorf("--file %q: want PATH=SRC", f)
		}
		spec.Files[dst] = imagepack.File{Src: src, Mode: 0o755}
	}
	if len(*labels) > 0 {
		spec.Labels = map[string]string{}
	}
	for _, l := range *labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return spec, "", fmt.Errorf("--label %q: want KEY=VALUE", l)
		}
		spec.Labels[k] = v
	}
	spec.Created = time.Unix(*created, 0)
	return spec, *out, nil
}
