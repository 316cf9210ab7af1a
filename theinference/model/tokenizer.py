"""The GPT-2 tokenizer, built offline from the bundled BPE ranks file."""

import binascii
import functools
import hashlib

import tiktoken

from theinference.bundled import asset

RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# tiktoken's r50k_base / gpt2 split pattern.
PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
ENDOFTEXT = "<|endoftext|>"


def _load_ranks() -> dict[bytes, int]:
    # tiktoken.load.load_tiktoken_bpe would copy the file into a temp-dir cache on every
    # machine; the format is one "base64 rank" pair per line, so read it in place.
    data = asset("gpt2.tiktoken").read_bytes()
    if hashlib.sha256(data).hexdigest() != RANKS_SHA256:
        raise RuntimeError("the bundled gpt2.tiktoken is corrupt (sha256 mismatch); reinstall theinference")
    fields = data.split()  # every run tokenizes the stages' text: one pass in C, not a loop over 50k lines
    return dict(zip(map(binascii.a2b_base64, fields[0::2]), map(int, fields[1::2])))


@functools.cache
def encoding() -> tiktoken.Encoding:
    """Return the GPT-2 encoding (50257 tokens, `<|endoftext|>` = 50256)."""
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=PAT_STR,
        mergeable_ranks=_load_ranks(),
        special_tokens={ENDOFTEXT: 50256},
        explicit_n_vocab=50257,
    )


def encode(text: str) -> list[int]:
    """Encode text to GPT-2 token ids (`<|endoftext|>` allowed)."""
    return encoding().encode(text, allowed_special={ENDOFTEXT})


def token_text(token_id: int) -> str:
    """Return a token's text for display: bytes decoded leniently, ids out of range marked."""
    if not 0 <= token_id < encoding().n_vocab:
        return f"<out of range {token_id}>"
    return encoding().decode_single_token_bytes(token_id).decode("utf-8", errors="replace")


def decode(ids: list[int]) -> str:
    """Decode ids to text, replacing broken UTF-8."""
    return encoding().decode(list(ids), errors="replace")
