# TensorWasm: thin wrappers over cargo. `make ci` is what CI runs.

CARGO ?= cargo
LISTEN ?= 127.0.0.1:8080
DATA_DIR ?= ./tensor-wasm-data
C_GUESTS := examples/c/wordcount.wasm examples/c/matmul.wasm examples/c/blueprints.wasm examples/c/ticker.wasm examples/c/nn_run.wasm examples/c/digits.wasm

.PHONY: run test ci deps examples fmt-check clippy unit doc bench bench-record ci-bench http-throughput perf-doc build release clean-data

## Start the server on $(LISTEN) with the data dir $(DATA_DIR) (release build).
run:
	$(CARGO) run --release -p tensor-wasm-cli -- serve --listen $(LISTEN) --data-dir $(DATA_DIR)

## Everything CI checks: formatting, clippy, the whole test suite, docs.
test: deps examples fmt-check clippy unit doc deploy-check icount perf-doc-check api-conformance otel-check

ci: test

## Installs what the tests need when it is missing: clang + lld + wasi-libc
## (the C example guest) from Debian packages, and the pinned tools of
## scripts/install-deps.sh under .tools/ (matplotlib for the charts included).
deps:
	@scripts/install-deps.sh

examples: $(C_GUESTS)

examples/c/%.wasm: examples/c/%.c sdk/c/tensor_wasm.h sdk/c/wasi_nn.h
	clang --target=wasm32-wasi -O2 -I sdk/c $< -o $@

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	LD_LIBRARY_PATH=$(CURDIR)/.tools/nvrtc/nvidia/cu13/lib$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} $(CARGO) test --workspace

doc:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --release -p tensor-wasm-cli

## Criterion benches (full Criterion defaults; slow).
bench:
	$(CARGO) bench -p tensor-wasm-bench

## HTTP load benchmark: tensor-wasm vs a minimal axum + wasmtime server, A/B interleaved.
http-throughput:
	bash scripts/http-throughput.sh

## The python of the venv that `deps` creates with the pinned matplotlib (the charts).
PERF_PY ?= $(CURDIR)/.tools/perf-doc/bin/python

## Regenerates PERFORMANCE.md from the run files under bench-results/.
## (The script also renders the SVG charts of docs/charts/, with matplotlib.)
perf-doc: deps
	$(PERF_PY) scripts/perf_doc.py > PERFORMANCE.md

## Fails when PERFORMANCE.md or a chart differs from what `make perf-doc`
## renders from the committed run files (regenerated into a temporary dir).
perf-doc-check: deps
	$(PERF_PY) scripts/perf_doc.py --check

clean-data:
	rm -rf $(DATA_DIR)

CI_BENCH := $(CARGO) bench -p tensor-wasm-bench -p tensor-wasm-tenant -p tensor-wasm-snapshot --bench '*' -- --warm-up-time 1 --measurement-time 3
CI_BENCH_DIR := $(CURDIR)/target/ci-bench/criterion

## CI flags (short warm-up and measurement) into a fresh results directory, then the
## regression gate against bench-results/baseline.json. A regressed metric is re-run
## once (the same command, filtered to the regressed ids) and fails only when it
## regresses again; a missing one fails at once. The gate names every failure.
ci-bench:
	rm -rf $(CI_BENCH_DIR)
	CRITERION_HOME=$(CI_BENCH_DIR) $(CI_BENCH)
	$(CARGO) run --release -q -p tensor-wasm-gates --bin bench-gate -- \
	  --criterion-dir $(CI_BENCH_DIR) --rerun -- $(CI_BENCH)

## Runs every Criterion bench with short windows and records a run file under
## bench-results/criterion/ (then run `make perf-doc`).
## Same suite and fresh results dir as ci-bench, without the gate.
bench-record:
	rm -rf $(CI_BENCH_DIR)
	CRITERION_HOME=$(CI_BENCH_DIR) $(CI_BENCH)
	CRITERION_HOME=$(CI_BENCH_DIR) python3 scripts/criterion_summary.py \
	  bench-results/criterion/$$(date -u +%F)-all.json "make bench-record ($(CI_BENCH))"

