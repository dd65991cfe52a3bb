"""`docker run` / `podman run`: the argv the two clients share after the client itself, for the
kinds that run containers through one (docker.py and its buildx, podman.py and buildah, which runs
with podman). Generic code asks ``Engine.run_argv(RunSpec)`` and never writes a client's flags."""

from __future__ import annotations

from buildkit_py.engine.run import RunSpec


def run_args(spec: RunSpec, gpu_flags: tuple[str, ...]) -> list[str]:
    """The `run` arguments docker and podman share, after the client: ``gpu_flags`` are the
    engine's way of asking for every GPU (``Engine.run_argv`` passes them)."""
    argv = ["run", "--rm"]
    if spec.name:
        argv += ["--name", spec.name]
    if spec.gpu:
        argv += gpu_flags
    if spec.network:
        argv += ["--network", spec.network]
    if spec.entrypoint is not None:
        argv += ["--entrypoint", spec.entrypoint]
    if spec.platform:
        argv += ["--platform", spec.platform]
    for w in spec.weights:
        argv += ["--mount", f"type=bind,source={w.host_dir},target={w.mount},readonly"]
    for m in spec.mounts:
        argv += ["--mount", f"type=bind,source={m.source},target={m.target}" + (",readonly" if m.read_only else "")]
    return argv + list(spec.extra) + [spec.image] + list(spec.command)
