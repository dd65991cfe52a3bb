"""budget.cold_start (issue 33: 3): the predicted start of an image on a fresh node (pull / bandwidth +
unpack / unpack rate + the entrypoint's start), its parsers, its place in the recipe, and a build over
it refused before anything is pushed. Exact figures: the model is arithmetic on its inputs."""

from __future__ import annotations

import hashlib

import fakes
import pytest
from helpers import run_cli, write_recipe
from hypothesis import given
from hypothesis import strategies as st

from buildkit_py.engine import cold_start as cs
from buildkit_py.engine.cold_start import ColdStartInputs, ColdStartOverBudget, Layer, NodeLayer, StartTime
from buildkit_py.errors import RecipeError
from buildkit_py.pipeline import OFFLINE
from buildkit_py.recipe.model import ColdStartBudget, load_recipe, parse_bandwidth, parse_duration

HEAD = 'name: team/app\nversion: "1"\ncuda: {version: "12.4", source: wheels, flavor: base}\n' \
       'base: {image: debian:bookworm-slim}\npython: "3.11"\npip: ["six==1.16.0"]\n'
A, B, C = (Layer(f"sha256:{c * 64}", compressed, uncompressed)
           for c, compressed, uncompressed in (("a", 30_000_000, 80_000_000), ("b", 500_000_000, 1_200_000_000),
                                               ("c", 2_000_000, 5_000_000)))


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90.0), ("1.5min", 90.0), ("2m", 120.0), ("500ms", 0.5),
                                               ("1h", 3600.0), (90, 90.0), ("45", 45.0), (" 30 S ", 30.0)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "s", "90 sec ago", "-5s", "1d", "1e3s", "ninety"])
def test_malformed_durations(text):
    assert parse_duration(text) is None


@pytest.mark.parametrize(("text", "rate"), [("1Gbit", 125e6), ("100Mbit/s", 12.5e6), ("1Gbps", 125e6),
                                            ("2.5gbit", 312.5e6), ("125MB/s", 125e6), ("10MiB/s", 10_485_760.0),
                                            ("800kbit", 100e3), ("1000B/s", 1000.0)])
def test_bandwidths(text, rate):
    assert parse_bandwidth(text) == rate


@pytest.mark.parametrize("text", ["1G", "1GB", "fast", "1 Gbit per s", "10MiB", "-1Gbit", ""])
def test_malformed_bandwidths(text):
    """A rate names its unit: bits (bit, bps, bit/s) or bytes per second (B/s); '1GB' is a size."""
    assert parse_bandwidth(text) is None


def test_a_fresh_node_pulls_and_unpacks_every_layer():
    p = cs.predict(ColdStartInputs((A, B, C), bandwidth=125e6, unpack_rate=100e6, start_seconds=2.5,
                                   start_source="test 'import torch'"))
    assert (p.pull_bytes, p.unpack_bytes, p.layers_pulled, p.layers_held) == (532_000_000, 1_285_000_000, 3, 0)
    assert p.download_seconds == pytest.approx(4.256)  # 532 MB at 125 MB/s
    assert p.unpack_seconds == pytest.approx(12.85)  # 1285 MB at 100 MB/s
    # A arrives at 0.24 s, unpacked by 1.04; B arrives at 4.24, unpacked by 16.24; C (at 4.256) by 16.29
    assert p.ready_seconds == pytest.approx(16.29)
    assert p.total_seconds == pytest.approx(16.29 + 2.5)
    assert p.sequential_seconds == pytest.approx(4.256 + 12.85 + 2.5)
    doc = p.to_json()
    assert (doc["seconds"], doc["ready_seconds"], doc["sequential_seconds"]) == (18.79, 16.29, 19.61)
    assert doc["start_source"] == "test 'import torch'"
    assert "18.8s on a fresh node at 1000 Mbit/s: pull 507.4 MiB 4.3s and unpack 1.2 GiB 12.8s, overlapped " \
           "layer by layer 16.3s, + 2.5s start (test 'import torch')" == p.summary()


def test_each_layer_unpacks_after_its_download_and_the_layer_below():
    """The timeline (issue 33: 3, run 3: the plain sum over-predicted cuda and torch by 20-34 %)."""
    assert cs.ready_seconds([]) == 0.0
    assert cs.ready_seconds([(3.0, 2.0)]) == 5.0  # one layer: nothing to overlap
    assert cs.ready_seconds([(1.0, 5.0), (1.0, 5.0)]) == 11.0  # the unpack is the bottleneck: 1 + 5 + 5
    assert cs.ready_seconds([(5.0, 1.0), (5.0, 1.0)]) == 11.0  # the link is: 5 + 5 + 1
    assert cs.ready_seconds([(1.0, 0.5), (4.0, 0.0)]) == 5.0  # the last download ends after every unpack
    assert cs.ready_seconds([(0.0, 2.0), (1.0, 2.0)]) == 4.0  # a held blob unpacks at once


