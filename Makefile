# ratelimitd — see README.md. `make run` and `make test` are the quick start.
GO ?= go
BIN := bin
CONFIG ?= examples/envoy/ratelimit

.PHONY: all build run test test-deps test-faults test-eg vet check fuzz bench clean test-browser image release

all: build

# The commit the tree is at, whether the tree differs from it (untracked
# files count), and its time: what image and release stamp into the
# binaries (internal/buildinfo) and the image. Outside a git checkout: no
# revision, and the epoch.
REVISION = $(shell git rev-parse HEAD 2>/dev/null)
MODIFIED = $(shell test -z "$$(git status --porcelain 2>/dev/null)" && echo false || echo true)
COMMIT_EPOCH = $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

## build: bin/ratelimitd. -buildvcs=auto, whatever GOFLAGS says, so that
## `ratelimitd version` and ratelimitd_build_info name the commit and a
## changed tree (the Go command's VCS stamp; see internal/buildinfo).
build:
	$(GO) build -buildvcs=auto -o $(BIN)/ratelimitd ./cmd/ratelimitd

## run: ratelimitd on the in-memory backend with the example descriptors.
run: build
	$(BIN)/ratelimitd --config $(CONFIG)

## test: what the tests need, installed when it is missing (test-deps),
## vet, the layering check, every test with the race detector, then
## each fuzz target for FUZZ_BRIEF executions (default 5000x). A count, not a
## duration: Go 1.26's fuzz coordinator can report a spurious "context
## deadline exceeded" failure when a -fuzztime duration expires on a busy
## machine (go.dev/issue/75804, fixed in Go 1.27). The image tests
## (internal/image and its command, run in parallel) each build the static
## binary the image ships; building it once first, with image.GoBuild's
## flags, lets both find its packages compiled instead of compiling them
## twice at once on a cold cache.
test: test-deps vet check
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -o /dev/null ./cmd/ratelimitd
	RATELIMITD_HEAVY_TESTS=1 $(GO) test -race -count=1 -timeout 8m ./...
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZ_BRIEF) FUZZMINIMIZE=$(FUZZ_BRIEF_MINIMIZE)

## fuzz: each fuzz target (FUZZ_TARGETS, name:package) for FUZZTIME (default
## 60s; a count such as 100000x also works). A failing input is saved under the package's testdata/fuzz/.
## FUZZMINIMIZE bounds the time spent shrinking each input found (go test's
## -fuzzminimizetime, default 60s); test's brief run gives it
## FUZZ_BRIEF_MINIMIZE (5s): an input grown from a large seed (config's
## testdata/bad/deep.yaml, 57 KB, 25 ms a parse) held one brief run 45 s.
FUZZTIME ?= 60s
FUZZMINIMIZE ?= 60s
FUZZ_BRIEF ?= 5000x
FUZZ_BRIEF_MINIMIZE ?= 5s
FUZZ_TARGETS := FuzzLoadConfig:./config FuzzShouldRateLimit:./internal/server FuzzRequestCodec:./internal/server
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "$(GO) test -run='^$$' -fuzz='^$${t%%:*}$$' -fuzztime=$(FUZZTIME) -fuzzminimizetime=$(FUZZMINIMIZE) $${t#*:}"; \
		$(GO) test -run='^$$' -fuzz="^$${t%%:*}\$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=$(FUZZMINIMIZE) $${t#*:} || exit 1; \
	done

## test-deps: redis-server and redis-cli, which the Redis tests start and
## ask, installed with apt-get when missing (scripts/test-deps says when it
## may, and what to run when it may not).
test-deps:
	@sh scripts/test-deps redis

## test-faults: the Redis Cluster fault suite alone, verbose (it is part
## of test too; see CONTRIBUTING.md, "The fault suite"): failovers, network
## faults through a TCP fault proxy on one Cluster master and on a
## standalone Redis, scale-out.
test-faults: test-deps
	RATELIMITD_HEAVY_TESTS=1 $(GO) test -race -count=1 -timeout 10m -v \
		-run 'TestCluster(UnderLoad|NodeFaults|FaultsStandaloneBlackhole|ScaleOutThenFullCoverageFailover)|TestTokenLeasesClusterFailover' ./cmd/ratelimitd

