# Kefir — common tasks. `make up` runs a local cluster; `make test` is the CI test suite.
GO ?= go
BIN := bin/kefir

.PHONY: build up test test-bench test-race test-race-concurrent soak fuzz lint bench-storage bench-resp compare compare-quick clean

build:
	$(GO) build -o $(BIN) ./cmd/kefir

# A local cluster on loopback, ready for redis-cli. It builds first, naming the
# packages as they compile (-v), so a cold first build (about a minute) is not a
# silent wait; `go run ./cmd/kefir up` compiles without a word. ARGS passes
# flags: make up ARGS="--nodes 1".
up:
	@echo "building $(BIN) (a first build takes a minute or so)..."
	$(GO) build -v -o $(BIN) ./cmd/kefir
	./$(BIN) up $(ARGS)

# The bench module's own tests (the YCSB harness, the delay mesh,
# the limits probe, storagebench, go-redis against the front door) need no
# peer servers; the driver tests, which start redis-server, etcd and
# ZooKeeper, run with `make test-bench`.
BENCH_SELF_TESTS = ./ycsb ./delaymesh ./limits ./storagebench ./frontdoor

# Tests run with -tags mutations: the deliberate bugs tests switch on to show
# they are caught exist only in that build (internal/mutation); binaries are
# built without it, so they carry none. Without the tag those tests skip.
TEST_TAGS = -tags mutations

# The default suite (CI): unit, simulator, checker and e2e tests. Must stay under 15 minutes on 2 cores.
test:
	$(GO) vet -tags cadtrace ./internal/vrshard/
	$(GO) test $(TEST_TAGS) -count=1 -timeout 20m ./...
	cd bench && $(GO) test -count=1 -timeout 5m $(BENCH_SELF_TESTS)

test-bench:
	cd bench && $(GO) test -count=1 -timeout 10m ./...

test-race:
	$(GO) test $(TEST_TAGS) -count=1 -race -timeout 30m ./...

# The race detector over the packages that run goroutines, as CI runs it. The
# protocol cores, the simulator and the codecs are single-threaded by design
# (internal/vr alone takes 7+ minutes under -race); `make test-race` covers them too.
# internal/vrshard's simulations (its tests named *Sim*; no other package here
# has such names) run the host on the simulator's one goroutine: the detector
# finds nothing there, and they are ~80 % of the package's CPU (user+sys 89 s
# of 123 s without -race; under it the package took 36 of its 40 minutes on a
# loaded box), so this run skips them; the real-time tests (goroutines,
# sockets) stay. `make test-race` runs them too.
RACE_PKGS = ./client/... ./cmd/... ./internal/check/... ./internal/cluster/... ./internal/faultproxy/... ./internal/server/... ./internal/shard/... \
	./internal/seglog/... ./internal/storage/... ./internal/transport/... ./internal/vfs/... ./internal/vrshard/... ./test/...

test-race-concurrent:
	$(GO) test $(TEST_TAGS) -count=1 -race -timeout 40m -skip 'Sim' $(RACE_PKGS)

# Longer randomized runs (crash-recovery seeds, simulator seeds, crash loops of
# real processes under SIGKILL): minutes to hours.
soak:
	KEFIR_SOAK=1 $(GO) test $(TEST_TAGS) -count=1 -timeout 90m ./internal/...
	KEFIR_SOAK=1 $(GO) test $(TEST_TAGS) -count=1 -timeout 30m -run 'TestCrashLoop|TestRestartedFollowerKeepsTheLeader' ./test/e2e/

# Short fuzzing passes over every fuzz target (seed corpora also run in `make test`).
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test $(TEST_TAGS) -run '^$$' -fuzz "^$$f$$" -fuzztime 30s $$pkg || exit 1; \
	  done; \
	done

lint:
	gofmt -l $$(git ls-files '*.go')
	$(GO) vet ./...
	$(GO) vet $(TEST_TAGS) ./...
	staticcheck ./...
	staticcheck $(TEST_TAGS) ./...

# Benchmarks (see docs/benchmarks.md; each figure there names its command).
bench-storage:
	cd bench && $(GO) run ./storagebench -md results/storage-table.md -json results/storage.json

bench-resp:
	bash bench/resp-vs-redis.sh -n 200000 -r 3

# The standard YCSB matrix (issue 8), twice back to back, ≤ 20 minutes: regenerates the
# section of docs/benchmarks.md between its ycsb-compare markers. Knobs: bench/compare.sh.
compare:
	DOCS=../docs/benchmarks.md bash bench/compare.sh

# A one-minute look at the same machinery (one matrix, two systems, workload A).
compare-quick:
	SYSTEMS="ceiling kefir-sync" WORKLOADS=a ROUNDS=2 MATRICES=1 OUT=results/compare-quick bash bench/compare.sh

clean:
	rm -rf bin kefir-data
