"""run/compose planning: GPU detection, weights mounts, compose documents; COPY of weights flagged."""

import dataclasses
import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml
from helpers import REPO, plan_of, run_cli, write_recipe

from buildkit_py.engine.kinds.docker import ClassicEngine, gpu_runtime
from buildkit_py.engine.kinds.podman import PodmanEngine
from buildkit_py.engine.run import (
    ImageStart,
    RunOptions,
    compose_document,
    container_name,
    container_process,
    make_run_plan,
    weights_dir_name,
)
from buildkit_py.recipe.model import load_recipe

COMPOSE_SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "compose-spec" / "compose-spec.json").read_text())

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
    monkeypatch.setattr("buildkit_py.engine.run.CDI_DIRS", (tmp_path,))
    assert gpu_runtime({"Runtimes": {"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}}})
    assert not gpu_runtime({"Runtimes": {"runc": {}}})
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    assert gpu_runtime({"Runtimes": {"runc": {}}})


DOCKER = ClassicEngine("/usr/bin/docker", host="unix:///run/x.sock")  # nothing here reaches it


def test_run_plan_mounts_weights_read_only(tmp_path):
    options = RunOptions(root=tmp_path, gpus="auto", network="none", command=("python", "-m", "serve"))
    plan = make_run_plan("team/infer:1", [("r.example.com/models/llm:1", "/models/llm")], options,
                         engine=DOCKER, gpu_available=True)
    assert plan.gpu
    argv = list(plan.argv)
    assert argv[:5] == ["/usr/bin/docker", "--host", "unix:///run/x.sock", "run", "--rm"]
    assert argv[argv.index("--gpus") + 1] == "all"
    host = tmp_path / weights_dir_name("r.example.com/models/llm:1")
    assert f"type=bind,source={host},target=/models/llm,readonly" in argv
    assert argv[-4:] == ["team/infer:1", "python", "-m", "serve"]
    assert not make_run_plan("x", [], RunOptions(root=tmp_path, gpus="none"), engine=DOCKER, gpu_available=True).gpu
    assert not make_run_plan("x", [], RunOptions(root=tmp_path, gpus="auto"), engine=DOCKER, gpu_available=False).gpu


def test_each_engine_asks_for_gpus_its_own_way(tmp_path):
    """The GPU flags are the engine's: docker's --gpus (NVIDIA runtime or CDI), podman's CDI device."""
    options = RunOptions(root=tmp_path, gpus="all", command=("nvidia-smi",))
    podman = make_run_plan("team/x:1", [], options, engine=PodmanEngine("/usr/bin/podman"), gpu_available=False)
    assert podman.argv == ("/usr/bin/podman", "run", "--rm", "--device", "nvidia.com/gpu=all", "team/x:1", "nvidia-smi")
    docker = make_run_plan("team/x:1", [], options, engine=DOCKER, gpu_available=False)
    assert docker.argv[3:] == ("run", "--rm", "--gpus", "all", "team/x:1", "nvidia-smi")


UVICORN = ImageStart(("uvicorn", "serve:app"), ("--port", "8000"))


@pytest.mark.parametrize(("start", "command", "entrypoint", "process", "words"), [
    # docker's rule: the command after the image is the ENTRYPOINT's arguments (issue 22: 8)
    (UVICORN, ("python", "-m", "serve"), None, ("uvicorn", "serve:app", "python", "-m", "serve"),
     "ENTRYPOINT runs with the command after -- as its arguments"),
    (UVICORN, (), None, ("uvicorn", "serve:app", "--port", "8000"), "the image's ENTRYPOINT and CMD"),
    (UVICORN, ("-m", "serve"), "python", ("python", "-m", "serve"), "--entrypoint python replaces"),
    (UVICORN, (), "python", ("python",), "--entrypoint python replaces"),  # the image's CMD goes too
    (UVICORN, ("python", "-V"), "", ("python", "-V"), "removes the image's ENTRYPOINT"),
    (ImageStart((), ("bash",)), ("python", "-V"), None, ("python", "-V"), "the image has no ENTRYPOINT"),
    (ImageStart((), ("bash",)), (), None, ("bash",), "the image's CMD"),
    (ImageStart(), (), None, (), "nothing"),
    (ImageStart(("serve",), (), source="recipe"), ("x",), None, ("serve", "x"), "read from the recipe"),
])
def test_container_process_follows_dockers_rule(start, command, entrypoint, process, words):
    got = container_process(start, command, entrypoint)
    assert got.argv == process
    assert words in got.how


def test_run_plan_command_line_is_shell_quoted(tmp_path):
    """--dry-run prints a line that can be pasted: split back by a shell, it is the argv."""
    options = RunOptions(root=tmp_path / "my weights", gpus="none", extra=("-e", "MSG=hello world"),
                         command=("sh", "-c", "echo $MSG; echo 'it''s' \"q\""), entrypoint="")
    plan = make_run_plan("team/infer:1", [("r.example.com/models/llm:1", "/models/llm")], options, engine=DOCKER,
                         gpu_available=False)
    assert shlex.split(plan.command_line) == list(plan.argv)
    argv = list(plan.argv)
    assert argv[argv.index("--entrypoint") + 1] == "" and argv.index("--entrypoint") < argv.index("team/infer:1")


def test_a_named_container_is_named_before_the_image(tmp_path):
    """run_container names each container it starts (--name, before the image: after it, docker
    would pass it to the container as an argument), so it can remove it; a plan has no name."""
    plan = make_run_plan("team/infer:1", [], RunOptions(root=tmp_path, gpus="none"), engine=DOCKER,
                         gpu_available=False)
    assert "--name" not in plan.argv and plan.spec is not None
    name = container_name()
    assert re.fullmatch(r"imgbuild-[0-9a-f]{12}", name) and name != container_name()
    argv = list(DOCKER.run_argv(dataclasses.replace(plan.spec, name=name)))
    assert argv[argv.index("--name") + 1] == name and argv.index("--name") < argv.index("team/infer:1")


def test_a_relative_weights_root_becomes_an_absolute_mount(tmp_path, monkeypatch):
    """issue 31: 5: a relative --weights-dir reached `docker run --mount source=wdir/...`, which the
    engine refuses (exit 125) after every weight was downloaded; the dry run printed it too."""
    monkeypatch.chdir(tmp_path)
    plan = make_run_plan("team/infer:1", [("r.example.com/models/llm:1", "/models/llm")],
                         RunOptions(root=Path("wdir/../w"), gpus="none"), engine=DOCKER, gpu_available=False)
    host = tmp_path / "w" / weights_dir_name("r.example.com/models/llm:1")
    assert plan.weights[0].host_dir == host
    assert f"type=bind,source={host},target=/models/llm,readonly" in plan.argv
    code, out, err = run_cli("run", str(REPO / "recipes" / "inference-slim.yaml"), "--dry-run", "--gpus", "none",
                             "--weights-dir", "wdir")
    assert code == 0, err
    assert f"-> {tmp_path}/wdir/" in out and f"source={tmp_path}/wdir/" in out


def test_run_dry_run_prints_a_pasteable_command_and_what_runs():
    recipe = str(REPO / "recipes" / "inference-slim.yaml")
    tail = ["--", "sh", "-c", "echo $MSG > '/tmp/a b'"]
    code, out, err = run_cli("run", recipe, "--dry-run", "--gpus", "none", "--docker-arg=-e",
                             "--docker-arg=MSG=hello world", *tail)
    assert code == 0, err
    lines = dict(line.split(None, 1) if line[:1] != " " else ("", line.strip()) for line in out.splitlines()
                 if not line.startswith("would pull"))
    _, json_out, _ = run_cli("run", recipe, "--dry-run", "--json", "--gpus", "none", "--docker-arg=-e",
                             "--docker-arg=MSG=hello world", *tail)
    argv = json.loads(json_out)["argv"]
    assert shlex.split(out.splitlines()[1].removeprefix("would run  ")) == argv
    entrypoint = list(load_recipe(Path(recipe)).entrypoint)  # uvicorn serve:app --host ... --port 8000
    assert shlex.split(lines["container"]) == [*entrypoint, "sh", "-c", "echo $MSG > '/tmp/a b'"]
    assert "ENTRYPOINT runs with the command after -- as its arguments" in lines[""]
    code, out, err = run_cli("run", recipe, "--dry-run", "--gpus", "none", "--entrypoint", "python", "--", "-m", "x")
    assert code == 0, err
    assert "container  python -m x\n" in out and "--entrypoint python replaces" in out


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
    plan = plan_of(load_recipe(write_recipe(tmp_path, RECIPE)))
    assert json.loads(plan.labels["io.imgbuild.weights"]) == [{"mount": "/models/llm", "ref": "r.example.com/models/llm:1"}]  # noqa: E501


def test_plan_flags_copy_of_weights(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "model.safetensors").write_bytes(b"\0" * (11 * 2**20))
    (tmp_path / "app" / "main.py").write_text("print(1)\n")
    path = write_recipe(tmp_path, RECIPE + "copy: [{src: app/, dest: /app}]\n")
    warnings = plan_of(load_recipe(path)).warnings
    assert [(w.code, w.key) for w in warnings] == [("weights-in-copy", "copy[0].src")]
    assert "app/model.safetensors (11.0 MiB)" in warnings[0].message and "weights push" in warnings[0].message


def test_plan_and_lint_apply_one_weight_file_limit(tmp_path):
    """Issue 23: 3. The plan warned from 10 MiB on (>=) and counted a folder's symlinks, lint called
    a file an error only above 10 MiB and skipped the links: a file of exactly 10 MiB, or a link
    to a big file (the build context keeps it a link), got the plan's warning but no lint error."""
    from buildkit_py.file_kinds import WEIGHT_FILE_LIMIT
    from buildkit_py.pipeline import lint_recipe

    app = tmp_path / "app"
    app.mkdir()
    for name, size in (("at.safetensors", WEIGHT_FILE_LIMIT), ("above.safetensors", WEIGHT_FILE_LIMIT + 1),
                       ("small.pt", 100)):
        with open(app / name, "wb") as fh:
            fh.truncate(size)  # sparse: no disk used
    big = tmp_path / "outside.bin"
    with open(big, "wb") as fh:
        fh.truncate(WEIGHT_FILE_LIMIT * 2)
    (app / "link.bin").symlink_to(big)
    path = write_recipe(tmp_path, RECIPE + "copy: [{src: app/, dest: /app}]\n")
    warned = [w.message.split()[2] for w in plan_of(load_recipe(path)).warnings if w.code == "weights-in-copy"]
    errors = [f.message.split()[0] for f in lint_recipe(path, hadolint=None).findings
              if f.code == "weights-in-copy" and f.severity == "error"]
    assert warned == errors == ["app/above.safetensors"]


def test_run_dry_run_json():
    code, out, err = run_cli("run", str(REPO / "recipes" / "inference-slim.yaml"), "--dry-run", "--json",
                             "--gpus", "none", "--", "python", "-c", "print(1)")
    assert code == 0, err
    data = json.loads(out)
    assert data["argv"][-3:] == ["python", "-c", "print(1)"] and data["gpu"] is False
    assert data["weights"][0]["mount"] == "/models/tiny-llm"


def compose_problems(doc: dict) -> list[str]:
    """What Compose refuses in a document: the compose-spec schema, plus the rule the schema
    cannot express (compose-go loader/validate.go): a service's named volume is declared at the
    top level. Short syntax as compose-go reads it: [SOURCE:]TARGET[:MODE], SOURCE a path when
    it starts with '.', '/' or '~'."""
    problems = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                for e in jsonschema.Draft202012Validator(COMPOSE_SCHEMA).iter_errors(doc)]
    declared = set(doc.get("volumes") or {})
    for name, service in (doc.get("services") or {}).items():
        for volume in service.get("volumes") or []:
            if isinstance(volume, dict):
                source = volume.get("source") if volume.get("type") == "volume" else None
            else:
                parts = volume.split(":")
                source = parts[0] if len(parts) > 1 and parts[0][:1] not in ("./~") else None
            if source and source not in declared:
                problems.append(f"service {name!r} refers to undefined volume {source}")
    return problems


SERVICES_WITH_VOLUMES = RECIPE.replace(
    "environment: {QDRANT__LOG_LEVEL: INFO}}",
    "environment: {QDRANT__LOG_LEVEL: INFO},\n"
    "           volumes: [\"qdrant-data:/qdrant/storage\", \"./snapshots:/qdrant/snapshots:ro\", /tmp/scratch]}\n"
    "  cache: {image: \"redis:7.2\", volumes: [\"qdrant-data:/shared:ro,nocopy\", \"cache-data:/data\"]}")


def test_the_compose_check_can_fail():
    doc = {"name": "x", "services": {"db": {"image": "qdrant/qdrant:v1", "volumes": ["data:/qdrant/storage"]}}}
    assert compose_problems(doc) == ["service 'db' refers to undefined volume data"]
    assert compose_problems({**doc, "volumes": {"data": {}}}) == []
    assert compose_problems({"services": {"db": {"image": 1}}})  # the schema part


@pytest.mark.parametrize("text", [RECIPE, SERVICES_WITH_VOLUMES, RECIPE.split("services:", maxsplit=1)[0]],
                         ids=["services", "named-volumes", "no-services"])
def test_compose_document_is_valid_compose(tmp_path, text):
    recipe = load_recipe(write_recipe(tmp_path, text))
    doc = yaml.safe_load(yaml.safe_dump(compose_document("team/infer:latest", recipe)))
    assert compose_problems(doc) == []


def test_compose_declares_each_named_volume_once(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, SERVICES_WITH_VOLUMES))
    doc = compose_document("team/infer:latest", recipe)
    assert doc["volumes"] == {"cache-data": {}, "qdrant-data": {}}
    assert doc["services"]["qdrant"]["volumes"] == ["qdrant-data:/qdrant/storage", "./snapshots:/qdrant/snapshots:ro",
                                                    "/tmp/scratch"]
    assert "volumes" not in compose_document("team/infer:latest", load_recipe(write_recipe(tmp_path, RECIPE)))


@pytest.mark.parametrize(("spec", "words"), [
    ("qdrant-data", "must be an absolute path"),
    ("data:storage", "must be an absolute path"),
    ("data:/a:/b:ro", "is not [SOURCE:]TARGET[:OPTIONS]"),
    ("data::/a", "is not [SOURCE:]TARGET[:OPTIONS]"),
    ("data:/a:readonly", "unknown option 'readonly'"),
    ("${HOME}/x:/a", "substitute"),
    ("-data:/a", "neither a host path"),
])
def test_bad_service_volume_is_a_recipe_error(tmp_path, spec, words):
    path = write_recipe(tmp_path, RECIPE.replace("ports: [\"6333:6333\"]", f"volumes: [{json.dumps(spec)}]"))
    code, _, err = run_cli("compose", str(path))
    assert code == 2, err
    assert f"{path}:7: services.qdrant.volumes[0]:" in err and words in err, err


def test_compose_keeps_dollar_signs_literal(tmp_path):
    """Compose would replace $HOME / ${X} with the shell's values: '$$' is its literal dollar."""
    text = RECIPE.replace("QDRANT__LOG_LEVEL: INFO}", "QDRANT__LOG_LEVEL: INFO, QDRANT__API_KEY: 'p$w${HOME}'},\n"
                          "           command: [sh, -c, 'echo $HOSTNAME $$']")
    doc = compose_document("team/infer:latest", load_recipe(write_recipe(tmp_path, text)))
    qdrant = doc["services"]["qdrant"]
    assert qdrant["environment"] == {"QDRANT__API_KEY": "p$$w$${HOME}", "QDRANT__LOG_LEVEL": "INFO"}
    assert qdrant["command"] == ["sh", "-c", "echo $$HOSTNAME $$$$"]
    assert compose_problems(doc) == []


def test_run_uses_the_engine_the_cli_created(tmp_path, monkeypatch):
    """`imgbuild run` reaches the engine $IMGBUILD_DOCKER and $DOCKER_HOST name (issue 12: the
    runner's client was fixed at import time): the CLI creates the engine once and the run plan
    takes its client command line."""
    client = tmp_path / "docker"
    client.write_text("#!/bin/sh\n[ \"$1\" = version ] && echo 20.10.24 && exit 0\nexit 1\n")
    client.chmod(0o755)
    monkeypatch.setenv("IMGBUILD_DOCKER", str(client))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/engine.sock")
    code, out, _ = run_cli("run", str(REPO / "recipes" / "demo.yaml"), "--dry-run", "--json", "--gpus", "none",
                           "--weights-dir", str(tmp_path / "w"), "--", "python", "-V")
    assert code == 0
    argv = json.loads(out)["argv"]
    assert argv[:4] == [str(client), "--host", f"unix://{tmp_path}/engine.sock", "run"]
    assert argv[-2:] == ["python", "-V"]