## test-eg: the conformance test against the real Envoy Gateway control
## plane (conformance/envoygateway, a module of its own; CONTRIBUTING.md, "The
## Envoy Gateway conformance test"), not part of test. envoy-gateway
## EG_VERSION is built from the Go module proxy into bin/ once (minutes on 2
## cores; kept there), then run standalone with ratelimitd, run as
## ratelimit, as its rate-limit service on a real redis-server.
EG_VERSION ?= v1.9.1
EG_BIN := $(BIN)/envoy-gateway-$(EG_VERSION)
test-eg: test-deps $(EG_BIN)
	cd conformance/envoygateway && RATELIMITD_EG_BIN=$(abspath $(EG_BIN)) \
		$(GO) test -count=1 -timeout 20m -v -run '^TestEnvoyGateway$$' .

$(EG_BIN):
	GOBIN=$(abspath $(BIN))/.envoy-gateway-$(EG_VERSION) $(GO) install github.com/envoyproxy/gateway/cmd/envoy-gateway@$(EG_VERSION)
	mv $(BIN)/.envoy-gateway-$(EG_VERSION)/envoy-gateway $@ && rmdir $(BIN)/.envoy-gateway-$(EG_VERSION)

## test-browser: load the /limits page in a real headless Chromium (Debian's
## chromium package), installed as test-deps installs Redis.
test-browser:
	@sh scripts/test-deps browser
	$(GO) vet -tags browser ./internal/limitspage
	$(GO) test -tags browser -count=1 -timeout 3m -run Browser -v ./internal/limitspage

vet:
	@files=$$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'); \
	test -z "$$(gofmt -l $$files)" || { echo "gofmt needed:"; gofmt -l $$files; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags testhooks ./cmd/ratelimitd

## check: the layering README promises: limiter imports only the standard
## library; config (which parses YAML) imports no gRPC, protobuf or Redis.
check:
	@self=$$($(GO) list ./limiter) && deps=$$($(GO) list -deps -f '{{if not .Standard}}{{.ImportPath}}{{end}}' ./limiter) || exit 1; \
	bad=$$(echo "$$deps" | grep -v -x "$$self" || true); \
	if [ -n "$$bad" ]; then echo "limiter imports more than the standard library: $$bad"; exit 1; fi
	@deps=$$($(GO) list -deps ./config) || exit 1; \
	bad=$$(echo "$$deps" | grep -E 'grpc|protobuf|redis' || true); \
	if [ -n "$$bad" ]; then echo "config imports what it must not: $$bad"; exit 1; fi

## bench: the load matrix against a do-nothing floor, side by side (not part
## of test). Starts and stops its own floor, ratelimitd (the one `build`
## makes, with the same $(GO)) and redis-server.
## BENCH_DURATION per cell (default 10s); BENCH_FLAGS go to ratelimit-bench run
## (e.g. BENCH_FLAGS='--rounds 3 --json'). Every call has a 2 s client deadline
## but in the 20 ms deadline cells; every backend is healthy, so any error in
## a 2 s cell fails the target (BENCH_FLAGS=--allow-errors only reports them).
## Then the fleet simulation (ratelimit-bench fleet): 32 replicas on one
## redis-server sharing one hot bucket offered twice its rate, evenly and
## with 80% on one replica, token leases off then on, FLEET_DURATION a
## phase (default 30s).
BENCH_DURATION ?= 10s
FLEET_DURATION ?= 30s
BENCH_FLAGS ?=
bench: build
	$(GO) build -o $(BIN)/ratelimit-bench ./bench
	$(BIN)/ratelimit-bench run --ratelimitd $(BIN)/ratelimitd --duration $(BENCH_DURATION) $(BENCH_FLAGS)
	$(BIN)/ratelimit-bench fleet --duration $(FLEET_DURATION)
	$(BIN)/ratelimit-bench fleet --duration $(FLEET_DURATION) --skew 0.8

