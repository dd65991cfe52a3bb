"""run/compose planning: GPU detection, weights mounts, compose documents; COPY of weights flagged."""

import json

import yaml

from buildkit_py.plan import make_plan
from buildkit_py.recipe import load_recipe
from buildkit_py.runner import compose_document, gpu_runtime, make_run_plan, weights_dir_name

from helpers import REPO, run_cli, write_recipe

RECIPE = """\
name: team/infer
cuda: {version: "12.4", source: wheels}
base: {image: debian:bookworm-slim}
python: "3.11"
weights: [{ref: "r.example.com/models/llm:1", mount: /models/llm}]
services:
  qdrant: {image: "qdrant/qdrant:v1.12.1", ports: ["6333:6333"], environment: {QDRANT__LOG_LEVEL: INFO}}
"""


def test_gpu_runtime_from_engine_info(tmp_path, monkeypatch):
    monkeypatch.setattr("buildkit_py.runner.CDI_DIRS", (tmp_path,))
    assert gpu_runtime({"Runtimes": {"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}}})
    assert not gpu_runtime({"Runtimes": {"runc": {}}})
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    assert gpu_runtime({"Runtimes": {"runc": {}}})


def test_run_plan_mounts_weights_read_only(tmp_path):
    plan = make_run_plan("team/infer:1", [("r.example.com/models/llm:1", "/models/llm")], root=tmp_path,
                         gpus="auto", engine_info={"Runtimes": {"nvidia": {}}}, network="none", extra=[],
                         command=["python", "-m", "serve"])
    assert plan.gpu
    argv = list(plan.argv)
    assert argv[argv.index("--gpus") + 1] == "all"
    host = tmp_path / weights_dir_name("r.example.com/models/llm:1")
    assert f"type=bind,source={host},target=/models/llm,readonly" in argv
    assert argv[-4:] == ["team/infer:1", "python", "-m", "serve"]
    assert not make_run_plan("x", [], root=tmp_path, gpus="none", engine_info={"Runtimes": {"nvidia": {}}},
                             network=None, extra=[], command=[]).gpu


def test_compose_document(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, RECIPE))
    doc = compose_document("team/infer:latest", recipe)
    app = doc["services"]["app"]
    assert app["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert app["volumes"] == [{"type": "bind", "source": "./weights/r.example.com_models_llm_1",
                               "target": "/models/llm", "read_only": True}]
    assert app["depends_on"] == ["qdrant"]
    assert doc["services"]["qdrant"] == {"image": "qdrant/qdrant:v1.12.1",
                                         "environment": {"QDRANT__LOG_LEVEL": "INFO"}, "ports": ["6333:6333"]}


def test_compose_cli_writes_file(tmp_path):
    path = write_recipe(tmp_path, RECIPE)
    out_file = tmp_path / "compose.yaml"
    code, _, err = run_cli("compose", str(path), "-o", str(out_file))
    assert code == 0, err
    text = out_file.read_text()
    assert "imgbuild weights pull r.example.com/models/llm:1" in text
    assert yaml.safe_load(text)["services"]["app"]["image"] == "team/infer:latest"


def test_bad_service_is_a_recipe_error(tmp_path):
    path = write_recipe(tmp_path, RECIPE.replace('ports: ["6333:6333"]', 'ports: ["lots"]'))
    code, _, err = run_cli("compose", str(path))
    assert code == 2 and "services.qdrant.ports[0]" in err


def test_weights_label_is_json(tmp_path):
    plan = make_plan(load_recipe(write_recipe(tmp_path, RECIPE)))
    assert json.loads(plan.labels["io.imgbuild.weights"]) == [{"mount": "/models/llm", "ref": "r.example.com/models/llm:1"}]


def test_plan_flags_copy_of_weights(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "model.safetensors").write_bytes(b"\0" * (11 * 2**20))
    (tmp_path / "app" / "main.py").write_text("print(1)\n")
    path = write_recipe(tmp_path, RECIPE + "copy: [{src: app/, dest: /app}]\n")
    warnings = make_plan(load_recipe(path)).warnings
    assert any("app/model.safetensors (11 MiB)" in w and "weights push" in w for w in warnings)


def test_run_dry_run_json():
    code, out, err = run_cli("run", str(REPO / "recipes" / "inference-slim.yaml"), "--dry-run", "--json",
                             "--gpus", "none", "--", "python", "-c", "print(1)")
    assert code == 0, err
    data = json.loads(out)
    assert data["argv"][-3:] == ["python", "-c", "print(1)"] and data["gpu"] is False
    assert data["weights"][0]["mount"] == "/models/tiny-llm"
