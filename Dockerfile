# syntax=docker/dockerfile:1
# TensorWasm container image. docs/deploy.md explains every choice made here.
#
#   docker build -t tensor-wasm .                                     # CUDA image
#   docker build -t tensor-wasm:cpu --build-arg RUNTIME_BASE=debian:bookworm-slim .   # CPU-only
#   (or `make image`, which builds both)
#
# One binary serves CPU and CUDA hosts: it loads libcuda (from the host driver,
# mounted by the NVIDIA container toolkit) and libnvrtc at run time, so the
# build stage needs no CUDA at all.

# The runtime base. Default: the CUDA 13.0 `runtime` flavour, the smallest
# nvidia/cuda flavour that ships libnvrtc (`base` has only libcudart; `devel`
# adds compilers). 13.0.2 carries NVRTC 13.0.88, the version the tests pin.
# CPU-only variant: --build-arg RUNTIME_BASE=debian:bookworm-slim
ARG RUNTIME_BASE=nvidia/cuda:13.0.2-runtime-ubuntu24.04
ARG RUST_IMAGE=rust:1.95-slim-bookworm

# ---------------------------------------------------------------------------
# Build stage: the release binary. Debian bookworm's glibc (2.36) is older than
# both runtime bases' (Ubuntu 24.04: 2.39, bookworm-slim: 2.36), so the one
# binary runs on either.
FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p tensor-wasm-cli \
    && install -D -m 0755 target/release/tensor-wasm /out/tensor-wasm

# ---------------------------------------------------------------------------
# Runtime stage.
FROM ${RUNTIME_BASE} AS runtime

# curl is the HEALTHCHECK client (neither base has one). It is one small
# package and gives an exact HTTP status check, where a bash /dev/tcp probe
# would have to parse the status line by hand. Versions follow the base image.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 tensorwasm \
    && useradd --system --uid 10001 --gid 10001 --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin tensorwasm \
    && mkdir -p /data \
    && chown 10001:10001 /data \
    && chmod 0700 /data

COPY --from=build /out/tensor-wasm /usr/local/bin/tensor-wasm

# Configuration is env-driven: every `serve` flag has a TENSOR_WASM_* variable
# (docs/deploy.md has the full list). The data dir is the only place written
# (a volume); the CUDA driver's JIT cache goes there too instead of $HOME.
ENV TENSOR_WASM_LISTEN=0.0.0.0:8080 \
    TENSOR_WASM_DATA_DIR=/data \
    TENSOR_WASM_LOG_FORMAT=json \
    TENSOR_WASM_SHUTDOWN_GRACE_S=25 \
    CUDA_CACHE_PATH=/data/cuda-cache \
    HOME=/data

VOLUME ["/data"]
WORKDIR /data
USER 10001:10001
EXPOSE 8080

# /healthz answers as soon as the listener is up (no token needed). The port
# follows TENSOR_WASM_LISTEN (expanded by /bin/sh in the container), so
# overriding the listen address keeps the check right.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/bin/sh", "-c", "curl -fsS --noproxy '*' --max-time 4 -o /dev/null http://127.0.0.1:${TENSOR_WASM_LISTEN##*:}/healthz"]

# `serve` drains in-flight requests for TENSOR_WASM_SHUTDOWN_GRACE_S seconds
# after SIGTERM, then exits 0. Give `docker stop` more than that:
# `docker run --stop-timeout 30` (Docker's default is 10 s).
STOPSIGNAL SIGTERM

ENTRYPOINT ["tensor-wasm", "serve"]
