"""Lock files without the network: a recorded pip report (tests/fixtures/lock/torch-report.json,
pip 23.2 `install --dry-run --report` of tests/fixtures/lock/torch.yaml for CPython 3.11 on
manylinux_2_36_x86_64, descriptions stripped) stands in for pip; base digests are faked."""

import copy
import json
import random
import re
import subprocess
from pathlib import Path

import fakes
import helpers
import pytest
import yaml
from helpers import REPO, run_cli, write_recipe

from buildkit_py.engine.build import assemble_context
from buildkit_py.errors import ExitStatus, LockDrift, LockError, LockFileError, LockStale, RegistryUnreachable
from buildkit_py.label_keys import OCI_BASE_DIGEST
from buildkit_py.pipeline import locks
from buildkit_py.plan import lock
from buildkit_py.plan.lock_model import LockedBase
from buildkit_py.plan.steps import LockedPrefixPipStep, MetaStep, PipStep
from buildkit_py.recipe.model import load_recipe
from buildkit_py.render.dockerfile import render_dockerfile

FIXTURES = REPO / "tests" / "fixtures" / "lock"
REPORT = json.loads((FIXTURES / "torch-report.json").read_text())
DIGEST = "sha256:" + "ab" * 32
RECIPE = (FIXTURES / "torch.yaml").read_text()


class FakeResolver:
    """Returns the recorded report (optionally edited) and remembers what it was asked."""

    def __init__(self, report=REPORT):
        self.report = report
        self.calls = []

    def __call__(self, target, indexes, requirements, *, constraints=(), ca_cert=None):
        self.calls.append({"target": target, "indexes": indexes, "requirements": requirements,
                           "constraints": list(constraints)})
        return copy.deepcopy(self.report)


def pinner(ref, engine=None):
    return LockedBase(ref, DIGEST)


def local_pinner(ref):
    return LockedBase(ref, None, "sha256:" + "cd" * 32, "exists only in the local engine")


def FakeEngine(image_id):  # noqa: N802 - reads as the engine it makes
    """The engine the CLI passes down, holding every base as the image ``image_id``."""
    return fakes.FakeEngine(any_image=fakes.image_info(image_id))


@pytest.fixture
def recipe(tmp_path):
    return write_recipe(tmp_path, RECIPE)


def plan_of(path):
    return helpers.plan_of(load_recipe(path))


def locked_text(path, resolver=None, base_pinner=pinner):
    data = lock.lock_recipe({"default": plan_of(path)}, resolver=resolver or FakeResolver(), base_pinner=base_pinner)
    return lock.dump_lock(data)


def write(path, **kwargs):
    text = locked_text(path, **kwargs)
    lock.write_lock(lock.lock_path(path), text)
    return text


def packages(path):
    entry = yaml.safe_load(lock.lock_path(path).read_text())["variants"]["default"]
    return {p["name"]: p for p in entry["packages"]["final"]}


# --- resolving and step assignment ----------------------------------------------------------


def test_each_package_goes_to_the_earliest_step_that_needs_it(recipe):
    plan = plan_of(recipe)
    steps = lock.lock_inputs(plan).stages["final"].steps
    cuda = [s.id for s in plan.final.steps if s.id.startswith("cuda-") and isinstance(s, PipStep)]
    assert [s.id for s in steps] == [*cuda, "torch-triton", "torch", "heavy-bitsandbytes", "pins"]
    got = {p.name: p.step for p in lock.packages_from_report(REPORT, lock.target_of(plan), steps)}
    # the CUDA wheels torch pins are in their own layers (plan._torch_stack), Triton in its own, the
    # rest of its closure in torch's
    assert got["nvidia-cudnn-cu12"] == "cuda-cudnn" and got["nvidia-cublas-cu12"] == "cuda-cublas"
    assert got["triton"] == "torch-triton"
    assert got["torch"] == got["MarkupSafe"] == "torch"
    assert got["sympy"] == got["mpmath"] == got["typing_extensions"] == "torch"
    # bitsandbytes needs torch (already there) and numpy (not in torch 2.4.1's closure)
    assert got["bitsandbytes"] == got["numpy"] == "heavy-bitsandbytes"
    # requests[socks]: the extra's dependency is locked with it
    assert got["requests"] == got["urllib3"] == got["certifi"] == got["PySocks"] == "pins"
    assert len(got) == len(REPORT["install"])


