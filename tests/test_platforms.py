"""arm64 beside amd64 (issue 24: 3), below the engine: the recipe's `platforms:`, the per-architecture
data (which releases have a Linux aarch64 wheel on the package index, what torch's aarch64 wheel
is), the refusal of each pin that has no build for a platform (file, line, key, the newest release
that fits), and which engine can build what. The builds themselves are in test_e2e_platforms.py."""

import json

import pytest
from helpers import TODAY, run_cli, write_recipe

from buildkit_py.compat import platforms, tables
from buildkit_py.compat.bases import BaseFacts
from buildkit_py.compat.resolve import resolve
from buildkit_py.engine import BuildRequest, require, required_capabilities
from buildkit_py.engine.kinds.buildx import BuildxEngine
from buildkit_py.engine.kinds.docker import ClassicEngine
from buildkit_py.errors import CompatibilityError, EngineCapabilityError, RecipeError
from buildkit_py.recipe.model import parse_recipe

BOTH = "platforms: [linux/amd64, linux/arm64]\n"


def recipe(tmp_path, cuda="12.4", flavor="base", extra="", plats=BOTH):
    text = (f'name: t/arm\nversion: "1"\ncuda: {{version: "{cuda}", source: wheels, flavor: {flavor}}}\n'
            f'base: {{image: debian:bookworm-slim}}\npython: "3.11"\n{plats}{extra}')
    path = write_recipe(tmp_path, text)
    return parse_recipe(text, path)


def refusals(exc: CompatibilityError) -> list[CompatibilityError]:
    return list(getattr(exc, "errors", [exc]))


# --- the recipe ---------------------------------------------------------------------------------

def test_platforms_key_parses_and_the_default_keeps_old_digests(tmp_path):
    both = recipe(tmp_path, plats=BOTH)
    assert both.platforms == ("linux/amd64", "linux/arm64") and both.multi_platform
    plain = recipe(tmp_path / "a", plats="")
    explicit = recipe(tmp_path / "b", plats="platforms: [linux/amd64]\n")
    assert plain.platforms == ("linux/amd64",) and not plain.multi_platform
    # naming the default changes nothing: the digest (labels, cache keys) of existing recipes stays
    assert plain.digest == explicit.digest != both.digest


@pytest.mark.parametrize(("value", "message"), [
    ("[linux/s390x]", "'linux/s390x' is not one of linux/amd64, linux/arm64"),
    ("[linux/arm64, linux/arm64]", ""),
    ("[]", "must not be empty"),
])
def test_bad_platforms_are_refused_at_their_line(tmp_path, value, message):
    with pytest.raises(RecipeError) as info:
        recipe(tmp_path, plats=f"platforms: {value}\n")
    issue = info.value.issues[0]
    assert issue.line == 6 and issue.key.startswith("platforms"), issue
    assert message in issue.message


# --- the data -----------------------------------------------------------------------------------

def test_platform_data_is_sourced_and_covers_every_cuda_wheel_imgbuild_pins():
    tables.validate_all()  # platforms.json is one of the checked data files
    data = platforms.data()
    assert platforms.platform("linux/arm64").nvidia_arch == "sbsa"
    assert platforms.platform("linux/amd64").wheel_arch == "x86_64"
    raw = json.loads(tables.data_dir().joinpath("platforms.json").read_text())
    assert raw["source"] and all(row["source"] and row["read"] for row in raw["wheels"].values())
    assert all(row["source"] for row in raw["torch"])
    # every nvidia-* wheel a CUDA release's extras name is covered: none is "unknown" on arm64
    for release in json.loads(tables.data_dir().joinpath("wheels.json").read_text())["releases"]:
        for pins in release["extras"].values():
            for name, version in pins.items():
                assert platforms.has_wheel(name, version, "x86_64") is not None, name
    # facts read from the index: cudart 12.1 is x86_64 only, 12.4 has both; torch's aarch64 wheel
    # is a CPU build up to 2.10, a CUDA 13.0 build from 2.11
    assert platforms.has_wheel("nvidia-cuda-runtime-cu12", "12.1.105", "aarch64") is False
    assert platforms.has_wheel("nvidia-cuda-runtime-cu12", "12.4.127", "aarch64") is True
    assert data.torch["2.10.0"].cuda is None and data.torch["2.11.0"].cuda == "13.0"


# --- the refusals -------------------------------------------------------------------------------

