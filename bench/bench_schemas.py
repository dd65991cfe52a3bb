"""The schema validator: import cost and validation time of our own (buildkit_py.schemas)
against jsonschema and pydantic, the two libraries issue 12 named (README, "Design notes").

Import: `python -X importtime`, the cumulative time of X imported after what a command that loads
a recipe has already imported (json, re, pathlib, typing, yaml), the least of N runs.
Validation: every recipe in recipes/ (parsed YAML), validated N times in one process; for
jsonschema the Draft 2020-12 validator is built once, for pydantic a model of the same keys
(pydantic validates models, not JSON Schema: the schema would have to be generated from them).
An arm whose library is not installed is reported as such; `--python` runs the pydantic arm
with another interpreter (a scratch venv with pydantic), since the package does not use it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ARMS = ("buildkit_py.schemas", "jsonschema", "pydantic")
# What a command that loads a recipe has imported before it validates: the arms pay only for the rest.
LOADED = "import json, re, pathlib, typing, functools, yaml, buildkit_py.errors"

VALIDATE = r'''
import json, sys, time
from pathlib import Path
import yaml
repo, arm, runs = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
docs = [yaml.safe_load(p.read_text()) for p in sorted((repo / "recipes").glob("*.yaml"))]
schema = json.loads((repo / "buildkit_py/schemas/recipe.schema.json").read_text())
if arm == "buildkit_py.schemas":
    from buildkit_py.schemas import validate
    check = lambda d: validate(d, schema)
elif arm == "jsonschema":
    import jsonschema
    v = jsonschema.Draft202012Validator(schema)
    check = lambda d: list(v.iter_errors(d))
else:
    from typing import Annotated, Literal, Union
    from pydantic import BaseModel, ConfigDict, Field, RootModel
    Text = Union[str, float, int]
    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid")
    class Cuda(Strict):
        version: Annotated[str, Field(pattern=r"^\d+\.\d+(?:\.\d+)?$")] | float
        flavor: Literal["base", "runtime", "devel"] = "runtime"
        source: Literal["nvidia", "wheels"] = "nvidia"
        cudnn: Text | None = None
    class Base(Strict):
        image: str | None = None
        os: Annotated[str, Field(pattern=r"^(?:ubuntu\d+\.\d+|debian\d+)$")] = "ubuntu22.04"
        mirror: str | None = None
    class Copy(Strict):
        src: str
        dest: Annotated[str, Field(pattern=r"^/[A-Za-z0-9._/@+=,: -]*$")]
    class Build(Strict):
        from_source: list[str] = []
        cuda_arch: list[Annotated[str, Field(pattern=r"^\d+\.\d+[af]?(?:\+PTX)?$")]] = []
        jobs: Annotated[int, Field(ge=1)] | None = None
    class Weights(Strict):
        ref: str
        mount: Annotated[str, Field(pattern=r"^/[A-Za-z0-9._/@+=,: -]*$")]
    class Service(Strict):
        image: str
        ports: list[str] = []
        environment: dict[str, Text] = {}
        volumes: list[str] = []
        command: list[Text] = []
    class Recipe(Strict):
        name: Annotated[str, Field(pattern=schema["properties"]["name"]["pattern"])]
        version: Text | None = None
        cuda: Cuda
        base: Base = Base()
        python: Annotated[str, Field(pattern=r"^3\.\d+$")] | float
        torch: Text | None = None
        pip: list[Annotated[str, Field(pattern="==")]] = []
        apt: list[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9+.-]+(?:=[A-Za-z0-9.+:~-]+)?$")]] = []
        copy: list[Copy] = []
        workdir: str | None = None
        env: dict[str, Text] = {}
        volumes: list[str] = []
        entrypoint: list[Text] = []
        cmd: list[Text] = []
        labels: dict[str, Text] = {}
        build: Build = Build()
        runtime_compile: bool = False
        budget: dict[str, Text] = {}
        weights: list[Weights] = []
        matrix: dict = {}
        services: dict[str, Service] = {}
    from pydantic import ValidationError
    def check(d):
        try:
            Recipe.model_validate(d)
        except ValidationError as exc:
            return exc.errors()
        return []
bad = [d.get("name") for d in docs if check(d)]
start = time.perf_counter()
for _ in range(runs):
    for d in docs:
        check(d)
print(json.dumps({"per_recipe_us": (time.perf_counter() - start) / runs / len(docs) * 1e6, "refused": bad}))
'''


def import_cost(python: str, module: str, runs: int) -> float | None:
    """Seconds ``import module`` adds to a fresh interpreter: the cumulative figure of
    ``python -X importtime`` (what the import itself cost, so machine load from other processes
    weighs less than in wall time), the least of ``runs``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    best = None
    for _ in range(runs):
        proc = subprocess.run([python, "-X", "importtime", "-c", f"{LOADED}; import {module}"], env=env,
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            return None
        line = next(ln for ln in reversed(proc.stderr.splitlines()) if ln.rstrip().endswith(f"| {module}"))
        cumulative = int(line.split("|")[1]) / 1e6
        best = cumulative if best is None else min(best, cumulative)
    return best


def validation_cost(python: str, arm: str, runs: int) -> dict | None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([python, "-c", VALIDATE, str(REPO), arm, str(runs)], env=env, capture_output=True,
                          text=True, check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10, help="fresh interpreters per arm (the least counts)")
    parser.add_argument("--iterations", type=int, default=200, help="validations of each recipe per arm")
    parser.add_argument("--python", help="interpreter for the pydantic arm (default: this one)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    print(f"(8) schema validators: import (-X importtime, least of {args.runs}) and validation "
          f"of recipes/*.yaml ({args.iterations} rounds)", flush=True)
    results = {}
    for arm in ARMS:
        python = args.python if arm == "pydantic" and args.python else sys.executable
        imp = import_cost(python, arm, args.runs)
        val = validation_cost(python, arm, args.iterations) if imp is not None else None
        results[arm] = {"import_ms": None if imp is None else imp * 1000, **(val or {})}
        if imp is None:
            print(f"    {arm:<22} not installed", flush=True)
            continue
        per = f"{val['per_recipe_us']:8.0f} us/recipe" if val else "   (validation failed)"
        print(f"    {arm:<22} import {imp * 1000:6.1f} ms   validate {per}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
