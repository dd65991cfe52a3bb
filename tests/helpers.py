"""Small helpers shared by test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import io
import subprocess
import uuid
from pathlib import Path

from buildkit_py.cli.main import main

REPO = Path(__file__).resolve().parent.parent
SYSTEM_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# This pytest run's mark: every image, tag or registry repository a test creates carries it in its
# name (``unique``, the ``unique_name`` fixture) or in the RUN_LABEL label, so the check at the end of
# the session (conftest.py) finds what a test left behind, and only this run's, while other runs
# share the engines.
RUN_MARK = "tr" + uuid.uuid4().hex[:6]
RUN_LABEL = "imgbuild-test.run"  # not io.imgbuild.*: inspect reports those


def unique(prefix: str) -> str:
    """A new name for something a test creates, marked with this run: ``imgbuild-test/diff`` ->
    ``imgbuild-test/diff-tr3fa2c1-5d0e9a1b``."""
    return f"{prefix}-{RUN_MARK}-{uuid.uuid4().hex[:8]}"


# Builds here reach PyPI through a proxy whose CA only the system bundle has (environment.md).
CA_ARGS = ["--ca-cert", str(SYSTEM_CA)] if SYSTEM_CA.exists() else []


def write_recipe(folder: Path, text: str, name: str = "recipe.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def tiny_recipe(name: str, base: str, *, installer: str = "uv", pip: tuple[str, ...] = ()) -> str:
    """The smallest recipe that builds: CUDA 12.4's cudart wheel (flavor base: the runtime tier is
    ~2 GB of wheels) on ``base``, Python 3.11."""
    text = (f'name: {name}\nversion: "1"\ncuda: {{version: "12.4", source: wheels, flavor: base}}\n'
            f'base: {{image: {base}}}\npython: "3.11"\nbuild: {{installer: {installer}}}\n')
    return text + (f"pip: [{', '.join(repr(p) for p in pip)}]\n" if pip else "")


def as_unprivileged(argv: list[str]) -> list[str] | None:
    """``argv`` run without the power to write where a folder's mode forbids it; None where that
    cannot be done here. Root has that power (CAP_DAC_OVERRIDE); in a new user namespace it keeps
    its uid, the folder's owner, but not the capability in this one, so a folder of mode 555
    refuses it as it refuses any user."""
    import os
    import shutil

    if os.geteuid() != 0:
        return argv
    unshare = shutil.which("unshare")
    return [unshare, "--user", *argv] if unshare else None


def run_cli(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    """Run the CLI in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err, stdin=io.StringIO(stdin))
    return code, out.getvalue(), err.getvalue()


def image_sh(image_id: str, script: str, timeout: int = 120, platform: str | None = None) -> str:
    """stdout of ``sh -c script`` in a throw-away container of the image (no network), started by
    the engine the test runs on as `imgbuild test` starts its containers (``Engine.run_argv``);
    ``platform``: that platform's image of a multi-platform one (linux/arm64 runs under qemu)."""
    from buildkit_py.engine import engine_for_reading
    from buildkit_py.engine.run import RunSpec

    engine = engine_for_reading()
    argv = engine.run_argv(RunSpec(image_id, network="none", entrypoint="sh", command=("-c", script),
                                   platform=platform))
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=engine.environment())
    assert out.returncode == 0, out.stderr
    return out.stdout


def assert_labels_true(image_id: str, labels: dict[str, str], platform: str | None = None) -> set[str]:
    """Each io.imgbuild.* label must be true of the image: the product's own label checks (what
    `imgbuild test` and `build --push` run; analysis/image_checks.py). Returns the labels that
    passed; fails on any that did not. ``platform``: check that platform's image of a
    multi-platform one against its own labels."""
    from buildkit_py.analysis.image_checks import PASSED, SKIPPED, label_checks, read_facts
    from buildkit_py.engine import engine_for_reading

    results = label_checks(labels, read_facts(engine_for_reading(), image_id, platform=platform))
    bad = [f"{r.name}: {r.detail}" for r in results if r.status not in (PASSED, SKIPPED)]
    assert not bad, "\n".join(bad)
    return {r.name.removeprefix("label ") for r in results if r.status == PASSED}