.PHONY: image deploy-check
IMAGE ?= tensor-wasm
TAG ?= dev
CPU_BASE ?= debian:bookworm-slim

## Container images: $(IMAGE):$(TAG) (CUDA 13.0 runtime base) and
## $(IMAGE):$(TAG)-cpu (same binary on $(CPU_BASE)). Without a reachable
## Docker engine it says so and exits 0 (see docs/deploy.md).
image:
	@if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then \
	  echo "make image: no Docker engine reachable (docker client missing or no daemon); nothing built."; \
	  echo "  with an engine: docker build -t $(IMAGE):$(TAG) ."; \
	  echo "                  docker build -t $(IMAGE):$(TAG)-cpu --build-arg RUNTIME_BASE=$(CPU_BASE) ."; \
	  exit 0; \
	fi; \
	set -e; \
	docker build -t $(IMAGE):$(TAG) . ; \
	docker build -t $(IMAGE):$(TAG)-cpu --build-arg RUNTIME_BASE=$(CPU_BASE) . ; \
	echo "built $(IMAGE):$(TAG) and $(IMAGE):$(TAG)-cpu"

## Deployment packaging: hadolint, Helm chart render + schema validation
## (replicaCount>1 must fail), docs/deploy.md reference up to date.
deploy-check: deps
	@scripts/deploy-check.sh

.PHONY: otel-check
## The server's traces read back from a real trace store (Arize Phoenix from PyPI, pinned,
## installed into .tools/otel-store when missing: about 50 s the first time, 853 MB).
otel-check:
	@scripts/otel-check.sh

.PHONY: api-conformance
## The OpenAPI document against a real server: schemathesis (pinned, installed
## into .tools/schemathesis when missing), every check, stateful phase included.
api-conformance:
	@scripts/api-conformance.sh

.PHONY: icount icount-baseline perf-doc-check
GUNGRAUN_RUNNER ?= $(CURDIR)/.tools/bin/gungraun-runner
ICOUNT_RUN := target/icount/run.jsonl
ICOUNT_BENCH := $(CARGO) bench -q -p tensor-wasm-icount --bench icount -- --output-format=json

## Instruction counts of the hot paths (gungraun + valgrind callgrind, one call
## each, deterministic), then the gate: fails when a tracked path executes more
## than +10 % instructions over bench-results/icount/baseline.json, or is missing.
icount: deps
	@mkdir -p $(dir $(ICOUNT_RUN))
	GUNGRAUN_RUNNER=$(GUNGRAUN_RUNNER) $(ICOUNT_BENCH) > $(ICOUNT_RUN)
	$(CARGO) run -q -p tensor-wasm-gates --bin icount-gate -- check --run $(ICOUNT_RUN)

## Re-records bench-results/icount/baseline.json from a fresh run (commit it on
## its own, saying why the counts moved; see bench-results/baseline-notes.md).
icount-baseline: deps
	@mkdir -p $(dir $(ICOUNT_RUN))
	GUNGRAUN_RUNNER=$(GUNGRAUN_RUNNER) $(ICOUNT_BENCH) > $(ICOUNT_RUN)
	GUNGRAUN_RUNNER=$(GUNGRAUN_RUNNER) $(CARGO) run -q -p tensor-wasm-gates --bin icount-gate -- record --run $(ICOUNT_RUN) \
	  --out bench-results/icount/baseline.json --command "make icount-baseline ($(ICOUNT_BENCH))"

.PHONY: tail-latency
## Tail latency (10 000 samples: p50/p95/p99/p99.9/max) of dispatch/serial/100,
## dispatch/concurrent_cap64/100, e2e/healthz/get and e2e/invoke_not_found/post,
## written to bench-results/tail-latency.json (then run `make perf-doc`).
tail-latency:
	TAIL_LATENCY_OUT=$(CURDIR)/bench-results/tail-latency.json \
	TAIL_LATENCY_COMMAND="make tail-latency ($(CARGO) bench -p tensor-wasm-bench --bench tail_latency)" \
	  $(CARGO) bench -p tensor-wasm-bench --bench tail_latency