def test_packages_carry_version_and_sha256_from_the_report(recipe):
    plan = plan_of(recipe)
    steps = lock.lock_inputs(plan).stages["final"].steps
    pkgs = {p.name: p for p in lock.packages_from_report(REPORT, lock.target_of(plan), steps)}
    item = next(i for i in REPORT["install"] if i["metadata"]["name"] == "requests")
    assert pkgs["requests"].version == "2.32.3"
    assert pkgs["requests"].sha256 == item["download_info"]["archive_info"]["hashes"]["sha256"]
    assert pkgs["requests"].url is None  # from the index, not a direct URL


def test_resolver_asked_for_the_image_python_and_platform(recipe):
    resolver = FakeResolver()
    lock.lock_recipe({"default": plan_of(recipe)}, resolver=resolver, base_pinner=pinner)
    (call,) = resolver.calls
    assert call["target"].python == "3.11" and call["target"].glibc == 36  # debian12
    assert call["requirements"][-3:] == ["torch==2.4.1", "bitsandbytes==0.43.3", "requests[socks]==2.32.3"]
    assert all(r.startswith(("nvidia-", "triton==")) for r in call["requirements"][:-3])  # the CUDA and Triton layers
    assert call["indexes"] == [lock.PYPI_SIMPLE]
    args = locks.pip_report_args(call["target"], ["https://download.pytorch.org/whl/cu124", lock.PYPI_SIMPLE],
                                "req.txt", "report.json")
    assert {"--isolated", "--dry-run", "--ignore-installed", "--only-binary=:all:"} <= set(args)
    assert args[args.index("--python-version") + 1] == "3.11" and args[args.index("--abi") + 1] == "cp311"
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert platforms[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in platforms
    assert "manylinux_2_37_x86_64" not in platforms
    assert args[args.index("--index-url") + 1] == "https://download.pytorch.org/whl/cu124"
    assert args[args.index("--extra-index-url") + 1] == lock.PYPI_SIMPLE


def test_pip_runs_without_the_machines_pip_configuration(monkeypatch):
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"], seen["env"] = cmd, kwargs["env"]
        report = cmd[cmd.index("--report") + 1]
        with open(report, "w") as f:
            json.dump({"install": []}, f)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    environ = {"PIP_FIND_LINKS": "/opt/wheels", "PIP_CONSTRAINT": "/etc/xdg/pip/constraints.txt", "HOME": "/h"}
    monkeypatch.setattr(locks.subprocess, "run", fake_run)
    locks.PipResolver("python3", environ)(lock.Target("3.11", 36), [lock.PYPI_SIMPLE], ["requests==2.32.3"])
    assert seen["cmd"][0] == "python3" and seen["env"]["HOME"] == "/h"
    assert seen["env"]["PIP_CONFIG_FILE"] == "/dev/null"
    assert not [k for k in seen["env"] if k.startswith("PIP_") and k != "PIP_CONFIG_FILE"]
    assert "--isolated" in seen["cmd"] and "--target" in seen["cmd"]


def test_pip_failure_is_a_lock_error_with_pips_words(monkeypatch):
    monkeypatch.setattr(locks.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "ERROR: No matching distribution found for requests==9.9.9\n"))
    with pytest.raises(LockError, match="No matching distribution found for requests==9.9.9"):
        locks.PipResolver("python3", {})(lock.Target("3.11", 36), [lock.PYPI_SIMPLE], ["requests==9.9.9"])


def test_a_resolution_for_other_markers_is_refused(recipe):
    """pip evaluates markers on the Python it runs on; a report that lacks what the image's
    Python needs (or holds what nothing needs) must not become a lock."""
    plan = plan_of(recipe)
    steps = lock.lock_inputs(plan).stages["final"].steps
    report = copy.deepcopy(REPORT)
    report["install"] = [i for i in report["install"] if i["metadata"]["name"] != "idna"]
    with pytest.raises(LockError, match="missing idna"):
        lock.packages_from_report(report, lock.target_of(plan), steps)
    report = copy.deepcopy(REPORT)
    extra = copy.deepcopy(report["install"][0])
    extra["metadata"].update(name="tomli", version="2.0.1", requires_dist=[])
    report["install"].append(extra)
    with pytest.raises(LockError, match="not needed by any pin: tomli"):
        lock.packages_from_report(report, lock.target_of(plan), steps)