## image: the container image, without a container daemon (internal/image):
## a static ratelimitd for each of IMAGE_PLATFORMS, an OCI layout of the
## multi-platform index in bin/image/oci tagged IMAGE, and a `docker load`
## tarball per platform. Every timestamp is the last commit's
## (SOURCE_DATE_EPOCH), so a rebuild gives the same digests. Push it with
## `crane push bin/image/oci REF` or
## `skopeo copy --all oci:bin/image/oci:$(IMAGE) docker://REF`.
IMAGE_REPO ?= ghcr.io/ratelimitd/ratelimitd
IMAGE ?= $(IMAGE_REPO):dev
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
image:
	rm -rf $(BIN)/image
	SOURCE_DATE_EPOCH=$${SOURCE_DATE_EPOCH:-$(COMMIT_EPOCH)} \
		$(GO) run ./internal/image/cmd/ratelimitd-image --out $(BIN)/image --tag $(IMAGE) \
		--platforms $(IMAGE_PLATFORMS) --go $(GO) --revision=$(REVISION) --modified=$(MODIFIED)

## release: what release VERSION (vX.Y.Z, required) ships, in RELEASE_DIR
## (default bin/release/VERSION): a static ratelimitd per platform of
## RELEASE_PLATFORMS (ratelimitd-OS-ARCH), the multi-platform image as an
## OCI layout tagged IMAGE_REPO:VERSION (oci/) and per platform as a
## `docker load` tarball (ratelimitd-OS-ARCH.tar), and SHA256SUMS of the
## binaries and tarballs. It is `make image` with the version: the
## binaries are stamped with VERSION, the commit, whether the tree differs
## from it and the commit's time, the image labelled with VERSION and the
## commit, and every timestamp is SOURCE_DATE_EPOCH (default the commit's),
## so two runs at one commit give the same bytes. Release from a clean
## checkout of the tag: a changed tree is released, but says modified=true.
VERSION ?=
RELEASE_DIR ?= $(BIN)/release/$(VERSION)
RELEASE_PLATFORMS ?= linux/amd64,linux/arm64
release:
	@case '$(VERSION)' in v[0-9]*.[0-9]*.[0-9]*) ;; *) echo 'make release: want VERSION=vX.Y.Z (got "$(VERSION)")' >&2; exit 2;; esac
	@test -n '$(REVISION)' || { echo 'make release: not a git checkout: the release names its commit' >&2; exit 1; }
	@test '$(MODIFIED)' = false || echo 'make release: the work tree differs from $(REVISION): the binaries say modified=true' >&2
	@case '$(RELEASE_DIR)' in $(BIN)/release/*) ;; *) test ! -e '$(RELEASE_DIR)/index.json' && test -z "$$(ls -A '$(RELEASE_DIR)' 2>/dev/null | grep -v -x -e SHA256SUMS -e 'ratelimitd-.*' -e oci)" || \
		{ echo 'make release: $(RELEASE_DIR) holds files a release does not: give an empty or new RELEASE_DIR' >&2; exit 1; };; esac
	rm -rf '$(RELEASE_DIR)'
	SOURCE_DATE_EPOCH=$${SOURCE_DATE_EPOCH:-$(COMMIT_EPOCH)} \
		$(GO) run ./internal/image/cmd/ratelimitd-image --out '$(RELEASE_DIR)' --tag '$(IMAGE_REPO):$(VERSION)' \
		--platforms '$(RELEASE_PLATFORMS)' --go '$(GO)' --version '$(VERSION)' --revision=$(REVISION) --modified=$(MODIFIED)
	cd '$(RELEASE_DIR)' && LC_ALL=C sha256sum ratelimitd-* > SHA256SUMS
	@echo '$(RELEASE_DIR)/SHA256SUMS:' && cat '$(RELEASE_DIR)/SHA256SUMS'

clean:
	rm -rf $(BIN)