@given(st.lists(st.tuples(st.floats(0, 1e4), st.floats(0, 1e4)), max_size=40))
def test_the_timeline_lies_between_its_bottlenecks_and_the_plain_sum(steps):
    """Never faster than the link or the unpacker alone, never slower than one after the other."""
    ready = cs.ready_seconds(steps)
    downloads, unpacks = sum(d for d, _ in steps), sum(u for _, u in steps)
    slack = 1e-9 * (1 + downloads + unpacks)
    assert max(downloads, unpacks) - slack <= ready <= downloads + unpacks + slack


def test_layers_the_node_holds_on_the_same_layers_are_neither_pulled_nor_unpacked():
    """The node holds an image made of A and B: only C is pulled (once, though the image names it twice);
    A and B are unpacked there already under the same chain, C is unpacked at both places."""
    held, chains = cs.node_holds([[A.digest, B.digest]])
    p = cs.predict(ColdStartInputs((A, B, C, C), bandwidth=12.5e6, unpack_rate=100e6, held=held, held_chains=chains))
    assert (p.pull_bytes, p.unpack_bytes, p.layers_pulled, p.layers_held) == (2_000_000, 10_000_000, 1, 2)
    assert p.layers_unpacked_held == 2
    assert p.total_seconds == pytest.approx(0.16 + 0.1)
    assert p.start_seconds is None and "start not measured" in p.summary()
    assert "2 layers already on the node (2 of them unpacked there under the same layers)" in p.summary()


def test_a_layer_held_under_another_parent_is_not_pulled_but_unpacked_again():
    """The shared CUDA layer above another OS: the engine keys unpacked layers by chain, so the node
    downloads nothing for B but unpacks it again above A."""
    other_os = Layer("sha256:" + "d" * 64, 29_000_000, 75_000_000)
    held, chains = cs.node_holds([[other_os.digest, B.digest]])
    p = cs.predict(ColdStartInputs((A, B, C), bandwidth=125e6, unpack_rate=100e6, held=held, held_chains=chains))
    assert (p.pull_bytes, p.unpack_bytes, p.layers_pulled, p.layers_held) == (32_000_000, 1_285_000_000, 2, 1)
    assert p.layers_unpacked_held == 0
    # A downloads (0.24 s) and unpacks (0.8 s); B is there, unpacked after A; C arrived long before
    assert p.total_seconds == pytest.approx(0.24 + 0.8 + 12.0 + 0.05)


def test_chain_ids_follow_the_oci_image_spec():
    """ChainID(L0) = DiffID(L0); ChainID(Ln) = sha256(ChainID(Ln-1) + " " + DiffID(Ln))."""
    one = cs.chain_ids([A.digest, B.digest, C.digest])
    ab = "sha256:" + hashlib.sha256(f"{A.digest} {B.digest}".encode()).hexdigest()
    assert one == (A.digest, ab, "sha256:" + hashlib.sha256(f"{ab} {C.digest}".encode()).hexdigest())
    assert cs.chain_ids([B.digest, A.digest])[1] != ab and cs.chain_ids([]) == ()


def test_split_keeps_the_total_exactly():
    assert cs.split(10, [1, 1, 1]) == [3, 3, 4]
    assert cs.split(1_000_001, [3, 0, 1]) == [750_000, 0, 250_001]
    assert cs.split(7, [0, 0]) == [3, 4] and cs.split(5, []) == []


def test_a_build_prediction_falls_back_to_the_uncompressed_size_and_says_so():
    """Docker 20.10's classic store knows no compressed size before a push: the uncompressed size is an
    upper bound of the pull, marked as one."""
    budget = ColdStartBudget(90.0, 125e6, 200e6)
    exact = cs.build_prediction(budget, 400_000_000, 1_000_000_000, StartTime(1.5, "test 'smoke'"))
    assert exact.pull_exact and exact.pull_bytes == 400_000_000
    assert exact.total_seconds == pytest.approx(3.2 + 5.0 + 1.5)
    bound = cs.build_prediction(budget, None, 1_000_000_000, None)
    assert not bound.pull_exact and bound.pull_bytes == 1_000_000_000 and "at most" in bound.summary()
    assert bound.total_seconds == pytest.approx(8.0 + 5.0)
    default = cs.build_prediction(None, 400_000_000, 1_000_000_000, None)  # no budget: 1 Gbit/s, measured rate
    assert default.bandwidth == cs.DEFAULT_BANDWIDTH and default.unpack_rate == cs.MEASURED_UNPACK_RATE


