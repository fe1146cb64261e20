"""A byte-level tokenizer for the tiny models this project builds itself.

Tiny random-init models (unit tests) and the synthetic pairs need a real `transformers`
tokenizer that exists offline: 256 byte tokens plus `<pad>`, `<bos>` and `<eos>`, built with
the `tokenizers` library (a BPE model with no merges over a byte-level alphabet, the same
pre-tokenizer/decoder GPT-2 uses), wrapped in `PreTrainedTokenizerFast`.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from functools import lru_cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")


@lru_cache(maxsize=1)
def _byte_vocab() -> dict[str, int]:
    alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins for bytes
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    return vocab


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Return a fresh byte-level tokenizer with a 259-token vocabulary.

    Ids 0, 1, 2 are `<pad>`, `<bos>`, `<eos>`; ids 3..258 are the 256 bytes. Every string
    round-trips exactly through encode/decode.
    """
    tok = Tokenizer(models.BPE(vocab=dict(_byte_vocab()), merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        padding_side="right",
    )


_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (size, fingerprint)


def vocab_fingerprint(tokenizer) -> str:
    """SHA-256 of a tokenizer's whole token → id map: equal iff two tokenizers share a vocabulary.

    Remembered per tokenizer object while its size stays the same (hashing a 49k-token vocabulary
    takes ~0.13 s, and every probe pass asks); adding tokens recomputes it."""
    size = len(tokenizer)
    try:
        cached = _FINGERPRINTS.get(tokenizer)
    except TypeError:  # not weak-referenceable: no memory
        cached = None
    if cached is not None and cached[0] == size:
        return cached[1]
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    fingerprint = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()
    try:
        _FINGERPRINTS[tokenizer] = (size, fingerprint)
    except TypeError:
        pass
    return fingerprint
