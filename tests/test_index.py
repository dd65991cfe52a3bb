"""Package-index client, data refresh and plan-time look-up, against a real index on 127.0.0.1."""

from __future__ import annotations

import io
import json
import subprocess

import pytest
from helpers import TODAY, write_recipe
from packaging.version import Version
from pyindex import LocalIndex

from buildkit_py.cli.main import main
from buildkit_py.compat import fa_repo, index, refresh, tables
from buildkit_py.compat.images import image_releases
from buildkit_py.errors import PackageIndexError
from buildkit_py.pipeline import lookups as live

LINUX = 'platform_system == "Linux"'
CP = ["cp311", "cp312", "cp313", "cp314", "cp315"]


def _torch_wheels(ix: LocalIndex, version: str, reqs, *, cps=CP, big: bool = False, pep658: bool = False):
    for cp in cps:
        ix.add_wheel("torch", version, f"{cp}-{cp}-manylinux_2_28_x86_64", requires_dist=reqs,
                     requires_python=">=3.11", pep658=pep658, padding=(5 * 1024 * 1024 if big and cp == "cp312" else 0))
    ix.add_wheel("torch", version, "cp312-none-macosx_11_0_arm64", requires_dist=(), requires_python=">=3.11")


@pytest.fixture
def ix(tmp_path):
    with LocalIndex(tmp_path / "index") as served:
        # torch 2.16.0: a CUDA 13 build through NVIDIA's cuda-toolkit meta package; its cp312 wheel is
        # 5 MB, so its METADATA must come by HTTP range, not by downloading the wheel
        _torch_wheels(served, "2.16.0", [f"cuda-toolkit[cublas,cudart]==13.5.0; {LINUX}",
                                         f"nvidia-cudnn-cu13==9.30.0.1; {LINUX}", f"nvidia-cublas<14,>=13.9; {LINUX}",
                                         f'triton~=3.10.0; {LINUX} and python_version < "3.16"', "filelock"], big=True)
        # torch 2.4.1: a CUDA 12 build with nvidia-*-cu12 pins, served with PEP 658 metadata; cp39 and
        # cp310 tags (3.9 < 3.10 only by version order, not by string order)
        _torch_wheels(served, "2.4.1", [
            'nvidia-cuda-runtime-cu12 (==12.1.105) ; platform_system == "Linux" and platform_machine == "x86_64"',
            'triton (==3.0.0) ; platform_system == "Linux" and platform_machine == "x86_64" and python_version < "3.13"'],  # noqa: E501
            cps=["cp310", "cp39", "cp312", "cp311"], pep658=True)
        served.add_wheel("torch", "2.17.0rc1", "cp312-cp312-manylinux_2_28_x86_64", requires_dist=())
        for wheel in ("nvidia-cuda-runtime", "nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm"):
            for v in ("13.5.37", "13.6.20", "13.6.20.post1"):   # the .post1 is what ==13.6.20.* resolves to
                served.add_wheel(wheel, v, "py3-none-manylinux2014_x86_64")
            served.add_wheel(wheel, "13.6.99", "py3-none-win_amd64")   # not a Linux wheel: never picked
        for v, cudart in (("13.5.0", "13.5.37"), ("13.6.0", "13.6.20")):
            served.add_wheel("cuda-toolkit", v, "py2.py3-none-any", extras=("cudart", "nvcc"), requires_dist=[
                f"nvidia-cuda-runtime=={cudart}.*; sys_platform == 'linux' and extra == 'cudart'",
                f"nvidia-cuda-nvcc=={cudart}.*; sys_platform == 'linux' and extra == 'nvcc'",
                f"nvidia-cuda-crt=={cudart}.*; sys_platform == 'linux' and extra == 'nvcc'",
                f"nvidia-nvvm=={cudart}.*; sys_platform == 'linux' and extra == 'nvcc'"])
        # release lists deliberately out of order: 0.49.10 > 0.49.9 > 0.49.2.post1 by version only
        for v in ("0.50.2", "0.49.10", "0.49.2.post1", "0.51.0", "0.49.9"):
            served.add_wheel("bitsandbytes", v, "py3-none-manylinux_2_24_x86_64", requires_python=">=3.10",
                             requires_dist=["torch<3,>=2.4", "numpy>=1.17"])
        for v in ("2.8.3.post2", "2.8.3", "2.9.0", "2.8.10"):
            served.add_sdist("flash-attn", v, requires_python=">=3.9")
        yield served