def test_a_build_prediction_subtracts_what_the_node_holds():
    """Built layers by diff id (80 MB, 1.2 GB, 5 MB unpacked; 532 MB compressed in all). A node image
    with the first two on the same base: the pull is the image's compressed size less those two as its
    registry weighs them (30 + 500 MB), the unpack only the third. The same CUDA layer above another OS:
    not pulled, unpacked again."""
    budget = ColdStartBudget(90.0, 125e6, 100e6)
    layers = ((A.digest, 80_000_000), (B.digest, 1_200_000_000), (C.digest, 5_000_000))
    same_base = [(NodeLayer(A.digest, 30_000_000), NodeLayer(B.digest, 500_000_000))]
    p = cs.build_prediction(budget, 532_000_000, 1_285_000_000, None, layers=layers, node=same_base)
    assert (p.pull_bytes, p.unpack_bytes, p.layers_pulled, p.layers_held, p.layers_unpacked_held) == (
        2_000_000, 5_000_000, 1, 2, 2)
    assert p.total_seconds == pytest.approx(0.016 + 0.05) and p.pull_exact
    other_os = [(NodeLayer("sha256:" + "d" * 64, 29_000_000), NodeLayer(B.digest, 500_000_000))]
    q = cs.build_prediction(budget, 532_000_000, 1_285_000_000, None, layers=layers, node=other_os)
    assert (q.pull_bytes, q.unpack_bytes, q.layers_pulled, q.layers_held, q.layers_unpacked_held) == (
        32_000_000, 1_285_000_000, 2, 1, 0)
    both = cs.build_prediction(budget, 532_000_000, 1_285_000_000, None, layers=layers,
                               node=[*same_base, *other_os, [NodeLayer(C.digest, 2_000_000)]])
    assert (both.pull_bytes, both.unpack_bytes) == (0, 5_000_000)  # C alone on the node: not on A, B
    # a node whose registry weighs the held layers more than this image in all: nothing below zero
    heavy = [(NodeLayer(A.digest, 600_000_000),)]
    assert cs.build_prediction(budget, 532_000_000, 1_285_000_000, None, layers=layers, node=heavy).pull_bytes == 0
    # no node: the whole image, as before
    fresh = cs.build_prediction(budget, 532_000_000, 1_285_000_000, None, layers=layers)
    assert (fresh.pull_bytes, fresh.unpack_bytes, fresh.layers_held) == (532_000_000, 1_285_000_000, 0)


def test_the_budget_names_the_biggest_part():
    budget = ColdStartBudget(10.0, 125e6, 200e6)
    fits = cs.build_prediction(budget, 400_000_000, 1_000_000_000, StartTime(1.8, "t"))  # 3.2 + 5.0 + 1.8 = 10.0
    cs.check_budget(fits, budget, "sha256:" + "1" * 64)
    assert not cs.over_budget(budget, fits)
    over = cs.build_prediction(budget, 400_000_000, 1_000_000_000, StartTime(9.0, "test 'import torch'"))
    assert cs.over_budget(budget, over)
    with pytest.raises(ColdStartOverBudget) as info:
        cs.check_budget(over, budget, "sha256:" + "1" * 64, "team/app:rejected")
    err = info.value
    assert err.exit_status == 1 and err.max_seconds == 10.0
    assert "would take 17.2s to start on a fresh node, over the recipe's budget.cold_start.max of 10s" in err.message
    assert err.message.endswith("kept as team/app:rejected")
    assert err.hint.startswith("the entrypoint's start takes the most")
    assert err.to_json()["cold_start"]["seconds"] == 17.2


def test_the_recipe_reads_its_cold_start_budget(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, HEAD + "budget: {cold_start: {max: 1.5min, bandwidth: 500Mbit,"
                                                        " unpack_rate: 200MB/s}}\n"))
    assert recipe.cold_start == ColdStartBudget(90.0, 62.5e6, 200e6)
    plain = load_recipe(write_recipe(tmp_path / "b", HEAD))
    assert plain.cold_start is None
    # a recipe without the budget keeps its digest; one with it gets another
    assert "cold_start" not in plain.normalized() and recipe.digest != plain.digest


