# gpuctl build. `make demo` runs the embedded default; `make test` is what CI runs.
GO        ?= go
export CGO_CFLAGS := -Wno-deprecated-declarations
# One package at a time: the integration tests run real servers, nodemons
# and ranks with timing bounds (node down within 3 s, stall named within
# threshold + 2 s) that two packages at once on a 2-core machine would blur.
GOTEST    ?= $(GO) test -count=1 -p 1 -timeout 30m
PKGS      := ./...

.PHONY: all build workload kube test gpu-check gpu-check-bundle chaos soak soak-away soak-etcd bench bench-tui bench-store bench-stalls bench-failslow bench-swarm bench-estimates bench-carbon bench-hetero fuzz generate check-generated demo lint clean

all: build

# nodemon finds gpuctl's NCCL profiler plugin beside itself (--nccl-profiler auto).
build: workload
	$(GO) build -o bin/gpuctl ./cmd/gpuctl
	$(GO) build -o bin/nodemon ./cmd/nodemon
	cp workload/build/libnccl-profiler-gpuctl.so bin/

workload:
	$(MAKE) -C workload

# The Kubernetes tests run a real kube-apiserver, kube-controller-manager
# and kubelets, built from k8s.io/kubernetes into bin/kube (once: about ten
# minutes on two cores; scripts/kube-build.sh says why it is not a plain
# go install).
kube:
	scripts/kube-build.sh

# Tests need the reference workload (ringtrain, libnccl.so.2) and the two
# binaries, which the integration tests start as real processes. The
# control plane's packages run again under the race detector: their
# goroutines share the node registry, the job owner's inbox and the watch
# hub.
test: build kube lint
	GPUCTL_BIN=$(CURDIR)/bin $(GOTEST) $(PKGS)
	GPUCTL_BIN=$(CURDIR)/bin $(GOTEST) -race ./controlplane/... ./agent/...

