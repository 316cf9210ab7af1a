"""spec/inputs.py: the one table of case inputs, and the tokens and positions a case makes the model use."""

import pytest

from theinference.grading.spec.inputs import (
    CASE_INPUTS,
    COUNT_INPUTS,
    ID_INPUTS,
    TOKEN_INPUTS,
    consumed_sequence,
    described,
    positions_needed,
)


def test_every_input_is_in_exactly_one_kind():
    assert TOKEN_INPUTS == ("seq", "prompt", "cont")
    assert COUNT_INPUTS == ("n_new",) and ID_INPUTS == ("next_id",)
    assert sorted(TOKEN_INPUTS + COUNT_INPUTS + ID_INPUTS) == sorted(CASE_INPUTS)


def test_described_names_every_input_with_its_kind():
    assert described() == "seq, prompt, cont (token lists), n_new (a count), next_id (one token)"


@pytest.mark.parametrize(
    "inputs, consumed, positions",
    [
        ({"seq": [1, 2, 3]}, [1, 2, 3], 3),
        ({"prompt": [1, 2], "next_id": 9}, [1, 2, 9], 3),
        # the last token of cont is an answer, never fed back
        ({"prompt": [1, 2], "cont": [7, 8, 9]}, [1, 2, 7, 8, 9], 4),
        # greedy: n_new tokens generated after the prompt, the last never fed back
        ({"prompt": [1, 2], "n_new": 5}, [1, 2], 6),
        ({"prompt": [1], "n_new": 1}, [1], 1),
        ({"n_new": 480}, [], 479),
    ],
)
def test_consumed_sequence_and_positions_needed(inputs, consumed, positions):
    assert consumed_sequence(inputs) == consumed
    assert positions_needed(inputs) == positions


def test_consumed_sequence_is_a_copy():
    inputs = {"seq": [1, 2]}
    consumed_sequence(inputs).append(3)
    assert inputs == {"seq": [1, 2]}