# --- the file -------------------------------------------------------------------------------


def test_lock_is_deterministic_whatever_order_pip_reports_in(recipe):
    first = locked_text(recipe)
    shuffled = copy.deepcopy(REPORT)
    random.Random(7).shuffle(shuffled["install"])  # noqa: S311
    assert locked_text(recipe, resolver=FakeResolver(shuffled)) == first
    assert locked_text(recipe) == first


def test_lock_file_is_readable_yaml_beside_the_recipe(recipe):
    text = write(recipe)
    path = recipe.with_suffix(".lock")
    assert path.read_text() == text
    assert text.startswith("# imgbuild lock file for recipe.yaml")
    data = lock.read_lock(path)
    assert data.lock_version == 1 and list(data.variants) == ["default"]
    entry = data.variants["default"]
    assert entry.bases["final"] == LockedBase("debian:bookworm-slim", DIGEST)
    assert entry.inputs.python == "3.11"
    names = [p.name for p in entry.packages["final"]]
    assert names == sorted(names, key=str.lower)
    assert "  - name: torch\n" in text and "\n        version: 2.4.1\n" in text  # one key a line
    # no timestamps or host facts: the same inputs give the same bytes on any machine
    assert "created" not in text and "/tmp" not in text


def test_write_lock_is_atomic_and_reports_no_change(recipe, tmp_path):
    path = tmp_path / "x.lock"
    assert lock.write_lock(path, "a\n") is True
    assert lock.write_lock(path, "a\n") is False
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_lock_holds_several_variants(recipe):
    plan = plan_of(recipe)
    data = lock.lock_recipe({"cu121-py311": plan, "default": plan}, resolver=FakeResolver(), base_pinner=pinner)
    assert list(data.variants) == ["cu121-py311", "default"]
    with pytest.raises(LockStale, match="no variant 'other'"):
        lock.check_current(data, plan, lock.lock_path(recipe), "other")


def test_a_malformed_lock_is_an_error(recipe):
    path = lock.lock_path(recipe)
    path.write_text("lock_version: 99\n")
    with pytest.raises(LockFileError, match="not an imgbuild lock file") as exc:
        locks.use_lock(plan_of(recipe))
    assert exc.value.exit_status == ExitStatus.BAD_INPUT and "imgbuild lock" in exc.value.hint
    assert f"{path}:1: lock_version: not an imgbuild lock file of version 1" in str(exc.value)
    assert {i.key for i in exc.value.issues} == {"lock_version", "recipe", "inputs_digest", "variants"}
    text = write(recipe)
    sha = packages(recipe)["certifi"]["sha256"]
    # YAML reads the first as the number 0; every broken value is reported in one pass
    broken = text.replace(sha, "0" * 64).replace("step: pins", "step: [pins]", 1)
    path.write_text(broken)
    with pytest.raises(LockError) as exc:
        locks.use_lock(plan_of(recipe))
    lines = broken.splitlines()
    found = {(i.key.rsplit(".", 1)[-1], i.line) for i in exc.value.issues}
    assert len(found) == 2 and {k for k, _ in found} == {"sha256", "step"}, exc.value.issues
    sha_issue = next(i for i in exc.value.issues if i.key.endswith(".sha256"))
    assert sha_issue.key.startswith("variants.default.packages.final[") and "malformed sha256" in sha_issue.message
    assert lines[sha_issue.line - 1].strip() == f"sha256: {'0' * 64}"
    assert str(exc.value).startswith(f"{path}:{sha_issue.line}: {sha_issue.key}: malformed sha256")


# --- staleness ------------------------------------------------------------------------------


