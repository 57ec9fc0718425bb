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

TOOLS := $(CURDIR)/.tools
BUF            := $(TOOLS)/buf-$(BUF_VERSION)/buf
PROTOC_GEN_GO  := $(TOOLS)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION)/protoc-gen-go
PROTOC_GEN_GO_GRPC := $(TOOLS)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)/protoc-gen-go-grpc
CONTROLLER_GEN := $(TOOLS)/controller-gen-$(CONTROLLER_GEN_VERSION)/controller-gen
GRPCURL        := $(TOOLS)/grpcurl-$(GRPCURL_VERSION)/grpcurl

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

.PHONY: tools
tools: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) $(CONTROLLER_GEN) $(GRPCURL)

.PHONY: proto
proto: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC)
	PATH=$(dir $(PROTOC_GEN_GO)):$(dir $(PROTOC_GEN_GO_GRPC)):$$PATH $(BUF) generate
	$(BUF) lint

.PHONY: crds
crds: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) object paths=./api/... 
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=deploy/crds

.PHONY: generate
generate: proto crds

# check-generated fails when committed generated code differs from what the pinned
# generators produce.
.PHONY: check-generated
check-generated: generate
	@if [ -n "$$(git status --porcelain -- proto api deploy/crds)" ]; then \
		git status --short -- proto api deploy/crds; git diff -- proto api deploy/crds; \
		echo "generated code is stale: run make generate and commit the result" >&2; exit 1; \
	fi

# ---------------------------------------------------------------------------------------
# Build

VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
BIN := $(CURDIR)/bin
LDFLAGS := -X main.version=$(VERSION)

.PHONY: build
build:
	@mkdir -p $(BIN)
	@CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

# deps installs the Debian packages the datapath, the lab and the tests use (sysctl is procps;
# chromium loads the controller's dashboard headless in its tests).
.PHONY: deps
deps:
	@if ! command -v nft >/dev/null || ! command -v conntrack >/dev/null || ! command -v ip >/dev/null || ! command -v sysctl >/dev/null || ! command -v chromium >/dev/null; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables conntrack iproute2 procps chromium) >&2; \
	fi

# lab-binaries builds (once per version, cached outside the repo) etcd, kube-apiserver and
# kubectl; see lab/build-binaries.sh.
.PHONY: lab-binaries
lab-binaries:
	@lab/build-binaries.sh >/dev/null

# ---------------------------------------------------------------------------------------
# Checks and tests

.PHONY: lint
lint: $(BUF)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out" >&2; exit 1; fi
	$(GO) vet ./...
	$(BUF) lint

# test runs everything: generated code up to date, lint, unit and golden tests, privileged
# datapath tests in fresh network namespaces, and the end-to-end suite against the lab.
.PHONY: test
test: deps tools lab-binaries check-generated lint build
	KUPORT_PRIVILEGED=1 KUPORT_LAB_BIN=$$(lab/build-binaries.sh) KUPORT_BIN=$(BIN) \
		$(GO) test -count=1 -p 1 -timeout 30m ./...
	# bench/datapath.sh once at small N: a smoke test that it completes, not of its timings.
	sh bench/datapath.sh --mappings 1,10 --traffic 200ms

# ---------------------------------------------------------------------------------------
# The lab

LAB_DIR ?= /run/kuport-lab
# LAB_ARGS adds kuport-lab flags to lab-up, e.g. --controller-replicas=2.
LAB_ARGS ?=

.PHONY: demo
# Only the SCENARIO lines reach stdout: recipes are silent and logs go to stderr.
demo: deps lab-binaries build
	@$(BIN)/kuport-lab demo --k8s-bin $$(lab/build-binaries.sh) --bin $(BIN) --dir $(LAB_DIR)

.PHONY: lab-up
lab-up: deps tools lab-binaries build
	@$(BIN)/kuport-lab up --k8s-bin $$(lab/build-binaries.sh) --bin $(BIN) --dir $(LAB_DIR) $(LAB_ARGS)

.PHONY: lab-down
lab-down:
	@if [ -x $(BIN)/kuport-lab ]; then $(BIN)/kuport-lab down --dir $(LAB_DIR); fi
