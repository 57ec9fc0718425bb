# kuport build, test and lab entry points. Every tool is installed with `go install` at the
# version pinned here, into .tools/<name>-<version>/ (one place for all pins).
SHELL := /bin/bash
GO ?= go
export GOTOOLCHAIN := local

BUF_VERSION                := v1.75.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
CONTROLLER_GEN_VERSION     := v0.20.1
GRPCURL_VERSION            := v1.9.3
CRD_REF_DOCS_VERSION       := v0.3.0
# HELM_VERSION is the helm.sh/helm/v3 of go.mod (the chart tests' library): keep them equal.
HELM_VERSION               := v3.21.4
ACTIONLINT_VERSION         := v1.7.12
CYCLONEDX_GOMOD_VERSION    := v1.10.0
# Debian's wireguard-tools (wg), which configures the lab's wireguard-go daemons; wireguard-go
# itself is pinned in lab/build-wireguard.sh.
WIREGUARD_TOOLS_VERSION    := 1.0.20210914-1+b1

TOOLS := $(CURDIR)/.tools
BUF            := $(TOOLS)/buf-$(BUF_VERSION)/buf
PROTOC_GEN_GO  := $(TOOLS)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION)/protoc-gen-go
PROTOC_GEN_GO_GRPC := $(TOOLS)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)/protoc-gen-go-grpc
CONTROLLER_GEN := $(TOOLS)/controller-gen-$(CONTROLLER_GEN_VERSION)/controller-gen
GRPCURL        := $(TOOLS)/grpcurl-$(GRPCURL_VERSION)/grpcurl
CRD_REF_DOCS   := $(TOOLS)/crd-ref-docs-$(CRD_REF_DOCS_VERSION)/crd-ref-docs
HELM           := $(TOOLS)/helm-$(HELM_VERSION)/helm
ACTIONLINT     := $(TOOLS)/actionlint-$(ACTIONLINT_VERSION)/actionlint
CYCLONEDX_GOMOD := $(TOOLS)/cyclonedx-gomod-$(CYCLONEDX_GOMOD_VERSION)/cyclonedx-gomod

# go-install(binary path, package@version)
define go-install
	@mkdir -p $(dir $(1))
	GOBIN=$(dir $(1)) $(GO) install $(2)
endef

$(BUF):
	$(call go-install,$@,github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION))
$(PROTOC_GEN_GO):
	$(call go-install,$@,google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION))
$(PROTOC_GEN_GO_GRPC):
	$(call go-install,$@,google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION))
$(CONTROLLER_GEN):
	$(call go-install,$@,sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION))
$(GRPCURL):
	$(call go-install,$@,github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION))
$(CRD_REF_DOCS):
	$(call go-install,$@,github.com/elastic/crd-ref-docs@$(CRD_REF_DOCS_VERSION))
$(HELM):
	$(call go-install,$@,helm.sh/helm/v3/cmd/helm@$(HELM_VERSION))
$(ACTIONLINT):
	$(call go-install,$@,github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION))
$(CYCLONEDX_GOMOD):
	$(call go-install,$@,github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$(CYCLONEDX_GOMOD_VERSION))

TOOL_BINS := $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) $(CONTROLLER_GEN) $(GRPCURL) $(CRD_REF_DOCS) $(HELM) $(ACTIONLINT) $(CYCLONEDX_GOMOD)

# tools installs two at a time (silently; go install still prints any error): on a cold
# machine one tool links, on one core, while the next compiles.
.PHONY: tools
tools:
	@$(MAKE) --no-print-directory -s -j2 $(TOOL_BINS)

.PHONY: proto
proto: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC)
	PATH=$(dir $(PROTOC_GEN_GO)):$(dir $(PROTOC_GEN_GO_GRPC)):$$PATH $(BUF) generate
	$(BUF) lint

# crds also copies the CRDs into the Helm chart's crds/ (Helm's place for them, installed
# untemplated), so the chart cannot drift from deploy/crds.
HELM_CRDS := deploy/helm/kuport/crds