# ---------------------------------------------------------------- client
def test_release_list_is_sorted_by_version_json_and_html(ix, monkeypatch):
    c = index.IndexClient(ix.url)
    p = c.project("bitsandbytes")
    assert p.versions == ("0.49.2.post1", "0.49.9", "0.49.10", "0.50.2", "0.51.0")
    monkeypatch.setattr(index, "_ACCEPT", "text/html")  # a PEP 503-only client sees the same
    assert index.IndexClient(ix.url).project("bitsandbytes").versions == p.versions
    assert c.project("torch").releases() == ("2.4.1", "2.16.0")
    assert "2.17.0rc1" in c.project("torch").versions


def test_metadata_by_range_reads_a_fraction_of_a_big_wheel(ix):
    c = index.IndexClient(ix.url)
    p = c.project("torch")
    wheel = refresh.pick_wheel(refresh.linux_x86_64_wheels(p, "2.16.0"))
    assert wheel.filename == "torch-2.16.0-cp312-cp312-manylinux_2_28_x86_64.whl" and wheel.size > 5_000_000
    before = ix.bytes_sent
    m = c.metadata(wheel)
    assert m.version == "2.16.0" and "METADATA by HTTP range" in m.source
    assert ix.bytes_sent - before < 200_000   # the wheel is 5 MB


def test_metadata_pep658_and_small_wheel_whole(ix):
    c = index.IndexClient(ix.url)
    p = c.project("torch")
    w = refresh.pick_wheel(refresh.linux_x86_64_wheels(p, "2.4.1"))
    m = c.metadata(w)
    assert "(PEP 658)" in m.source and any(path.endswith(".metadata") for path in ix.requests)
    small = c.project("bitsandbytes").files_of("0.50.2")[0]
    assert "(whole wheel)" in c.metadata(small).source


def test_sdist_without_metadata_is_a_typed_error(ix):
    c = index.IndexClient(ix.url)
    with pytest.raises(PackageIndexError, match="sdist"):
        c.metadata(c.project("flash-attn").files_of("2.9.0")[0])


def test_unreachable_index_is_an_environment_error():
    c = index.IndexClient("http://127.0.0.1:9/simple/", timeout=2)
    with pytest.raises(PackageIndexError, match="unreachable") as exc:
        c.project("torch")
    assert exc.value.exit_status == 3


