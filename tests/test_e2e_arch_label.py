"""issue 30, end to end: io.imgbuild.cuda.arch held to the kernels of a real built image.

An image imgbuild builds (tiny_recipe: CUDA 12.4's cudart from wheels, Python 3.11) gets one more
layer the way its compile stage's wheels are installed: a wheel bind-mounted at /tmp/wheels
(plan.steps.LOCAL_WHEELS_MOUNT) and installed by the image's own pip, which records it in
direct_url.json. The wheel's extension is a real torch extension, xformers 0.0.35's _C.so (sm_75,
sm_80 with its PTX, the arch-specific sm_90a; cuobjdump's listing, tests/test_kernels_cuobjdump.py),
standing in for a source build: nvcc compiling flash-attn takes hours on this 2-core machine, and
the check reads the files the same way whoever compiled them. The true label passes `imgbuild test`,
the label a recipe would naively write fails naming the file, and `inspect --kernels` lists the
file's SASS per architecture from the same image."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile

import pytest
from conftest import _client
from helpers import CA_ARGS, run_cli, tiny_recipe, write_recipe
from test_kernels_cuobjdump import _member, _wheel

pytestmark = pytest.mark.e2e

XFORMERS = ("xformers==0.0.35", "xformers/_C.so")


def _ext_wheel(folder, so_path) -> None:
    """tinyext-1.0, a wheel carrying ``so_path`` as tinyext/_C.so, with a RECORD as installers want it."""
    files = {"tinyext/__init__.py": b"", "tinyext/_C.so": so_path.read_bytes(),
             "tinyext-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinyext\nVersion: 1.0\n",
             "tinyext-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
                                            b"Tag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files.items()) + "tinyext-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(folder / "tinyext-1.0-py3-none-any.whl", "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("tinyext-1.0.dist-info/RECORD", record)


def _with_extension(engine, tmp_path, image: str, tag: str, label: str) -> None:
    ctx = tmp_path / tag.replace("/", "_").replace(":", "_")
    (ctx / "wheels").mkdir(parents=True)
    _ext_wheel(ctx / "wheels", _member(_wheel(XFORMERS[0]), XFORMERS[1]))
    (ctx / "Dockerfile").write_text(
        f"FROM {image}\n"
        # a COPY, not a bind mount: Docker 20.10's classic builder (this client's default) has no --mount
        "COPY wheels /tmp/wheels\n"
        "RUN pip install --no-index --no-deps --disable-pip-version-check /tmp/wheels/*.whl && rm -rf /tmp/wheels\n"
        f'LABEL "io.imgbuild.cuda.arch"="{label}"\n')
    done = _client(engine, "build", "--network", "host", "-t", tag, str(ctx))
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_arch_label_is_checked_against_a_built_images_kernels(tmp_path, engine, base_image, unique_name,
                                                                   cleanup_images):
    recipe = write_recipe(tmp_path, tiny_recipe(unique_name, base_image))
    code, out, err = run_cli("build", str(recipe), "--json", "--progress", "plain", *CA_ARGS)
    assert code == 0, err
    built = json.loads(out)["tags"][0]
    cleanup_images.append(built)
    true, naive = f"{unique_name}-arch:true", f"{unique_name}-arch:naive"
    cleanup_images.extend([true, naive])
    _with_extension(engine, tmp_path, built, true, "7.5;8.0+PTX;9.0a")
    _with_extension(engine, tmp_path, built, naive, "7.5;8.0;9.0")

    code, out, err = run_cli("test", true, "--json")
    results = {r["name"]: r for r in json.loads(out)["results"]}
    arch = results["label io.imgbuild.cuda.arch"]
    assert code == 0 and arch["status"] == "passed", err
    assert arch["detail"] == ("'7.5;8.0+PTX;9.0a': 1 file(s) compiled from source (tinyext) carry sm_75, compute_80, "
                              "sm_80, sm_90a")

    code, out, err = run_cli("test", naive, "--json")
    arch = {r["name"]: r for r in json.loads(out)["results"]}["label io.imgbuild.cuda.arch"]
    assert code == 1 and arch["status"] == "failed"
    assert "/site-packages/tinyext/_C.so (tinyext) carries compute_80, sm_90a, which it omits" in arch["detail"]

    code, out, err = run_cli("inspect", true, "--kernels", "--json", "--no-compressed", "--progress", "quiet")
    assert code == 0, err
    kernels = json.loads(out)["kernels"]
    [ext] = [lib for lib in kernels["libraries"] if lib["path"].endswith("/tinyext/_C.so")]
    assert set(ext["sass_bytes"]) == {"sm_75", "sm_80", "sm_90a"} and ext["ptx"] == ["compute_80 (8.7)"]