def test_cuda_wheel_missing_for_arm64_is_refused_with_the_newest_that_fits(tmp_path):
    with pytest.raises(CompatibilityError) as info:
        resolve(recipe(tmp_path, cuda="12.1"), today=TODAY)
    err = info.value
    assert (err.key, err.line, err.other, err.other_version) == ("cuda.version", 3, "platform", "linux/arm64")
    assert "nvidia-cuda-runtime-cu12==12.1.105 has no Linux aarch64 build" in err.message
    assert 'cuda.version "12.9"' in err.hint
    # the same recipe for linux/amd64 alone resolves
    assert resolve(recipe(tmp_path / "amd", cuda="12.1", plats=""), today=TODAY).cuda_version.startswith("12.1")


def test_runtime_tier_without_arm64_opencl_points_at_the_base_flavor(tmp_path):
    with pytest.raises(CompatibilityError) as info:
        resolve(recipe(tmp_path, flavor="runtime"), today=TODAY)
    assert info.value.key == "cuda.flavor" and "nvidia-cuda-opencl-cu12==12.4.127" in info.value.message
    assert "cuda.flavor: base" in info.value.hint
    assert resolve(recipe(tmp_path / "base", flavor="base"),
                   today=TODAY).cuda_wheels == ("nvidia-cuda-runtime-cu12==12.4.127",)


def test_every_pin_missing_for_arm64_is_refused_in_one_pass(tmp_path):
    r = recipe(tmp_path, extra='torch: "2.4.1"\npip: ["bitsandbytes==0.45.0", "flash-attn==2.6.3"]\n')
    with pytest.raises(CompatibilityError) as info:
        resolve(r, today=TODAY)
    found = {e.key: e for e in refusals(info.value)}
    assert set(found) == {"torch", "pip[0]", "pip[1]"}
    # torch 2.4.1's aarch64 wheel on the index is a CPU build; PyTorch's own index is not read: unknown
    assert found["torch"].partial and "CPU build" in found["torch"].message
    assert "2.15.0" in found["torch"].hint
    assert found["pip[0]"].line == 8 and "bitsandbytes==0.50.2" in found["pip[0]"].hint
    assert "no flash-attn release has a Linux aarch64 wheel" in found["pip[1]"].message
    assert all(e.other_version == "linux/arm64" for e in found.values())


def test_torch_with_an_arm64_cuda_build_resolves(tmp_path):
    res = resolve(recipe(tmp_path, cuda="13.0", extra='torch: "2.14.1"\n'), today=TODAY)
    assert res.torch == "2.14.1"


def test_base_index_without_the_platform_is_refused(tmp_path):
    r = recipe(tmp_path)
    amd64_only = BaseFacts("127.0.0.1:5000/x/debian:12", "sha256:" + "a" * 64, platforms=("linux/amd64",))
    with pytest.raises(CompatibilityError) as info:
        resolve(r, base=amd64_only, today=TODAY)
    assert info.value.key == "base.image" and "no linux/arm64 manifest (it has linux/amd64)" in info.value.message
    both = BaseFacts("127.0.0.1:5000/x/debian:12", "sha256:" + "a" * 64, platforms=("linux/amd64", "linux/arm64/v8"))
    assert resolve(r, base=both, today=TODAY).cuda_wheels


def test_cli_platform_overrides_the_recipe_and_is_checked_before_any_engine(tmp_path):
    path = write_recipe(tmp_path, 'name: t/arm\nversion: "1"\ncuda: {version: "12.1", source: wheels, flavor: base}\n'
                                  'base: {image: debian:bookworm-slim}\npython: "3.11"\n')
    code, _, err = run_cli("build", str(path), "--platform", "linux/arm64", "--engine", "docker")
    assert code == 2 and "conflicts with platform linux/arm64" in err and "Traceback" not in err
    code, _, err = run_cli("build", str(path), "--platform", "linux/s390x")
    assert code == 2 and "--platform linux/s390x" in err
    code, out, _ = run_cli("plan", str(write_recipe(tmp_path / "ok", f'name: t/arm\nversion: "1"\ncuda: {{version: '
                                                    f'"12.4", source: wheels, flavor: base}}\nbase: {{image: debian:'
                                                    f'bookworm-slim}}\npython: "3.11"\n{BOTH}')), "--json")
    assert code == 0 and json.loads(out)["platforms"] == ["linux/amd64", "linux/arm64"]


# --- the engines --------------------------------------------------------------------------------

