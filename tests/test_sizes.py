"""The one size formatter: IEC binary units everywhere, so one image reads one figure."""

import pytest

from buildkit_py.sizes import human_size


@pytest.mark.parametrize(("n", "text"), [
    (None, "-"),
    (0, "0 B"),
    (1023, "1023 B"),
    (1024, "1.0 KiB"),
    (10 * 2**20, "10.0 MiB"),
    (50_000_000, "47.7 MiB"),  # a budget written "50MB" (decimal) prints in the one convention
    (6_000_000_000, "5.6 GiB"),  # the image that read "6.0 GB" after a build and "5.6 GiB" in inspect
    (3 * 2**40, "3.0 TiB"),
    (5000 * 2**40, "5000.0 TiB"),  # no unit past TiB
])
def test_human_size(n, text):
    assert human_size(n) == text


def test_build_summary_inspect_and_budget_share_the_helper():
    from buildkit_py.analysis import diff, inspect
    from buildkit_py.pipeline import build, matrix_build

    assert inspect.human_size is diff.human_size is build.human_size is matrix_build.human_size is human_size