@pytest.mark.parametrize(("edit", "change"), [
    (("requests[socks]==2.32.3", "requests[socks]==2.32.2"), "pip: requests 2.32.3 -> 2.32.2"),
    (('python: "3.11"\n', 'python: "3.12"\n'), "python 3.11 -> 3.12"),
    (('pip: [', 'pip: ["einops==0.8.0", '), "pip: added einops==0.8.0"),
    ((', "requests[socks]==2.32.3"', ""), "pip: removed requests[socks]==2.32.3"),
    (("debian:bookworm-slim", "ubuntu:24.04"), "base of stage final: debian:bookworm-slim -> ubuntu:24.04"),
    (('torch: "2.4.1"', 'torch: "2.3.1"'), "pip: torch 2.4.1 -> 2.3.1"),
])
def test_a_stale_lock_is_refused_naming_the_change(recipe, edit, change):
    write(recipe)
    text = RECIPE.replace(*edit)
    if "3.12" in text:  # Debian 12 has no Python 3.12: take it from a python image on Debian 12
        text = text.replace("image: debian:bookworm-slim", "image: python:3.12-slim-bookworm\n  os: debian12")
    recipe.write_text(text)
    with pytest.raises(LockStale) as err:
        locks.use_lock(plan_of(recipe))
    assert change in err.value.changes
    assert change in err.value.message and "--update-lock" in err.value.hint
    assert err.value.exit_status == ExitStatus.BAD_INPUT


def test_a_change_outside_the_pins_keeps_the_lock(recipe):
    write(recipe)
    recipe.write_text(RECIPE + "env: {HF_HOME: /models}\nlabels: {team: ml}\n")
    use = locks.use_lock(plan_of(recipe), engine=FakeEngine("x"))
    assert use.status == "used"


def test_cli_build_refuses_a_stale_lock_exit_2(recipe):
    write(recipe)
    recipe.write_text(RECIPE.replace("bitsandbytes==0.43.3", "bitsandbytes==0.43.1"))
    code, out, err = run_cli("build", str(recipe), "--json")
    assert code == 2
    assert "pip: bitsandbytes 0.43.3 -> 0.43.1" in err
    assert json.loads(out)["changes"] == ["pip: bitsandbytes 0.43.3 -> 0.43.1"]


# --- --locked and --update-lock -------------------------------------------------------------


def test_locked_needs_a_lock(recipe):
    with pytest.raises(LockDrift, match="has no lock file"):
        locks.use_lock(plan_of(recipe), mode="locked", resolver=FakeResolver(), base_pinner=pinner)


def test_locked_passes_when_a_fresh_resolve_agrees_and_prefers_locked_versions(recipe):
    write(recipe)
    resolver = FakeResolver()
    use = locks.use_lock(plan_of(recipe), mode="locked", resolver=resolver, base_pinner=pinner)
    assert use.status == "used"
    assert "torch==2.4.1" in resolver.calls[0]["constraints"]  # new releases are no drift
    assert lock.lock_path(recipe).read_text() == locked_text(recipe)  # never written


def test_locked_catches_drift_in_versions_and_hashes(recipe):
    write(recipe)
    report = copy.deepcopy(REPORT)
    for item in report["install"]:
        if item["metadata"]["name"] == "certifi":
            item["download_info"]["archive_info"]["hashes"]["sha256"] = "0" * 64
        if item["metadata"]["name"] == "idna":
            item["metadata"]["version"] = "3.7"
    with pytest.raises(LockDrift) as err:
        locks.use_lock(plan_of(recipe), mode="locked", resolver=FakeResolver(report), base_pinner=pinner)
    assert err.value.exit_status == ExitStatus.FAILED
    assert any(c.startswith("certifi ") and "but the index has 000000000000" in c for c in err.value.changes)
    assert any(c.startswith("idna ") and c.endswith(" -> 3.7") for c in err.value.changes)


def test_locked_fails_on_a_stale_lock_with_exit_1(recipe):
    write(recipe)
    recipe.write_text(RECIPE.replace("requests[socks]==2.32.3", "requests==2.32.3"))
    with pytest.raises(LockDrift) as err:
        locks.use_lock(plan_of(recipe), mode="locked", resolver=FakeResolver(), base_pinner=pinner)
    assert err.value.changes == ["pip: requests requests[socks]==2.32.3 -> requests==2.32.3"]


