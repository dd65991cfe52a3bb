"""A pin imgbuild has no platform row for is judged per platform by the files the package index serves
of it (issue 29): triton 2.3.1 has x86_64 wheels only and no sdist, so a two-platform recipe pinning
it was planned and then failed in the emulated arm64 build. The look-up reads each such project's file
list once (PEP 691), at plan time; the rule refuses with the nearest release that has an aarch64 wheel."""

import pytest
from helpers import TODAY, write_recipe
from pyindex import LocalIndex

from buildkit_py.compat import index
from buildkit_py.compat.platforms import PinFiles
from buildkit_py.compat.resolve import resolve
from buildkit_py.compat.rules import LookedUp
from buildkit_py.errors import CompatibilityError
from buildkit_py.pipeline import OFFLINE, lookups
from buildkit_py.recipe.model import load_recipe

X86, ARM = frozenset({"x86_64"}), frozenset({"x86_64", "aarch64"})
TRITON = PinFiles("triton", (("2.3.1", X86, False), ("3.0.0", X86, False), ("3.5.0", ARM, False)), "test index")


def _recipe(tmp_path, pins, platforms="[linux/amd64, linux/arm64]"):
    text = ('name: team/x\ncuda: {version: "12.4", source: wheels, flavor: base}\n'
            'base: {image: debian:bookworm-slim}\npython: "3.11"\n'
            f"platforms: {platforms}\npip: [{', '.join(pins)}]\n")
    return load_recipe(write_recipe(tmp_path, text))


def test_a_pin_with_no_arm64_wheel_and_no_sdist_is_refused_with_the_nearest_that_has_one(tmp_path):
    with pytest.raises(CompatibilityError) as info:
        resolve(_recipe(tmp_path, ['"six==1.16.0"', '"triton==2.3.1"']), looked_up=LookedUp(pin_files=(TRITON,)),
                today=TODAY)
    err = info.value
    assert (err.key, err.other, err.other_version) == ("pip[1]", "platform", "linux/arm64")
    assert "Linux wheels of triton 2.3.1 for x86_64 only and no sdist to build for aarch64" in err.reason
    assert err.hint == "use triton==3.5.0 (the nearest release with a Linux aarch64 wheel)"
    fixed = _recipe(tmp_path, ['"six==1.16.0"', '"triton==3.5.0"'])  # the hint, applied
    assert resolve(fixed, looked_up=LookedUp(pin_files=(TRITON,)), today=TODAY).cuda_version == "12.4.1"


@pytest.mark.parametrize(("releases", "ok"), [
    ((("1.0", frozenset({"any"}), False),), True),       # a pure wheel
    ((("1.0", X86, True),), True),                       # an sdist to build from
    ((("1.0", X86, False),), False),
])
def test_a_pure_wheel_or_an_sdist_is_enough(tmp_path, releases, ok):
    recipe = _recipe(tmp_path, ['"somepkg==1.0"'])
    facts = LookedUp(pin_files=(PinFiles("somepkg", releases, "test index"),))
    if ok:
        resolve(recipe, looked_up=facts, today=TODAY)
    else:
        with pytest.raises(CompatibilityError):
            resolve(recipe, looked_up=facts, today=TODAY)


def test_one_platform_or_an_unread_pin_is_not_judged(tmp_path):
    resolve(_recipe(tmp_path, ['"triton==2.3.1"'], platforms="[linux/amd64]"), looked_up=LookedUp(pin_files=(TRITON,)),
            today=TODAY)
    resolve(_recipe(tmp_path, ['"triton==2.3.1"']), today=TODAY)  # not read (--offline): the look-up warned instead


def test_the_look_up_reads_each_projects_files_from_the_index(tmp_path):
    """Against a real HTTP index: machines from the wheel tags, sdists, macOS and musl wheels ignored."""
    with LocalIndex(tmp_path / "index") as served:
        served.add_wheel("triton", "2.3.1", "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64")
        served.add_wheel("triton", "3.5.0", "cp311-cp311-manylinux_2_27_aarch64.manylinux_2_28_aarch64")
        served.add_wheel("triton", "3.5.0", "cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64")
        served.add_wheel("somepkg", "1.0", "cp311-cp311-macosx_11_0_arm64")
        served.add_wheel("somepkg", "1.0", "cp311-cp311-musllinux_1_2_aarch64")
        served.add_sdist("somepkg", "1.0")
        settings = index.IndexSettings(served.url, None, "--index-url")
        warned: list[str] = []
        read = lookups.read_pin_files(("triton", "somepkg", "missing"), settings, warn=warned.append)
    files = {f.name: f for f in read}
    assert files["triton"].of("2.3.1") == (X86, False)
    assert files["triton"].of("3.5.0") == (ARM, False)
    assert files["somepkg"].of("1.0") == (frozenset(), True)
    assert "missing" not in files and warned and warned[0].startswith("missing not checked for every platform")


def test_offline_says_which_pins_were_not_checked(tmp_path):
    warned: list[str] = []
    recipe = _recipe(tmp_path, ['"six==1.16.0"', '"bitsandbytes==0.45.5"'])
    lookups.looked_up(recipe, OFFLINE, warn=warned.append)
    assert warned == ["--offline: six not checked for linux/amd64, linux/arm64 (imgbuild's platform data has no "
                      "row for them and the package index was not read)"]


def test_a_pin_the_content_model_records_is_judged_offline(tmp_path):
    """triton 2.3.1 is in wheel_contents.json (torch 2.3.1 pins it): its recorded file list (x86_64
    wheels only, no sdist) refuses linux/arm64 without reading the index."""
    warned: list[str] = []
    recipe = _recipe(tmp_path, ['"triton==2.3.1"'])
    facts = lookups.looked_up(recipe, OFFLINE, warn=warned.append)
    assert warned == []
    assert [f.name for f in facts.pin_files] == ["triton"]
    assert "wheel_contents.json" in facts.pin_files[0].source
    with pytest.raises(CompatibilityError) as info:
        resolve(recipe, looked_up=facts, today=TODAY)
    assert (info.value.key, info.value.other_version) == ("pip[0]", "linux/arm64")
    assert "for x86_64 only and no sdist" in info.value.reason
    nearest = info.value.hint.split("==")[1].split()[0]
    assert facts.pin_files[0].of(nearest)[0] >= {"aarch64"}
    resolve(_recipe(tmp_path, [f'"triton=={nearest}"']), looked_up=facts, today=TODAY)  # the hint, applied
