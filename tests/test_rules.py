"""The resolver's rules one at a time: each returns its own part and its own warnings."""

import dataclasses

import pytest
from helpers import write_recipe

from buildkit_py import compat
from buildkit_py.compat import (
    base_rule,
    bitsandbytes_rule,
    codes,
    cuda_rule,
    flash_attn_rule,
    image_rule,
    rules,
    torch_rule,
)
from buildkit_py.compat.bases import BaseFacts
from buildkit_py.errors import CompatibilityError
from buildkit_py.recipe.model import load_recipe

RECIPE = """\
name: team/x
cuda: {{version: "12.4", source: {source}, flavor: {flavor}}}
base: {{{base}}}
python: "{python}"
{extra}
"""


def recipe(tmp_path, source="wheels", flavor="runtime", base="image: debian:bookworm-slim", python="3.11", extra=""):
    return load_recipe(write_recipe(tmp_path, RECIPE.format(source=source, flavor=flavor, base=base, python=python,
                                                            extra=extra)))


def test_cuda_rule_takes_the_toolkit_of_the_wheels(tmp_path):
    part = cuda_rule.cuda_rule(recipe(tmp_path), None)
    assert part.version == "12.4.1" and part.wheel_set is not None and part.floor.minor_compat == "525.60.13"
    with_torch = cuda_rule.cuda_rule(recipe(tmp_path, extra='torch: "2.4.1"'), None)
    # torch pins its own CUDA wheels and the toolkit is the recipe's; the wheel set serves the rest of the tier
    assert with_torch.version == "12.4.1" and with_torch.wheel_set.toolkit == "12.4.1"


def test_python_rule_names_the_provider(tmp_path):
    assert rules.python_rule(recipe(tmp_path), None) == rules.PythonPart("3.11", "os", "debian12")
    ubuntu = recipe(tmp_path, source="nvidia", base="os: ubuntu22.04", python="3.12")
    assert rules.python_rule(ubuntu, None).provider == "deadsnakes"
    base = BaseFacts("r.example.com/base:1", "sha256:" + "a" * 64,
                     {"io.imgbuild.python.version": "3.11", "io.imgbuild.os": "debian12"})
    shared = recipe(tmp_path, base="image: r.example.com/base:1")
    assert rules.python_rule(shared, base) == rules.PythonPart("3.11", "base", "debian12")


def test_torch_rule_part_and_its_warning(tmp_path):
    r = recipe(tmp_path, source="nvidia", base="os: ubuntu22.04", python="3.10", extra='torch: "2.4.1"')
    part = torch_rule.torch_rule(r, "12.4.1", "3.10")
    assert (part.version, part.variant, part.label) == ("2.4.1", "cu124", "2.4.1+cu124")
    assert [(w.code, w.key) for w in part.warnings] == [(codes.CUDA_TWICE, "torch")]
    assert torch_rule.torch_rule(recipe(tmp_path), "12.4.1", "3.11") == torch_rule.TorchPart()


def test_arch_rule_defaults_only_when_something_compiles(tmp_path):
    part = rules.arch_rule(recipe(tmp_path), "12.4.1")
    assert part.requested == () and part.for_build(compiles=False) == ()
    assert part.for_build(compiles=True) == ("8.0", "8.6", "8.9", "9.0")
    with pytest.raises(CompatibilityError) as info:
        rules.arch_rule(recipe(tmp_path, extra="build: {cuda_arch: ['12.0']}"), "12.4.1")
    assert info.value.key == "build.cuda_arch[0]"


def test_flavor_rule_is_warnings_only(tmp_path):
    r = recipe(tmp_path, flavor="devel", extra="pip: [requests==2.32.3, cupy-cuda12x==13.3.0, pycuda==2024.1.2]")
    assert [(w.code, w.key) for w in rules.flavor_rule(r, frozenset())] == [
        (codes.DEVEL_WITHOUT_COMPILE, "cuda.flavor"), (codes.JIT_WITHOUT_RUNTIME_COMPILE, "pip[2]")]
    assert [w.code for w in rules.flavor_rule(r, frozenset({"flash-attn"}))] == [codes.JIT_WITHOUT_RUNTIME_COMPILE]


