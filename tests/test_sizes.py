"""Sizes as text: binary units, as the caps are set."""

import pytest

from theinference.sizes import size_text


@pytest.mark.parametrize(
    "nbytes, text",
    [
        (16 * 2**20, "16 MB"),
        (8 * 2**20, "8 MB"),
        (2**30, "1 GB"),
        (int(1.1 * 2**30), "1.1 GB"),
        (600 * 2**20, "600 MB"),
    ],
)
def test_a_size_reads_in_the_units_its_cap_was_set_in(nbytes, text):
    assert size_text(nbytes) == text
