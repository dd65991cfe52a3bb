"""The image pushed is the image tested (issue 31: 1), on every engine.

Between the tests and the push two things used to swap the image: another build of the same recipe
(--no-cache, same tags) finishing meanwhile, and a prune of the build cache. On buildx the push was a
second build trusting the cache, so it pushed what the cache now held; on the classic client and
podman the push went by tag, so it pushed whatever the tag now named. Both races are made to happen
here, while the tests run (pipeline.build.run_tests, replaced by the race), and the registry must then
hold the tested image: its manifest's digest or config digest is the id the tests were given. A push
whose registry answer is another image is refused (verify_pushed), shown on a real push of a different
image.
"""

from pathlib import Path

import pytest
from conftest import _client, on_every_engine, uses_containers_storage
from helpers import CA_ARGS, tiny_recipe, write_recipe
from test_e2e_engines import own_base, prune_own_cache

from buildkit_py import oci
from buildkit_py.engine.build import verify_pushed
from buildkit_py.errors import RegistryError
from buildkit_py.pipeline import OFFLINE, plan_recipe
from buildkit_py.pipeline import build as build_mod

pytestmark = pytest.mark.e2e


def _options(push: bool, no_cache: bool = False, test: bool = False) -> build_mod.BuildOptions:
    ca = Path(CA_ARGS[1]) if CA_ARGS else None
    return build_mod.BuildOptions(push=push, no_cache=no_cache, ca_cert=ca, test=test)


def _prune(engine, marker: str | None) -> None:
    """The build's cache, emptied, as a prune on a busy CI runner does: on buildx only this test's own
    records (built on its marked base: a full prune of the shared engine also took the content later
    tests' builds stood on, "failed to solve: not found"); the classic builder's whole cache; podman's
    intermediate images."""
    if marker is not None:
        assert prune_own_cache(engine, marker) > 0
        return
    args = ("image", "prune", "-f") if uses_containers_storage(engine) else ("builder", "prune", "-af")
    done = _client(engine, *args)
    assert done.returncode == 0, done.stderr


@on_every_engine
@pytest.mark.parametrize("race", ["a concurrent --no-cache build", "a prune"])
def test_the_registry_gets_the_image_the_tests_passed(tmp_path, engine, logged_in, base_image, unique_name,
                                                      cleanup_images, registry_refs, race, monkeypatch):
    marker = None
    if getattr(engine, "buildx", None) is not None and race == "a prune":  # a base of its own to prune above
        base_image, marker = own_base(engine, base_image, tmp_path / "base")
        cleanup_images.append(base_image)
    recipe = write_recipe(tmp_path, tiny_recipe(unique_name, base_image, pip=("six==1.16.0",)))
    plan = plan_recipe(recipe, registry=logged_in.address, lookup=OFFLINE)
    cleanup_images.extend(plan.tags)
    # The concurrent build takes the same tags with other content: a --no-cache build of the same recipe
    # is the same image where builds are reproducible (Docker 26: issue 33 item 1), which races nothing.
    other_recipe = write_recipe(tmp_path / "other", tiny_recipe(unique_name, base_image, pip=("six==1.17.0",)))
    other_plan = plan_recipe(other_recipe, registry=logged_in.address, lookup=OFFLINE)
    assert other_plan.tags == plan.tags
    tested: list[str] = []
    others: list[str] = []

    def racing_tests(_engine, image_id, _recipe, _shown_as, _platforms, _on_event):  # the tests; meanwhile, the race
        tested.append(image_id)
        if race == "a prune":
            _prune(engine, marker)
            return ()
        other = build_mod.build_checked(other_plan, engine, _options(push=False, no_cache=True), lambda _line: None)
        others.append(other.outcome.result.image_id)
        return ()

    monkeypatch.setattr(build_mod, "run_tests", racing_tests)
    outcome = build_mod.build_checked(plan, engine, _options(push=True, test=True), lambda _line: None).outcome
    registry_refs.extend(p.ref for p in outcome.pushes)
    [image_id] = tested
    [pushed] = outcome.pushes
    manifest, digest, _ = oci.get_manifest(pushed.ref)
    assert image_id in (digest, manifest["config"]["digest"]), (image_id, digest, manifest["config"])
    if others:  # the other build really made another image, which the tag named until the push
        assert others[0] != image_id

    # The check can fail: the registry's image held to an id it is not
    with pytest.raises(RegistryError) as info:
        verify_pushed("sha256:" + "0" * 64, pushed)
    assert "is not the image that was tested" in info.value.message
