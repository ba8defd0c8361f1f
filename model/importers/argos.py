"""Argos Translate packages (what LibreTranslate serves) as bundles: ``attnserve import-argos PACKAGE OUT``.

A package is a folder (or an ``.argosmodel`` zip of one folder) holding ``metadata.json`` (``from_code``,
``to_code``, optional ``target_prefix``), ``sentencepiece.model`` and a CTranslate2 model in ``model/``
(``model.bin``, ``config.json``, ``shared_vocabulary.json`` or ``.txt``). argos-translate feeds CTranslate2 the bare
SentencePiece pieces; CTranslate2 adds ``<s>``/``</s>`` around a source as config.json's ``add_source_bos`` and
``add_source_eos`` say and starts decoding from its ``decoder_start_token``. The bundle does the same: its
tokenizer entry's ``source_prefix``/``source_suffix`` and the model's ``decoder_start_id``. A metadata.json
``target_prefix`` (one token, which argos-translate passes as CTranslate2's ``target_prefix``) becomes the tokenizer
entry's ``target_prefix``: the service forces it first and leaves it out of the answer, as argos-translate does.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model.config import TransformerConfig
from model.export.builder.write import write_bundle
from model.importers.ct2_transformer import map_transformer, transformer_config
from model.importers.ctranslate2 import read_model_bin
from model.importers.safe_zip import extract

log = logging.getLogger(__name__)

LANGUAGE = re.compile(r"[a-z]{2,3}([_-][A-Za-z0-9]{2,8})*")
MAX_JSON_BYTES = 1 << 20
MAX_VOCABULARY_BYTES = 64 << 20
DEFAULT_EPS = 1e-5  # CTranslate2's LayerNorm epsilon when config.json gives none (src/layers/common.cc)


class PackageError(ValueError):
    """A package that is not what an Argos package should be; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Metadata:
    """What metadata.json says that the import needs."""

    from_code: str
    to_code: str
    target_prefix: str


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON file of at most ``limit`` bytes.

    Raises:
        PackageError: missing, too large or not JSON.
    """
    if not path.is_file():
        raise PackageError(f"the package has no {path.name} ({path.parent.name}/)")
    if path.stat().st_size > limit:
        raise PackageError(f"{path.name} is {path.stat().st_size} bytes, more than {limit}")
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackageError(f"{path.name} is not UTF-8 JSON: {e}") from None


def read_metadata(folder: Path) -> Metadata:
    """metadata.json: a JSON object with language codes ``from_code`` and ``to_code``, ``target_prefix`` a string.

    Raises:
        PackageError: anything else.
    """
    meta = read_json(folder / "metadata.json")
    if not isinstance(meta, dict):
        raise PackageError(f"metadata.json holds a {type(meta).__name__}, expected an object")
    if meta.get("type", "translate") != "translate":
        raise PackageError(f"metadata.json: type {meta['type']!r}; only translation packages are imported")
    codes = []
    for key in ("from_code", "to_code"):
        code = meta.get(key)
        if not isinstance(code, str) or not LANGUAGE.fullmatch(code):
            raise PackageError(f"metadata.json: {key} {code!r} is not a language code such as 'en' or 'pt_BR'")
        codes.append(code)
    prefix = meta.get("target_prefix", "")
    if not isinstance(prefix, str):
        raise PackageError(f"metadata.json: target_prefix {prefix!r} is not a string")
    return Metadata(codes[0], codes[1], prefix)


def read_vocabulary(model_dir: Path) -> list[str]:
    """The shared vocabulary: a JSON list of tokens, or a text file of one token a line.

    Raises:
        PackageError: separate source and target vocabularies, none, a malformed one, or a token listed twice.
    """
    if (model_dir / "source_vocabulary.json").exists() or (model_dir / "source_vocabulary.txt").exists():
        raise PackageError("model/ has separate source and target vocabularies; attnserve needs a shared one")
    if (model_dir / "shared_vocabulary.json").is_file():
        tokens = read_json(model_dir / "shared_vocabulary.json", MAX_VOCABULARY_BYTES)
    elif (model_dir / "shared_vocabulary.txt").is_file():
        text = (model_dir / "shared_vocabulary.txt").read_bytes()[: MAX_VOCABULARY_BYTES + 1]
        if len(text) > MAX_VOCABULARY_BYTES:
            raise PackageError(f"shared_vocabulary.txt is more than {MAX_VOCABULARY_BYTES} bytes")
        tokens = text.decode("utf-8", errors="strict").split("\n")
        tokens = tokens[:-1] if tokens and tokens[-1] == "" else tokens
    else:
        raise PackageError("model/ has no shared_vocabulary.json or shared_vocabulary.txt")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens) or not tokens:
        raise PackageError("the shared vocabulary is not a non-empty list of tokens")
    if len(set(tokens)) != len(tokens):
        raise PackageError("the shared vocabulary lists a token twice")
    return tokens


def package_folder(root: Path) -> Path:
    """The folder holding metadata.json: ``root`` itself or its one subfolder (an .argosmodel zips one folder).

    Raises:
        PackageError: neither.
    """
    if (root / "metadata.json").is_file():
        return root
    entries = [p for p in root.iterdir() if not p.name.startswith("__MACOSX")]
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / "metadata.json").is_file():
        return entries[0]
    raise PackageError("no metadata.json at the package's top or in its one folder")


def special_ids(tokens: list[str], config: dict[str, Any]) -> tuple[dict[str, int], tuple[list[int], list[int]]]:
    """The model's special ids (by config.json's token names) and the ids CTranslate2 puts around a source.

    Raises:
        PackageError: a named token missing from the vocabulary, or no decoder start token.
    """
    index = {t: i for i, t in enumerate(tokens)}

    def find(key: str, default: str) -> int:
        token = config.get(key, default)
        if not isinstance(token, str) or token not in index:
            raise PackageError(f"model/config.json: {key} {token!r} is not in the vocabulary")
        return index[token]

    if "decoder_start_token" in config and config["decoder_start_token"] is None:
        raise PackageError("model/config.json: no decoder_start_token (the start token comes in a prefix)")
    ids = {"eos_id": find("eos_token", "</s>"), "unk_id": find("unk_token", "<unk>"),
           "decoder_start_id": find("decoder_start_token", "<s>")}  # fmt: skip
    prefix = [find("bos_token", "<s>")] if config.get("add_source_bos", False) is True else []
    suffix = [ids["eos_id"]] if config.get("add_source_eos", False) is True else []
    return ids, (prefix, suffix)


def layer_norm_eps(config: dict[str, Any]) -> float:
    """config.json's ``layer_norm_epsilon`` as CTranslate2 reads it (a float32), or its default."""
    eps = config.get("layer_norm_epsilon")
    if eps is None:
        return DEFAULT_EPS
    if not isinstance(eps, int | float) or isinstance(eps, bool) or not 0 < eps < 1:
        raise PackageError(f"model/config.json: layer_norm_epsilon {eps!r} is not a small positive number")
    return float(np.float32(eps))


