#!/usr/bin/env bash
# `make docker-base`: a Debian bookworm base image (python3 3.11 and venv) made with
# debootstrap from Debian's own mirror, for machines that cannot pull from Docker Hub.
# Build on it with `make docker-smoke BASE=ordrec-base:bookworm` or
# `docker build --build-arg BASE=ordrec-base:bookworm .`. Needs root, debootstrap and docker.
set -euo pipefail

name=${BASE_IMAGE:-ordrec-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=${DEBIAN_SUITE:-bookworm}
ca_bundle=${CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}

die() { echo "docker-base: $*" >&2; exit 1; }
[ -z "$ca_bundle" ] || [ -r "$ca_bundle" ] || die "CA_BUNDLE=$ca_bundle cannot be read"
[ "$(id -u)" = 0 ] || die "debootstrap needs root: run as root (or sudo make docker-base)"
command -v debootstrap >/dev/null || die "debootstrap is not installed: apt-get install -y debootstrap"
docker info >/dev/null 2>&1 || die "no Docker daemon answers (docker info): start dockerd first"

root=$(mktemp -d "${TMPDIR:-/tmp}/ordrec-base.XXXXXX")
cleanup() {
    # debootstrap mounts /proc (and more) in the target while it works; an interrupted run
    # leaves them mounted, and rm must never descend into them.
    { grep -o " $root/[^ ]*" /proc/mounts || true; } | sort -r | xargs -r -n1 umount -l
    rm -rf --one-file-system "$root"
}
trap cleanup EXIT
echo "docker-base: debootstrap $suite from $mirror into $root" >&2
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$suite" "$root" "$mirror" >&2
# pip uses its own CA list unless told otherwise: give it this machine's bundle, so a build
# behind a TLS-intercepting proxy trusts what the host trusts (CA_BUNDLE= keeps Debian's).
if [ -n "$ca_bundle" ]; then
    cp "$ca_bundle" "$root/etc/ssl/certs/ca-certificates.crt"
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$root/etc/pip.conf"
fi
# Package caches and lists are not needed at run time, and every layer on top copies them.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import - "$name" >/dev/null
echo "docker-base: built $name ($(docker image inspect --format '{{.Id}}' "$name"))" >&2
echo "BASE=$name"