def test_only_http_and_https_are_read(tmp_path):
    """urllib would read a file: URL; an index URL (or a link on an index page) never does."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "index.html").write_text("<a href='torch-2.4.1.tar.gz'>torch-2.4.1.tar.gz</a>")
    client = index.IndexClient(tmp_path.as_uri())
    with pytest.raises(PackageIndexError, match="only http and https URLs are read"):
        client.project("torch")
    assert client.requests == 0


def test_torch_facts_cuda13_and_cuda12(ix):
    c = index.IndexClient(ix.url)
    p = c.project("torch")
    f16 = refresh.torch_facts(c.metadata(refresh.pick_wheel(refresh.linux_x86_64_wheels(p, "2.16.0"))),
                              refresh.linux_x86_64_wheels(p, "2.16.0"))
    assert (f16.variant, f16.python, f16.triton) == ("cu135", ">=3.11,<3.16", "~=3.10.0")
    assert f16.cuda_wheels == {"cuda-toolkit": "13.5.0", "nvidia-cudnn-cu13": "9.30.0.1"}
    assert f16.cuda_toolkit_extras == ("cublas", "cudart") and f16.ranges == {"nvidia-cublas": "<14,>=13.9"}
    files = refresh.linux_x86_64_wheels(p, "2.4.1")
    f4 = refresh.torch_facts(c.metadata(refresh.pick_wheel(files)), files)
    assert (f4.variant, f4.python, f4.triton) == ("cu121", ">=3.9,<3.13", "3.0.0")
    assert f4.cuda_wheels == {"nvidia-cuda-runtime-cu12": "12.1.105"}


# ---------------------------------------------------------------- which index
def test_one_pypi_url_in_two_spellings():
    """The look-ups' client joins project names onto PYPI (slash kept); a lock records PYPI_SIMPLE as
    pip spells its default, so a lock written before stays current."""
    from buildkit_py.plan import lock

    assert (index.PYPI, lock.PYPI_SIMPLE) == ("https://pypi.org/simple/", "https://pypi.org/simple")
    assert index.IndexClient().index_url == index.IndexClient(lock.PYPI_SIMPLE).index_url == index.PYPI


def test_index_settings_follow_pip(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = http://mirror.example/simple\ncert = /ca.pem\n")
    home = {"HOME": str(tmp_path / "home")}
    assert index.index_settings(env=home).url == index.PYPI
    s = index.index_settings(env={**home, "PIP_CONFIG_FILE": str(conf)})
    assert (s.url, s.cafile, s.source) == ("http://mirror.example/simple", "/ca.pem", str(conf))
    assert index.index_settings(env={**home, "PIP_CONFIG_FILE": "/dev/null"}).url == index.PYPI
    assert index.index_settings(env={**home, "PIP_CONFIG_FILE": str(conf), "PIP_INDEX_URL": "http://e/simple"}).source \
        == "PIP_INDEX_URL"
    assert index.index_settings(pip_config=str(conf), env={**home, "PIP_INDEX_URL": "http://e/simple"}).url \
        == "http://mirror.example/simple"
    assert index.index_settings(index_url="http://x/simple", env={**home, "PIP_INDEX_URL": "http://e"}).source \
        == "--index-url"
    assert index.redact("https://u:secret@host/simple/") == "https://***@host/simple/"


# ---------------------------------------------------------------- refresh
def _shipped():
    return {n: json.loads(tables.data_dir().joinpath(n).read_text()) for n in tables.DATA_FILES}


def test_refresh_against_local_index(ix):
    report = refresh.refresh(index.IndexClient(ix.url), _shipped(), today="2026-12-24")
    by = {(c.file, c.key): c.what for c in report.changes}
    assert by[("torch.json", "2.16.0")].startswith("new release (cu135")
    assert by[("toolkits.json", "13.6.0")].startswith("new toolkit")
    # torch 2.4.1: what this index serves differs (fewer pins, cp39-cp312) and is taken, the
    # hand-sourced variants stay
    changed = [c.what.split(":")[0] for c in report.changes if (c.file, c.key) == ("torch.json", "2.4.1")]
    assert changed == ["python", "pypi_cuda_wheels"]
    new_torch = {r["version"]: r for r in report.files["torch.json"]["releases"]}
    assert new_torch["2.16.0"]["read"] == "2026-12-24" and ix.url in new_torch["2.16.0"]["source"]
    assert new_torch["2.4.1"]["variants"] == {"cu118": "11.8", "cu121": "12.1", "cu124": "12.4"}
    assert [r["version"] for r in report.files["torch.json"]["releases"]][-2:] == ["2.15.0", "2.16.0"]
    tk = {t["version"]: t for t in report.files["toolkits.json"]["toolkits"]}["13.6.0"]
    assert (tk["linux_min_driver"], tk["min_driver_basis"]) == (None, "unpublished")
    ws = {r["toolkit"]: r for r in report.files["wheels.json"]["releases"]}["13.6.0"]
    assert ws["extras"]["cudart"] == {"nvidia-cuda-runtime": "13.6.20.post1"}
    assert ws["extras"]["nvcc"]["nvidia-cuda-nvcc"] == "13.6.20.post1" and ws["meta_package"] == "cuda-toolkit==13.6.0"
    assert "13.6.0" in report.files["images.json"]["absent"]
    # this index's cuda-toolkit 13.5.0 has only two extras: the shipped row's others are reported gone
    assert by[("wheels.json", "13.5.0")].startswith("extras changed: ")
    assert any("bitsandbytes 0.51.0" in r for r in report.review)
    assert any("flash-attn 2.9.0" in r for r in report.review) and any("flash-attn 2.8.10" in r for r in report.review)
    assert report.files["torch.json"]["as_of"] == "2026-12-24"
    refresh.validate_files({n: refresh.dump(raw) for n, raw in report.files.items()})


# A flash-attention tag as the refresh reads it: publish.yml's matrix and wheel name, setup.py's nvcc
# floor, -gencode list and -std, the README's requirements (shaped like tag v2.8.3's files).
SMALL_MATRIX = """\
          python-version: ['3.10', '3.11']
          torch-version: ['2.4.0', '2.5.1', '2.6.0.dev20241001']
          cuda-version: ['12.9.1']
          cxx11_abi: ['FALSE', 'TRUE']
          exclude:
            - torch-version: '2.4.0'
              python-version: '3.11'
