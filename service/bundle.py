"""Read a bundle directory (the contract with model/, see docs/ARCHITECTURE.md): manifest, checksums, tokenizer."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sentencepiece as spm

FORMAT = "attnserve-bundle/3"


class BundleError(ValueError):
    """A bundle is missing, malformed or corrupted; the message says which file and what is wrong."""


@dataclass(frozen=True)
class ModelSpec:
    """What the service needs to know of the model (a subset of the manifest's ``"model"``)."""

    vocab_size: int
    d_model: int
    h: int
    n_encoder_layers: int
    n_decoder_layers: int
    max_positions: int
    pad_id: int
    eos_id: int
    unk_id: int
    decoder_start_id: int

    @property
    def d_k(self) -> int:
        return self.d_model // self.h

    @classmethod
    def from_manifest(cls, model: dict[str, Any]) -> ModelSpec:
        return cls(**{k: int(model[k]) for k in cls.__dataclass_fields__})


class Tokenizer:
    """SentencePiece segmentation; ids are SentencePiece's own, or looked up in a piece -> id map (Marian)."""

    def __init__(self, source: Path, target: Path, vocab: dict[str, int] | None, spec: ModelSpec) -> None:
        self.source = spm.SentencePieceProcessor(model_file=str(source))
        self.target = spm.SentencePieceProcessor(model_file=str(target))
        self.vocab = vocab
        self.spec = spec
        if vocab is not None:
            self.pieces_by_id = {i: p for p, i in vocab.items()}
        else:
            self.pieces_by_id = {i: self.target.id_to_piece(i) for i in range(self.target.get_piece_size())}
        self.special = {spec.eos_id, spec.pad_id}

    def _ids(self, sp: spm.SentencePieceProcessor, text: str) -> list[int]:
        if self.vocab is None:
            return list(sp.encode(text))
        unk = self.spec.unk_id
        return [self.vocab.get(p, unk) for p in sp.encode(text, out_type=str)]

    def encode_source(self, text: str) -> list[int]:
        """Source ids with the closing </s>."""
        return [*self._ids(self.source, text), self.spec.eos_id]

    def encode_target(self, text: str) -> list[int]:
        """Target ids with the closing </s> (for forced decoding)."""
        return [*self._ids(self.target, text), self.spec.eos_id]

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.pieces_by_id.get(i, "<unk>") for i in ids]

    def decode(self, ids: list[int]) -> str:
        pieces = [self.pieces_by_id.get(i, "") for i in ids if i not in self.special]
        return str(self.target.decode_pieces(pieces))


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Bundle:
    """A loaded, verified bundle."""

    path: Path
    manifest: dict[str, Any]
    spec: ModelSpec
    tokenizer: Tokenizer

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    @property
    def source_lang(self) -> str:
        return str(self.manifest["source_lang"])

    @property
    def target_lang(self) -> str:
        return str(self.manifest["target_lang"])

    @property
    def variants(self) -> list[str]:
        """Graph variants besides float32 (e.g. ``int8``), as the manifest lists them."""
        return ["float32", *(k for k, v in self.manifest["graphs"].items() if isinstance(v, dict))]

    def graph(self, role: str, variant: str = "float32") -> Path:
        """The file of the ``encoder`` or ``decoder`` graph of a variant (float32 also has a ``fast_decoder``).

        Raises:
            BundleError: the bundle has no such variant.
        """
        graphs = self.manifest["graphs"]
        if variant == "float32":
            if role not in graphs:
                raise BundleError(f"{self.path}: no {role} graph (export it again with this version)")
            return self.path / graphs[role]
        if variant not in self.variants:
            raise BundleError(f"{self.path}: no {variant!r} graphs; this bundle has {self.variants}")
        return self.path / graphs[variant][role]


def load_bundle(path: Path, verify: bool = True) -> Bundle:
    """Read and check a bundle directory.

    Args:
        path: the bundle directory.
        verify: compare every file's sha256 with the manifest.

    Raises:
        BundleError: no manifest, an unknown format, a missing file or a checksum mismatch.
    """
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise BundleError(f"{path}: no manifest.json — is this a bundle directory? (see `attnserve export`)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as e:
        raise BundleError(f"{manifest_path}: not valid JSON: {e}") from e
    if manifest.get("format") != FORMAT:
        raise BundleError(
            f"{manifest_path}: format {manifest.get('format')!r}, expected {FORMAT!r} — export it again with this "
            "version (`attnserve export CHECKPOINT DIR --force`, or `attnserve import-marian`)"
        )
    hashes: dict[str, str] = manifest.get("sha256", {})
    tok = manifest["tokenizer"]
    needed = {tok["source"], tok["target"]}
    for graphs in (manifest["graphs"], *(v for v in manifest["graphs"].values() if isinstance(v, dict))):
        needed |= {graphs["encoder"], graphs["decoder"]}
    if tok.get("vocab"):
        needed.add(tok["vocab"])
    for name in sorted(needed | set(hashes)):
        file = path / name
        if not file.is_file():
            raise BundleError(f"{path}: {name} is missing")
        if verify:
            if name not in hashes:
                raise BundleError(f"{manifest_path}: no sha256 for {name}")
            if sha256(file) != hashes[name]:
                raise BundleError(f"{file}: sha256 does not match the manifest — the file is corrupted or replaced")
    spec = ModelSpec.from_manifest(manifest["model"])
    vocab = json.loads((path / tok["vocab"]).read_text()) if tok.get("vocab") else None
    tokenizer = Tokenizer(path / tok["source"], path / tok["target"], vocab, spec)
    return Bundle(path=path, manifest=manifest, spec=spec, tokenizer=tokenizer)
