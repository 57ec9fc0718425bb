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
	@git diff --exit-code -- proto api deploy/crds || { echo "generated code is stale: run make generate" >&2; exit 1; }
