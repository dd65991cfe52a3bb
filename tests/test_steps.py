"""One exact text per step type (hpccm-style): what each macro of templates/steps.j2 places.
A change to a macro shows here as a one-step diff; the whole-file goldens (test_render.py)
show where it lands in each example recipe."""

import re

import pytest

from buildkit_py.plan.installer import UV_INSTALLER
from buildkit_py.plan.steps import (
    CUDA_PREFIX,
    STEP_TYPES,
    AptStep,
    ContextFile,
    CopyStep,
    CudaHomeStep,
    DeadsnakesStep,
    LdconfigStep,
    LocalWheelsStep,
    LockedPipStep,
    LockedPrefixPipStep,
    MetaStep,
    MountStubsStep,
    PipStep,
    PrefixPathStep,
    PrefixPipStep,
    VenvStep,
    WheelBuildStep,
)
from buildkit_py.render.dockerfile import render_step, template_dir

# What every uv step places: uv's mounts, then (after the secrets) uv's env and its first-use
# install into the cache mount, pinned by hash (plan/installer.py), in a folder per machine: the
# cache mount is shared by the platforms of a multi-platform build, and an arm64 step must not find
# the x86_64 uv there (issue 24: 3). Exact, like every case here.
UV_MOUNTS = r"""--mount=type=cache,target=/root/.cache/uv \
    --mount=type=cache,target=/run/imgbuild-uv \
    --mount=type=secret,id=cacert \
    --mount=type=secret,id=pipconf \
    --mount=type=secret,id=uvenv"""
UV_ENV = r"""if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert SSL_CERT_FILE=/run/secrets/cacert; fi; \
    if [ -s /run/secrets/pipconf ]; then export PIP_CONFIG_FILE=/run/secrets/pipconf; fi; \
    export UV_CACHE_DIR=/root/.cache/uv UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1; \
    if [ -s /run/secrets/uvenv ]; then . /run/secrets/uvenv; fi; \
    home=/run/imgbuild-uv/0.13.9-"$(uname -m)"; uv="$home/bin/uv"; \
    if [ ! -x "$uv" ]; then \
        new="$(mktemp -d /run/imgbuild-uv/new.XXXXXX)"; \
        echo 'uv==0.13.9 --hash=sha256:d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 --hash=sha256:5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe --hash=sha256:ecb6028d79dc96fbeafffe5c8af62a7099487ebc05a701e76714eebcffd06375' > "$new.txt"; \
        PYTHONDONTWRITEBYTECODE=1 pip install -q --disable-pip-version-check --no-cache-dir --no-deps --require-hashes --target "$new" -r "$new.txt"; \
        rm -f "$new.txt"; mv -T "$new" "$home" 2>/dev/null || rm -rf "$new"; \
    fi"""  # noqa: E501


def uv(text: str) -> str:
    return text.replace("@UV_MOUNTS@", UV_MOUNTS).replace("@UV_ENV@", UV_ENV)