def test_base_rule_pins_warns_or_refuses(tmp_path):
    r = recipe(tmp_path, base="image: r.example.com/base:1")
    torch = torch_rule.TorchPart()
    assert base_rule.base_rule(r, None, "12.4.1", torch, "r.example.com/base:1") == base_rule.BasePart(
        "r.example.com/base:1", None)
    read = BaseFacts("r.example.com/base:1", "sha256:" + "a" * 64, {"io.imgbuild.cuda.version": "12.4.1"})
    assert base_rule.base_rule(r, read, "12.4.1", torch, "r.example.com/base:1").base_image == \
        "r.example.com/base:1@sha256:" + "a" * 64
    with pytest.raises(CompatibilityError) as info:
        base_rule.base_rule(r, read, "12.8.1", torch, "r.example.com/base:1")
    assert info.value.key == "base.image" and "CUDA 12.4.1" in info.value.message


def test_images_rule_warns_from_the_end_of_life_date_on(tmp_path):
    """12.4.1's nvidia/cuda images reach end of life on 2026-06-01 (NVIDIA's EOL chart: R535);
    the rule compares with the date it is given (it reads no clock), and any later one warns alike."""
    import datetime
    r = recipe(tmp_path, source="nvidia", base="os: ubuntu22.04", python="3.10")
    before = image_rule.images_rule(r, "12.4.1", "ubuntu22.04", frozenset(), today=datetime.date(2026, 5, 31))
    assert before.base_image == "nvidia/cuda:12.4.1-runtime-ubuntu22.04" and before.warnings == ()
    on = image_rule.images_rule(r, "12.4.1", "ubuntu22.04", frozenset(), today=datetime.date(2026, 6, 1))
    assert [(w.code, w.key) for w in on.warnings] == [(codes.EOL_IMAGE, "cuda.version")]
    assert "reached end of life on 2026-06-01" in on.warnings[0].message
    assert "from 2026-12-01" in on.warnings[0].message
    later = image_rule.images_rule(r, "12.4.1", "ubuntu22.04", frozenset(), today=datetime.date(2099, 1, 1))
    assert later.warnings == on.warnings


def test_images_rule_no_warning_where_nvidia_publishes_no_end_of_life(tmp_path):
    import datetime
    r = recipe(tmp_path, source="nvidia", base="os: ubuntu24.04", python="3.12")
    part = image_rule.images_rule(r, "13.4.2", "ubuntu24.04", frozenset(), today=datetime.date(2099, 1, 1))
    assert part.base_image == "nvidia/cuda:13.4.2-runtime-ubuntu24.04" and part.warnings == ()


def test_images_rule_no_eol_warning_when_no_nvidia_cuda_tag_is_pulled(tmp_path):
    """A shared base.image is the FROM: Docker Hub deleting 12.4.1's tags cannot break it."""
    import datetime
    r = recipe(tmp_path, source="nvidia", base="image: r.example.com/base:1", python="3.10")
    part = image_rule.images_rule(r, "12.4.1", "ubuntu22.04", frozenset(), today=datetime.date(2026, 6, 1))
    assert part.base_image == "r.example.com/base:1" and part.warnings == ()
    compiling = image_rule.images_rule(r, "12.4.1", "ubuntu22.04", frozenset({"flash-attn"}),
                                  today=datetime.date(2026, 6, 1))
    assert compiling.builder_image == "nvidia/cuda:12.4.1-devel-ubuntu22.04"
    assert [w.code for w in compiling.warnings] == [codes.EOL_IMAGE]


