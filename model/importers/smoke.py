"""The import smoke check: an imported bundle's greedy output on a few sentences must be transformers' ``generate``
on the source checkpoint, token for token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SENTENCES = ["Open file", "The file could not be saved.", "Do you want to delete the selected items?", "Settings"]
MAX_NEW_TOKENS = 32


def hf_greedy(hf_model: Any, hf_dir: Path, texts: list[str], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy ``generate``, one text at a time, tokens after the decoder start (the ``</s>``
    included)."""
    from transformers import GenerationConfig, MarianTokenizer

    tok = MarianTokenizer.from_pretrained(hf_dir)
    c = hf_model.config
    generation = GenerationConfig(
        decoder_start_token_id=c.decoder_start_token_id,
        eos_token_id=c.eos_token_id,
        pad_token_id=c.pad_token_id,
        bad_words_ids=[[c.pad_token_id]],  # our decoders never emit padding
        num_beams=1,
        do_sample=False,
        max_new_tokens=max_new_tokens,
    )
    out = []
    for text in texts:
        with torch.no_grad():
            ids = hf_model.generate(**tok(text, return_tensors="pt"), generation_config=generation)
        out.append(ids[0, 1:].tolist())
    return out


def check_bundle(bundle_dir: Path, hf_model: Any, hf_dir: Path, sentences: list[str] = SENTENCES) -> None:
    """The bundle's greedy tokens (exact graphs and fast decoder) against transformers' on ``sentences``; a
    multi-target bundle is asked each sentence in one of its targets, in turn.

    Raises:
        ValueError: naming the first sentence whose tokens differ.
    """
    from service.decoding import DecodeRequest, decode
    from service.runtime.bundle import load_bundle
    from service.runtime.runner import open_runner

    bundle = load_bundle(bundle_dir)
    targets = bundle.targets
    codes = list(targets)
    exact = open_runner(bundle, "cpu")
    fast = open_runner(bundle, "cpu", role="fast_decoder", encoder=exact.encoder)
    asked, requests = [], []
    for i, sentence in enumerate(sentences):
        code = codes[i % len(codes)]
        prefix = targets[code]
        pieces = bundle.tokenizer.pieces(prefix)
        asked.append((code, " ".join([*pieces, sentence])))
        src = [*prefix, *bundle.tokenizer.encode_source(sentence)]
        requests.append(DecodeRequest(src=src, max_length=MAX_NEW_TOKENS))
    want = hf_greedy(hf_model, hf_dir, [text for _, text in asked], MAX_NEW_TOKENS)
    for runner in (exact, fast):
        for (code, text), result, tokens in zip(asked, decode(runner, requests), want, strict=True):
            got = result.hypotheses[0].tokens
            if got != tokens:
                raise ValueError(
                    f"import check: {text!r} (target {code}) gives {got} in the bundle but {tokens} in transformers; "
                    "the bundle does not reproduce the checkpoint (--no-check skips this check)"
                )