def test_locked_fails_when_a_local_base_changed(recipe):
    write(recipe, base_pinner=local_pinner)
    kwargs = {"resolver": FakeResolver(), "base_pinner": local_pinner}
    assert locks.use_lock(plan_of(recipe), mode="locked", engine=FakeEngine("sha256:" + "cd" * 32), **kwargs)
    auto = locks.use_lock(plan_of(recipe), engine=FakeEngine("sha256:" + "ef" * 32))
    assert any("is not the image locked" in w for w in auto.warnings)
    with pytest.raises(LockDrift, match="is not the image locked"):
        locks.use_lock(plan_of(recipe), mode="locked", engine=FakeEngine("sha256:" + "ef" * 32), **kwargs)


def test_local_base_drift_is_typed_and_ignores_digest_pinned_bases():
    bases = {"final": LockedBase("local/base:1", image_id="sha256:" + "cd" * 32),
             "builder": LockedBase("reg/base:1", "sha256:" + "00" * 32, "x")}
    assert lock.local_base_drift(bases, FakeEngine("sha256:" + "cd" * 32)) == []
    assert lock.local_base_drift(bases, FakeEngine("sha256:" + "ef" * 32)) == [
        lock.LocalBaseDrift("local/base:1", "sha256:" + "cd" * 32, "sha256:" + "ef" * 32)]
    (gone,) = lock.local_base_drift(bases, None)  # no engine to ask: not provably the locked image
    assert gone.now_id is None and gone.render().endswith("now None)")


def test_update_lock_rewrites_a_stale_lock(recipe):
    write(recipe)
    recipe.write_text(RECIPE.replace("bitsandbytes==0.43.3", "bitsandbytes==0.43.1"))
    report = copy.deepcopy(REPORT)
    for item in report["install"]:
        if item["metadata"]["name"] == "bitsandbytes":
            item["metadata"]["version"] = "0.43.1"
    use = locks.use_lock(plan_of(recipe), mode="update", resolver=FakeResolver(report), base_pinner=pinner)
    assert use.status == "updated"
    assert packages(recipe)["bitsandbytes"]["version"] == "0.43.1"
    again = locks.use_lock(plan_of(recipe), mode="update", resolver=FakeResolver(report), base_pinner=pinner)
    assert again.status == "unchanged"


# --- the locked build -----------------------------------------------------------------------


def test_locked_plan_installs_hashed_files_from_bind_mounts(recipe, tmp_path):
    write(recipe)
    use = locks.use_lock(plan_of(recipe))
    text = render_dockerfile(use.plan)
    assert f"FROM debian:bookworm-slim@{DIGEST} AS final" in text
    layers = sum(1 for s in plan_of(recipe).final.steps
                 if s.id.startswith(("cuda-", "torch-")) and isinstance(s, PipStep))  # + Triton's
    assert layers >= 7 and text.count("--no-deps --require-hashes") == 2 * (3 + layers)  # and uv's own install
    assert text.count("-r /run/imgbuild-lock/") == 3 + layers
    # the CUDA wheels locked go into the shared prefix as they did unlocked (plan.PrefixPipStep)
    prefixed = [s.id for s in use.plan.final.steps if isinstance(s, LockedPrefixPipStep)]
    assert prefixed and all(s.startswith("cuda-") for s in prefixed)
    assert text.count("--target /tmp/imgbuild-prefix") == len(prefixed)
    assert ("--mount=type=bind,source=.imgbuild-lock/final-torch.txt,"
            "target=/run/imgbuild-lock/final-torch.txt") in text
    assert "-r /run/imgbuild-lock/final-pins.txt" in text
    assert "requests" not in text.split("imgbuild-step=pins")[1].split("RUN")[0]  # pins are in the file
    # inspect still maps layers
    assert ": imgbuild-step=torch;" in text and ": imgbuild-step=heavy-bitsandbytes;" in text
    work = tmp_path / "work"
    work.mkdir()
    context, _ = assemble_context(use.plan, text, work)
    pins = (context / ".imgbuild-lock" / "final-pins.txt").read_text().splitlines()
    expected = {n: p for n, p in packages(recipe).items() if p["step"] == "pins"}
    assert pins == [f"{p['name']}=={p['version']} --hash=sha256:{p['sha256']}"
                    for p in sorted(expected.values(), key=lambda p: p["name"].lower())]
    torch_file = (context / ".imgbuild-lock" / "final-torch.txt").read_text()
    assert "torch==2.4.1 --hash=sha256:" in torch_file and "nvidia-cudnn-cu12==" not in torch_file
    cudnn_file = (context / ".imgbuild-lock" / "final-cuda-cudnn.txt").read_text()
    assert cudnn_file.startswith("nvidia-cudnn-cu12==9.1.0.70 --hash=sha256:") and cudnn_file.count("\n") == 1


