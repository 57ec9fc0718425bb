// Command imagepack packs static binaries into a one-layer image tarball, and one such image
// per architecture into an image index in an OCI image layout (package
// kuport.wlz.li/kuport/build/imagepack). For the tarball it prints "NAME DIGEST ID": the
// image's manifest digest (what a registry serves once it is pushed) and its config digest
// (the image ID, the same after `ctr images import`); for the index "NAME DIGEST PLATFORMS":
// the index digest (what a registry serves once the layout is pushed) and its platforms,
// comma-separated. `make images` runs it.
//
//	imagepack --name REGISTRY/REPO:TAG [--out FILE] [--index DIR] --file PATH=SRC [--file ...]
//	          [--user UID:GID] [--entrypoint ARG ...] [--label KEY=VALUE ...]
//	          [--created UNIX-SECONDS] [--arch GOARCH] [--index-arch GOARCH ...]
//
// Every --file is packed at PATH in the image with mode 0755; {arch} in SRC stands for the
// image's GOARCH: --arch for the tarball, each --index-arch for the index. --created
// (default 0, the Unix epoch) is every timestamp in the image.
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

// request is what one run packs: the tarball at out of the image of arch, and the index at
// indexDir of one image per indexArchs; "" and empty skip either.
type request struct {
	spec       imagepack.ImageSpec // its Files' SRC may hold {arch}
	out        string
	arch       string
	indexDir   string
	indexArchs []string
}

func run(args []string, stdout, stderr io.Writer) int {
	req, err := parse(args, stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "imagepack:", err)
		return 2
	}
	if req.out != "" {
		d, err := imagepack.Build(forArch(req.spec, req.arch), req.out)
		if err != nil {
			_, _ = fmt.Fprintln(stderr, "imagepack:", err)
			return 1
		}
		_, _ = fmt.Fprintln(stdout, req.spec.Name, d.Manifest, d.ID)
	}
	if req.indexDir != "" {
		var specs []imagepack.ImageSpec
		var platforms []string
		for _, arch := range req.indexArchs {
			specs = append(specs, forArch(req.spec, arch))
			platforms = append(platforms, "linux/"+arch)
		}
		d, err := imagepack.BuildIndex(specs, req.indexDir)
		if err != nil {
			_, _ = fmt.Fprintln(stderr, "imagepack:", err)
			return 1
		}
		_, _ = fmt.Fprintln(stdout, req.spec.Name, d, strings.Join(platforms, ","))
	}
	return 0
}

// forArch returns spec for the GOARCH arch, {arch} in its files' SRC replaced by arch.
func forArch(spec imagepack.ImageSpec, arch string) imagepack.ImageSpec {
	files := map[string]imagepack.File{}
	for dst, f := range spec.Files {
		f.Src = strings.ReplaceAll(f.Src, "{arch}", arch)
		files[dst] = f
	}
	spec.Files = files
	spec.Architecture = arch
	return spec
}

func parse(args []string, stderr io.Writer) (request, error) {
	fs := pflag.NewFlagSet("imagepack", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var req request
	spec := &req.spec
	fs.StringVar(&spec.Name, "name", "", "the image's tag, REGISTRY/REPO:TAG")
	fs.StringVar(&req.out, "out", "", "the tarball to write")
	fs.StringVar(&req.indexDir, "index", "", "the OCI image layout directory to write the index to")
	files := fs.StringArray("file", nil, "PATH=SRC: pack the host file SRC at PATH, mode 0755, {arch} in SRC the image's GOARCH (repeatable)")
	fs.StringVar(&spec.User, "user", "", "the config's User, UID:GID")
	fs.StringArrayVar(&spec.Entrypoint, "entrypoint", nil, "one argument of the config's Entrypoint (repeatable)")
	labels := fs.StringArray("label", nil, "KEY=VALUE: a config label (repeatable)")
	created := fs.Int64("created", 0, "every timestamp in the image, in Unix seconds (make passes SOURCE_DATE_EPOCH)")
	fs.StringVar(&req.arch, "arch", runtime.GOARCH, "the GOARCH the tarball's files were built for")
	fs.StringArrayVar(&req.indexArchs, "index-arch", nil, "a GOARCH of the index, its image linux/GOARCH (repeatable)")
	if err := fs.Parse(args); err != nil {
		return req, err
	}
	if fs.NArg() > 0 {
		return req, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if spec.Name == "" || (req.out == "" && req.indexDir == "") || len(*files) == 0 {
		return req, errors.New("--name, --out or --index, and --file are required")
	}
	if (req.indexDir == "") != (len(req.indexArchs) == 0) {
		return req, errors.New("--index and --index-arch go together")
	}
	spec.Files = map[string]imagepack.File{}
	for _, f := range *files {
		dst, src, ok := strings.Cut(f, "=")
		if !ok || dst == "" || src == "" {
			return req, fmt.Errorf("--file %q: want PATH=SRC", f)
		}
		spec.Files[dst] = imagepack.File{Src: src, Mode: 0o755}
	}
	if len(*labels) > 0 {
		spec.Labels = map[string]string{}
	}
	for _, l := range *labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return req, fmt.Errorf("--label %q: want KEY=VALUE", l)
		}
		spec.Labels[k] = v
	}
	spec.Created = time.Unix(*created, 0)
	return req, nil
}