"""
# tag v2.6.3's, as published: 5 Pythons x 5 torch x 2 CUDA x 2 ABIs minus three excludes
V2_6_3_MATRIX = """\
          python-version: ['3.8', '3.9', '3.10', '3.11', '3.12']
          torch-version: ['2.0.1', '2.1.2', '2.2.2', '2.3.1', '2.4.0']
          cuda-version: ['11.8.0', '12.3.2']
          cxx11_abi: ['FALSE', 'TRUE']
          exclude:
            - torch-version: '2.0.1'
              python-version: '3.12'
            - torch-version: '2.1.2'
              python-version: '3.12'
            - torch-version: '2.0.1'
              cuda-version: '12.3.2'
"""


def publish_yml(matrix: str, cuda_label: str = "WHEEL_CUDA_VERSION") -> str:
    return ("name: Build wheels and deploy\njobs:\n  build_wheels:\n    strategy:\n      fail-fast: false\n"
            "      matrix:\n          os: [ubuntu-22.04]\n" + matrix +
            "    steps:\n      - name: Build wheel\n        run: |\n"
            "          tmpname=cu${" + cuda_label + "}torch${MATRIX_TORCH_VERSION}cxx11abi${{ matrix.cxx11_abi}}\n")


SETUP_PY = """\
    if CUDA_HOME is not None:
        _, bare_metal_version = get_cuda_bare_metal_version(CUDA_HOME)
        if bare_metal_version < Version("11.7"):
            raise RuntimeError("FlashAttention is only supported on CUDA 11.7 and above.")
    if "80" in cuda_archs():
        cc_flag.append("-gencode")
        cc_flag.append("arch=compute_80,code=sm_80")
    if CUDA_HOME is not None:
        if bare_metal_version >= Version("11.8") and "90" in cuda_archs():
            cc_flag.append("-gencode")
            cc_flag.append("arch=compute_90,code=sm_90")
        if bare_metal_version >= Version("12.8") and "100" in cuda_archs():
            cc_flag.append("-gencode")
            cc_flag.append("arch=compute_100,code=sm_100")
    nvcc_flags = [
    "-O3",
    "-std=c++17",
    ]
"""
README = """\
**Requirements:**
- CUDA toolkit or ROCm toolkit
- PyTorch 2.2 and above.

FlashAttention-2 with CUDA currently supports:
1. Ampere, Ada, or Hopper GPUs (e.g., A100, RTX 3090, RTX 4090, H100). Support for Turing
   GPUs (T4, RTX 2080) is coming soon, please use FlashAttention 1.x for Turing
