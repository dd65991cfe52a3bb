"""A recipe's ``gpus:`` end to end on Docker 26: planned against the kernels recorded for its
wheels, stamped as io.imgbuild.gpus, and checked by the image tests against the kernels read
from the built image. A small image: CUDA 13.0 from wheels plus cuRAND 10.4.0.35 (a 60 MB wheel;
libcurand.so.10 carries SASS for sm_75 to sm_121, none for 7.0)."""

import json

import pytest
from conftest import on_engine
from helpers import CA_ARGS, run_cli, write_recipe

pytestmark = pytest.mark.e2e


@on_engine("docker26")
def test_recipe_gpus_planned_labelled_and_tested(tmp_path, engine, base_image, unique_name, cleanup_images):
    text = f"""\
name: {unique_name}-gpus
version: "1.0"
cuda: {{version: "13.0", source: wheels, flavor: base}}
base: {{image: {base_image}}}
python: "3.11"
pip: ["nvidia-curand==10.4.0.35"]
gpus: [H100, T4]
"""
    # a V100 (7.0) is refused before anything is built, at its key
    refused = write_recipe(tmp_path / "v100", text.replace("[H100, T4]", "[H100, V100]"))
    code, _, err = run_cli("build", str(refused), *CA_ARGS, "--progress", "quiet")
    assert code == 2
    assert "gpus[1]: nvidia-curand 10.4.0.35 conflicts with gpu V100 (compute capability 7.0)" in err

    recipe = write_recipe(tmp_path, text)
    code, out, err = run_cli("build", str(recipe), *CA_ARGS, "--json", "--progress", "quiet")
    assert code == 0, err
    image = json.loads(out)["tags"][0]
    cleanup_images.append(image)
    assert engine.image_attrs(image)["Config"]["Labels"]["io.imgbuild.gpus"] == "H100;T4"

    # (the exit code is not this test's: the base flavor's label fails on any extra nvidia-* wheel)
    _, out, err = run_cli("test", image, "--json")
    results = {r["name"]: r for r in json.loads(out)["results"]}
    assert [n for n in results if "gpus" in n] == ["label io.imgbuild.gpus: H100", "label io.imgbuild.gpus: T4"]
    for gpu in ("H100", "T4"):
        r = results[f"label io.imgbuild.gpus: {gpu}"]
        assert r["status"] == "passed", r
        assert r["detail"] == f"every CUDA library carries SASS that runs on {gpu} (compute capability " + (
            "9.0)" if gpu == "H100" else "7.5)"), r