.PHONY: cuda-coverage
## Line coverage of the CUDA backend (tensor-wasm-gpu's cuda.rs, cuda/*.rs, raw_launch.rs) from
## the gpu crate's tests, their run on the stand-in driver included (cargo-llvm-cov, pinned, in
## .tools; its own target dir target/llvm-cov-target). Prints it per file, writes
## bench-results/coverage/cuda-<date>.txt, fails below 85 % for cuda.rs + cuda/*.rs.
## Not part of `make test`.
cuda-coverage:
	@scripts/cuda-coverage.sh

.PHONY: gpu-suite gpu-suite-dry-run
GPU_SUITE_DIR ?= .gpu-suite

## GPU validation suite: stripped release `tensor-wasm` + `gpu-suite`, the example
## guests, the runner and the CPU backend's record, in $(GPU_SUITE_DIR) (git-ignored; carried
## to the GPU machine). See BUILD.md, "GPU validation suite".
gpu-suite: deps examples
	$(CARGO) build --release -p tensor-wasm-cli --bin tensor-wasm -p tensor-wasm-gpu-suite --bin gpu-suite
	bash scripts/gpu-suite/build.sh $(GPU_SUITE_DIR)

## The suite's CPU-side test: the runner with --device cpu --quick into a temporary
## directory, then scripts/gpu-suite/check_results.py (not part of `make test`).
gpu-suite-dry-run: gpu-suite
	bash scripts/gpu-suite/dry-run.sh $(GPU_SUITE_DIR)

.PHONY: fence-overhead
## Instructions the PTX interpreter executes for each CUDA C++ kernel of the conformance set,
## the tenant's module and the fenced one (tensor-wasm-ptx-verify's corpus test); writes
## bench-results/fence-overhead/<date>.json (then `make perf-doc`). Not part of `make test`.
fence-overhead: deps
	mkdir -p bench-results/fence-overhead
	TENSOR_WASM_FENCE_OVERHEAD_OUT=$(CURDIR)/bench-results/fence-overhead/$$(date -u +%F).json \
	LD_LIBRARY_PATH=$(CURDIR)/.tools/nvrtc/nvidia/cu13/lib$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} \
	$(CARGO) test -p tensor-wasm-ptx-verify --test corpus -- --nocapture

.PHONY: interp-speed
## How fast the PTX interpreter (a CPU host's engine for tenant kernels) runs each CUDA C++
## kernel of the conformance set, plain and fenced, interleaved over 21 rounds (release build);
## writes bench-results/interp-speed/<date>.json (then `make perf-doc`). Not part of `make test`.
interp-speed: deps
	mkdir -p bench-results/interp-speed
	LD_LIBRARY_PATH=$(CURDIR)/.tools/nvrtc/nvidia/cu13/lib$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} \
	$(CARGO) run --release -p tensor-wasm-ptx-verify --example interp_speed -- --rounds 21 \
		--out $(CURDIR)/bench-results/interp-speed/$$(date -u +%F).json

.PHONY: models-bench
## The real models of scripts/onnx/models.py through the ONNX executor (CPU backend) beside
## ONNX Runtime (CPU), interleaved rounds; writes bench-results/models/<date>.json. Not part of
## `make test`.
models-bench: deps
	python3 scripts/models_bench.py

.PHONY: scale-out-bench
## The shared store's bench (issue 19): invoke throughput over PostgreSQL + S3 against the local
## data dir (interleaved), deploy latency in both modes, invalidation lag; starts its own
## PostgreSQL and S3 server; writes bench-results/scale-out/<date>.json (then `make perf-doc`).
## Not part of `make test`.
scale-out-bench: deps
	bash scripts/scale-out-bench.sh

