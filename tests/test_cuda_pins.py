"""A pip pin of a CUDA library wheel of another CUDA than the image's, or of another version than the
one torch requires, is refused before building (issue 29: it passed the plan without a word), and the
hint, applied, plans."""

import pytest
from helpers import TODAY, write_recipe

from buildkit_py.compat.resolve import resolve
from buildkit_py.errors import CompatibilityError
from buildkit_py.recipe.model import load_recipe


def _recipe(tmp_path, pin, cuda="12.4", torch=None):
    text = (f'name: team/x\ncuda: {{version: "{cuda}", source: wheels, flavor: base}}\n'
            f'base: {{image: debian:bookworm-slim}}\npython: "3.11"\n'
            + (f'torch: "{torch}"\n' if torch else "") + f'pip: ["six==1.16.0", "{pin}"]\n')
    return load_recipe(write_recipe(tmp_path, text))


@pytest.mark.parametrize(("cuda", "pin", "other", "fix"), [
    ("12.4", "nvidia-cublas-cu12==12.1.3.1", "12.1", "nvidia-cublas-cu12==12.4.5.8"),
    ("12.4", "nvidia-cuda-runtime-cu12==12.6.77", "12.6", "nvidia-cuda-runtime-cu12==12.4.127"),
])
def test_a_cuda_wheel_of_another_minor_is_refused_and_the_hint_plans(tmp_path, cuda, pin, other, fix):
    with pytest.raises(CompatibilityError) as info:
        resolve(_recipe(tmp_path, pin, cuda), today=TODAY)
    err = info.value
    assert err.key == "pip[1]" and f"is the CUDA {other} release of that library" in err.message
    assert err.hint.startswith(f"use {fix} ")
    assert resolve(_recipe(tmp_path, fix, cuda), today=TODAY).cuda_version.startswith(cuda)  # the hint, applied


def test_a_cuda_wheel_torch_requires_another_version_of_is_refused(tmp_path):
    with pytest.raises(CompatibilityError) as info:
        resolve(_recipe(tmp_path, "nvidia-cublas-cu12==12.1.0.26", "12.1", torch="2.4.1"), today=TODAY)
    err = info.value
    assert err.key == "pip[1]" and "torch 2.4.1+cu121 requires nvidia-cublas-cu12==12.1.3.1" in err.message
    assert err.hint == "drop pip[1] (torch brings nvidia-cublas-cu12==12.1.3.1)"
    assert resolve(_recipe(tmp_path, "nvidia-cublas-cu12==12.1.3.1", "12.1", torch="2.4.1"),
                   today=TODAY).torch == "2.4.1"


def test_a_cuda_wheel_of_this_cuda_or_unrecorded_passes(tmp_path):
    assert resolve(_recipe(tmp_path, "nvidia-cublas-cu12==12.4.5.8"), today=TODAY).cuda_version == "12.4.1"
    assert resolve(_recipe(tmp_path, "nvidia-nccl-cu12==2.21.5"),
                   today=TODAY).cuda_version == "12.4.1"  # not tied to a minor


def test_the_wheel_owners_and_the_data_date_are_read_once_and_forgotten_with_the_data():
    """Both were rebuilt for each refusal (~30 ms reading every data file for the date, ~15 ms for the
    owners; tests/test_plan_space.py plans thousands): now cached, and forgotten by clear_caches with the
    files they are read from, so a test serving other data never sees the old ones."""
    from buildkit_py.compat import cuda_pins, tables

    first = cuda_pins.wheel_owners()
    assert cuda_pins.wheel_owners() is first and tables.data_as_of().startswith("as of ")
    assert tables._data_as_of.cache_info().currsize == 1
    tables.clear_caches()
    assert cuda_pins.wheel_owners.cache_info().currsize == 0 and tables._data_as_of.cache_info().currsize == 0
    assert cuda_pins.wheel_owners() == first
