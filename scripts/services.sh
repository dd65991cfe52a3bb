#!/usr/bin/env bash
# Set up, start and stop what imgbuild's demo and tests need on a Debian machine:
# Debian's Docker engine (BuildKit-capable 20.10 client), a local registry with htpasswd
# auth on 127.0.0.1, and a Debian base image made with mmdebstrap (no public image
# registry is needed). Idempotent: it reuses whatever already runs.
#
# Beside it, a modern engine: Docker 26 + buildx + the containerd image store, from Debian 13's
# packages unpacked under /opt/engine26 (never installed over the system's), on its own socket.
# And podman (Debian 12's 4.3.1, daemonless: nothing to start), with the base image loaded, and
# buildah (Debian 12's 1.28.2), the fourth engine: it shares podman's storage, so nothing more to set up.
#
#   scripts/services.sh up      install what is missing, start both engines + registry, make base
#   scripts/services.sh down    stop only what `up` started
#   scripts/services.sh reclaim give back the disk a test run takes (both engines' build caches,
#                               leftover test images, the registry's test repositories), then stop
#   scripts/services.sh env     print the registry and engine settings as shell assignments
#   scripts/services.sh install only install the Debian packages (and unpack cosign and oras)
#
# For linux/arm64 beside linux/amd64: Debian's qemu-user-static registers binfmt handlers (binfmt_misc
# is mounted if it is not), mmdebstrap makes an arm64 Debian root file system, and both bases are
# pushed to the local registry as one index ($MULTIARCH_BASE), which multi-platform builds start FROM.
#
# IMGBUILD_ENGINE26=0 skips the modern engine (then only 20.10 is tested, and no multi-platform base);
# IMGBUILD_PODMAN_ENGINE=0 skips podman and buildah (`env` lists them in IMGBUILD_TEST_ENGINES only
# when podman runs a container here and buildah is installed).
set -euo pipefail