def test_classic_builder_refuses_an_index_and_builds_one_platform(tmp_path):
    classic = ClassicEngine("/usr/bin/docker")
    two = BuildRequest(tmp_path, tmp_path / "Dockerfile", ("a:1",), platforms=("linux/amd64", "linux/arm64"))
    with pytest.raises(EngineCapabilityError) as info:
        require(classic, required_capabilities(frozenset(), two))
    assert "multi-platform" in info.value.message
    assert "a repeated --platform keeps only the last one" in info.value.hint
    one = BuildRequest(tmp_path, tmp_path / "Dockerfile", ("a:1",), platforms=("linux/arm64",))
    require(classic, required_capabilities(frozenset(), one))  # one platform: the classic builder can
    cmd = classic.command(one, tmp_path / "iid")
    assert cmd[cmd.index("--platform") + 1] == "linux/arm64" and cmd.count("--platform") == 1


def test_buildx_names_every_platform(tmp_path):
    cmd = BuildxEngine("/usr/bin/docker").command(
        BuildRequest(tmp_path, tmp_path / "Dockerfile", ("a:1",), platforms=("linux/amd64", "linux/arm64")),
        tmp_path / "iid")
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--platform"] == ["linux/amd64", "linux/arm64"]


def test_a_lock_is_refused_for_a_multi_platform_recipe(tmp_path):
    """A lock pins x86_64 wheels and hashes: the arm64 half of the build would fail on them."""
    path = write_recipe(tmp_path, 'name: t/arm\nversion: "1"\ncuda: {version: "12.4", source: wheels, flavor: base}\n'
                                  f'base: {{image: debian:bookworm-slim}}\npython: "3.11"\n{BOTH}pip: [six==1.16.0]\n')
    code, _, err = run_cli("lock", str(path))
    assert code == 2 and "a lock pins linux/amd64 (x86_64) wheels only" in err, err
    assert not path.with_suffix(".lock").exists()


def test_nvidia_tags_on_arm64_are_unknown_unless_the_base_index_is_read(tmp_path):
    text = ('name: t/arm\nversion: "1"\ncuda: {version: "12.4", source: nvidia, flavor: base}\npython: "3.10"\n'
            + BOTH)
    r = parse_recipe(text, write_recipe(tmp_path, text))
    with pytest.raises(CompatibilityError) as info:
        resolve(r, today=TODAY)
    assert info.value.key == "cuda.source" and info.value.partial and "(sbsa)" in info.value.message


def test_each_matrix_variant_builds_its_recipes_platforms(tmp_path):
    """build --all: a variant whose recipe names platforms builds them (the options' --platform only
    for the others), and an engine that cannot make an index refuses before any variant builds."""
    from buildkit_py import pipeline
    from buildkit_py.pipeline.build import BuildOptions
    from buildkit_py.pipeline.matrix_build import BuildHooks, build_all

    path = write_recipe(tmp_path, 'name: t/arm\nversion: "1"\ncuda: {version: "12.4", source: wheels, flavor: base}\n'
                                  f'base: {{image: debian:bookworm-slim}}\npython: "3.11"\n{BOTH}'
                                  "matrix:\n  python: ['3.11']\n  tags: ['{variant}']\n")
    seen = []

    def runner(plan, engine, options, on_line, on_event=None):
        seen.append(options.platforms)
        raise CompatibilityError("x", "1", "y", "2", "stop here")  # a failed variant: nothing else needed

    class Buildx:  # what buildx with the containerd store declares, without an engine to ask
        name, client, hints = "buildx", "docker", {}
        capabilities = frozenset({"multi-stage", "cache-mounts", "secrets", "cache-from", "platform",
                                  "multi-platform", "engine-store"})

        def describe(self):
            return "buildx engine"

    build_all(pipeline.load_matrix(path), Buildx(), BuildOptions(), hooks=BuildHooks(runner=runner))
    assert seen == [("linux/amd64", "linux/arm64")]
    classic = ClassicEngine("/usr/bin/docker")
    with pytest.raises(EngineCapabilityError):
        build_all(pipeline.load_matrix(path), classic, BuildOptions(), hooks=BuildHooks(runner=runner))
    assert len(seen) == 1


def test_a_container_of_one_platform_of_an_index(tmp_path):
    """The push gate and the label checker run each platform's image: `run --platform` before the image."""
    from buildkit_py.engine.kinds.container_run import run_args
    from buildkit_py.engine.run import RunSpec

    argv = run_args(RunSpec("r/a:1", network="none", entrypoint="python", platform="linux/arm64",
                            command=("-c", "pass")), ())
    assert argv[argv.index("--platform") + 1] == "linux/arm64" and argv.index("--platform") < argv.index("r/a:1")
    assert "--platform" not in run_args(RunSpec("r/a:1"), ())