def test_a_pin_refused_for_its_python_names_the_nearest_release_that_fits(tmp_path):
    """issue 29 (found by tests/test_plan_space.py): a bitsandbytes or flash-attn pin refused for the
    recipe's Python came with no hint at all. The hint names the nearest release that fits the Python,
    CUDA and torch, and that release passes the same rule."""
    r = recipe(tmp_path, base="image: ubuntu:22.04", python="3.9",
               extra='torch: "2.4.1"\npip: ["bitsandbytes==0.49.2"]')
    with pytest.raises(CompatibilityError) as info:
        bitsandbytes_rule.bitsandbytes_rule(r, "12.4.1", "3.9", "2.4.1", ())
    assert (info.value.key, info.value.other) == ("pip[0]", "python")
    assert info.value.hint.startswith("use bitsandbytes==0.48.2 (the nearest release that fits CUDA 12.4, Python 3.9 "
                                      "and torch 2.4.1)"), info.value.hint
    fixed = recipe(tmp_path, base="image: ubuntu:22.04", python="3.9",
                   extra='torch: "2.4.1"\npip: ["bitsandbytes==0.48.2"]')
    assert bitsandbytes_rule.bitsandbytes_rule(fixed, "12.4.1", "3.9", "2.4.1", ()) == ()

    fa = recipe(tmp_path, base="image: ubuntu:22.04", python="3.8", extra='torch: "2.4.1"\npip: ["flash-attn==2.8.3"]')
    with pytest.raises(CompatibilityError) as info:
        flash_attn_rule.flash_attn_rule(fa, "12.4.1", "3.8", "2.4.1", ())
    assert info.value.other == "python" and info.value.hint.startswith("use flash-attn=="), info.value.hint
    nearest = info.value.hint.split("==", 1)[1].split()[0]
    ok = recipe(tmp_path, base="image: ubuntu:22.04", python="3.8",
                extra=f'torch: "2.4.1"\npip: ["flash-attn=={nearest}"]')
    flash_attn_rule.flash_attn_rule(ok, "12.4.1", "3.8", "2.4.1", ())


def test_an_os_python_hint_never_offers_a_python_the_torch_pin_refuses(tmp_path):
    """issue 29 (found by tests/test_plan_space.py): Debian 13 with Python 3.14 and torch 2.1.1 was told
    'use python: "3.13"', which torch 2.1.1 (Python <3.12) refuses next. Where the OS's Python clashes
    with the torch pin, the hint offers only the bases that bring the Python asked for."""
    r = recipe(tmp_path, base="image: debian:trixie-slim", python="3.11", extra='torch: "2.1.1"')
    with pytest.raises(CompatibilityError) as info:
        rules.python_rule(r, None)
    assert info.value.hint == ("use an Ubuntu base or a python:3.11 base image (torch 2.1.1 has no wheel for "
                               "Python 3.13: <3.12,>=3.8)"), info.value.hint
    fits = recipe(tmp_path, base="image: debian:trixie-slim", python="3.11", extra='torch: "2.5.1"')
    with pytest.raises(CompatibilityError) as info:
        rules.python_rule(fits, None)
    assert info.value.hint == 'use python: "3.13", an Ubuntu base, or a python:3.11 base image'


def test_a_torch_cuda_hint_names_a_cuda_nvidia_has_an_image_of_for_the_os(tmp_path):
    """issue 29 (found by tests/test_plan_space.py): source: nvidia on ubuntu24.04 with torch 2.5.1 and
    CUDA 13.1 was told "use cuda 12.4", for which nvidia/cuda has no ubuntu24.04 image (refused next).
    The hint names the nearest CUDA of torch's builds that has the image; the image rule agrees."""
    r = recipe(tmp_path, source="nvidia", flavor="base", base="os: ubuntu24.04", python="3.12",
               extra='torch: "2.5.1"')
    with pytest.raises(CompatibilityError) as info:
        torch_rule.torch_rule(r, "13.1.1", "3.12")
    # cu118, cu121, cu124: none has an image on 24.04, and no torch has cu131
    assert info.value.hint.startswith('use cuda: "12.4" on ubuntu22.04 (the nearest CUDA torch 2.5.1 has a build '
                                      "for; nvidia/cuda has no base image of it on ubuntu24.04)"), info.value.hint
    r = recipe(tmp_path, source="nvidia", flavor="runtime", base="os: ubuntu24.04", python="3.12",
               extra='torch: "2.6.0"')
    with pytest.raises(CompatibilityError) as info:
        torch_rule.torch_rule(r, "12.3.2", "3.12")  # cu123: none; cu124 is nearer, but not on 24.04
    assert info.value.hint.startswith("use cuda 12.6 (the nearest CUDA torch 2.6.0 has a build for and nvidia/cuda "
                                      "has a runtime image on ubuntu24.04 for)"), info.value.hint
    assert compat.image_release("12.6", "runtime", None, "ubuntu24.04")