def test_the_recipe_names_the_images_on_the_node(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, HEAD + "budget:\n  cold_start:\n    max: 90s\n    bandwidth: 1Gbit\n"
                                                        "    node: [127.0.0.1:5000/team/base:1, reg.io/a/b@sha256:"
                                                        + "0" * 64 + "]\n"))
    assert recipe.cold_start is not None
    assert recipe.cold_start.node == ("127.0.0.1:5000/team/base:1", "reg.io/a/b@sha256:" + "0" * 64)
    assert recipe.normalized()["cold_start"]["node"] == list(recipe.cold_start.node)
    without = load_recipe(write_recipe(tmp_path / "b", HEAD + "budget: {cold_start: {max: 90s, bandwidth: 1Gbit}}\n"))
    assert "node" not in without.normalized()["cold_start"]  # budgets written before the key keep their digest


def test_a_malformed_node_image_is_located(tmp_path):
    path = write_recipe(tmp_path, HEAD + "budget:\n  cold_start:\n    max: 90s\n    bandwidth: 1Gbit\n"
                                         "    node: [\"http://reg/a:1\"]\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    [issue] = info.value.issues
    assert (issue.line, issue.key) == (11, "budget.cold_start.node[0]")
    assert issue.message.startswith("invalid image reference 'http://reg/a:1'; name an image the node holds")
    code, _out, err = run_cli("plan", str(path))
    assert code == 2 and f"{path}:11: budget.cold_start.node[0]" in err and "Traceback" not in err


def test_a_malformed_budget_is_located(tmp_path):
    path = write_recipe(tmp_path, HEAD + "budget:\n  cold_start:\n    max: soon\n    bandwidth: 1GB\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    got = {(i.line, i.key): i.message for i in info.value.issues}
    assert got == {(9, "budget.cold_start.max"): "'soon' is not a duration like 90s, 1.5min or 2m",
                   (10, "budget.cold_start.bandwidth"): "'1GB' is not a rate like 1Gbit, 100Mbit/s or 200MB/s"}
    code, _out, err = run_cli("plan", str(path))
    assert code == 2 and f"{path}:9: budget.cold_start.max" in err and "Traceback" not in err


def test_the_budget_needs_max_and_bandwidth(tmp_path):
    path = write_recipe(tmp_path, HEAD + "budget: {cold_start: {max: 90s}}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    [issue] = info.value.issues
    assert (issue.line, issue.key, issue.message) == (7, "budget.cold_start.bandwidth", "required key is missing")


def test_a_build_over_its_cold_start_budget_keeps_nothing_and_pushes_nothing(tmp_path, monkeypatch):
    """The build checks the budget after the tests (which time the start) and before the push, as it
    checks budget.max_size: the image keeps only REPO:rejected and nothing reaches the registry."""
    from types import SimpleNamespace

    from buildkit_py import engine as engine_pkg
    from buildkit_py.analysis.image_checks import PASSED
    from buildkit_py.engine import build as build_mod
    from buildkit_py.pipeline import build as pipeline_build
    from buildkit_py.pipeline import plan_recipe

    def tests_taking(seconds: float, name: str):
        """The recipe's tests, passed, the first command taking ``seconds`` (the entrypoint's start)."""
        result = SimpleNamespace(kind="command", status=PASSED, seconds=seconds, name=name)
        return lambda *_a, **_k: (SimpleNamespace(failed=False, results=[result]),)

    monkeypatch.setattr(pipeline_build, "check_can_push", lambda tags: None)
    monkeypatch.setattr(pipeline_build, "layer_groups", lambda *_a: {})
    text = HEAD + "budget: {cold_start: {max: 10s, bandwidth: 1Gbit, unpack_rate: 200MB/s}}\n"
    plan = plan_recipe(write_recipe(tmp_path, text), registry="127.0.0.1:5000", lookup=OFFLINE)

    def StoreEngine():  # noqa: N802 - buildx on the containerd store: pushes from BuildKit, keeps what it builds
        return fakes.FakeEngine(
            capabilities={engine_pkg.PUSH, engine_pkg.ENGINE_STORE, engine_pkg.SECRETS, engine_pkg.CACHE_MOUNTS,
                          engine_pkg.MULTI_STAGE, engine_pkg.METADATA_FILE, engine_pkg.PROVENANCE},
            built="sha256:built", built_labels={"io.imgbuild.os": "debian12"}, run_steps=7,
            sizes=engine_pkg.ImageSizes(1_000_000_000, 400_000_000))  # pushing it fails the test

    engine = StoreEngine()
    monkeypatch.setattr(pipeline_build, "run_tests", tests_taking(9.0, "import torch"))
    with pytest.raises(ColdStartOverBudget) as info:
        pipeline_build.build_checked(plan, engine, build_mod.BuildOptions(push=True, test=True), lambda _l: None)
    assert info.value.prediction.total_seconds == pytest.approx(3.2 + 5.0 + 9.0)
    [request] = engine.requests
    assert not request.push  # checked first, so BuildKit did not push as it exported
    [tag] = plan.tags
    assert ("tag", "sha256:built", "127.0.0.1:5000/team/app:rejected") in engine.calls
    assert ("untag", tag) in engine.calls
    # under budget (a faster start): the same build keeps its figure for the report
    engine = StoreEngine()
    monkeypatch.setattr(pipeline_build, "registry_compressed_size", lambda ref: None)
    monkeypatch.setattr(build_mod, "verify_pushed", lambda image_id, pushed: None)
    monkeypatch.setattr(pipeline_build, "run_tests", tests_taking(1.0, "smoke"))
    engine.push = lambda ref, on_progress=None, on_transfer=None: build_mod.PushResult(
        f"{ref}@sha256:{'9' * 64}", "1", "sha256:" + "9" * 64, None, 1)
    outcome = pipeline_build.build_checked(plan, engine, build_mod.BuildOptions(push=True, test=True),
                                           lambda _l: None).outcome
    assert outcome.cold_start is not None and outcome.cold_start.total_seconds == pytest.approx(9.2)
    assert outcome.pushes


def test_a_build_reads_the_node_images_and_predicts_on_them(tmp_path, monkeypatch):
    """budget.cold_start.node: each image read from its registry (diff ids, compressed sizes) before the
    build, the built image's layers from its engine, matched by diff id; an image that cannot be read
    fails with its own exit status, naming the key."""
    from types import SimpleNamespace

    from buildkit_py import engine as engine_pkg
    from buildkit_py.analysis.diff import ImageLayers, LayerInfo
    from buildkit_py.errors import ManifestNotFound
    from buildkit_py.pipeline import build as pipeline_build
    from buildkit_py.pipeline import plan_recipe

    def image(ref, *layers):
        return ImageLayers(ref, "registry", None, tuple(
            LayerInfo(i, None, d, c, u, None, None, "other", "") for i, (d, c, u) in enumerate(layers)), {})

    base = "127.0.0.1:5000/team/base:1"
    node = {base: image(base, (A.digest, 30_000_000, None), (B.digest, 500_000_000, None))}

    def read_image(ref, **_k):
        if ref not in node:
            raise ManifestNotFound(f"no manifest {ref}")
        return node[ref]

    monkeypatch.setattr(pipeline_build, "read_image", read_image)
    monkeypatch.setattr(pipeline_build, "read_engine", lambda ref, engine: image(
        ref, (A.digest, None, 80_000_000), (B.digest, None, 1_200_000_000), (C.digest, None, 5_000_000)))
    text = HEAD + f"budget: {{cold_start: {{max: 10s, bandwidth: 1Gbit, unpack_rate: 100MB/s, node: [{base}]}}}}\n"
    plan = plan_recipe(write_recipe(tmp_path, text), registry="127.0.0.1:5000", lookup=OFFLINE)
    held = pipeline_build.node_images(plan.recipe)
    assert held == ((NodeLayer(A.digest, 30_000_000), NodeLayer(B.digest, 500_000_000)),)
    run = SimpleNamespace(results=[SimpleNamespace(kind="command", status="passed", seconds=1.5, name="smoke")])
    monkeypatch.setattr(pipeline_build, "PASSED", "passed")
    measured = (engine_pkg.ImageSizes(1_285_000_000, 532_000_000), {}, {})
    cold = pipeline_build._check_cold_start(object(), plan, "sha256:built", ("t",), measured, (run,), None, held)
    assert cold is not None
    assert (cold.pull_bytes, cold.unpack_bytes, cold.layers_held) == (2_000_000, 5_000_000, 2)
    assert cold.total_seconds == pytest.approx(0.016 + 0.05 + 1.5)

    missing = "127.0.0.1:5000/team/gone:1"
    plan = plan_recipe(write_recipe(tmp_path / "b", text.replace(base, missing)), registry="127.0.0.1:5000",
                       lookup=OFFLINE)
    with pytest.raises(ManifestNotFound) as info:
        pipeline_build.node_images(plan.recipe)
    assert info.value.message == f"budget.cold_start.node: {missing}: no manifest {missing}"
    assert info.value.hint and "registry reference" in info.value.hint