def prefix_ids(prefix: str, tokens: list[str], eos_id: int) -> list[int]:
    """metadata.json's ``target_prefix`` as ids: none for an empty one, else its one token's id.

    Raises:
        PackageError: a token that is not in the vocabulary (CTranslate2 would force <unk>), or is </s>.
    """
    if not prefix:
        return []
    if prefix not in tokens:
        raise PackageError(f"metadata.json: target_prefix {prefix!r} is not a token of the vocabulary")
    if (i := tokens.index(prefix)) == eos_id:
        raise PackageError(f"metadata.json: target_prefix {prefix!r} is the end of sentence token")
    return [i]


def build_model(
    folder: Path, target_prefix: str = ""
) -> tuple[TransformerConfig, dict[str, np.ndarray], list[str], dict[str, list[int]], dict[str, Any]]:
    """The package's model as ours (its config and state-dict weights, numpy), its vocabulary (the pad token
    appended), the tokenizer entry's affixes (``source_prefix``, ``source_suffix``, ``target_prefix``) and
    provenance.

    Raises:
        PackageError, ModelBinError, UnsupportedModel: as their messages say.
    """
    model_dir = folder / "model"
    config = read_json(model_dir / "config.json")
    if not isinstance(config, dict):
        raise PackageError("model/config.json is not a JSON object")
    tokens = read_vocabulary(model_dir)
    ids, (source_prefix, source_suffix) = special_ids(tokens, config)
    affixes = {"source_prefix": source_prefix, "source_suffix": source_suffix,
               "target_prefix": prefix_ids(target_prefix, tokens, ids["eos_id"])}  # fmt: skip
    model_bin = read_model_bin(model_dir / "model.bin")
    mapped = map_transformer(model_bin, layer_norm_eps(config))
    if mapped.vocab_size != len(tokens):
        raise PackageError(f"the vocabulary has {len(tokens)} tokens, model.bin's embeddings {mapped.vocab_size}")
    pad = next(p for p in ("<pad>", "<attnserve-pad>", "<attnserve-pad-0>") if p not in set(tokens))
    dtypes = sorted({v.dtype for v in model_bin.variables.values() if v.shape})
    provenance = {"ctranslate2": {"binary_version": model_bin.version, "spec": model_bin.spec,
                                  "revision": model_bin.revision, "weights": dtypes}}  # fmt: skip
    weights = {k: np.ascontiguousarray(v, np.float32) for k, v in mapped.state.items()}
    return transformer_config(mapped, ids), weights, [*tokens, pad], affixes, provenance


def unpacked(package: Path, work: Path) -> Path:
    """The package's folder: ``package`` itself, or ``package`` (a zip) unpacked safely into ``work``.

    Raises:
        PackageError, UnsafeZip: no package there, or a zip that is unsafe or unreadable.
    """
    if package.is_dir():
        return package_folder(package)
    if not package.is_file():
        raise PackageError(f"{package}: no such file or directory")
    extract(package, work)
    return package_folder(work)


def import_argos(package: Path, out_dir: Path, *, name: str | None = None, force: bool = False) -> Path:
    """Import an Argos package (folder or .argosmodel zip) as a bundle at ``out_dir``, with the int8 variant (its
    graphs derived from the float32 weights on first load, as for any bundle).

    Nothing is written outside ``out_dir`` but a temporary folder beside it, removed before returning; on any
    refusal ``out_dir`` is left as it was.

    Raises:
        FileExistsError: ``out_dir`` holds files and ``force`` is false.
        ValueError: a refusal (PackageError, UnsafeZip, ModelBinError, UnsupportedModel), one line.
    """
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise FileExistsError(f"{out_dir} exists; pass --force to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.package.") as work:
        folder = unpacked(package, Path(work))
        meta = read_metadata(folder)
        if not (folder / "sentencepiece.model").is_file():
            raise PackageError("the package has no sentencepiece.model")
        config, weights, tokens, affixes, provenance = build_model(folder, meta.target_prefix)
        spm = folder / "sentencepiece.model"
        return write_bundle(
            config,
            weights,
            out_dir,
            name=name or out_dir.name,
            source_lang=meta.from_code,
            target_lang=meta.to_code,
            tokenizer={"source": spm, "target": spm},
            vocab={t: i for i, t in enumerate(tokens)},
            tokenizer_fields=affixes,
            provenance={
                "imported_from": package.name,
                "command": f"attnserve import-argos {package} {out_dir}",
                **provenance,
            },
            variants=("int8",),
            force=force,
        )