STATE_DIR=${IMGBUILD_STATE_DIR:-/var/lib/imgbuild-services}
REGISTRY_ADDR=${IMGBUILD_REGISTRY_ADDR:-127.0.0.1:5000}
REGISTRY_USER=${IMGBUILD_REGISTRY_USER:-ci}
BASE_IMAGE=${IMGBUILD_BASE_IMAGE:-debian:bookworm-slim}
DEBIAN_MIRROR=${IMGBUILD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
DOCKER_SOCK=/var/run/docker.sock
# Debian's client first: the newer client some machines put first on PATH lacks buildx and
# silently falls back to the legacy builder.
DOCKER=/usr/bin/docker
# The modern engine: Debian 13 (trixie) packages, unpacked beside the system.
ENGINE26=${IMGBUILD_ENGINE26:-1}
E26_ROOT=${IMGBUILD_ENGINE26_ROOT:-/opt/engine26}
E26_SOCK=/run/docker26.sock
E26_HOST=unix://$E26_SOCK
E26_DATA=/var/lib/docker26
E26_DOCKER=$E26_ROOT/usr/bin/docker
# The client finds buildx in its own config folder, so the 20.10 client's config is untouched.
E26_CONFIG=$E26_ROOT/config
# The Debian base of multi-platform builds: one index of linux/amd64 and linux/arm64 in the local
# registry (nothing else here serves a multi-platform Debian image).
MULTIARCH_BASE=${IMGBUILD_MULTIARCH_BASE:-$REGISTRY_ADDR/imgbuild/debian:bookworm-slim}
ARM64_TAR=$STATE_DIR/rootfs-bookworm-arm64.tar
E26_DEBS="d/docker.io/docker.io_26.1.5+dfsg1-9+deb13u1+b1_amd64.deb
d/docker.io/docker-cli_26.1.5+dfsg1-9+deb13u1+b1_amd64.deb
d/docker-buildx/docker-buildx_0.13.1+ds1-3_amd64.deb"
# The cosign and oras CLIs the signing and referrer tests check interoperability with: Debian 13's
# packages (Go binaries, libc6 >= 2.34 only), unpacked like the engine's, never installed.
TOOLS_ROOT=${IMGBUILD_TOOLS_ROOT:-/opt/imgbuild-tools}
TOOL_DEBS="c/cosign/cosign_2.5.0-2+b5_amd64.deb
o/oras/oras_1.2.0-1+b9_amd64.deb"
# Podman: Debian's package; its containers.conf drop-in for machines that refuse its rlimits.
PODMAN_ENGINE=${IMGBUILD_PODMAN_ENGINE:-1}
PODMAN_DROPIN=/etc/containers/containers.conf.d/imgbuild-ulimits.conf

# A full test run (both engines, CUDA wheels, torch) writes about this much before it can reclaim
# it; `up` makes room or refuses, rather than letting builds fail an hour in on a full disk.
MIN_FREE_GB=${IMGBUILD_MIN_FREE_GB:-40}

log() { printf '[services] %s\n' "$*" >&2; }

need_root() {
    if [ "$(id -u)" != 0 ]; then
        log "this step needs root (apt-get, dockerd): run as root or with sudo"; exit 3
    fi
}

install_missing() {
    local pkgs=()
    command -v dockerd >/dev/null || pkgs+=(docker.io)
    [ -x /usr/bin/docker ] || pkgs+=(docker.io)
    command -v docker-registry >/dev/null || pkgs+=(docker-registry)
    command -v htpasswd >/dev/null || pkgs+=(apache2-utils)
    command -v mmdebstrap >/dev/null || pkgs+=(mmdebstrap)
    [ -x /usr/libexec/qemu-binfmt/aarch64-binfmt-P ] || pkgs+=(qemu-user-static)
    command -v update-binfmts >/dev/null || pkgs+=(binfmt-support)
    # a third-party client the SBOM tests read the pushed image's referrers with
    command -v skopeo >/dev/null || pkgs+=(skopeo)
    # `test --lazy` traces the image tests with the host's strace
    command -v strace >/dev/null || pkgs+=(strace)
    python3 -c 'import venv, ensurepip' 2>/dev/null || pkgs+=(python3-venv python3-pip)
    if [ "$PODMAN_ENGINE" = 1 ]; then
        command -v podman >/dev/null || pkgs+=(podman)
        command -v buildah >/dev/null || pkgs+=(buildah)
    fi
    if [ ${#pkgs[@]} -gt 0 ]; then
        need_root
        log "installing: ${pkgs[*]}"
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkgs[@]}"
    fi
}

engine_up() { $DOCKER version --format '{{.Server.Version}}' >/dev/null 2>&1; }

start_engine() {
    if engine_up; then log "docker engine already running"; return; fi
    need_root
    mkdir -p "$STATE_DIR"
    log "starting dockerd (no bridge network; builds use --network host)"
    setsid dockerd --bridge=none --iptables=false --ip-masq=false \
        --host "unix://$DOCKER_SOCK" >"$STATE_DIR/dockerd.log" 2>&1 < /dev/null &
    echo $! >"$STATE_DIR/dockerd.pid"
    for _ in $(seq 1 60); do engine_up && { log "dockerd up"; return; }; sleep 1; done
    log "dockerd did not come up; see $STATE_DIR/dockerd.log"; tail -20 "$STATE_DIR/dockerd.log" >&2; exit 3
}

e26() { DOCKER_HOST=$E26_HOST DOCKER_CONFIG=$E26_CONFIG "$E26_DOCKER" "$@"; }
engine26_up() { [ -x "$E26_DOCKER" ] && e26 version --format '{{.Server.Version}}' >/dev/null 2>&1; }

unpack_engine26() {
    if [ -x "$E26_ROOT/usr/sbin/dockerd" ] && [ -x "$E26_DOCKER" ] \
        && [ -x "$E26_ROOT/usr/libexec/docker/cli-plugins/docker-buildx" ]; then return; fi
    need_root
    mkdir -p "$STATE_DIR/debs" "$E26_ROOT"
    local f
    for f in $E26_DEBS; do
        dpkg -x "$(fetch_deb "$f")" "$E26_ROOT"   # unpack only: nothing of the system's docker is replaced
    done
}

fetch_deb() {
    # a Debian pool path (d/docker.io/docker-cli_...deb) into $STATE_DIR/debs, once
    local deb="$STATE_DIR/debs/${1##*/}"
    if [ ! -s "$deb" ]; then
        log "downloading ${1##*/}"
        curl -sSf -o "$deb.tmp" "$DEBIAN_MIRROR/pool/main/$1"; mv "$deb.tmp" "$deb"
    fi
    printf '%s\n' "$deb"
}

unpack_tools() {
    # cosign 2.5 and oras 1.2 under $TOOLS_ROOT/usr/bin (the tests read IMGBUILD_TEST_COSIGN/ORAS)
    if [ -x "$TOOLS_ROOT/usr/bin/cosign" ] && [ -x "$TOOLS_ROOT/usr/bin/oras" ]; then return; fi
    need_root
    mkdir -p "$STATE_DIR/debs" "$TOOLS_ROOT"
    local f
    for f in $TOOL_DEBS; do dpkg -x "$(fetch_deb "$f")" "$TOOLS_ROOT"; done
    log "cosign and oras unpacked under $TOOLS_ROOT"
}

start_engine26() {
    [ "$ENGINE26" = 1 ] || { log "modern engine skipped (IMGBUILD_ENGINE26=0)"; return; }
    unpack_engine26
    mkdir -p "$E26_CONFIG/cli-plugins"
    ln -sf "$E26_ROOT/usr/libexec/docker/cli-plugins/docker-buildx" "$E26_CONFIG/cli-plugins/docker-buildx"
    [ -f "$E26_CONFIG/config.json" ] || echo '{}' >"$E26_CONFIG/config.json"
    if engine26_up; then log "docker 26 engine already running on $E26_SOCK"; return; fi
    need_root
    # No automatic build-cache GC: tests assert which steps come from the cache, and BuildKit's own GC
    # (its keep-storage bound) evicted records mid-run after the ~2 GB runtime-tier build; up and
    # reclaim prune the cache themselves
    echo '{"features": {"containerd-snapshotter": true}, "builder": {"gc": {"enabled": false}}}' >"$E26_ROOT/daemon.json"
    log "starting dockerd 26 (containerd image store) on $E26_SOCK"
    # Debian 12's containerd and runc serve it; its own binaries come first on PATH.
    PATH=$E26_ROOT/usr/sbin:$E26_ROOT/usr/bin:$PATH setsid dockerd \
        --config-file "$E26_ROOT/daemon.json" --data-root "$E26_DATA" --exec-root /run/docker26 \
        --pidfile /run/docker26.pid -H "$E26_HOST" --bridge=none --iptables=false --ip-masq=false \
        >"$STATE_DIR/dockerd26.log" 2>&1 </dev/null &
    echo $! >"$STATE_DIR/dockerd26.pid"
    for _ in $(seq 1 60); do engine26_up && { log "dockerd 26 up"; return; }; sleep 1; done
    log "dockerd 26 did not come up; see $STATE_DIR/dockerd26.log"; tail -20 "$STATE_DIR/dockerd26.log" >&2; exit 3
}

base_image26() {
    [ "$ENGINE26" = 1 ] || return 0
    if e26 image inspect "$BASE_IMAGE" >/dev/null 2>&1; then log "base image $BASE_IMAGE present in docker 26"; return; fi
    # The containerd store cannot `docker load` a 20.10 save ("unrecognized image format"):
    # export the file system of a container of it and import that.
    log "importing $BASE_IMAGE into docker 26"
    local cid; cid=$($DOCKER create "$BASE_IMAGE" /bin/true)
    $DOCKER export "$cid" | e26 import - "$BASE_IMAGE" >/dev/null
    $DOCKER rm "$cid" >/dev/null
    log "imported $BASE_IMAGE into docker 26"
}

podman_runs() { podman run --rm --network none "$BASE_IMAGE" true >/dev/null 2>&1; }
podman_up() {
    [ "$PODMAN_ENGINE" = 1 ] && command -v podman >/dev/null && podman image exists "$BASE_IMAGE" && podman_runs
}
# buildah builds into podman's storage (the base image podman loaded is its base) and its image tests run there
buildah_up() { podman_up && command -v buildah >/dev/null && buildah --version >/dev/null 2>&1; }

setup_podman() {
    [ "$PODMAN_ENGINE" = 1 ] || { log "podman skipped (IMGBUILD_PODMAN_ENGINE=0)"; return; }
    command -v podman >/dev/null || { podman_missing "podman is not installed"; return; }
    command -v buildah >/dev/null || podman_missing "buildah is not installed"
    if ! podman image exists "$BASE_IMAGE"; then
        # The classic `docker save` layout loads as it is (named localhost/debian:bookworm-slim,
        # which `FROM debian:bookworm-slim` finds).
        log "loading $BASE_IMAGE into podman"
        $DOCKER save "$BASE_IMAGE" | podman load -q >/dev/null
    fi
    podman_runs && { log "podman ready"; return; }
    local err; err=$(podman run --rm --network none "$BASE_IMAGE" true 2>&1 || true)
    if [[ $err == *"error setting rlimit"* ]]; then
        # Podman gives root's containers RLIMIT_NOFILE and RLIMIT_NPROC of 1048576; where root has
        # no CAP_SYS_RESOURCE (a sandboxed VM) runc may not raise them ("error setting rlimit type
        # 7: operation not permitted"). Ask for what this machine allows: its hard limits, nproc at
        # most 32768 (podman lowers its own to that, and a container gets no more than podman has).
        need_root
        local nofile nproc
        nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
        if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
        mkdir -p "$(dirname "$PODMAN_DROPIN")"
        printf '# Written by imgbuild scripts/services.sh: runc here may not raise rlimits (no CAP_SYS_RESOURCE).\n[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n' \
            "$nofile" "$nofile" "$nproc" "$nproc" >"$PODMAN_DROPIN"
        log "podman: container limits set to nofile=$nofile nproc=$nproc in $PODMAN_DROPIN"
        podman_runs && { log "podman ready"; return; }
        err=$(podman run --rm --network none "$BASE_IMAGE" true 2>&1 || true)
    fi
    podman_missing "podman cannot run a container here: $err"
}

# In CI a missing engine fails the run (the README's rule for every engine and tool); elsewhere
# the podman tests are left out with the reason. IMGBUILD_PODMAN_ENGINE=0 opts out explicitly.
podman_missing() {
    if [ "${CI:-}" = true ]; then
        log "CI=true: $1 (set IMGBUILD_PODMAN_ENGINE=0 to leave podman out)"
        exit 1
    fi
    log "$1, so it is not tested"
}

registry_up() {
    # 401 (auth required) is the answer of a running registry with auth.
    local code
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://$REGISTRY_ADDR/v2/" || true)
    [ "$code" = 401 ] || [ "$code" = 200 ]
}

start_registry() {
    mkdir -p "$STATE_DIR/registry/data"
    if [ ! -s "$STATE_DIR/registry/password" ]; then
        # A random password per machine: tests read it from here, it is never a constant.
        head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$STATE_DIR/registry/password"
        chmod 600 "$STATE_DIR/registry/password"
    fi
    if registry_up; then log "registry already answering on $REGISTRY_ADDR"; return; fi
    htpasswd -Bbn "$REGISTRY_USER" "$(cat "$STATE_DIR/registry/password")" >"$STATE_DIR/registry/htpasswd"
    cat >"$STATE_DIR/registry/config.yml" <<EOF
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: $STATE_DIR/registry/data}
  delete: {enabled: true}
http:
  addr: $REGISTRY_ADDR
auth:
  htpasswd: {realm: imgbuild-registry, path: $STATE_DIR/registry/htpasswd}
EOF
    log "starting registry on $REGISTRY_ADDR (htpasswd auth, user $REGISTRY_USER)"
    setsid docker-registry serve "$STATE_DIR/registry/config.yml" \
        >"$STATE_DIR/registry.log" 2>&1 < /dev/null &
    echo $! >"$STATE_DIR/registry.pid"
    for _ in $(seq 1 30); do registry_up && { log "registry up"; return; }; sleep 0.5; done
    log "registry did not come up; see $STATE_DIR/registry.log"; tail -20 "$STATE_DIR/registry.log" >&2; exit 3
}

make_base_image() {
    if $DOCKER image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        log "base image $BASE_IMAGE present"; return
    fi
    if $DOCKER pull "$BASE_IMAGE" >/dev/null 2>&1; then log "pulled $BASE_IMAGE"; return; fi
    need_root
    log "no registry serves $BASE_IMAGE here: making it with mmdebstrap (about 20 s)"
    local tar="$STATE_DIR/rootfs-bookworm.tar"
    if [ ! -s "$tar" ]; then
        mmdebstrap --quiet --format=tar --variant=minbase --include=ca-certificates bookworm "$tar.tmp" "$DEBIAN_MIRROR"
        mv "$tar.tmp" "$tar"
    fi
    $DOCKER import "$tar" "$BASE_IMAGE" >/dev/null
    log "imported $BASE_IMAGE"
}

binfmt_up() {
    # arm64 programs run under qemu through the kernel's binfmt_misc: mount it, register aarch64.
    # qemu-user-static registers with the F flag (the interpreter is opened now), so containers use it.
    if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
        need_root
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    fi
    if ! grep -qs '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64; then
        need_root
        update-binfmts --enable qemu-aarch64
    fi
    grep -qs '^flags: .*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 \
        || { log "qemu-aarch64 is registered without the F flag: containers cannot use it"; exit 3; }
    log "binfmt: qemu-aarch64 registered (linux/arm64 programs run emulated)"
}

registry_curl() {
    curl -sf -u "$REGISTRY_USER:$(cat "$STATE_DIR/registry/password")" "$@"
}

multiarch_base() {
    # linux/amd64 + linux/arm64 Debian as one index in the local registry, for multi-platform builds.
    [ "$ENGINE26" = 1 ] || { log "multi-platform base skipped (needs the docker 26 engine)"; return 0; }
    local repo=${MULTIARCH_BASE#*/} tag
    tag=${repo##*:}; repo=${repo%:*}
    local index="application/vnd.oci.image.index.v1+json"
    if registry_curl -H "Accept: $index" "http://$REGISTRY_ADDR/v2/$repo/manifests/$tag" 2>/dev/null \
            | grep -q '"arm64"'; then
        log "multi-platform base $MULTIARCH_BASE present"; return
    fi
    need_root
    if [ ! -s "$ARM64_TAR" ]; then
        log "making the arm64 Debian base with mmdebstrap under qemu (a few minutes)"
        mmdebstrap --quiet --format=tar --architectures=arm64 --variant=minbase --include=ca-certificates \
            bookworm "$ARM64_TAR.tmp" "$DEBIAN_MIRROR"
        mv "$ARM64_TAR.tmp" "$ARM64_TAR"
    fi
    # Push both images with the docker 26 client and a private config (the user's is not touched),
    # then put an OCI index of the two manifests under the tag.
    local cfg; cfg=$(mktemp -d)
    printf '{"auths": {"%s": {"auth": "%s"}}}\n' "$REGISTRY_ADDR" \
        "$(printf '%s:%s' "$REGISTRY_USER" "$(cat "$STATE_DIR/registry/password")" | base64 -w0)" >"$cfg/config.json"
    local cid arch entries="" sep=""
    cid=$($DOCKER create "$BASE_IMAGE" /bin/true)
    $DOCKER export "$cid" | e26 import --platform linux/amd64 - "$MULTIARCH_BASE-amd64" >/dev/null
    $DOCKER rm "$cid" >/dev/null
    e26 import --platform linux/arm64 "$ARM64_TAR" "$MULTIARCH_BASE-arm64" >/dev/null
    for arch in amd64 arm64; do
        DOCKER_CONFIG=$cfg DOCKER_HOST=$E26_HOST "$E26_DOCKER" push -q "$MULTIARCH_BASE-$arch" >/dev/null
        local hdrs body media digest size
        hdrs=$(mktemp); body=$(mktemp)
        registry_curl -D "$hdrs" -o "$body" \
            -H "Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json" \
            "http://$REGISTRY_ADDR/v2/$repo/manifests/$tag-$arch"
        media=$(grep -i '^content-type:' "$hdrs" | tr -d '\r' | awk '{print $2}')
        digest=sha256:$(sha256sum "$body" | cut -d' ' -f1)
        size=$(stat -c %s "$body")
        entries+="$sep{\"mediaType\": \"$media\", \"digest\": \"$digest\", \"size\": $size, \"platform\": {\"architecture\": \"$arch\", \"os\": \"linux\"}}"
        sep=", "
        rm -f "$hdrs" "$body"
        e26 image rm "$MULTIARCH_BASE-$arch" >/dev/null
    done
    rm -rf "$cfg"
    printf '{"schemaVersion": 2, "mediaType": "%s", "manifests": [%s]}' "$index" "$entries" \
        | registry_curl -X PUT -H "Content-Type: $index" --data-binary @- \
            "http://$REGISTRY_ADDR/v2/$repo/manifests/$tag" >/dev/null
    log "pushed the multi-platform base $MULTIARCH_BASE (linux/amd64, linux/arm64)"
}

free_gb() { df --output=avail -BG "$1" | tail -1 | tr -dc '0-9'; }

prune_engines() {
    # Build caches (pip/uv cache mounts, CUDA wheel layers) are what grows: tens of GB per run.
    if engine_up; then
        $DOCKER builder prune -af 2>/dev/null | tail -1 | sed 's/^/[services] docker 20.10: /' >&2 || true
        remove_test_images "$DOCKER"
    fi
    if [ "$ENGINE26" = 1 ] && engine26_up; then
        e26 builder prune -af 2>/dev/null | tail -1 | sed 's/^/[services] docker 26: /' >&2 || true
        remove_test_images e26
    fi
}

remove_test_images() {
    # what tests and the demo tag: imgbuild-test/... locally, anything named for the local registry
    # ("$1": a client, or the e26 function)
    local refs
    refs=$("$1" image ls --format '{{.Repository}}:{{.Tag}}' 2>/dev/null \
        | grep -E "^(imgbuild-test|${REGISTRY_ADDR//./\\.}/)" || true)
    [ -z "$refs" ] || "$1" image rm -f $refs >/dev/null 2>&1 || true
}

ensure_room() {
    local where=/var/lib avail
    avail=$(free_gb "$where")
    [ "$avail" -ge "$MIN_FREE_GB" ] && return
    log "only ${avail} GB free on $where (a test run needs about $MIN_FREE_GB): pruning build caches"
    prune_engines
    avail=$(free_gb "$where")
    [ "$avail" -ge "$MIN_FREE_GB" ] && { log "${avail} GB free now"; return; }
    log "still only ${avail} GB free on $where; the tests need about $MIN_FREE_GB GB" \
        "(IMGBUILD_MIN_FREE_GB sets the bar): free some space first"
    [ "${CI:-}" = true ] && exit 3
    return 0
}

reclaim_registry() {
    # The registry is stopped: drop every repository but the shared base (imgbuild/), then
    # delete the blobs nothing references any more.
    local repos="$STATE_DIR/registry/data/docker/registry/v2/repositories"
    [ -d "$repos" ] || return 0
    find "$repos" -mindepth 1 -maxdepth 1 ! -name imgbuild -exec rm -rf {} +
    docker-registry garbage-collect --delete-untagged "$STATE_DIR/registry/config.yml" >/dev/null 2>&1 \
        || log "registry garbage-collect failed (the blobs stay until the next reclaim)"
    log "registry storage: $(du -sh "$STATE_DIR/registry/data" | cut -f1)"
}

reset_engine26() {
    # Docker 26's data-root is test state only: start the next run from an empty one. After a day
    # of builds its state made dockerd grow to 23 GB in a registry cache import (OOM-killed on a
    # 24 GB machine, both test_registry_cache_survives_prune and bake failing); a fresh data-root ran
    # the same test at 136 MB. `up` imports the base image again.
    if pgrep -f -- "--data-root $E26_DATA" >/dev/null; then
        log "docker 26 still running: its data-root stays"; return 0
    fi
    [ -d "$E26_DATA" ] && rm -rf --one-file-system "$E26_DATA" && log "docker 26 data-root reset"
    return 0
}

stop_started() {
    for name in registry dockerd26 dockerd; do
        local pidfile="$STATE_DIR/$name.pid"
        [ -f "$pidfile" ] || continue
        local pid; pid=$(cat "$pidfile")
        if kill -0 "$pid" 2>/dev/null; then
            log "stopping $name ($pid)"; kill "$pid" || true
            for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        fi
        rm -f "$pidfile"
    done
}

print_env() {
    echo "export IMGBUILD_TEST_REGISTRY=$REGISTRY_ADDR"
    echo "export IMGBUILD_TEST_REGISTRY_USER=$REGISTRY_USER"
    echo "export IMGBUILD_TEST_REGISTRY_PASSWORD_FILE=$STATE_DIR/registry/password"
    echo "export IMGBUILD_TEST_BASE_IMAGE=$BASE_IMAGE"
    echo "export IMGBUILD_TEST_MULTIARCH_BASE=$MULTIARCH_BASE"
    # The engines the E2E suite runs on (tests/conftest.py's `engine` fixture).
    local engines=docker20
    if [ "$ENGINE26" = 1 ] && engine26_up; then engines+=,docker26; fi
    if podman_up; then engines+=,podman; fi  # only the engine-contract tests run on it (tests/conftest.py)
    if buildah_up; then engines+=,buildah; fi  # the same
    echo "export IMGBUILD_TEST_ENGINES=$engines"
    echo "export IMGBUILD_TEST_DOCKER26_HOST=$E26_HOST"
    echo "export IMGBUILD_TEST_DOCKER26_CLIENT=$E26_DOCKER"
    echo "export IMGBUILD_TEST_DOCKER26_CONFIG=$E26_CONFIG"
    # the third-party CLIs of the signing and referrer tests (absent: those tests fail under CI=true)
    [ -x "$TOOLS_ROOT/usr/bin/cosign" ] && echo "export IMGBUILD_TEST_COSIGN=$TOOLS_ROOT/usr/bin/cosign"
    [ -x "$TOOLS_ROOT/usr/bin/oras" ] && echo "export IMGBUILD_TEST_ORAS=$TOOLS_ROOT/usr/bin/oras"
    return 0
}

case "${1:-up}" in
    up) install_missing; unpack_tools; start_engine; start_engine26; ensure_room; start_registry; make_base_image; base_image26
        setup_podman; binfmt_up; multiarch_base; print_env ;;
    install) install_missing; unpack_tools ;;
    down) stop_started ;;
    reclaim) prune_engines; stop_started; reset_engine26; reclaim_registry; log "$(free_gb /var/lib) GB free on /var/lib" ;;
    env) print_env ;;
    *) echo "usage: $0 up|down|reclaim|env|install" >&2; exit 2 ;;
esac
