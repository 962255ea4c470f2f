# forkfleet: the two commands a user needs are `make demo` and `make test`.
# Everything else here is what they are made of.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

export PATH := /usr/local/go/bin:$(CURDIR)/.cache/bin:/usr/local/sbin:/usr/local/bin:$(PATH)
export GOFLAGS ?= -trimpath

MODULES := api guestd controld benchd deploy/kubernetes
BIN := $(CURDIR)/bin
TOOLS := $(CURDIR)/.cache/bin

# Pinned code generators (local plugins only: no remote buf plugins).
BUF_VERSION := v1.75.0
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
# What the operability tests drive controld with, as an operator would.
GRPCURL_VERSION := v1.9.4
GRPC_HEALTH_PROBE_VERSION := v0.4.62

# The Python SDK (python/): Debian's python3-* packages only, installed into a
# venv that sees them (--system-site-packages) with pip kept off any index.
PYTHON := /usr/bin/python3
PY_VENV := $(CURDIR)/.cache/python
# protoc's python generator and grpc's python plugin, for buf generate.
PY_GEN_PACKAGES := protobuf-compiler protobuf-compiler-grpc
# What the SDK imports, what pip builds it with (no build isolation: the
# installed setuptools and wheel), and what its tests use (pytest; websockets
# is an independent WebSocket implementation the tests put against the SDK's).
PY_PACKAGES := python3-grpcio python3-protobuf python3-numpy python3-pil python3-venv python3-setuptools python3-wheel \
  python3-pytest python3-websockets

# Root integration tests on the real stack (containerd, runc, CRIU, Xvfb).
INTEGRATION ?= 1
# Bounded fuzzing in `make test`.
FUZZTIME ?= 300x

.PHONY: build tools test-tools kube-apiserver python-tools python-deps python-venv python-test proto check test unit-test integration-test fuzz controld-up demo demo-stop image image-web image-node host peers browser clean

# Every binary reports this version (--version; controld also as
# forkfleet_controld_build_info): git describe of the checkout, -dirty with
# uncommitted changes.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
GO_LDFLAGS := -X main.version=$(VERSION)

## build: compile every binary into bin/
build:
	@mkdir -p $(BIN)
	cd guestd && go build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/guestd ./cmd/guestd
	cd controld && go build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/controld ./cmd/controld
	cd controld && CGO_ENABLED=0 go build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/forkfleet-log ./cmd/forkfleet-log
	cd controld && CGO_ENABLED=0 go build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/forkfleet-nethook ./cmd/forkfleet-nethook
	cd controld && go build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/forkfleet-image ./cmd/forkfleet-image
	cd benchd && go build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/benchd ./cmd/benchd
	cd api && go build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/forkfleetctl ./cmd/forkfleetctl
	@for b in guestd controld forkfleet-log forkfleet-nethook forkfleet-image benchd forkfleetctl; do \
	  v=$$($(BIN)/$$b --version 2>&1 | awk '{print $$NF}'); \
	  [ "$$v" = "$(VERSION)" ] || { echo "$$b reports version '$$v', want $(VERSION)"; exit 1; }; done

## tools: install the pinned code generators into .cache/bin
tools: $(TOOLS)/buf $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc

$(TOOLS)/buf:
	GOBIN=$(TOOLS) GOFLAGS= go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
$(TOOLS)/protoc-gen-go:
	GOBIN=$(TOOLS) GOFLAGS= go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
$(TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS) GOFLAGS= go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

## test-tools: grpcurl and grpc-health-probe (Go module proxy, into .cache/bin), Debian's prometheus and
## promtool (unpacked into /var/cache/forkfleet/prometheus/bin) and docker-registry (unpacked into
## /var/cache/forkfleet/registry/bin), none installed as a service
test-tools: $(TOOLS)/grpcurl $(TOOLS)/grpc-health-probe
	deploy/host-setup.sh --prometheus
	deploy/host-setup.sh --registry
$(TOOLS)/grpcurl:
	GOBIN=$(TOOLS) GOFLAGS= go install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)
$(TOOLS)/grpc-health-probe:
	GOBIN=$(TOOLS) GOFLAGS= go install github.com/grpc-ecosystem/grpc-health-probe@$(GRPC_HEALTH_PROBE_VERSION)

## kube-apiserver: build (or reuse: cached by its inputs in /var/cache/forkfleet/kube-apiserver) Kubernetes'
## API server with an embedded etcd from Go modules, for deploy/kubernetes's server-side dry run
## (deploy/kubernetes/apiserver; a cold build compiles most of Kubernetes)
kube-apiserver:
	deploy/kubernetes/apiserver/build.sh >/dev/null

## python-tools: Debian's protoc and gRPC python plugin, which buf.gen.yaml names
python-tools:
	@if [ ! -x /usr/bin/protoc ] || [ ! -x /usr/bin/grpc_python_plugin ]; then \
	  deploy/host-setup.sh --packages $(PY_GEN_PACKAGES); fi

