"""sizes.py: a size as text, in the binary units every cap is set in (MB = 2**20 bytes)."""

import pytest

from theinference.sizes import size_text


@pytest.mark.parametrize(
    "nbytes, text",
    [
        (2**20, "1 MB"),
        (2**30 - 1, "1024 MB"),  # under a GB: still MB, never "1.0 GB"
        (2**30, "1 GB"),
        (3 * 2**29, "1.5 GB"),
        (10 * 2**30, "10 GB"),  # a whole number of GB has no ".0"
        (int(10.25 * 2**30), "10.2 GB"),
    ],
)
def test_binary_units(nbytes, text):
    assert size_text(nbytes) == text