.PHONY: crds
crds: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) object paths=./api/... 
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=deploy/crds
	rm -f $(HELM_CRDS)/*.yaml
	cp deploy/crds/*.yaml $(HELM_CRDS)/

.PHONY: generate
generate: proto crds docs

# docs generates the API reference, docs/reference/api.md, from the Go types in api/.
API_REF := docs/reference/api.md

.PHONY: docs
docs: $(CRD_REF_DOCS)
	$(CRD_REF_DOCS) --log-level=WARN --config docs/reference/crd-ref-docs.yaml --source-path ./api \
		--renderer markdown --output-path $(API_REF)

# check-generated fails when committed generated code differs from what the pinned
# generators produce.
.PHONY: check-generated
check-generated: generate
	@if [ -n "$$(git status --porcelain -- proto api deploy/crds $(HELM_CRDS) $(API_REF))" ]; then \
		git status --short -- proto api deploy/crds $(HELM_CRDS) $(API_REF); git diff -- proto api deploy/crds $(HELM_CRDS) $(API_REF); \
		echo "generated code is stale: run make generate and commit the result" >&2; exit 1; \
	fi

# ---------------------------------------------------------------------------------------
# Build

VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
BIN := $(CURDIR)/bin
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# internal/version: what --version prints and the agents report.
LDFLAGS := -X kuport.wlz.li/kuport/internal/version.Version=$(VERSION) -X kuport.wlz.li/kuport/internal/version.Commit=$(REVISION)
# Static binaries whose bytes depend only on the source, VERSION and the Go toolchain: no cgo,
# no build paths, no VCS stamp (the image labels carry the revision).
GOBUILD := CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false

.PHONY: build
build:
	@mkdir -p $(BIN)
	@$(GOBUILD) -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

# images packs one image tarball per binary into bin/images/ (build/imagepack; no daemon, no
# registry) for IMAGE_ARCH, the one `ctr images import` loads, and beside it <binary>.oci/,
# an OCI image layout holding the index of the binary's images for IMAGE_INDEX_ARCHES
# (linux/<arch> each; empty: no index), the one a release pushes. bin/images/digests.txt has
# a line per tarball (its name, manifest digest and image ID, the config digest) and one per
# index (its name, index digest and platforms). The same commit gives the same digests: every
# timestamp is SOURCE_DATE_EPOCH (the commit time). Beside them,
# <binary>.linux-<arch>.sbom.cdx.json is the SBOM of the binary built for each architecture
# (CycloneDX JSON: the Go modules its build info lists; one per architecture, as each names
# its binary's hash), with no timestamp or serial number, so it is as reproducible as the
# image.
# `make images VERSION=v0.1.0` sets the binaries' version and the tag.
IMAGES := $(BIN)/images
IMAGE_REPO ?= ghcr.io/kuport
IMAGE_TAG ?= $(VERSION)
IMAGE_ARCH ?= $(shell $(GO) env GOARCH)
IMAGE_INDEX_ARCHES ?= amd64 arm64
IMAGE_BUILD_ARCHES = $(sort $(IMAGE_ARCH) $(IMAGE_INDEX_ARCHES))
IMAGE_SOURCE := https://github.com/kuport/kuport
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
IMAGEPACK := $(GO) run ./build/cmd/imagepack

# image(binary, user, description) packs bin/images/<binary>.tar and <binary>.oci from the
# builds in bin/images/bin/linux_<arch>/ and prints their digest lines.
define image
$(IMAGEPACK) --name $(IMAGE_REPO)/$(1):$(IMAGE_TAG) --out $(IMAGES)/$(1).tar \
	$(if $(IMAGE_INDEX_ARCHES),--index $(IMAGES)/$(1).oci $(foreach a,$(IMAGE_INDEX_ARCHES),--index-arch $(a))) \
	--file /$(1)=$(IMAGES)/bin/linux_{arch}/$(1) --entrypoint /$(1) --user $(2) \
	--arch $(IMAGE_ARCH) --created $(SOURCE_DATE_EPOCH) \
	--label org.opencontainers.image.source=$(IMAGE_SOURCE) \
	--label org.opencontainers.image.revision=$(REVISION) \
	--label org.opencontainers.image.version=$(VERSION) \
	--label org.opencontainers.image.title=$(1) \
	--label "org.opencontainers.image.description=$(3)"
endef

.PHONY: images
images: $(CYCLONEDX_GOMOD)
	@for a in $(IMAGE_BUILD_ARCHES); do \
		mkdir -p $(IMAGES)/bin/linux_$$a && \
		GOOS=linux GOARCH=$$a $(GOBUILD) -ldflags "$(LDFLAGS)" -o $(IMAGES)/bin/linux_$$a/ ./cmd/kuport-controller ./cmd/kuport-agent || exit 1; \
	done
	@{ $(call image,kuport-controller,65532:65532,kuport controller: compiles PortMaps and streams node programs) && \
	   $(call image,kuport-agent,0:0,kuport node agent: applies its node's program with nftables and netlink); \
	 } > $(IMAGES)/digests.txt.tmp
	@mv $(IMAGES)/digests.txt.tmp $(IMAGES)/digests.txt
	@for a in $(IMAGE_BUILD_ARCHES); do for b in kuport-controller kuport-agent; do \
		$(CYCLONEDX_GOMOD) bin -json -noserial -notimestamp -version $(VERSION) \
			-output $(IMAGES)/$$b.linux-$$a.sbom.cdx.json $(IMAGES)/bin/linux_$$a/$$b || exit 1; \
	done; done
	@cat $(IMAGES)/digests.txt

# chart packages the Helm chart into bin/chart/kuport-<CHART_VERSION>.tgz, its appVersion (the
# images' default tag) VERSION: what the release workflow (.github/workflows/release.yaml)
# pushes as an OCI artifact. A tag v1.2.3 gives chart version 1.2.3; any other VERSION, which
# is no semantic version, 0.0.0-<VERSION>.
CHART_VERSION ?= $(shell echo '$(VERSION)' | sed -E 's/^v([0-9]+\.[0-9]+\.[0-9]+.*)$$/\1/; t; s/^/0.0.0-/')

.PHONY: chart
chart: $(HELM)
	@mkdir -p $(BIN)/chart
	@$(HELM) package deploy/helm/kuport --version $(CHART_VERSION) --app-version $(VERSION) -d $(BIN)/chart >/dev/null
	@ls $(BIN)/chart/kuport-$(CHART_VERSION).tgz

# release-notes writes $(BIN)/release-notes.md, VERSION's section of CHANGELOG.md
# (build/cmd/releasenotes), its relative links made absolute against the repository's tree
# at the tag: the notes of the GitHub release the release workflow publishes. It fails when
# CHANGELOG.md has no section for VERSION; `make release-notes VERSION=Unreleased` shows
# what the next release's would be.
RELEASE_LINK_BASE ?= $(IMAGE_SOURCE)/blob/$(VERSION)/

.PHONY: release-notes
release-notes:
	@mkdir -p $(BIN)
	@$(GO) run ./build/cmd/releasenotes --version=$(VERSION) --base=$(RELEASE_LINK_BASE) CHANGELOG.md \
		> $(BIN)/release-notes.md.tmp || { rm -f $(BIN)/release-notes.md.tmp; exit 1; }
	@mv $(BIN)/release-notes.md.tmp $(BIN)/release-notes.md
	@echo $(BIN)/release-notes.md

# lab-images packs the lab's sandbox image, bin/images/pause.tar as kuport.lab/pause:1
# (lab/pause; containerd's sandbox_image). It carries no version and every timestamp is the
# epoch, so its digest changes only with the program and the toolchain.
.PHONY: lab-images
lab-images:
	@mkdir -p $(IMAGES)/bin
	@GOOS=linux GOARCH=$(IMAGE_ARCH) $(GOBUILD) -o $(IMAGES)/bin/ ./lab/pause
	@$(IMAGEPACK) --name kuport.lab/pause:1 --out $(IMAGES)/pause.tar \
		--file /pause=$(IMAGES)/bin/pause --entrypoint /pause --user 65535:65535 --arch $(IMAGE_ARCH) \
		--label org.opencontainers.image.source=$(IMAGE_SOURCE) --label org.opencontainers.image.title=pause

# deps installs the Debian packages the datapath, the lab and the tests use (sysctl is procps;
# ping, iputils-ping, is docs/troubleshooting.md's MTU check and the lab's mesh check;
# wireguard-tools' wg configures the lab's WireGuard daemons, pinned and without its
# recommends, which would pull a kernel image;
# chromium loads the controller's dashboard headless in its tests; containerd, runc, the CNI
# plugins and socat run the kubelet-backed lab's nodes, and its flanneld runs iptables even in
# nftables mode, to clear its iptables-mode chains; its kube-router writes iptables rules and
# ipsets with the ipset tool; installing containerd starts nothing;
# qemu-user's qemu-aarch64 runs the arm64 image's agent in build/release's tests, without its
# recommends, which would register qemu with the host kernel's binfmt_misc; qemu-system-arm
# boots the arm64 machine (lab/armvm) in which the arm64 agent applies a program, without its
# recommends: the machine needs no firmware or network boot ROM).
.PHONY: deps
deps:
	@if ! command -v nft >/dev/null || ! command -v conntrack >/dev/null || ! command -v ip >/dev/null || ! command -v sysctl >/dev/null || ! command -v chromium >/dev/null \
		|| ! command -v ping >/dev/null || ! command -v containerd >/dev/null || ! command -v runc >/dev/null || ! command -v socat >/dev/null || ! [ -x /usr/lib/cni/bridge ] \
		|| ! command -v iptables >/dev/null || ! command -v ipset >/dev/null; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables conntrack iproute2 procps iputils-ping chromium \
			containerd runc containernetworking-plugins socat iptables ipset) >&2; \
	fi
	@if [ "$$(dpkg-query -W -f '$${Version}' wireguard-tools 2>/dev/null)" != "$(WIREGUARD_TOOLS_VERSION)" ]; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			wireguard-tools=$(WIREGUARD_TOOLS_VERSION)) >&2; \
	fi
	@if ! command -v qemu-aarch64 >/dev/null || ! command -v qemu-system-aarch64 >/dev/null; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-user qemu-system-arm) >&2; \
	fi

# lab-binaries builds (once per version, cached outside the repo) etcd, kube-apiserver,
# kubectl and the rest of lab/build-binaries.sh, and the mesh's wireguard-go
# (lab/build-wireguard.sh), and fetches the arm64 machine's kernel (lab/fetch-arm64-kernel.sh).
# KUPORT_WIREGUARD tells the lab where wireguard-go is, KUPORT_ARM64_KERNEL build/release's
# tests where the kernel is.
.PHONY: lab-binaries
lab-binaries:
	@lab/build-binaries.sh >/dev/null
	@lab/build-wireguard.sh >/dev/null
	@lab/fetch-arm64-kernel.sh >/dev/null
LAB_ENV = KUPORT_WIREGUARD=$$(lab/build-wireguard.sh) KUPORT_ARM64_KERNEL=$$(lab/fetch-arm64-kernel.sh)

# ---------------------------------------------------------------------------------------
# Checks and tests

.PHONY: lint
lint: $(BUF) $(ACTIONLINT)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out" >&2; exit 1; fi
	$(GO) vet ./...
	$(BUF) lint
	$(ACTIONLINT)

# test runs everything: generated code up to date, lint, unit and golden tests, privileged
# datapath tests in fresh network namespaces, and the end-to-end suite against the lab.
.PHONY: test
test: deps tools lab-binaries check-generated lint build images chart lab-images images-next images-prev
	KUPORT_PRIVILEGED=1 KUPORT_LAB_BIN=$$(lab/build-binaries.sh) KUPORT_BIN=$(BIN) $(LAB_ENV) \
		KUPORT_IMAGES=$(IMAGES) KUPORT_IMAGES_NEXT=$(BIN)/images-next KUPORT_HELM=$(HELM) \
		env $(PREV_ENV) $(GO) test -count=1 -p 1 -timeout 45m ./...
	# bench/datapath.sh once at small N, bench/link.sh and bench/setlookup.sh one short round:
	# smoke tests that they complete, not of their figures.
	sh bench/datapath.sh --mappings 1,10 --ranged 10:2 --dualstack 1,10 --traffic 200ms
	sh bench/link.sh --rounds 1 --traffic 200ms
	sh bench/setlookup.sh --rounds 1 --traffic 200ms
	# bench/compile.sh once per benchmark, and the Go benchmarks no script runs once each
	# (compile's fan-out, the datapath's and the agent's apply and change): that they complete.
	sh bench/compile.sh --smoke
	KUPORT_PRIVILEGED=1 $(GO) test -run '^$$' -bench 'Compile$$|CompileFanout|Apply|AgentChange' -benchtime 1x \
		./controller/compile/ ./datapath/ ./agent/
	# bench/control.sh and bench/fanout.sh once at small N, in the lab: that they complete.
	sh bench/control.sh -n 10 --changes 2 --bulk 10 --settle 2m
	sh bench/fanout.sh --agents 10 --settle 2m
	@$(MAKE) --no-print-directory fuzz-smoke

# fuzz-smoke runs each fuzz target briefly beyond its committed corpus (testdata/fuzz/<name>/,
# which plain `go test` already runs): compile over generated snapshots, and the agent's
# validation of any program a peer can send, 50,000 inputs each (15-25 s here); FUZZTIME=2000000x
# for a longer run. A failure writes the input to testdata/fuzz/, to commit with its fix. The
# budget is a count, not a duration: Go 1.26's fuzz coordinator can end a timed run with a
# bare "context deadline exceeded" and no input (golang/go#75804, fixed in Go 1.27), which
# failed a clean-machine run of this target.
FUZZTIME ?= 50000x
.PHONY: fuzz-smoke
fuzz-smoke:
	$(GO) test -run '^$$' -fuzz '^FuzzCompile$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 100x ./controller/compile/
	$(GO) test -run '^$$' -fuzz '^FuzzValidateProgram$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 100x ./datapath/

# images-next packs the images of a later version (VERSION-next) into bin/images-next, for the
# install e2e's rolling upgrade, which loads the tarballs only: no index, no second arm64 build.
.PHONY: images-next
images-next:
	@$(MAKE) --no-print-directory images VERSION=$(VERSION)-next IMAGES=$(BIN)/images-next IMAGE_INDEX_ARCHES= >/dev/null

# PREV_RELEASE is the release before this tree, which the install e2e's version skew installs
# first (docs/upgrade.md, Versions that work together); PREV_RELEASE_COMMIT is the commit its
# tag points at, for a clone without tags. images-prev extracts that commit's tree into
# bin/prev-src and packs its images into bin/images-prev with that tree's own Makefile; in a
# clone without the commit (a shallow one) it says so and makes neither, and the e2e skips
# the skew.
PREV_RELEASE := v0.1.0
PREV_RELEASE_COMMIT := bd624946b8053d000fe654154416aa297c9a2e51
PREV_SRC := $(BIN)/prev-src
.PHONY: images-prev
images-prev: $(CYCLONEDX_GOMOD)
	@rm -rf $(PREV_SRC) $(BIN)/images-prev
	@if ! git cat-file -e $(PREV_RELEASE_COMMIT)^{commit} 2>/dev/null; then \
		echo "images-prev: this clone lacks $(PREV_RELEASE) ($(PREV_RELEASE_COMMIT)): the version skew e2e will be skipped (git fetch --unshallow)" >&2; \
		exit 0; \
	fi; \
	mkdir -p $(PREV_SRC) && git archive $(PREV_RELEASE_COMMIT) | tar -x -C $(PREV_SRC) && \
	$(MAKE) --no-print-directory -C $(PREV_SRC) images VERSION=$(PREV_RELEASE) REVISION=$(PREV_RELEASE_COMMIT) \
		SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct $(PREV_RELEASE_COMMIT)) TOOLS=$(TOOLS) IMAGES=$(BIN)/images-prev >/dev/null

# PREV_ENV hands images-prev's outputs to the e2e, when it made them.
PREV_ENV = $$(test -f $(BIN)/images-prev/kuport-agent.tar && echo KUPORT_IMAGES_PREV=$(BIN)/images-prev KUPORT_PREV_SRC=$(PREV_SRC))

# ---------------------------------------------------------------------------------------
# The lab

LAB_DIR ?= /run/kuport-lab
# LAB_ARGS adds kuport-lab flags to lab-up, e.g. --controller-replicas=2.
# cluster-up is lab-up on the kubelet-backed cluster, kuport installed from make images.
LAB_ARGS ?=

.PHONY: demo
# Only the SCENARIO lines reach stdout: recipes are silent and logs go to stderr.
demo: deps lab-binaries build
	@$(LAB_ENV) $(BIN)/kuport-lab demo --k8s-bin $$(lab/build-binaries.sh) --bin $(BIN) --dir $(LAB_DIR)

.PHONY: lab-up
lab-up: deps tools lab-binaries build
	@$(LAB_ENV) $(BIN)/kuport-lab up --k8s-bin $$(lab/build-binaries.sh) --bin $(BIN) --dir $(LAB_DIR) $(LAB_ARGS)

.PHONY: cluster-up
cluster-up: deps tools lab-binaries build images lab-images
	@$(LAB_ENV) $(BIN)/kuport-lab up --kubelet --images $(IMAGES) --k8s-bin $$(lab/build-binaries.sh) --bin $(BIN) --dir $(LAB_DIR) $(LAB_ARGS)

.PHONY: lab-down
lab-down:
	@if [ -x $(BIN)/kuport-lab ]; then $(BIN)/kuport-lab down --dir $(LAB_DIR); fi
