"""The case inputs, in one table: the names a stage's cases (and an instructor's oracle) may use,
what each holds, and the tokens a case makes the model consume.

The stage loader, the oracle registry, random cases, grading and the `stages new` template read
the names and kinds here; docs/authoring.md describes them for instructors.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class CaseInput:
    kind: str  # tokens: a list of token ids (or text); count: an integer >= 1; token: one token id (or text)
    meaning: str


CASE_INPUTS = {
    "seq": CaseInput("tokens", "a whole sequence, run at once"),
    "prompt": CaseInput("tokens", "the prompt, prefilled into the cache"),
    "cont": CaseInput("tokens", "the tokens fed one at a time after the prompt (teacher forcing)"),
    "n_new": CaseInput("count", "how many tokens to generate after the prompt"),
    "next_id": CaseInput("token", "the one token decoded after the prompt"),
}
TOKEN_INPUTS = tuple(name for name, spec in CASE_INPUTS.items() if spec.kind == "tokens")
COUNT_INPUTS = tuple(name for name, spec in CASE_INPUTS.items() if spec.kind == "count")
ID_INPUTS = tuple(name for name, spec in CASE_INPUTS.items() if spec.kind == "token")


def described() -> str:
    """The names and kinds in one line, for messages and templates: 'seq, prompt, cont (token lists), ...'."""
    kinds = {"tokens": "token lists", "count": "a count", "token": "one token"}
    groups = [(TOKEN_INPUTS, "tokens"), (COUNT_INPUTS, "count"), (ID_INPUTS, "token")]
    return ", ".join(f"{', '.join(names)} ({kinds[kind]})" for names, kind in groups if names)


def consumed_sequence(inputs: dict) -> list[int]:
    """The token ids the model consumes, in order: seq; or the prompt, then next_id or cont."""
    if "seq" in inputs:
        return list(inputs["seq"])
    tail = [inputs["next_id"]] if "next_id" in inputs else list(inputs.get("cont", []))
    return list(inputs.get("prompt", [])) + tail


def positions_needed(inputs: dict) -> int:
    """How many positions of the context a case uses (n_new tokens generated after the prompt included)."""
    if "seq" in inputs or "next_id" in inputs:
        return len(consumed_sequence(inputs))
    # The last token of cont (or of n_new generated ones) is an answer, never fed back.
    extra = len(inputs["cont"]) - 1 if "cont" in inputs else inputs.get("n_new", 1) - 1
    return len(inputs.get("prompt", [])) + extra