def test_torch_index_is_used_by_every_locked_step_with_pypi_as_extra(tmp_path):
    path = write_recipe(tmp_path, RECIPE.replace('version: "12.1"', 'version: "12.4"'))
    plan = plan_of(path)
    assert plan.resolution.torch_index_url  # cu124 is not the registry's torch 2.4.1 wheel
    resolver = FakeResolver(_relabel_torch(REPORT, "2.4.1+cu124"))
    lock.write_lock(lock.lock_path(path), lock.dump_lock(lock.lock_recipe({"default": plan}, resolver=resolver,
                                                                          base_pinner=pinner)))
    assert resolver.calls[0]["indexes"] == [plan.resolution.torch_index_url, lock.PYPI_SIMPLE]
    text = render_dockerfile(locks.use_lock(plan).plan)
    assert text.count(f"--index-url {plan.resolution.torch_index_url}") == 3
    assert text.count(f"--extra-index-url {lock.PYPI_SIMPLE}") == 3


def _relabel_torch(report, version):
    report = copy.deepcopy(report)
    for item in report["install"]:
        if item["metadata"]["name"] == "torch":
            item["metadata"]["version"] = version
    return report


def test_without_a_lock_the_plan_is_untouched(recipe):
    plan = plan_of(recipe)
    use = locks.use_lock(plan)
    assert use.status == "none" and use.plan is plan


def test_lock_document_has_the_documented_keys_and_the_text_reads_it(recipe, monkeypatch):
    monkeypatch.setattr(locks, "PipResolver", lambda *_args: FakeResolver())
    monkeypatch.setattr(locks, "pin_base", pinner)
    code, out, err = run_cli("lock", str(recipe), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"schema", "lock", "changed", "seconds", "variants"}
    assert set(data["variants"]["default"]) == {"packages", "bases", "notes"}
    path = Path(data["lock"])
    document = locks.LockWritten(path, data["changed"], data["seconds"], lock.read_lock(path).variants)
    assert {"schema": 1, **document.to_json()} == data  # the document the command printed, read back
    assert document.lines() == [f"{len(REPORT['install'])} packages, 1/1 bases by digest",
                                f"wrote {path} (1 variant, {data['seconds']:.1f}s)"]


def test_cli_lock_writes_the_file(recipe, monkeypatch):
    monkeypatch.setattr(locks, "PipResolver", lambda *_args: FakeResolver())
    monkeypatch.setattr(locks, "pin_base", pinner)
    code, out, err = run_cli("lock", str(recipe))
    assert code == 0, err
    assert f"{len(REPORT['install'])} packages, 1/1 bases by digest\nwrote {recipe.with_suffix('.lock')} (1 variant" in out  # noqa: E501
    code, out, err = run_cli("lock", str(recipe))
    assert code == 0 and "\nunchanged " in out
    # the wait for pip is announced off a terminal; --progress quiet says nothing (issue 22: 10)
    assert re.match(r"resolving \d+ requirements of stage final with pip \(Python 3\.\d+\)\n", err), err
    code, out, err = run_cli("lock", str(recipe), "--progress", "quiet")
    assert code == 0 and err == "", err


