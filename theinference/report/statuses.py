"""How a verdict is shown: each Status's one mark, style and words, the closed type's one presentation.

A status added to results.Status without a presentation here fails mypy (the match ends in assert_never)."""

from dataclasses import dataclass
from typing import assert_never

from theinference.grading.judge.results import Status


@dataclass(frozen=True)
class Shown:
    """A status on screen: the stage line's mark, its rich style, and the words the report says it in."""

    mark: str
    style: str
    words: str


def presentation(status: str) -> Shown:
    """The presentation of a status (a Status, or its str: results carry either)."""
    match Status(status):
        case Status.PASS:
            return Shown("✔", "green", "passed")
        case Status.FAIL:
            return Shown("✘", "red", "failed")
        case Status.NOT_STARTED:
            return Shown("·", "yellow", "not started")
        case Status.ERROR:
            return Shown("✘", "red", "error")
        case Status.TIMEOUT:
            return Shown("⏱", "red", "timed out")
        case Status.CRASH:
            return Shown("✘", "red", "crashed")
        case Status.UNPROVEN:
            return Shown("?", "yellow", "not provable here")
        case unhandled:
            assert_never(unhandled)
