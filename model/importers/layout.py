"""What a MarianMTModel directory says about itself, read once: special ids, language codes, target tokens and the
dtype its weights are stored in. Nothing here is assumed; a checkpoint that contradicts itself is refused."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.importers.languages import Target, served_code, served_targets

DIR_NAME = re.compile(r"opus-mt-(?:tc-(?:big|base)-)?(?P<source>[^-]+)-(?P<target>[^-]+)$")


@dataclass(frozen=True)
class Specials:
    """The special ids as the checkpoint's vocab.json and config.json give them."""

    eos_id: int
    unk_id: int
    pad_id: int
    decoder_start_id: int


@dataclass(frozen=True)
class Languages:
    """The model's own codes and the served ones; ``targets`` for a multi-target model (one per ``>>xxx<<``)."""

    model_source: str
    model_target: str
    source: str
    target: str
    targets: list[Target]

    def to_manifest(self) -> dict[str, Any]:
        """The manifest's ``model_languages`` entry: the codes as the model names them."""
        return {"source": self.model_source, "target": self.model_target}


def special_ids(hf: dict[str, Any], vocab: dict[str, int], tok_config: dict[str, Any]) -> Specials:
    """``</s>``, ``<unk>``, ``<pad>`` from the vocabulary (under tokenizer_config.json's names for them), checked
    against config.json's ``eos_token_id`` and ``pad_token_id``; the decoder start from config.json.

    Raises:
        ValueError: a special piece missing from vocab.json, or config.json naming another id for it.
    """
    ids = {}
    for key, default in (("eos_token", "</s>"), ("unk_token", "<unk>"), ("pad_token", "<pad>")):
        piece = tok_config.get(key) or default
        piece = piece["content"] if isinstance(piece, dict) else piece
        if piece not in vocab:
            raise ValueError(f"vocab.json has no {piece!r} ({key})")
        ids[key] = vocab[piece]
    for key, config_key in (("eos_token", "eos_token_id"), ("pad_token", "pad_token_id")):
        if hf.get(config_key) is not None and hf[config_key] != ids[key]:
            raise ValueError(
                f"config.json's {config_key}={hf[config_key]}, but vocab.json puts the {key} at {ids[key]}: "
                "the files do not belong together"
            )
    start = hf.get("decoder_start_token_id")
    return Specials(ids["eos_token"], ids["unk_token"], ids["pad_token"], ids["pad_token"] if start is None else start)


def model_codes(hf_dir: Path, tok_config: dict[str, Any]) -> tuple[str | None, str | None]:
    """The model's language codes: tokenizer_config.json's ``source_lang``/``target_lang``, else the directory
    name's (``opus-mt-tc-big-en-fr``); None where neither says."""
    source, target = tok_config.get("source_lang"), tok_config.get("target_lang")
    if (source is None or target is None) and (m := DIR_NAME.search(hf_dir.resolve().name)):
        source, target = source or m.group("source"), target or m.group("target")
    return source, target


def _served(model_code: str | None, override: str | None, flag: str) -> str:
    if override:
        return override
    if model_code is None:
        raise ValueError(f"the checkpoint does not say its language; give {flag}")
    try:
        return served_code(model_code)
    except ValueError as e:
        raise ValueError(f"{e}; give {flag}") from None


def languages(
    hf_dir: Path,
    vocab: dict[str, int],
    tok_config: dict[str, Any],
    *,
    source_lang: str | None = None,
    target_lang: str | None = None,
    targets: list[str] | None = None,
) -> Languages:
    """The model's codes and the served ones: ``source_lang``/``target_lang`` override the served codes; a
    vocabulary with ``>>xxx<<`` pieces makes a multi-target model, whose ``targets`` (all, or those of
    ``targets``) are served and whose ``target`` is the model's group code (``mul`` when unnamed).

    Raises:
        ValueError: a code that names no language and no override for it; ``targets`` for a model without target
            tokens, or naming one the vocabulary lacks.
    """
    model_source, model_target = model_codes(hf_dir, tok_config)
    source = _served(model_source, source_lang, "--source-lang")
    found = served_targets(vocab, targets)
    if found:
        if target_lang:
            raise ValueError("the model has target tokens (>>xxx<<): choose targets with --targets, not --target-lang")
        group = model_target or "mul"
        return Languages(model_source or source, group, source, group, found)
    if targets:
        raise ValueError("--targets: the model has no target tokens (>>xxx<<); it serves one target")
    target = _served(model_target, target_lang, "--target-lang")
    return Languages(model_source or source, model_target or target, source, target, [])


def stored_dtype(hf_dir: Path, hf: dict[str, Any]) -> str:
    """``float16`` when the checkpoint's weights are stored in float16 (safetensors' header, else config.json's
    ``torch_dtype``/``dtype``), else ``float32``."""
    weights = hf_dir / "model.safetensors"
    if weights.is_file():
        with weights.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
        return "float16" if dtypes == {"F16"} else "float32"
    return "float16" if (hf.get("torch_dtype") or hf.get("dtype")) == "float16" else "float32"