def test_the_locked_base_digest_wins_over_the_one_the_plan_looked_up(recipe):
    """bases.py pins a private-registry base at plan time; the lock records the recipe's ref and
    builds on the locked digest even after the tag moved (a moved tag is an update, not drift)."""
    import dataclasses

    write(recipe)
    plan = plan_of(recipe)
    moved = "sha256:" + "99" * 32
    labels = {**plan.labels, OCI_BASE_DIGEST: moved}
    final = dataclasses.replace(plan.final, base=f"{plan.final.base}@{moved}", steps=tuple(
        dataclasses.replace(s, labels=tuple(labels.items())) if isinstance(s, MetaStep) else s for s in plan.final.steps))  # noqa: E501
    looked_up = dataclasses.replace(plan, stages=(final,), labels=labels)
    assert lock.lock_inputs(looked_up) == lock.lock_inputs(plan)
    text = render_dockerfile(locks.use_lock(looked_up).plan)
    assert f"FROM debian:bookworm-slim@{DIGEST} AS final" in text and moved not in text
    # and a lock made from such a plan takes the plan's digest without asking the registry
    data = lock.lock_recipe({"default": looked_up}, resolver=FakeResolver(), base_pinner=None)
    assert data.variants["default"].bases["final"] == LockedBase("debian:bookworm-slim", moved)


def test_update_lock_of_one_variant_keeps_the_others(recipe):
    plan = plan_of(recipe)
    data = lock.lock_recipe({"cu121-py311": plan, "default": plan}, resolver=FakeResolver(), base_pinner=pinner)
    lock.write_lock(lock.lock_path(recipe), lock.dump_lock(data))
    use = locks.use_lock(plan, mode="update", variant="cu121-py311", resolver=FakeResolver(), base_pinner=pinner)
    assert use.status == "unchanged"
    assert list(lock.read_lock(lock.lock_path(recipe)).variants) == ["cu121-py311", "default"]


def test_locked_dockerfile_parses(recipe):
    import dockerfile

    write(recipe)
    text = render_dockerfile(locks.use_lock(plan_of(recipe)).plan)
    runs = [c for c in dockerfile.parse_string(text) if c.cmd == "RUN"]
    layers = sum(1 for s in plan_of(recipe).final.steps
                 if s.id.startswith(("cuda-", "torch-")) and isinstance(s, PipStep))
    assert sum("--require-hashes" in " ".join(c.value) for c in runs) == 3 + layers


def test_locked_dockerfile_lints(recipe, tmp_path, hadolint):
    write(recipe)
    path = tmp_path / "Dockerfile"
    path.write_text(render_dockerfile(locks.use_lock(plan_of(recipe)).plan))
    out = subprocess.run([hadolint, "--no-color", "--format", "json", "--failure-threshold", "error", str(path)],
                         capture_output=True, text=True, check=False)
    assert [f for f in json.loads(out.stdout) if f["level"] == "error"] == []
    assert out.returncode == 0, out.stderr


def test_written_lock_follows_its_schema_for_both_validators(recipe):
    import jsonschema

    from buildkit_py import schemas

    write(recipe)
    data = yaml.safe_load(lock.lock_path(recipe).read_text())
    schema = schemas.load_schema("lock")
    assert [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(data)] == []
    assert schemas.validate(data, schema) == []
    assert lock.read_lock(lock.lock_path(recipe)).to_json() == data


def test_lock_file_errors_exit_2_with_file_line_key_and_hint(recipe):
    path = lock.lock_path(recipe)
    text = write(recipe)
    path.write_text(text.replace("lock_version: 1", "lock_version: 1\nextra: true"))
    code, out, err = run_cli("build", str(recipe), "--json")
    assert code == 2 and "Traceback" not in err
    data = json.loads(out)
    assert data["error"] == "LockFileError" and "imgbuild lock" in data["hint"]
    line = text.splitlines().index("lock_version: 1") + 2
    assert data["issues"] == [{"file": str(path), "line": line, "key": "extra",
                               "message": "unknown key; allowed: inputs_digest, lock_version, recipe, variants"}]


