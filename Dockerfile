# The serving image, and with --build-arg EXTRAS=train the trainer's too:
#   docker build -t ordrec .                                 serving only (no scikit-learn)
#   docker build --build-arg EXTRAS=train -t ordrec-train .  serving + the trainer's dependencies
#   docker run ordrec                                        -> ordrec-serve on /registry (the default command)
#   docker run ordrec-train ordrec-train run /jobs/job.toml  -> a trainer job (cron)
# Multi-stage: build the virtualenv with the compiler toolchain, ship only the venv.
FROM python:3.11-slim AS build
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/ordrec
ENV PATH=/opt/ordrec/bin:$PATH
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE MANIFEST.in ./
COPY proto proto
COPY ordrec ordrec
COPY service service
COPY trainer trainer
COPY tools tools
# The s3 extra (boto3) is always in: the image serves from and trains into s3:// registries too.
RUN pip install ".[s3${EXTRAS:+,$EXTRAS}]"

FROM python:3.11-slim
RUN useradd --system --uid 10001 --create-home --home-dir /srv/ordrec ordrec \
    && mkdir /registry && chown ordrec /registry
COPY --from=build /opt/ordrec /opt/ordrec
# numba's cache=True writes beside the installed sources, which the non-root
# user cannot write: give it a cache directory of its own.
ENV PATH=/opt/ordrec/bin:$PATH PYTHONUNBUFFERED=1 NUMBA_CACHE_DIR=/srv/ordrec/.numba-cache
USER ordrec
WORKDIR /srv/ordrec
EXPOSE 50051 9095
# The gRPC health service: SERVING once at least one model is loaded.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["ordrec-client", "--target", "127.0.0.1:50051", "--timeout", "2", "--wait", "0", "health"]
# --processes 0: one server process per CPU the container may use, sharing the
# port with SO_REUSEPORT and pinned to its core (README, Benchmarks: on 2 cores
# two pinned processes served 2.1-2.6x one pinned process and 3.9-4.7x one unpinned
# process). With a CPU quota rather than
# a cpuset, set --processes to the quota. Metrics: one port per process, 9095+i.
CMD ["ordrec-serve", "--registry", "/registry", "--host", "0.0.0.0", "--port", "50051", \
     "--metrics-host", "0.0.0.0", "--metrics-port", "9095", "--processes", "0"]
