#!/usr/bin/env bash
# `make docker-smoke`: build the serving and the trainer image, train the built-in sample in a
# container into a registry folder made on the host, serve it, pass a health check and a query,
# stop and clean up; then the same start without the image's numba cache, for comparison.
# Any failed step stops the run with "docker-smoke FAILED: <step>" and a non-zero exit.
#
#   BASE=image            build on this base instead of the Dockerfile's pinned one
#                         (e.g. ordrec-base:bookworm from `make docker-base`)
#   DOCKER_NETWORK=host   where the daemon runs with --bridge=none: builds and containers use the
#                         host's network, so the server takes the host's ports 50051 and 9095+
#   IMAGE, TRAIN_IMAGE    image tags (default ordrec:smoke, ordrec-train:smoke; kept for rebuilds)
set -euo pipefail

IMAGE=${IMAGE:-ordrec:smoke}
TRAIN_IMAGE=${TRAIN_IMAGE:-ordrec-train:smoke}
network=(${DOCKER_NETWORK:+--network "$DOCKER_NETWORK"})
base=(${BASE:+--build-arg "BASE=$BASE"})
me="$(id -u):$(id -g)"
work=$(mktemp -d "${TMPDIR:-/tmp}/ordrec-docker-smoke.XXXXXX")
chmod 755 "$work" # as a folder made with mkdir: other uids may read it, only its owner write
server="ordrec-smoke-$$"
timings=()

step() { echo "== docker-smoke: $*" >&2; }
fail() {
    echo "docker-smoke FAILED: $*" >&2
    exit 1
}
cleanup() {
    docker rm -f "$server" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

build() {  # build TAG [docker build args...]
    local tag=$1 t0
    shift
    step "docker build $* -t $tag"
    t0=$(now)
    docker build "${network[@]}" "${base[@]}" "$@" -t "$tag" . || fail "docker build -t $tag"
    timings+=("build $tag: $(since "$t0") s")
    step "${timings[-1]}"
}

train() {  # the trainer image as the host user, so it may write the host-made registry
    docker run --rm "${network[@]}" --user "$me" -v "$work:/work" "$TRAIN_IMAGE" "$@"
}

write_job() {
    cat >"$work/job.toml" <<'EOF'
[job]
name = "smoke"
registry = "/work/registry"

[data.ratings]
path = "/work/data/ratings.data"
format = "ml-100k"

[[models]]
name = "dcr"
kind = "dcr"
data = "ratings"
params = { n_components = 5, max_iter = 8, random_state = 0 }
EOF
}

check_uid_guidance() {  # the image's own user (10001) cannot write a folder the host user made
    [ "$(id -u)" != 10001 ] || return 0
    step "trainer as the image's user on the host-made registry: refused with the fix"
    local out
    if out=$(docker run --rm "${network[@]}" -v "$work:/work" "$TRAIN_IMAGE" \
        ordrec-train run /work/job.toml 2>&1); then
        fail "the trainer wrote a registry it has no permission for"
    fi
    grep -q "docker run --user $me" <<<"$out" || fail "no --user guidance in: $out"
}

serve() {  # serve [docker run args...]: start the default command, print the seconds to SERVING
    local t0
    t0=$(now)
    docker run -d --name "$server" "${network[@]}" -v "$work/registry:/registry:ro" "$@" "$IMAGE" \
        >/dev/null || fail "docker run $IMAGE"
    docker exec "$server" ordrec-client --timeout 5 --wait 120 health >/dev/null \
        || fail "health: not SERVING within 120 s ($(docker logs "$server" 2>&1 | tail -5))"
    since "$t0"
}

query() {
    local out
    out=$(docker exec "$server" ordrec-client recommend --model dcr --user u001 --n 3) \
        || fail "recommend query"
    echo "$out" >&2
    grep -q "i0" <<<"$out" || fail "recommend returned no item: $out"
    docker exec "$server" python3 -c \
        "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9095/metrics', timeout=5)" \
        || fail "metrics on the container's loopback (127.0.0.1:9095)"
}

cache_was_used() {  # the warm start loaded every kernel: numba wrote nothing new into the image's cache
    local new
    new=$(docker diff "$server" | grep "^A /opt/ordrec/numba-cache/" || true)
    [ -z "$new" ] || fail "the server compiled kernels despite the image's numba cache: $new"
}

wait_healthy() {  # the image's HEALTHCHECK (every 10 s) reports healthy
    for _ in $(seq 30); do
        [ "$(docker inspect -f '{{.State.Health.Status}}' "$server")" = healthy ] && return 0
        sleep 2
    done
    fail "docker's HEALTHCHECK did not report healthy within 60 s"
}

stop() {  # SIGTERM drains; the server must exit 0
    docker stop -t 30 "$server" >/dev/null || fail "docker stop"
    local code
    code=$(docker inspect -f '{{.State.ExitCode}}' "$server")
    [ "$code" = 0 ] || fail "server exited $code on SIGTERM ($(docker logs "$server" 2>&1 | tail -5))"
    docker rm "$server" >/dev/null
}

build "$IMAGE"
build "$TRAIN_IMAGE" --build-arg EXTRAS=train

step "the built-in sample, trained in a container into a registry made on the host"
mkdir "$work/registry"
write_job
train ordrec-train sample --out /work/data >/dev/null || fail "ordrec-train sample"
check_uid_guidance
train ordrec-train run /work/job.toml || fail "ordrec-train run (as $me)"

step "serve with the image's numba cache"
timings+=("start to SERVING, numba cache in the image: $(serve) s")
query
cache_was_used
wait_healthy
stop

step "serve with an empty numba cache (every kernel compiled at start)"
timings+=("start to SERVING, empty numba cache: $(serve -e NUMBA_CACHE_DIR=/tmp/numba-cold) s")
query
stop

echo "docker-smoke passed" >&2
printf '  %s\n' "${timings[@]}" >&2