def test_an_unknown_torch_or_cuda_is_hinted_a_release_that_fits_the_rest(tmp_path):
    """issue 29 (found by tests/test_plan_space.py): torch 2.15.1 (no such release) with CUDA 13.0 was told
    "use torch 2.15.0 (the newest imgbuild knows)", which has no cu130 build; CUDA 13.6 (beyond the
    data) with source: nvidia on ubuntu22.04 was told "13.5", which has no nvidia/cuda image there."""
    r = recipe(tmp_path, base="image: ubuntu:22.04", python="3.11", extra='torch: "2.15.1"')
    r = dataclasses.replace(r, cuda=dataclasses.replace(r.cuda, version="13.0"))
    with pytest.raises(CompatibilityError) as info:
        torch_rule.torch_release_rule(r, rules.LookedUp(offline=True))
    assert info.value.hint.endswith("or use torch 2.14.1 (the newest imgbuild knows with a cu130 build for "
                                    "Python 3.11)"), info.value.hint
    assert "cu130" in compat.torch_release("2.14.1").variants
    typo = dataclasses.replace(r, torch="2.12.7")
    with pytest.raises(CompatibilityError) as info:
        torch_rule.torch_release_rule(typo, rules.LookedUp(offline=True))
    assert info.value.hint.startswith("use torch 2.12.1 (the nearest release with a cu130 build for Python 3.11)")
    beyond = dataclasses.replace(r, cuda=dataclasses.replace(r.cuda, version="12.0"))  # no torch has cu120
    with pytest.raises(CompatibilityError) as info:
        torch_rule.torch_release_rule(beyond, rules.LookedUp(offline=True))
    assert info.value.hint.endswith("; no torch release imgbuild knows has a cu120 build for Python 3.11 (change "
                                    "cuda.version or python too)"), info.value.hint

    nv = recipe(tmp_path, source="nvidia", flavor="runtime", base="os: ubuntu22.04", python="3.10")
    nv = dataclasses.replace(nv, cuda=dataclasses.replace(nv.cuda, version="13.6"))
    with pytest.raises(CompatibilityError) as info:
        cuda_rule.cuda_rule(nv, None)
    nearest = info.value.hint.split('"')[1]
    assert info.value.hint == (f'use a released CUDA toolkit, e.g. "{nearest}" (the nearest with an nvidia/cuda '
                               "runtime image on ubuntu22.04)")
    assert compat.image_release(nearest, "runtime", None, "ubuntu22.04")
    with pytest.raises(compat.ImageGap):
        compat.image_release("13.5", "runtime", None, "ubuntu22.04")  # what the hint said before