def test_lock_says_what_it_waits_for(recipe):
    """issue 22: 10: `imgbuild lock` was silent for the 20-30 s pip takes: each wait is announced."""
    plan = plan_of(recipe)
    heard: list[str] = []
    lock.lock_recipe({"cu121-py311": plan, "default": plan}, resolver=FakeResolver(), base_pinner=pinner,
                     on_status=heard.append)
    stages = [s.name for s in plan.stages]
    assert [h.split(" requirements")[0].split(" resolving ")[0] for h in heard if "resolving" in h] == \
        ["[cu121-py311]"] * len(stages) + ["[default]"] * len(stages)
    assert all(re.fullmatch(r"\[(cu121-py311|default)\] (resolving \d+ requirements of stage \w+ with pip "
                            r"\(Python 3\.\d+\)|pinning base \S+ of stage \w+ by digest)", h) for h in heard), heard
    assert any("pinning base" in h for h in heard)
    one: list[str] = []
    lock.lock_recipe({"default": plan}, resolver=FakeResolver(), base_pinner=pinner, on_status=one.append)
    assert one and not any(h.startswith("[") for h in one)  # one variant: no id in front


# --- the typed model (issue 23: 4) ---------------------------------------------------------


@pytest.mark.parametrize("base_pinner", [pinner, local_pinner], ids=["digest", "local"])
def test_a_lock_reads_into_the_typed_model_and_writes_back_byte_for_byte(recipe, base_pinner):
    from buildkit_py.plan import lock_model as M

    plan = plan_of(recipe)
    text = lock.dump_lock(lock.lock_recipe({"cu121-py311": plan, "default": plan}, resolver=FakeResolver(),
                                           base_pinner=base_pinner))
    path = lock.lock_path(recipe)
    path.write_text(text)
    data = lock.read_lock(path)
    assert isinstance(data, M.LockFile) and isinstance(data.variants["default"], M.VariantLock)
    entry = data.variants["default"]
    assert isinstance(entry.inputs, M.LockInputs) and isinstance(entry.inputs.stages["final"].steps[0], M.LockedStep)
    assert all(isinstance(p, M.LockedPackage) for p in entry.packages["final"])
    assert lock.dump_lock(data) == text
    assert lock.dump_lock(M.LockFile.from_json(yaml.safe_load(text))) == text


def _fields(cls) -> tuple[set[str], set[str]]:
    import dataclasses

    fields = dataclasses.fields(cls)
    return {f.name for f in fields}, {f.name for f in fields if f.default is dataclasses.MISSING
                                      and f.default_factory is dataclasses.MISSING}


@pytest.mark.parametrize(("name", "where"), [
    ("LockFile", ()), ("VariantLock", ("$defs", "variant")), ("LockInputs", ("$defs", "inputs")),
    ("StageInputs", ("$defs", "inputs", "properties", "stages", "additionalProperties")),
    ("LockedStep", ("$defs", "inputs", "properties", "stages", "additionalProperties", "properties", "steps", "items")),
    ("LockedPackage", ("$defs", "package")), ("LockedBase", ("$defs", "base")),
])
def test_each_model_class_has_the_keys_its_schema_object_has(name, where):
    """The dataclasses and lock.schema.json describe one document: a field per property, the
    schema's required keys the fields without a default."""
    from buildkit_py import schemas
    from buildkit_py.plan import lock_model as M

    node = schemas.load_schema("lock")
    for key in where:
        node = node[key]
    fields, required = _fields(getattr(M, name))
    assert fields == set(node["properties"]) and required == set(node["required"])


def test_a_base_the_registry_does_not_confirm_is_pinned_by_image_id_not_by_the_engines_digest(monkeypatch):
    """On the containerd store an imported image has RepoDigests of its own manifest, which no
    registry holds; the lock took it for a registry digest ('1/1 bases by digest') and the
    locked build's FROM ref@sha256 then failed asking the registry (found on docker 26)."""
    ref = "127.0.0.1:9/imgbuild-test/base:1"

    def unreachable(*_a, **_kw):
        raise RegistryUnreachable("127.0.0.1:9: connection refused")

    monkeypatch.setattr(locks.oci, "fetch_manifest", unreachable)

    store = fakes.FakeEngine(any_image=fakes.image_info(
        "sha256:" + "ab" * 32, repo_digests=["127.0.0.1:9/imgbuild-test/base@sha256:" + "53" * 32]))
    pinned = locks.pin_base(ref, engine=store)
    assert pinned.digest is None and pinned.image_id == "sha256:" + "ab" * 32
    assert "did not confirm a digest" in pinned.note and "push it to a registry" in pinned.note
    assert locks.pin_base(ref, engine=None).note == "neither its registry nor the local engine knows it: not pinned"