# The GPU check (scripts/gpu-check.sh) runs on a GPU host from a bundle
# built here: gpuctl and nodemon stripped into bin/gpu-check (about 50 MiB
# together), with the reference workload in workload/build for the
# simulated run. go-nvml needs cgo, so both link the host's glibc
# dynamically (the script says when the GPU host's is too old). Without a
# GPU, `make gpu-check` runs the same steps against simulated GPUs.
gpu-check-bundle: workload
	$(GO) build -trimpath -ldflags='-s -w' -o bin/gpu-check/gpuctl ./cmd/gpuctl
	$(GO) build -trimpath -ldflags='-s -w' -o bin/gpu-check/nodemon ./cmd/nodemon
	cp workload/build/libnccl-profiler-gpuctl.so bin/gpu-check/
	@du -ch bin/gpu-check/* workload/build/libnccl.so.2 workload/build/ringtrain | tail -1

gpu-check:
	scripts/gpu-check.sh $(GPU_CHECK_FLAGS)

# The chaos test for longer than `make test` gives it (15 s): seeded
# kill -9 and SIGSTOP of the server, nodemons and ranks amid submits,
# cancels and cordons. CHAOS_SEED replays a run.
CHAOS_FOR  ?= 3m
CHAOS_SEED ?= 1
chaos: build
	GPUCTL_BIN=$(CURDIR)/bin CHAOS_FOR=$(CHAOS_FOR) CHAOS_SEED=$(CHAOS_SEED) $(GO) test -count=1 -timeout 20m -run '^TestChaos$$' -v ./demo/

# The control plane away for long, with no rank stopped: soak-away stops
# the only server, then kills and restarts it, SOAK_AWAY each time;
# soak-etcd kills every etcd member of two servers for ETCD_OUTAGE.
SOAK_AWAY ?= 10m
ETCD_OUTAGE ?= 2m
soak: soak-away soak-etcd
soak-away: build
	GPUCTL_BIN=$(CURDIR)/bin GPUCTL_AWAY_FOR=$(SOAK_AWAY) $(GO) test -count=1 -timeout 40m -run '^TestControlPlaneAwayStopsNoRank$$' -v ./demo/
soak-etcd: build
	GPUCTL_BIN=$(CURDIR)/bin GPUCTL_ETCD_OUTAGE=$(ETCD_OUTAGE) $(GO) test -count=1 -timeout 20m -run '^TestHAEtcdOutage$$' -v ./demo/

# Benchmarks whose figures go into notes; -benchtime keeps them short on a
# shared 2-core machine. Compare runs with benchstat.
bench: build
	GPUCTL_BIN=$(CURDIR)/bin $(GO) test -run '^$$' -bench . -benchmem -benchtime 2x -timeout 30m $(PKGS)

# The console's benchmarks: a frame of the overview (2,000 nodes x 8 GPUs)
# and of the node table, a snapshot, key press to redraw while 2,000 nodes
# stream at 1 Hz, and server CPU with 20 SSH sessions. `make bench` runs
# them too (they live in ./tui/...).
bench-tui:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 20x ./tui/...

# A scheduling pass's store commit (20 jobs with 16-node placements, 40
# events) and one job write, on bbolt and on a three-member etcd in the
# same run; the etcd rows report their ratio to bbolt (x_bbolt).
bench-store:
	$(GO) test -run '^$$' -bench BenchmarkPassCommit -count 3 ./store/...

# Stalls in the default demo with the stall rule at its defaults: a healthy
# run of STALL_HEALTHY (the long run is 10m) and its false findings, then
# each fault of demo.TestStallBench's table (hangs inside and outside a
# collective, SIGSTOP) STALL_ROUNDS times, timed from injection to the
# finding that names it. Prints a table.
STALL_HEALTHY ?= 30s
STALL_ROUNDS  ?= 3
bench-stalls: build
	GPUCTL_BIN=$(CURDIR)/bin GPUCTL_STALL_BENCH=1 GPUCTL_STALL_BENCH_HEALTHY=$(STALL_HEALTHY) \
		GPUCTL_STALL_BENCH_ROUNDS=$(STALL_ROUNDS) $(GO) test -count=1 -timeout 30m -run '^TestStallBench$$' -v ./demo/

# Fail-slow in the demo: time from injecting a 0.7x GPU, a 0.5x link and a
# 15% step-time shift to its event, after FAILSLOW_HEALTHY of healthy
# running that must raise nothing (needs root for eBPF).
FAILSLOW_HEALTHY ?= 2m
bench-failslow: build
	GPUCTL_BIN=$(CURDIR)/bin GPUCTL_BENCH_FAILSLOW=1 GPUCTL_BENCH_HEALTHY=$(FAILSLOW_HEALTHY) \
		$(GO) test -count=1 -run '^TestFailSlowBench$$' -v -timeout 40m ./demo/

# Runtime estimates on held-out trace: a model learned on the Philly
# trace's first 60% schedules the rest, against users' limits and exact
# runtimes (docs/scheduling.md).
bench-estimates:
	GPUCTL_BENCH_ESTIMATES=1 $(GO) test -count=1 -run '^TestStudyEstimatesOnPhilly$$' -v -timeout 20m ./scheduler/simulate/

# The server at scale: `gpuctl bench swarm` at each of SWARM_NODES, one
# after another, each against a fresh `gpuctl serve` on loopback with N
# real node sessions streaming at 1 Hz. Run it on an otherwise idle
# machine: the load generator shares its CPUs with the server.
SWARM_NODES ?= 500 1000 2000
SWARM_FLAGS ?=
bench-swarm: build
	@for n in $(SWARM_NODES); do echo "== gpuctl bench swarm --nodes $$n $(SWARM_FLAGS)"; \
		bin/gpuctl bench swarm --nodes $$n $(SWARM_FLAGS) || exit 1; done

# Carbon-aware scheduling on the Philly trace: 5 seeds of 30% deferrable
# jobs, with and without the option, on scheduler/simulate/testdata's
# two-site curves. Prints the table of docs/scheduling.md.
bench-carbon:
	$(GO) test -count=1 -timeout 10m -run '^TestCarbonAwareOnPhilly$$' -v ./scheduler/simulate -carbon-study

# Heterogeneity-aware allocation on a mixed A100/H100 cluster: the Philly
# trace's held-out 40%, 5 seeds of cost-model throughputs, type-agnostic
# against max-throughput and max-min-fair. Prints the table of
# docs/scheduling.md.
bench-hetero:
	$(GO) test -count=1 -timeout 10m -run '^TestStudyHeteroOnPhilly$$' -v ./scheduler/simulate -hetero-study

# Every fuzz target (each `func Fuzz` in a _test.go), one at a time, for
# FUZZTIME each. Minimizing an interesting input is capped by count, or a
# large one (a state file) eats the whole budget. A crasher is written to
# its package's testdata/fuzz/<Target>/ (commit it with the fix); the run
# goes on and fails at the end, naming every target that failed.
# scripts/fuzz-target.sh runs one, and tells Go 1.26's deadline race
# (a failure with no failing input) from a real one.
FUZZTIME         ?= 30s
FUZZMINIMIZETIME ?= 100x
fuzz:
	@failed=""; n=0; \
	for dir in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
		for target in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$dir/*_test.go); do \
			n=$$((n+1)); echo "== $$dir $$target ($(FUZZTIME))"; \
			GO=$(GO) GPUCTL_BIN=$(CURDIR)/bin scripts/fuzz-target.sh $$dir $$target $(FUZZTIME) $(FUZZMINIMIZETIME) \
				|| failed="$$failed $$dir:$$target"; \
		done; \
	done; \
	echo "fuzzed $$n targets for $(FUZZTIME) each"; \
	if [ -n "$$failed" ]; then echo "fuzz failures:$$failed (crashers are under each package's testdata/fuzz/)"; exit 1; fi

bin/protoc-gen-go: go.mod
	$(GO) build -o $@ google.golang.org/protobuf/cmd/protoc-gen-go

# Regenerates protobuf code and eBPF objects (needs protoc, clang, llvm-strip).
generate: bin/protoc-gen-go
	$(GO) generate $(PKGS)

check-generated: generate
	@git diff --exit-code --stat -- api probes || { \
		echo "generated code is out of date: run 'make generate' and commit the result"; exit 1; }

demo: build
	bin/gpuctl demo

lint:
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "not gofmt'ed:"; echo "$$out"; exit 1; fi

clean:
	rm -rf bin
	$(MAKE) -C workload clean