def test_a_flash_attn_hint_never_names_a_release_whose_source_build_torch_refuses(tmp_path):
    """issue 29 (found by tests/test_plan_space.py): flash-attn 0.2.1 (known only in part) with torch 2.14.1
    and CUDA 13.2 was told "use flash-attn 2.8.3.post2, ...": none has a release wheel for torch 2.14, and
    their source builds compile as C++17, which torch 2.14.1's headers refuse (C++20). None is offered now."""
    r = recipe(tmp_path, base="image: ubuntu:24.04", python="3.10", extra='torch: "2.14.1"\npip: ["flash-attn==0.2.1"]')
    with pytest.raises(CompatibilityError) as info:
        flash_attn_rule.flash_attn_rule(r, "13.2.0", "3.10", "2.14.1", ())
    assert info.value.partial
    assert info.value.hint.startswith("no flash-attn release imgbuild knows fits CUDA 13.2, Python 3.10 and torch "
                                      "2.14.1; its newest are 2.8.3.post2"), info.value.hint
    before = recipe(tmp_path, base="image: ubuntu:24.04", python="3.10",
                    extra='torch: "2.14.1"\npip: ["flash-attn==2.8.3.post2"]')
    with pytest.raises(CompatibilityError) as info:  # what the hint offered before
        flash_attn_rule.flash_attn_rule(before, "13.2.0", "3.10", "2.14.1", ())
    assert "headers need C++20" in info.value.message


def test_a_torch_refused_for_the_python_names_a_python_the_os_has_or_a_torch_that_fits(tmp_path):
    """issue 29 (found by tests/test_plan_space.py): "pick a Python in that range" was the hint of ~1 in 10
    refusals of the grid, no edit a user can apply. It names the nearest Python torch has wheels for that
    the OS provides (Debian: its own; Ubuntu: deadsnakes), or the nearest torch with a build for the Python."""
    r = recipe(tmp_path, base="image: ubuntu:22.04", python="3.13", extra='torch: "2.4.1"')
    with pytest.raises(CompatibilityError) as info:
        torch_rule.torch_rule(r, "12.4.1", "3.13")
    assert info.value.hint == ('use python: "3.12" (the nearest Python torch 2.4.1 has wheels for that ubuntu22.04 '
                               "provides) or torch 2.5.0 (the nearest release with a cu124 build for Python 3.13)")
    torch_rule.torch_rule(recipe(tmp_path, base="image: ubuntu:22.04", python="3.12", extra='torch: "2.4.1"'),
                     "12.4.1", "3.12")
    torch_rule.torch_rule(recipe(tmp_path, base="image: ubuntu:22.04", python="3.13", extra='torch: "2.5.0"'),
                     "12.4.1", "3.13")
    debian = recipe(tmp_path, base="image: debian:trixie-slim", python="3.13", extra='torch: "2.4.1"')
    with pytest.raises(CompatibilityError) as info:
        torch_rule.torch_rule(debian, "12.4.1", "3.13")
    assert info.value.hint == "use torch 2.5.0 (the nearest release with a cu124 build for Python 3.13)"


def test_a_bitsandbytes_without_the_cudas_library_is_hinted_the_nearest_release_that_has_it(tmp_path):
    """issue 29 (found by tests/test_plan_space.py): "pick a CUDA it supports or another bitsandbytes
    release" named neither. bitsandbytes 0.41.0 ships no CUDA 12.4 library; the hint names the nearest
    release that does and fits Python and torch, and that release passes the rule."""
    r = recipe(tmp_path, python="3.11", extra='torch: "2.4.1"\npip: ["bitsandbytes==0.41.0"]')
    with pytest.raises(CompatibilityError) as info:
        bitsandbytes_rule.bitsandbytes_rule(r, "12.4.1", "3.11", "2.4.1", ())
    assert info.value.other == "cuda" and info.value.hint.startswith("use bitsandbytes=="), info.value.hint
    nearest = info.value.hint.split("==", 1)[1].split()[0]
    assert info.value.hint.endswith(" (the nearest release that fits CUDA 12.4, Python 3.11 and torch 2.4.1)")
    fixed = recipe(tmp_path, python="3.11", extra=f'torch: "2.4.1"\npip: ["bitsandbytes=={nearest}"]')
    assert bitsandbytes_rule.bitsandbytes_rule(fixed, "12.4.1", "3.11", "2.4.1", ()) == ()
