"""The position mistakes, described once: a decode step's position counter that starts at the prompt's length, at 0
or at the number of layers, advances by one a step or stands still, and is off by a constant.

The families (families.py: a cached pass's decode rows) and the greedy loops (loops.py: the token fed back) try the
same grid of counters and name each the same way; only the sentence around it differs. The positions themselves are
theinference.model.variant.counted's.
"""

from collections.abc import Iterator

OFFSETS = (0, 1, -1, 2)

# Why a counter is wrong, by (base, slope): as a family's finding says it, and as a greedy loop's does.
WHY = {
    ("prompt", 1): ("the position is off by a constant", "off by a constant"),
    ("prompt", 0): ("the position does not advance", "a position that does not advance"),
    ("zero", 1): (
        "the prompt's length is missing from the position",
        "a position that ignores the prompt's length, e.g. len(out)",
    ),
    ("zero", 0): ("a fixed position", "a fixed position"),
    ("layers", 0): (
        "a length that counts the layers, not the cached rows (len() of the wrong object)",
        "a length that counts layers, not cached rows",
    ),
    ("layers", 1): (
        "a length that counts the layers, not the cached rows",
        "a length that counts layers, not cached rows",
    ),
}


def counters() -> Iterator[tuple[str, int, int]]:
    """Every wrong counter (base, slope, k) tried, in order: GPT-2's own ("prompt", 1, 0) left out, and of those
    counting layers only the one a len() of the wrong object gives (the others alias simpler ones)."""
    for base in ("prompt", "layers", "zero"):
        for slope in (1, 0):
            for k in OFFSETS:
                if (base, slope, k) != ("prompt", 1, 0) and (base != "layers" or (slope, k) == (0, 0)):
                    yield base, slope, k


def expression(base: str, slope: int, k: int, n_layer: int) -> str:
    """The counter as the student's code computes it for decode step i: "len(prompt) + i + 1", "0", ..."""
    term = {"prompt": "len(prompt)", "zero": "", "layers": f"n_layer ({n_layer})"}[base]
    expr = " + ".join(t for t in (term, "i" if slope else "") if t)
    if k:
        return f"{expr} {'+' if k > 0 else '-'} {abs(k)}" if expr else str(k)
    return expr or "0"
