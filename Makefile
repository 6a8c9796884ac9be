# ratelimitd — see README.md. `make run` and `make test` are the quick start.
GO ?= go
BIN := bin
CONFIG ?= examples/envoy/ratelimit

.PHONY: all build run test vet check fuzz bench clean

all: build

build:
	$(GO) build -o $(BIN)/ratelimitd ./cmd/ratelimitd

## run: ratelimitd on the in-memory backend with the example descriptors.
run: build
	$(BIN)/ratelimitd --config $(CONFIG)

## test: vet, the layering check, and every test with the race detector.
test: vet check
	$(GO) test -race -count=1 -timeout 8m ./...

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...

## check: the core packages must not import gRPC, protobuf, YAML or Redis.
check:
	@bad=$$($(GO) list -deps ./limiter | grep -E 'grpc|protobuf|yaml|redis' || true); \
	if [ -n "$$bad" ]; then echo "limiter imports what it must not: $$bad"; exit 1; fi
	@bad=$$($(GO) list -deps ./config | grep -E 'grpc|protobuf|redis' || true); \
	if [ -n "$$bad" ]; then echo "config imports what it must not: $$bad"; exit 1; fi

clean:
	rm -rf $(BIN)