## proto: format, lint and regenerate api/gen and python/gen from proto/
proto: tools python-tools
	buf format -w
	buf lint
	buf generate

## check: gofmt, go vet, buf lint/format, generated code (Go and Python) up to date, and the committed
## benchmark report (benchd/docs/benchmarks.md and its charts) rendered from the committed results
check: tools python-tools
	@bad=$$(gofmt -l $(MODULES) | grep -v '^api/gen/' || true); \
	  if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	@for m in $(MODULES); do (cd $$m && go vet ./...) || exit 1; done
	buf lint
	buf format --diff --exit-code
	buf generate
	@if [ -n "$$(git status --porcelain -- api/gen python/gen)" ]; then \
	  echo "generated code is stale: run 'make proto' and commit api/gen and python/gen"; \
	  git status --short -- api/gen python/gen; exit 1; fi
	cd benchd && go run ./cmd/benchd report --check
	@echo "check: ok"

## host: make this machine a forkfleet host (containerd, runc, CRIU, config)
host:
	deploy/host-setup.sh

## peers: install every peer the benchmark suites measure (benchd peers lists them)
peers:
	deploy/host-setup.sh --packages $$(cd benchd && go run ./cmd/benchd peers packages)

## image: build (or reuse) the desktop image and import it into containerd
image: host
	images/desktop/build.sh

## image-web: build (or reuse) the web desktop image (desktop + Chromium) and import it
image-web: image
	images/desktop-web/build.sh

## image-node: build (or reuse) the node image of deploy/kubernetes's DaemonSet, an OCI layout in
## /var/cache/forkfleet/images/node-oci (images/node; host-setup's containerd and CRIU, controld)
image-node: host
	images/node/build.sh

## browser: Debian's Chromium on the host, the real browser of the live view's tests (TestRealStackView)
browser:
	deploy/host-setup.sh --packages chromium

## test: set up what the tests need, then run every test (unit and real stack) and bounded fuzzing
## (benchd's suite smoke tests drive the host's controld, as benchd does: controld-up starts it; deploy/kubernetes's
## server-side dry run needs the kube-apiserver target, its node image tests the image-node one)
test: host image image-web image-node peers python-deps browser test-tools kube-apiserver controld-up
	$(MAKE) integration-test python-test fuzz

## unit-test: the tests that need no root and no real stack
unit-test:
	@for m in $(MODULES); do echo "== go test $$m"; (cd $$m && go test -count=1 ./...) || exit 1; done
	$(MAKE) python-test INTEGRATION=0

## integration-test: every test, the real-stack ones included (needs `make host image`)
integration-test:
	@set -a; . /etc/forkfleet/host.env; set +a; \
	for m in $(MODULES); do echo "== integration $$m"; \
	  (cd $$m && FORKFLEET_INTEGRATION=$(INTEGRATION) go test -count=1 -p 1 -timeout 20m ./...) || exit 1; done

## python-deps: the Debian packages the Python SDK and its tests use
python-deps:
	deploy/host-setup.sh --packages $(PY_PACKAGES)

## python-venv: install python/ as a user would (pip, no index) into .cache/python (benchd's clientscale uses it too)
python-venv:
	rm -rf $(PY_VENV) && $(PYTHON) -m venv --system-site-packages $(PY_VENV)
	$(PY_VENV)/bin/pip install --quiet --no-index --no-build-isolation ./python

## python-test: the Python SDK's tests (real stack with INTEGRATION=1)
python-test: python-venv
	@set -a; [ ! -f /etc/forkfleet/host.env ] || . /etc/forkfleet/host.env; set +a; \
	cd python && FORKFLEET_INTEGRATION=$(INTEGRATION) $(PY_VENV)/bin/python -m pytest -q -p no:cacheprovider tests

## fuzz: every Fuzz target of every module, FUZZTIME inputs each (go test -fuzz takes one target at a time;
## the targets are found in the sources, which costs no build)
fuzz:
	@for m in $(MODULES); do \
	  for dir in $$(cd $$m && grep -rl --include='*_test.go' '^func Fuzz' . | xargs -r -n1 dirname | sort -u); do \
	    for f in $$(cd $$m && cat $$dir/*_test.go | grep -o '^func Fuzz[A-Za-z0-9_]*' | cut -d' ' -f2); do \
	      echo "== fuzz $$m/$${dir#./} $$f"; \
	      (cd $$m && go test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$dir) || exit 1; done; done; done

## controld-up: build and (re)start the host's controld (deploy/controld-up.sh)
controld-up: host image build
	deploy/controld-up.sh $(BIN)/controld

## demo: set up the host, build, start controld, and boot/act/observe/checkpoint/fork a sandbox
demo: controld-up
	$(BIN)/forkfleetctl demo

demo-stop:
	deploy/controld-up.sh --stop

clean:
	rm -rf $(BIN)
