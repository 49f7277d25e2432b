# The serving image, and with --build-arg EXTRAS=train the trainer's too (docs/docker.md):
#   docker build -t ordrec .                                 serving only (no scikit-learn)
#   docker build --build-arg EXTRAS=train -t ordrec-train .  serving + the trainer's dependencies
#   docker build --build-arg BASE=ordrec-base:bookworm ...   any base with python3 (3.10+) and venv
#   docker run ordrec                                        -> ordrec-serve on /registry (the default command)
#   docker run --user "$(id -u):$(id -g)" ordrec-train ordrec-train run /jobs/job.toml  -> a trainer job
# Pinned by digest, so a rebuild gets the same base; `make docker-base` makes a local one from Debian.
ARG BASE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

# The source alone, in layers of its own: the final stage copies it in one step after the
# dependencies, so editing a line reinstalls only the project, not its dependencies.
FROM scratch AS source
COPY pyproject.toml setup.py README.md LICENSE MANIFEST.in /src/
COPY proto /src/proto
COPY ordrec /src/ordrec
COPY service /src/service
COPY trainer /src/trainer
COPY tools /src/tools

FROM ${BASE}
# "" serves; "train" adds the trainer's dependencies (requirements/train.txt instead of serve.txt).
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/ordrec/bin:$PATH \
    PYTHONUNBUFFERED=1 NUMBA_CACHE_DIR=/opt/ordrec/numba-cache
# Dependencies: exactly the locked versions, every file checked against its hash, no resolution.
COPY requirements/serve.txt requirements/train.txt /opt/ordrec-locks/
RUN useradd --system --uid 10001 --create-home --home-dir /srv/ordrec ordrec \
    && mkdir /registry && chown ordrec /registry \
    && python3 -m venv /opt/ordrec \
    && pip install --no-deps --require-hashes -r "/opt/ordrec-locks/${EXTRAS:-serve}.txt"
WORKDIR /srv/ordrec
# gRPC, and the metrics ports: process i of --processes N listens on 9095+i (up to 16 CPUs here).
EXPOSE 50051 9095-9110
# The gRPC health service: SERVING once at least one model is loaded.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["ordrec-client", "--target", "127.0.0.1:50051", "--timeout", "2", "--wait", "0", "health"]
# --processes 0: one server process per CPU the container may use, sharing the
# port with SO_REUSEPORT and pinned to its core (README, Benchmarks: on 2 cores
# two pinned processes served 2.1-2.6x one pinned process and 3.9-4.7x one unpinned
# process). With a CPU quota rather than a cpuset, set --processes to the quota.
# Metrics stay on the container's loopback (docs/service.md, Security); to scrape them
# from outside, run with --metrics-host 0.0.0.0 and publish 9095+i for each process.
CMD ["ordrec-serve", "--registry", "/registry", "--host", "0.0.0.0", "--port", "50051", \
     "--metrics-host", "127.0.0.1", "--metrics-port", "9095", "--processes", "0"]
# Everything above is cached while the locks are unchanged: a source edit reruns the three
# steps below (the settings stay above them for that reason).
COPY --from=source /src /src
# The s3 extra (boto3) is always in: the image serves from and trains into s3:// registries too.
# The serving kernels are compiled here into NUMBA_CACHE_DIR, so a container starts without
# compiling; the cache stays writable by any uid (numba skips a cache it cannot write).
RUN cd /src \
    && pip install ".[s3${EXTRAS:+,$EXTRAS}]" --no-deps --no-build-isolation \
    && pip check \
    && cd / && rm -rf /src \
    && python3 -c "from ordrec.service.serving.server import warm_up_kernels; warm_up_kernels()" \
    && chmod -R a+rwX "$NUMBA_CACHE_DIR"
USER ordrec
