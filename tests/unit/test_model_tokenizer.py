"""model/tokenizer.py: the GPT-2 tokenizer, offline, and token texts as the reports show them."""

from theinference.model import tokenizer


def test_round_trip_and_known_ids():
    ids = tokenizer.encode("Hello world")
    assert ids == [15496, 995]
    assert tokenizer.decode(ids) == "Hello world"


def test_endoftext_is_one_token():
    assert tokenizer.encode("a<|endoftext|>") == [64, 50256]
    assert tokenizer.token_text(50256) == "<|endoftext|>"


def test_token_text_marks_ids_out_of_range():
    assert tokenizer.token_text(50257) == "<out of range 50257>"
    assert tokenizer.token_text(-1) == "<out of range -1>"


def test_broken_utf8_is_replaced_not_raised():
    # a token holding part of a multi-byte character: shown with the replacement character
    partial = next(t for t in range(50000) if tokenizer.encoding().decode_single_token_bytes(t) == b"\xe2\x80")
    assert "\ufffd" in tokenizer.token_text(partial)
    assert "\ufffd" in tokenizer.decode([partial])