"""


def _fa_repo(path) -> str:
    """A git repository with tag v2.7.3 holding the three files the refresh reads."""
    git = ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t", "-C", str(path)]
    (path / ".github" / "workflows").mkdir(parents=True)
    (path / ".github" / "workflows" / "publish.yml").write_text(publish_yml(SMALL_MATRIX))
    (path / "setup.py").write_text(SETUP_PY)
    (path / "README.md").write_text(README)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "v2.7.3"], check=True)
    subprocess.run([*git, "tag", "v2.7.3"], check=True)
    return str(path)


def _bnb_libs(*cuda: str, nocublaslt=()) -> list[str]:
    return [f"bitsandbytes/libbitsandbytes_cuda{c}.so" for c in cuda] + \
        [f"bitsandbytes/libbitsandbytes_cuda{c}_nocublaslt.so" for c in nocublaslt]


@pytest.fixture
def middle(ix):
    """The index above, also serving releases the data has on both sides of one it lacks (flash-attn
    2.7.3, bitsandbytes 0.41.3.post1): the refresh used to report only releases newer than the newest known."""
    for v in ("2.7.2.post1", "2.7.3", "2.7.4.post1"):
        ix.add_sdist("flash-attn", v, requires_python=">=3.9")
    libs = ("110", "111", "114", "115", "117", "118", "120", "121", "122")
    ix.add_wheel("bitsandbytes", "0.41.3", files=_bnb_libs(*libs, nocublaslt=libs))
    ix.add_wheel("bitsandbytes", "0.41.3.post1", files=_bnb_libs("102", *libs, nocublaslt=libs[:-1]))
    ix.add_wheel("bitsandbytes", "0.41.3.post2", files=_bnb_libs(*libs[:-1], nocublaslt=libs))
    data = _shipped()
    data["flash_attn.json"]["releases"] = [r for r in data["flash_attn.json"]["releases"] if r["version"] != "2.7.3"]
    data["bitsandbytes.json"]["releases"] = [r for r in data["bitsandbytes.json"]["releases"]
                                             if r["version"] != "0.41.3.post1"]
    return ix, data


def test_refresh_adds_a_release_missing_in_the_middle(middle, tmp_path):
    served, data = middle
    report = refresh.refresh(index.IndexClient(served.url), data, today="2026-12-24",
                             flash_attn_repo=_fa_repo(tmp_path / "fa"))
    by = {(c.file, c.key): c.what for c in report.changes}
    assert by[("flash_attn.json", "2.7.3")] == "new release (from the index and tag v2.7.3: 10 release wheels)"
    fa = {r["version"]: r for r in report.files["flash_attn.json"]["releases"]}["2.7.3"]
    assert {k: fa[k] for k in ("python", "torch", "cuda", "archs", "cxx_std")} == {
        "python": ">=3.9", "torch": ">=2.2", "cuda": ">=11.7", "archs": ["8.0", "8.6", "8.9", "9.0", "10.0"],
        "cxx_std": 17}
    assert fa["gencode"] == [{"sm": "8.0", "nvcc": ""}, {"sm": "9.0", "nvcc": ">=11.8"},
                             {"sm": "10.0", "nvcc": ">=12.8"}]
    assert [(w["torch_build"], w["python"], w["cxx11abi"]) for w in fa["prebuilt"]] == [
        ("2.4.0", ["3.10"], [False, True]), ("2.5.1", ["3.10", "3.11"], [False, True]),
        ("2.6.0.dev20241001", ["3.10", "3.11"], [False, True])]
    assert {(w["cuda"], w["build_cuda"]) for w in fa["prebuilt"]} == {("12", "12.9.1")}
    assert "2.6.0.dev20241001" in fa["notes"] and "partial" not in fa and served.url in fa["source"]
    # bitsandbytes: the libraries from the wheel's zip listing (CUDA 10.2: no toolkit imgbuild knows)
    bnb = {r["version"]: r for r in report.files["bitsandbytes.json"]["releases"]}
    new = bnb["0.41.3.post1"]
    assert new["cuda"] == ["11.0", "11.1", "11.4", "11.5", "11.7", "11.8", "12.0", "12.1", "12.2"]
    assert new["cuda_nocublaslt"] == new["cuda"][:-1] and "CUDA 10.2" in new["notes"]
    assert new["partial"].startswith("added by imgbuild data refresh") and new["python"] == ""
    assert by[("bitsandbytes.json", "0.41.3.post1")] == "new release, partial (CUDA libraries 11.0, 11.1, 11.4, " \
                                                        "11.5, 11.7, 11.8, 12.0, 12.1, 12.2)"
    # a known release whose wheel carries other libraries than the data says
    assert by[("bitsandbytes.json", "0.41.3.post2")].endswith("-> ['11.0', '11.1', '11.4', '11.5', '11.7', '11.8', "
                                                               "'12.0', '12.1'] (the wheel's CUDA libraries)")
    assert ("bitsandbytes.json", "0.41.3") not in by
    assert any(r.startswith("flash-attn 2.6.3: in flash_attn.json but not a release on the index")
               for r in report.review)
    refresh.validate_files({n: refresh.dump(raw) for n, raw in report.files.items()})


def test_refresh_without_the_repository_adds_a_partial_row(middle):
    served, data = middle
    report = refresh.refresh(index.IndexClient(served.url), data, today="2026-12-24")
    fa = {r["version"]: r for r in report.files["flash_attn.json"]["releases"]}["2.7.3"]
    assert fa["partial"].startswith("known from the package index only (no flash-attention repository given "
                                    "(--flash-attn-repo))")
    assert set(fa) == {"version", "python", "partial", "source", "read"}
    assert any(r.startswith("flash-attn 2.7.3: partial row") for r in report.review)


def test_refresh_fills_a_partial_row_from_its_tag(middle, tmp_path):
    served, data = middle
    data["flash_attn.json"]["releases"].append({"version": "2.7.3", "python": ">=3.9", "partial": "index only",
                                                "source": "the index", "read": "2026-12-01"})
    data["flash_attn.json"]["releases"].sort(key=lambda r: Version(r["version"]))
    report = refresh.refresh(index.IndexClient(served.url), data, today="2026-12-24",
                             flash_attn_repo=_fa_repo(tmp_path / "fa"))
    assert [c.what for c in report.changes if c.key == "2.7.3"] == [
        "was partial, now filled (from the index and tag v2.7.3: 10 release wheels)"]
    row = {r["version"]: r for r in report.files["flash_attn.json"]["releases"]}["2.7.3"]
    assert "partial" not in row and row["cxx_std"] == 17 and row["read"] == "2026-12-24"


def test_cli_refresh_fills_flash_attn_from_the_repository(middle, tmp_path):
    served, _ = middle
    out = io.StringIO()
    assert main(["data", "refresh", "--index-url", served.url, "--flash-attn-repo", _fa_repo(tmp_path / "fa")],
                out, io.StringIO()) == 0
    # the shipped data has every release this index serves: nothing new, but the tag read here differs
    # from the real v2.7.3 (10 wheels, not 100): the refresh reports the difference
    assert "flash_attn.json: 2.7.3: prebuilt: 100 -> 10 release wheels (v2.7.3 publish.yml)" in out.getvalue()
    err = io.StringIO()
    assert main(["data", "refresh", "--index-url", served.url, "--flash-attn-repo", str(tmp_path)],
                io.StringIO(), err) == 3
    assert "not a git repository" in err.getvalue()


def test_publish_matrix_of_v2_6_3_is_84_wheels():
    wheels, why = fa_repo.publish_matrix(publish_yml(V2_6_3_MATRIX, "MATRIX_CUDA_VERSION"))
    assert why is None and fa_repo.combinations(wheels) == 84
    assert {w["cuda"] for w in wheels} == {"11.8", "12.3"}
    assert not any(w["torch"] == "2.0" and w["cuda"] == "12.3" for w in wheels)
    unnamed = publish_yml(V2_6_3_MATRIX).replace("cxx11abi${{ matrix.cxx11_abi}}", "")
    assert fa_repo.publish_matrix(unnamed)[1].startswith("publish.yml names its wheels without")


def test_cli_refresh_writes_data_that_loads(ix, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for n in tables.DATA_FILES:
        (data / n).write_text(tables.data_dir().joinpath(n).read_text())
    out, err = io.StringIO(), io.StringIO()
    assert main(["data", "refresh", "--index-url", ix.url], out, err) == 0
    assert "torch.json: 2.16.0: new release" in out.getvalue() and "nothing written" in err.getvalue()
    out = io.StringIO()
    assert main(["data", "refresh", "--index-url", ix.url, "--write", "--data-dir", str(data), "--json"],
                out, io.StringIO()) == 0
    report = json.loads(out.getvalue())
    # this index serves flash-attn 2.9.0/2.8.10 and bitsandbytes 0.49.9/0.49.10/0.51.0, which the data lacks:
    # they are added as partial rows (the data then still loads; plans refuse them)
    assert sorted(report["written"]) == ["bitsandbytes.json", "flash_attn.json", "images.json", "toolkits.json",
                                         "torch.json", "wheels.json"]
    rows = json.loads((data / "torch.json").read_text())["releases"]
    assert rows[-1]["version"] == "2.16.0" and rows[-1]["pypi_variant"] == "cu135"


# ---------------------------------------------------------------- plan-time look-up
RECIPE = """\
name: team/new-torch
cuda:
  version: "13.5"
  source: wheels