.PHONY: history-check
## The concurrent history checker's long run (crates/tensor-wasm-cli/tests/history.rs): three
## replicas over PostgreSQL + S3 for 300 s, a replica killed (kill -9) and restarted and
## PostgreSQL stopped and started during the run; at least 10,000 operations and 1,000
## conflicting writes, 0 anomalies; writes bench-results/history/<date>.json. The 30 s run
## without trouble is part of `make test`.
history-check: deps
	mkdir -p bench-results/history
	HISTORY_SECONDS=300 HISTORY_CHAOS=1 HISTORY_MIN_OPERATIONS=10000 HISTORY_MIN_CONFLICTS=1000 \
	  HISTORY_RUN_FILE=$(CURDIR)/bench-results/history/$$(date -u +%F).json \
	  $(CARGO) test -p tensor-wasm-cli --test history -- --nocapture

.PHONY: conformance-isa
## The PTX interpreter's conformance suite once per CPU ISA this host has (portable, avx2,
## avx512: TENSOR_WASM_CPU_ISA picks the CPU backend's matmul and conv2d tiles); writes
## bench-results/conformance/<date>-<isa>.json after each passing run. Not part of `make test`
## (which runs the suite once, with the widest ISA).
conformance-isa:
	mkdir -p bench-results/conformance
	for isa in portable avx2 avx512; do \
	  case $$isa in avx2) grep -qw avx2 /proc/cpuinfo || continue;; \
	    avx512) grep -qw avx512f /proc/cpuinfo || continue;; esac; \
	  TENSOR_WASM_CPU_ISA=$$isa \
	    CONFORMANCE_RUN_FILE=$(CURDIR)/bench-results/conformance/$$(date -u +%F)-$$isa.json \
	    $(CARGO) test -p tensor-wasm-ptx-emu --test conformance || exit 1; \
	done

.PHONY: component-release
## How long after its deadline a component blocked in the host frees its instance slot (goal
## p99 <= 100 ms): release build of the runtime's component_deadlines test, its ignored
## `release_latency`; writes bench-results/component-release/<date>.json. Not part of `make test`.
component-release:
	TENSOR_WASM_RELEASE_OUT=$(CURDIR)/bench-results/component-release/$$(date -u +%F).json \
	  $(CARGO) test --release -p tensor-wasm-runtime --test component_deadlines -- --ignored release_latency --nocapture

.PHONY: serve-compare
## The same wasi:http components (examples/components/python/http_app.py, examples/components/c/
## http.c) under `wasmtime serve` (wasmtime-cli 48.0.8, installed into .tools/bin when missing:
## a long build, once) and `tensor-wasm serve`: identical answers to a request list, and the
## hello-world handler's throughput, interleaved; writes bench-results/serve-compare/<date>.json
## (then `make perf-doc`). Not part of `make test`.
serve-compare: deps
	python3 scripts/serve_compare.py

.PHONY: cpu-kernels
## The CPU backend's kernels next to numpy/OpenBLAS on the same cores, one run: builds the
## cpu-kernels bench (release), creates .tools/cpu-peer (pinned numpy + threadpoolctl from PyPI)
## when missing, writes bench-results/cpu-kernels/<date>.json (not part of `make test`).
cpu-kernels:
	python3 scripts/cpu_kernels.py

.PHONY: soak
SOAK_MINUTES ?= 10
SOAK_CRASH_ROUNDS ?= 500
## Long hardening checks (not part of `make test`): $(SOAK_MINUTES) minutes of mixed load
## (deploys, invocations, slow and abandoned streams, async jobs, snapshots, hostile guests,
## client disconnects) on the release server while a second tenant's latency is sampled
## (scripts/soak.py; run file in bench-results/soak/, fails when a bound breaks), then the
## crash-consistency test with $(SOAK_CRASH_ROUNDS) SIGKILL rounds (`make test` runs 50).
soak: examples
	$(CARGO) build --release -p tensor-wasm-cli --bin tensor-wasm
	python3 scripts/soak.py target/release/tensor-wasm --minutes $(SOAK_MINUTES)
	TENSOR_WASM_CRASH_ROUNDS=$(SOAK_CRASH_ROUNDS) $(CARGO) test -p tensor-wasm-cli --test crash -- --nocapture