CASES = {
    "apt": (
        AptStep("os", "os", packages=("curl", "python3")),
        r'''\
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt/lists,sharing=locked \
    set -eu; : imgbuild-step=os; start="$(date +%s)"; \
    rm -f /etc/apt/apt.conf.d/docker-clean; \
    apt-get update -q; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        curl \
        python3; \
    rm -rf /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log /var/cache/ldconfig/aux-cache; \
    find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run/secrets \
        -o -path /etc/hosts -o -path /etc/resolv.conf -o -path /etc/hostname -o -path /var/cache/apt -o -path /var/lib/apt/lists \) -prune \
        -o -newermt "@$((start - 1))" -exec touch -h -d @315532800 {} +''',  # noqa: E501
    ),
    "deadsnakes": (
        DeadsnakesStep("python-ppa", "os", python="3.11"),
        r'''\
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt/lists,sharing=locked \
    set -eu; : imgbuild-step=python-ppa; start="$(date +%s)"; \
    rm -f /etc/apt/apt.conf.d/docker-clean; \
    apt-get update -q; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends software-properties-common gpg-agent; \
    add-apt-repository -y ppa:deadsnakes/ppa; \
    rm -rf /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log /var/cache/ldconfig/aux-cache; \
    find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run/secrets \
        -o -path /etc/hosts -o -path /etc/resolv.conf -o -path /etc/hostname -o -path /var/cache/apt -o -path /var/lib/apt/lists \) -prune \
        -o -newermt "@$((start - 1))" -exec touch -h -d @315532800 {} +''',  # noqa: E501
    ),
    "venv": (
        VenvStep("python", "python", python="python3.11", venv="/opt/venv"),
        r'''\
RUN set -eu; : imgbuild-step=python; start="$(date +%s)"; \
    python3.11 -m venv /opt/venv; \
    find /opt/venv -exec touch -h -d @315532800 {} +; \
    PYTHONHASHSEED=0 /opt/venv/bin/python -m compileall -qq -f --invalidation-mode timestamp /opt/venv/lib; \
    find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run/secrets \
        -o -path /etc/hosts -o -path /etc/resolv.conf -o -path /etc/hostname \) -prune \
        -o -newermt "@$((start - 1))" -exec touch -h -d @315532800 {} +
ENV PATH="/opt/venv/bin:$PATH"''',
    ),
    "pip": (
        PipStep("pins", "pins", requirements=("numpy==2.1.0", "requests==2.32.3")),
        r'''\
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cacert \
    --mount=type=secret,id=pipconf \
    set -eu; : imgbuild-step=pins; \
    if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert SSL_CERT_FILE=/run/secrets/cacert; fi; \
    if [ -s /run/secrets/pipconf ]; then export PIP_CONFIG_FILE=/run/secrets/pipconf; fi; \
    pip install --disable-pip-version-check --no-warn-script-location \
        numpy==2.1.0 \
        requests==2.32.3''',
    ),
    "pip-index": (
        PipStep("torch", "torch", requirements=("torch==2.4.1+cu124",), index_url="https://download.pytorch.org/whl/cu124"),
        r'''\
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cacert \
    --mount=type=secret,id=pipconf \
    set -eu; : imgbuild-step=torch; \
    if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert SSL_CERT_FILE=/run/secrets/cacert; fi; \
    if [ -s /run/secrets/pipconf ]; then export PIP_CONFIG_FILE=/run/secrets/pipconf; fi; \
    pip install --disable-pip-version-check --no-warn-script-location \
        --index-url https://download.pytorch.org/whl/cu124 \
        torch==2.4.1+cu124''',
    ),
    "pip-locked": (
        LockedPipStep("pins", "pins",
                      requirements_file=ContextFile(".imgbuild/lock/final-pins.txt", "x==1 --hash=sha256:00\n"),
                      mount_target="/tmp/imgbuild-lock/final-pins.txt", index_url="https://download.pytorch.org/whl/cu124",
                      extra_index_urls=("https://pypi.org/simple",)),
        r'''\
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cacert \
    --mount=type=secret,id=pipconf \
    --mount=type=bind,source=.imgbuild/lock/final-pins.txt,target=/tmp/imgbuild-lock/final-pins.txt \
    set -eu; : imgbuild-step=pins; \
    if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert SSL_CERT_FILE=/run/secrets/cacert; fi; \
    if [ -s /run/secrets/pipconf ]; then export PIP_CONFIG_FILE=/run/secrets/pipconf; fi; \
    pip install --disable-pip-version-check --no-warn-script-location --no-deps --require-hashes \
        --index-url https://download.pytorch.org/whl/cu124 \
        --extra-index-url https://pypi.org/simple \
        -r /tmp/imgbuild-lock/final-pins.txt''',
    ),
    "wheel-build": (
        WheelBuildStep("wheels", "heavy", requirements=("flash-attn==2.6.3",), arch_list="8.0 9.0", jobs=4,
                       no_isolation=True, no_binary="flash-attn"),
        r'''\
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cacert \
    --mount=type=secret,id=pipconf \
    set -eu; : imgbuild-step=wheels; \
    if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert SSL_CERT_FILE=/run/secrets/cacert; fi; \
    if [ -s /run/secrets/pipconf ]; then export PIP_CONFIG_FILE=/run/secrets/pipconf; fi; \
    export TORCH_CUDA_ARCH_LIST='8.0 9.0' MAX_JOBS=4; \
    pip wheel --disable-pip-version-check --no-deps --no-build-isolation --no-binary flash-attn --wheel-dir /wheels \
        flash-attn==2.6.3''',
    ),
    "local-wheels": (
        LocalWheelsStep("compiled", "heavy", packages=("flash-attn==2.6.3",), wheels_from="builder"),
        r'''\
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cacert \
    --mount=type=secret,id=pipconf \
    --mount=type=bind,from=builder,source=/wheels,target=/tmp/wheels \
    set -eu; : imgbuild-step=compiled; \
    if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert SSL_CERT_FILE=/run/secrets/cacert; fi; \
    if [ -s /run/secrets/pipconf ]; then export PIP_CONFIG_FILE=/run/secrets/pipconf; fi; \
    pip install --disable-pip-version-check --no-warn-script-location /tmp/wheels/*.whl; \
    : built from source: flash-attn==2.6.3''',
    ),
    "ldconfig": (
        LdconfigStep("ldconfig", "cuda", venv="/opt/venv"),
        r'''\
RUN set -eu; : imgbuild-step=ldconfig; start="$(date +%s)"; \
    for d in /opt/venv/lib/python*/site-packages/nvidia/*/lib; do \
        if [ -d "$d" ]; then echo "$d"; fi; \
    done > /etc/ld.so.conf.d/imgbuild-cuda-wheels.conf; \
    ldconfig; \
    rm -f /var/cache/ldconfig/aux-cache; \
    find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run/secrets \
        -o -path /etc/hosts -o -path /etc/resolv.conf -o -path /etc/hostname \) -prune \
        -o -newermt "@$((start - 1))" -exec touch -h -d @315532800 {} +''',
    ),
    "cuda-home": (
        CudaHomeStep("cuda-home", "cuda", venv="/opt/venv", tree="nvidia/cu13", home="/usr/local/cuda"),
        r'''\
RUN set -eu; : imgbuild-step=cuda-home; start="$(date +%s)"; \
    tree="$(echo /opt/venv/lib/python*/site-packages/nvidia/cu13)"; \
    test -x "$tree/bin/nvcc"; \
    ln -sfn lib "$tree/lib64"; \
    ln -sfn "$tree" /usr/local/cuda; \
    find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run/secrets \
        -o -path /etc/hosts -o -path /etc/resolv.conf -o -path /etc/hostname \) -prune \
        -o -newermt "@$((start - 1))" -exec touch -h -d @315532800 {} +
ENV CUDA_HOME="/usr/local/cuda" PATH="/usr/local/cuda/bin:$PATH"''',
    ),
    "copy": (
        CopyStep("copy-0", "app", src="app/", dest="/app/"),
        r'''\
COPY ["app/", "/app/"]''',
    ),
    "meta": (
        MetaStep("meta", "meta", workdir="/app", env=(("A", "1"), ("B", "x y")), volumes=("/data",),
                 labels=(("org.opencontainers.image.title", "demo"), ("x", "y")),
                 entrypoint=("python",), cmd=("serve.py",)),
        r'''\
WORKDIR /app
ENV A="1" \
    B="x y"
VOLUME ["/data"]
LABEL "org.opencontainers.image.title"="demo" \
      "x"="y"
ENTRYPOINT ["python"]
CMD ["serve.py"]''',
    ),
    "meta-labels-only": (
        MetaStep("meta", "meta", workdir=None, env=(), volumes=(), labels=(("x", "y"),), entrypoint=(), cmd=()),
        r'''\
LABEL "x"="y"''',
    ),
    "pip-reproducible": (
        PipStep("cuda-cudnn", "cuda", requirements=("nvidia-cudnn-cu13==9.24.0.43",), no_deps=True, reproducible=True),
        r'''\
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cacert \
    --mount=type=secret,id=pipconf \
    --mount=type=tmpfs,target=/tmp \
    set -eu; : imgbuild-step=cuda-cudnn; \
    if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert SSL_CERT_FILE=/run/secrets/cacert; fi; \
    if [ -s /run/secrets/pipconf ]; then export PIP_CONFIG_FILE=/run/secrets/pipconf; fi; \
    export PYTHONDONTWRITEBYTECODE=1; SOURCE_DATE_EPOCH=315532800; touch /tmp/imgbuild-stamp; \
    pip install --disable-pip-version-check --no-warn-script-location --no-deps --no-compile \
        nvidia-cudnn-cu13==9.24.0.43; \
    prefix="$(python -c 'import sys; print(sys.prefix)')"; \
    find "$prefix" -newer /tmp/imgbuild-stamp -name '*.py' > /tmp/imgbuild-new-py; \
    find "$prefix" -newer /tmp/imgbuild-stamp -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +; \
    if [ -s /tmp/imgbuild-new-py ]; then \
        PYTHONHASHSEED=0 python -m compileall -qq --invalidation-mode timestamp -i /tmp/imgbuild-new-py || :; \
    fi; \
    find "$prefix" -newer /tmp/imgbuild-stamp -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +; \
    for d in "$prefix"/lib/python*/site-packages "$prefix/bin"; do \
        while [ "$d" != / ]; do touch -h -d "@$SOURCE_DATE_EPOCH" "$d"; d="$(dirname "$d")"; done; \
    done''',
    ),
    "pip-uv": (
        PipStep("pins", "pins", requirements=("numpy==2.1.0", "requests==2.32.3"), installer=UV_INSTALLER),
        uv(r'''\
RUN @UV_MOUNTS@ \
    set -eu; : imgbuild-step=pins; \
    @UV_ENV@; \
    "$uv" pip install --python "$(command -v python)" --compile-bytecode \
        numpy==2.1.0 \
        requests==2.32.3'''),
    ),
    "pip-uv-reproducible": (
        PipStep("cuda-cudnn", "cuda", requirements=("nvidia-cudnn-cu13==9.24.0.43",), no_deps=True, reproducible=True,
                installer=UV_INSTALLER),
        uv(r'''\
RUN @UV_MOUNTS@ \
    --mount=type=tmpfs,target=/tmp \
    set -eu; : imgbuild-step=cuda-cudnn; \
    @UV_ENV@; \
    export PYTHONDONTWRITEBYTECODE=1; SOURCE_DATE_EPOCH=315532800; touch /tmp/imgbuild-stamp; \
    "$uv" pip install --python "$(command -v python)" --no-deps \
        nvidia-cudnn-cu13==9.24.0.43; \
    prefix="$(python -c 'import sys; print(sys.prefix)')"; \
    find "$prefix" -newer /tmp/imgbuild-stamp -name '*.py' > /tmp/imgbuild-new-py; \
    find "$prefix" -newer /tmp/imgbuild-stamp -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +; \
    if [ -s /tmp/imgbuild-new-py ]; then \
        PYTHONHASHSEED=0 python -m compileall -qq --invalidation-mode timestamp -i /tmp/imgbuild-new-py || :; \
    fi; \
    find "$prefix" -newer /tmp/imgbuild-stamp -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +; \
    for d in "$prefix"/lib/python*/site-packages "$prefix/bin"; do \
        while [ "$d" != / ]; do touch -h -d "@$SOURCE_DATE_EPOCH" "$d"; d="$(dirname "$d")"; done; \
    done'''),
    ),
    "pip-locked-uv": (
        LockedPipStep("pins", "pins",
                      requirements_file=ContextFile(".imgbuild/lock/final-pins.txt", "x==1 --hash=sha256:00\n"),
                      mount_target="/tmp/imgbuild-lock/final-pins.txt", index_url="https://download.pytorch.org/whl/cu124",
                      extra_index_urls=("https://pypi.org/simple",), installer=UV_INSTALLER),
        uv(r'''\
RUN @UV_MOUNTS@ \
    --mount=type=bind,source=.imgbuild/lock/final-pins.txt,target=/tmp/imgbuild-lock/final-pins.txt \
    set -eu; : imgbuild-step=pins; \
    @UV_ENV@; \
    "$uv" pip install --python "$(command -v python)" --no-deps --require-hashes --compile-bytecode \
        --index-url https://download.pytorch.org/whl/cu124 \
        --extra-index-url https://pypi.org/simple \
        --index-strategy unsafe-best-match \
        -r /tmp/imgbuild-lock/final-pins.txt'''),
    ),
    "local-wheels-uv": (
        LocalWheelsStep("compiled", "heavy", packages=("flash-attn==2.6.3",), wheels_from="builder",
                        installer=UV_INSTALLER),
        uv(r'''\
RUN @UV_MOUNTS@ \
    --mount=type=bind,from=builder,source=/wheels,target=/tmp/wheels \
    set -eu; : imgbuild-step=compiled; \
    @UV_ENV@; \
    "$uv" pip install --python "$(command -v python)" --compile-bytecode /tmp/wheels/*.whl; \
    : built from source: flash-attn==2.6.3'''),
    ),
    "mount-stubs": (
        MountStubsStep("mount-stubs", "python", hosts=ContextFile(".imgbuild/root/etc/hosts", ""),
                       dirs=("/root/.cache/pip", "/run/secrets"),
                       files=("/run/secrets/cacert", "/run/secrets/pipconf")),
        r'''\
COPY [".imgbuild/root/", "/"]
RUN set -eu; : imgbuild-step=mount-stubs; \
    mkdir -p /root/.cache/pip /run/secrets; \
    touch /run/secrets/cacert /run/secrets/pipconf; \
    touch -h -d @315532800 /etc /root /root/.cache /root/.cache/pip /run /run/secrets /run/secrets/cacert /run/secrets/pipconf''',  # noqa: E501
    ),
    "prefix-pip": (
        PrefixPipStep("cuda-cudnn", "cuda", requirements=("nvidia-cudnn-cu12==9.1.0.70",), no_deps=True,
                      reproducible=True),
        r'''\
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cacert \
    --mount=type=secret,id=pipconf \
    --mount=type=tmpfs,target=/tmp \
    set -eu; : imgbuild-step=cuda-cudnn; \
    if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert SSL_CERT_FILE=/run/secrets/cacert; fi; \
    if [ -s /run/secrets/pipconf ]; then export PIP_CONFIG_FILE=/run/secrets/pipconf; fi; \
    export PYTHONDONTWRITEBYTECODE=1 SOURCE_DATE_EPOCH=315532800; \
    pip install --disable-pip-version-check --no-warn-script-location --no-deps --no-compile \
        --target /tmp/imgbuild-prefix \
        nvidia-cudnn-cu12==9.1.0.70; \
    find /tmp/imgbuild-prefix -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +; \
    mkdir -p /opt/imgbuild/cuda-wheels; \
    cp -a /tmp/imgbuild-prefix/. /opt/imgbuild/cuda-wheels/; \
    d=/opt/imgbuild/cuda-wheels; \
    while [ "$d" != / ]; do touch -h -d "@$SOURCE_DATE_EPOCH" "$d"; d="$(dirname "$d")"; done''',
    ),
    "locked-prefix-pip": (
        LockedPrefixPipStep("cuda", "cuda",
                            requirements_file=ContextFile(".imgbuild/lock/final-cuda.txt", "x==1 --hash=sha256:00\n"),
                            mount_target="/tmp/imgbuild-lock/final-cuda.txt", index_url=None, extra_index_urls=(),
                            reproducible=True),
        r'''\
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cacert \
    --mount=type=secret,id=pipconf \
    --mount=type=bind,source=.imgbuild/lock/final-cuda.txt,target=/tmp/imgbuild-lock/final-cuda.txt \
    --mount=type=tmpfs,target=/tmp \
    set -eu; : imgbuild-step=cuda; \
    if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert SSL_CERT_FILE=/run/secrets/cacert; fi; \
    if [ -s /run/secrets/pipconf ]; then export PIP_CONFIG_FILE=/run/secrets/pipconf; fi; \
    export PYTHONDONTWRITEBYTECODE=1 SOURCE_DATE_EPOCH=315532800; \
    pip install --disable-pip-version-check --no-warn-script-location --no-deps --require-hashes --no-compile \
        --target /tmp/imgbuild-prefix \
        -r /tmp/imgbuild-lock/final-cuda.txt; \
    find /tmp/imgbuild-prefix -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +; \
    mkdir -p /opt/imgbuild/cuda-wheels; \
    cp -a /tmp/imgbuild-prefix/. /opt/imgbuild/cuda-wheels/; \
    d=/opt/imgbuild/cuda-wheels; \
    while [ "$d" != / ]; do touch -h -d "@$SOURCE_DATE_EPOCH" "$d"; d="$(dirname "$d")"; done''',
    ),
    "prefix-path": (
        PrefixPathStep("cuda-path", "cuda", venv="/opt/venv", prefix=CUDA_PREFIX, pth="imgbuild-cuda-wheels.pth"),
        r'''\
RUN set -eu; : imgbuild-step=cuda-path; \
    for site in /opt/venv/lib/python*/site-packages; do \
        echo /opt/imgbuild/cuda-wheels > "$site"/imgbuild-cuda-wheels.pth; \
        d="$site"/imgbuild-cuda-wheels.pth; \
        while [ "$d" != / ]; do touch -h -d @315532800 "$d"; d="$(dirname "$d")"; done; \
    done''',
    ),
    "ldconfig-prefix": (
        LdconfigStep("ldconfig", "cuda", venv="/opt/venv", prefix=CUDA_PREFIX),
        r'''\
RUN set -eu; : imgbuild-step=ldconfig; start="$(date +%s)"; \
    for d in /opt/venv/lib/python*/site-packages/nvidia/*/lib /opt/imgbuild/cuda-wheels/nvidia/*/lib; do \
        if [ -d "$d" ]; then echo "$d"; fi; \
    done > /etc/ld.so.conf.d/imgbuild-cuda-wheels.conf; \
    ldconfig; \
    rm -f /var/cache/ldconfig/aux-cache; \
    find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run/secrets \
        -o -path /etc/hosts -o -path /etc/resolv.conf -o -path /etc/hostname \) -prune \
        -o -newermt "@$((start - 1))" -exec touch -h -d @315532800 {} +''',
    ),
    "cuda-home-prefix": (
        CudaHomeStep("cuda-home", "cuda", venv="/opt/venv", tree="nvidia/cu13", home="/usr/local/cuda",
                     prefix=CUDA_PREFIX),
        r'''\
RUN set -eu; : imgbuild-step=cuda-home; start="$(date +%s)"; \
    tree=/opt/imgbuild/cuda-wheels/nvidia/cu13; \
    test -x "$tree/bin/nvcc"; \
    ln -sfn lib "$tree/lib64"; \
    ln -sfn "$tree" /usr/local/cuda; \
    find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run/secrets \
        -o -path /etc/hosts -o -path /etc/resolv.conf -o -path /etc/hostname \) -prune \
        -o -newermt "@$((start - 1))" -exec touch -h -d @315532800 {} +
ENV CUDA_HOME="/usr/local/cuda" PATH="/usr/local/cuda/bin:$PATH"''',
    ),
    "prefix-pip-uv": (
        PrefixPipStep("cuda", "cuda", requirements=("nvidia-cuda-runtime-cu12==12.4.127",), reproducible=True,
                      installer=UV_INSTALLER),
        uv(r'''\
RUN @UV_MOUNTS@ \
    --mount=type=tmpfs,target=/tmp \
    set -eu; : imgbuild-step=cuda; \
    @UV_ENV@; \
    export PYTHONDONTWRITEBYTECODE=1 SOURCE_DATE_EPOCH=315532800; \
    "$uv" pip install --python "$(command -v python)" \
        --target /tmp/imgbuild-prefix \
        nvidia-cuda-runtime-cu12==12.4.127; \
    find /tmp/imgbuild-prefix -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +; \
    mkdir -p /opt/imgbuild/cuda-wheels; \
    cp -a /tmp/imgbuild-prefix/. /opt/imgbuild/cuda-wheels/; \
    d=/opt/imgbuild/cuda-wheels; \
    while [ "$d" != / ]; do touch -h -d "@$SOURCE_DATE_EPOCH" "$d"; d="$(dirname "$d")"; done'''),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_step_type_renders_exactly(name):
    step, text = CASES[name]
    assert render_step(step) == text.replace("\\\n", "", 1)


def test_every_step_type_has_its_macro_and_an_exact_case():
    macros = set(re.findall(r"macro (step_\w+)\(", (template_dir() / "steps.j2").read_text()))
    assert {t.MACRO for t in STEP_TYPES} == macros
    assert {type(step) for step, _ in CASES.values()} == set(STEP_TYPES)


def test_what_the_mount_stubs_step_dates_source_date_epoch():
    """Every path the step creates or changes is dated, up to / (left out): with no engine rewriting
    times, its layer is the same from one build to the next (issue 33: 1)."""
    stubs = CASES["mount-stubs"][0]
    assert stubs.tree == ".imgbuild/root/"
    assert stubs.stamped == ("/etc", "/root", "/root/.cache", "/root/.cache/pip", "/run", "/run/secrets",
                             "/run/secrets/cacert", "/run/secrets/pipconf")
    with pytest.raises(ValueError, match="etc/hosts"):
        MountStubsStep("mount-stubs", "python", hosts=ContextFile(".imgbuild/empty", ""), dirs=(), files=())


def test_context_files_are_the_locked_steps_requirements():
    step = CASES["pip-locked"][0]
    assert step.context_files == (ContextFile(".imgbuild/lock/final-pins.txt", "x==1 --hash=sha256:00\n"),)
    assert CASES["pip"][0].context_files == ()



def test_the_mount_stubs_empty_hosts_file_is_a_context_file():
    assert CASES["mount-stubs"][0].context_files == (ContextFile(".imgbuild/root/etc/hosts", ""),)
