"""Tokenizers (Hugging Face `tokenizer.json`, read with the `tokenizers` library; never fetched from a hub)
and the encoding of documents into one EOS-separated token array."""
from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from autohet_ray import ConfigError
from autohet_ray.data.index import TOKENIZER_FILE

EOS_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[SEP]")
MASK_TOKENS = ("[MASK]", "<mask>", "<|mask|>")
TRAINED_SPECIAL_TOKENS = ("<|endoftext|>", "<|mask|>")      # EOS and mask of a tokenizer trained here
BYTE_ALPHABET = 256


def read_tokenizer_json(path: str) -> str:
    """The text of a tokenizer.json: `path` is the file or a directory holding it."""
    file = os.path.join(path, TOKENIZER_FILE) if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"--tokenizer {path!r}: no {TOKENIZER_FILE} there (a Hugging Face tokenizer.json "
                          "is needed; nothing is fetched from a hub)") from None
    tokenizer_from_json(text, where=file)          # refuse a malformed file before any work
    return text


def tokenizer_from_json(text: str, *, where: str = TOKENIZER_FILE):
    try:
        return Tokenizer.from_str(text)
    except Exception as err:                        # the library raises a bare Exception for bad JSON
        raise ConfigError(f"{where} is not a tokenizer the `tokenizers` library reads: {err}") from None


def vocab_size_of(tokenizer) -> int:
    return tokenizer.get_vocab_size(with_added_tokens=True)


def special_ids(tokenizer, *, eos_token: str | None = None) -> tuple[int, int | None]:
    """(EOS id, mask id or None): `eos_token`, or the first of EOS_TOKENS the vocabulary has."""
    candidates = (eos_token,) if eos_token else EOS_TOKENS
    eos = next((tokenizer.token_to_id(t) for t in candidates if tokenizer.token_to_id(t) is not None), None)
    if eos is None:
        raise ConfigError(f"the tokenizer has no end-of-document token {' or '.join(candidates)}; name its "
                          "separator with --eos-token")
    mask = next((tokenizer.token_to_id(t) for t in MASK_TOKENS if tokenizer.token_to_id(t) is not None), None)
    return eos, mask


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int) -> str:
    """The tokenizer.json of a byte-level BPE of `vocab_size` ids (EOS and mask included) trained on `texts`."""
    smallest = BYTE_ALPHABET + len(TRAINED_SPECIAL_TOKENS)
    if vocab_size < smallest:
        raise ConfigError(f"--train-tokenizer {vocab_size}: a byte-level BPE needs at least {smallest} ids "
                          f"({BYTE_ALPHABET} bytes + {len(TRAINED_SPECIAL_TOKENS)} special tokens)")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(TRAINED_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer.to_str()


def encode_documents(tokenizer, documents: list[str], *, eos_id: int, dtype: np.dtype) -> np.ndarray:
    """The token ids of `documents`, each followed by `eos_id`, as one array of `dtype`. Special tokens are
    not added; the caller sets TOKENIZERS_PARALLELISM=false to keep this on one core."""
    encodings = tokenizer.encode_batch(documents, add_special_tokens=False)
    total = sum(len(e.ids) for e in encodings) + len(encodings)
    tokens = np.empty(total, dtype=dtype)
    at = 0
    for encoding in encodings:
        ids = encoding.ids
        tokens[at:at + len(ids)] = ids
        tokens[at + len(ids)] = eos_id
        at += len(ids) + 1
    assert at == total
    return tokens