base: {image: debian:bookworm-slim}
python: "3.11"
torch: "2.16.0"
"""


def test_plan_looks_a_newer_torch_up_and_caches_it(ix, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    recipe = write_recipe(tmp_path, RECIPE)
    out, err = io.StringIO(), io.StringIO()
    assert main(["plan", str(recipe), "--json", "--index-url", ix.url], out, err) == 0, err.getvalue()
    plan = json.loads(out.getvalue())
    assert plan["resolution"]["torch"] == "2.16.0+cu135" and plan["resolution"]["torch_index_url"] is None
    assert any(w["code"] == "torch-from-index" and w["key"] == "torch" and ix.url in w["message"]
               for w in plan["warnings"])
    assert "looked torch 2.16.0 up" in err.getvalue()
    cached = json.loads((tmp_path / "cache" / "imgbuild" / "compat" / "torch.json").read_text())
    assert cached["releases"]["2.16.0"]["index"] == ix.url
    # the second plan reads the cache: offline works, the index is not asked again
    asked = len(ix.requests)
    assert main(["plan", str(recipe), "--offline"], io.StringIO(), io.StringIO()) == 0
    assert len(ix.requests) == asked
    status = io.StringIO()
    assert main(["data", "status", "--json"], status, io.StringIO()) == 0
    st = json.loads(status.getvalue())
    assert st["shipped_as_of"] == max(d for d in tables.data_files_as_of().values() if d)
    assert st["cached"] == [{"component": "torch", "version": "2.16.0", "index": ix.url, "read": st["cached"][0]["read"],  # noqa: E501
                             "pypi_variant": "cu135", "shipped": False}]


def test_the_resolver_reads_no_home_folder(ix, tmp_path, monkeypatch):
    """The plan depends on the recipe and the facts passed in, never on the user's cache: the same
    recipe and facts give the same resolution with no home folder at all (issue 23: 2)."""
    from buildkit_py.compat.resolve import resolve
    from buildkit_py.compat.rules import LookedUp
    from buildkit_py.errors import CompatibilityError
    from buildkit_py.recipe.model import load_recipe

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    recipe_path = write_recipe(tmp_path, RECIPE)
    assert main(["plan", str(recipe_path), "--index-url", ix.url], io.StringIO(), io.StringIO()) == 0
    rows = live.cached_torch_releases(tmp_path / "cache" / "imgbuild" / "compat")  # the resolver gets these
    assert [r.version for r in rows] == ["2.16.0"] and rows[0].from_cache
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "no-such-home"))  # nothing to read, nowhere to write
    recipe = load_recipe(recipe_path)
    with pytest.raises(CompatibilityError, match="newer than imgbuild's data"):
        resolve(recipe, today=TODAY)  # without the facts: unknown, whatever a cache holds
    first = resolve(recipe, looked_up=LookedUp(torch=rows), today=TODAY)
    second = resolve(recipe, looked_up=LookedUp(torch=rows), today=TODAY)
    assert first == second and first.torch_label == "2.16.0+cu135"
    assert not (tmp_path / "no-such-home").exists()


def test_offline_unknown_pin_is_a_clear_error(ix, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    recipe = write_recipe(tmp_path, RECIPE)
    out, err = io.StringIO(), io.StringIO()
    assert main(["plan", str(recipe), "--offline", "--index-url", ix.url], out, err) == 2
    assert ix.requests == []
    text = err.getvalue()
    assert "torch 2.16.0 is newer than imgbuild's data (newest known: 2.15.0), and --offline: the package " \
           "index was not asked" in text
    assert "plan without --offline" in text


def test_unreachable_index_falls_back_with_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    recipe = write_recipe(tmp_path, RECIPE)
    err = io.StringIO()
    assert main(["plan", str(recipe), "--index-url", "http://127.0.0.1:9/simple/"], io.StringIO(), err) == 2
    assert "could not be looked up" in err.getvalue() and "unreachable" in err.getvalue()
    assert live.cached_rows(tmp_path / "cache" / "imgbuild" / "compat") == {}


def test_data_status_text_with_empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = io.StringIO()
    assert main(["data", "status"], out, io.StringIO()) == 0
    shipped = max(d for d in tables.data_files_as_of().values() if d)
    assert f"shipped compatibility data as of {shipped}" in out.getvalue() and "empty" in out.getvalue()


def test_data_status_lists_rows_known_only_in_part(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = io.StringIO()
    assert main(["data", "status", "--json"], out, io.StringIO()) == 0
    st = json.loads(out.getvalue())
    assert st["partial"]["torch"] == ["2.15.0"] and "torch_cuda_pins.json" in st["files"]
    text = io.StringIO()
    assert main(["data", "status"], text, io.StringIO()) == 0
    assert "known only in part: torch 2.15.0" in text.getvalue()


def test_data_status_shows_the_images_end_of_life(tmp_path, monkeypatch):
    import datetime
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = io.StringIO()
    assert main(["data", "status", "--json"], out, io.StringIO()) == 0
    images = json.loads(out.getvalue())["images"]
    assert images["today"] == str(datetime.date.today()) and images["releases"] == len(image_releases())
    row = next(r for r in images["end_of_life"] if r["cuda"] == "12.4.1")
    assert row == {"cuda": "12.4.1", "date": "2026-06-01", "basis": "driver", "deletion": "2026-12-01", "past": True}
    assert "13.4.2" in images["no_end_of_life"] and "13.2.1" in images["end_of_life_unknown"]
    assert "latest patch" in images["policy"]
    text = io.StringIO()
    assert main(["data", "status"], text, io.StringIO()) == 0
    assert f"past NVIDIA's end of life on {datetime.date.today()}" in text.getvalue()
    assert "no end-of-life date published: " in text.getvalue() and "13.4.2" in text.getvalue()


def test_a_torch_version_the_index_has_not_is_called_no_release(ix, tmp_path, monkeypatch):
    """issue 29: a torch pin the index answered has no such release was refused as 'newer than
    imgbuild's data, and the package index could not answer'; it is no release, and the hint names the
    nearest that exists (here one only the index has). exit 2, partial false: nothing is unknown."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    recipe = write_recipe(tmp_path, RECIPE.replace('torch: "2.16.0"', 'torch: "2.16.3"'))
    out, err = io.StringIO(), io.StringIO()
    assert main(["plan", str(recipe), "--json", "--index-url", ix.url], out, err) == 2
    doc = json.loads(out.getvalue())
    assert "torch 2.16.3 is not a release: the package index has no such version" in doc["message"], doc
    assert "could not answer" not in doc["message"]
    assert doc["hint"] == "use torch 2.16.0 (the nearest release)" and not doc.get("partial")


def test_a_look_up_without_a_cache_folder_serves_its_run_and_writes_nothing(ix, tmp_path, monkeypatch):
    """Issue 32 (4): the look-up reads no $XDG_CACHE_HOME; a library caller that gives no cache
    folder still gets the torch release it looked up, and nothing is written anywhere."""
    from buildkit_py.pipeline.lookups import Lookup, looked_up
    from buildkit_py.recipe.model import load_recipe

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # not read below the CLI
    notes: list[str] = []
    facts = looked_up(load_recipe(write_recipe(tmp_path, RECIPE)), Lookup(index_url=ix.url), note=notes.append)
    assert [r.version for r in facts.torch] == ["2.16.0"] and facts.torch[0].from_cache == "no cache folder"
    assert "kept it for this run (no cache folder)" in notes[0]
    assert not (tmp_path / "cache").exists()
