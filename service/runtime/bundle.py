"""Read a bundle directory (the contract with model/, see docs/ARCHITECTURE.md): manifest, checksums, tokenizer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import sentencepiece as spm

from service.errors import InvalidText
from service.runtime.manifest import MANIFEST, Manifest, ManifestError, sha256

FORMAT = "attnserve-bundle/5"


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


@dataclass(frozen=True)
class GraphForm:
    """What a graph is, as the manifest's ``graph_forms`` says (the runner's flags; nothing sniffs ONNX names).

    Attributes:
        role: ``encoder``, ``decoder``, or ``forced`` (a known target teacher-forced in one call: its
            ``cross_attentions``; ``attentions`` is always true).
        attentions: it outputs attention weights (``encoder_attentions``; ``self_attentions``/``cross_attentions``).
        cache: a decoder's key/value caches: ``appended`` (past caches in, presents one slot longer out, with a
            ``self_attention_mask``), ``in_place`` (buffers written in place, no mask) or ``gathered`` (past caches
            gathered by ``parent_rows`` inside the step, then appended, no mask; cross caches one per source, read
            through ``source_rows``); ``None`` for an encoder.
        grouped_cross: a decoder's cross keys/values may serve G consecutive rows each (their first axis is named
            apart from the rows').
        greedy_tokens: a decoder takes ``logit_rows``/``token_rows`` and outputs greedy ``tokens``.
        candidates: a decoder takes ``candidates`` (K) and outputs each row's K best tokens and their logits, its
            log normalizer and its greedy token instead of logits; only with ``gathered`` caches. Optional in the
            manifest (absent: false).
    """

    role: Literal["encoder", "decoder", "forced"]
    attentions: bool
    cache: Literal["appended", "in_place", "gathered"] | None = None
    grouped_cross: bool = False
    greedy_tokens: bool = False
    candidates: bool = False

    @classmethod
    def from_manifest(cls, where: str, entry: Any) -> GraphForm:
        """Parse one ``graph_forms`` entry; ``where`` names it in errors.

        Raises:
            BundleError: the entry is not an object of known keys and values.
        """
        if not isinstance(entry, dict):
            raise BundleError(f"{where}: expected an object, got {entry!r}")
        role = entry.get("role")
        if role not in ("encoder", "decoder", "forced"):
            raise BundleError(f"{where}: role {role!r}, expected 'encoder', 'decoder' or 'forced'")
        keys = {"role", "attentions", *(("cache", "grouped_cross", "greedy_tokens") if role == "decoder" else ())}
        optional = {"candidates"} if role == "decoder" else set()
        if not keys <= set(entry) <= keys | optional:
            raise BundleError(
                f"{where}: keys {sorted(entry)}, expected {sorted(keys)} (and optionally {sorted(optional)})"
            )
        flags = [k for k in ("attentions", "grouped_cross", "greedy_tokens", "candidates") if k in entry]
        if bad := [k for k in flags if not isinstance(entry[k], bool)]:
            raise BundleError(f"{where}: {bad[0]} {entry[bad[0]]!r}, expected true or false")
        if "cache" in keys and entry["cache"] not in ("appended", "in_place", "gathered"):
            raise BundleError(f"{where}: cache {entry['cache']!r}, expected 'appended', 'in_place' or 'gathered'")
        if role == "forced" and entry["attentions"] is not True:
            raise BundleError(f"{where}: a forced decoder gives cross-attention: attentions must be true")
        if role == "decoder" and (entry["cache"] == "gathered") != entry.get("candidates", False):
            raise BundleError(f"{where}: candidates are given by a decoder of gathered caches, and only by one")
        return cls(**entry)

    def to_manifest(self) -> dict[str, Any]:
        """The ``graph_forms`` entry :meth:`from_manifest` reads back (an encoder's has no cache keys; ``candidates``
        only when true, so that the other decoders' entries read as before it existed)."""
        entry: dict[str, Any] = {"role": self.role, "attentions": self.attentions}
        if self.role == "decoder":
            entry |= {"cache": self.cache, "grouped_cross": self.grouped_cross, "greedy_tokens": self.greedy_tokens}
        if self.candidates:
            entry["candidates"] = True
        return entry


class Tokenizer:
    """SentencePiece segmentation; ids are SentencePiece's own, or looked up in a piece -> id map (Marian).

    A source's pieces go between ``source_prefix`` and ``source_suffix`` (the manifest's tokenizer entry; by
    default nothing and </s>); ``target_prefix``, the ids every target starts with (decoding forces them and leaves
    them out of its hypotheses), by default none.
    """

    def __init__(
        self,
        source: Path,
        target: Path,
        vocab: dict[str, int] | None,
        spec: ModelSpec,
        source_affixes: tuple[list[int], list[int]] | None = None,
        target_prefix: tuple[int, ...] = (),
    ) -> None:
        self.source_prefix, self.source_suffix = source_affixes or ([], [spec.eos_id])
        self.target_prefix = target_prefix
        self.source = spm.SentencePieceProcessor(model_file=str(source))
        self.target = spm.SentencePieceProcessor(model_file=str(target))
        self.vocab = vocab
        self.spec = spec
        if vocab is not None:
            self.pieces_by_id = {i: p for p, i in vocab.items()}
        else:
            self.pieces_by_id = {i: self.target.id_to_piece(i) for i in range(self.target.get_piece_size())}
        self.special = {spec.eos_id, spec.pad_id}

    def _ids(self, sp: spm.SentencePieceProcessor, text: str, field: str) -> list[int]:
        try:
            if self.vocab is None:
                return list(sp.encode(text))
            unk = self.spec.unk_id
            return [self.vocab.get(p, unk) for p in sp.encode(text, out_type=str)]
        except RuntimeError as e:  # SentencePiece takes UTF-8 only: a str it cannot encode fails the cast
            raise InvalidText(unencodable(text, field), field) from e

    def encode_source(self, text: str) -> list[int]:
        """Source ids between the bundle's source prefix and suffix (by default: with the closing </s>).

        Raises:
            InvalidText: the text is not valid Unicode (field ``q``).
        """
        return [*self.source_prefix, *self._ids(self.source, text, "q"), *self.source_suffix]

    def encode_target(self, text: str) -> list[int]:
        """Target ids with the closing </s> (for forced decoding).

        Raises:
            InvalidText: the text is not valid Unicode (field ``target_text``).
        """
        return [*self._ids(self.target, text, "target_text"), self.spec.eos_id]

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.pieces_by_id.get(i, "<unk>") for i in ids]

    def decode(self, ids: list[int]) -> str:
        pieces = [self.pieces_by_id.get(i, "") for i in ids if i not in self.special]
        return str(self.target.decode_pieces(pieces))


def unencodable(text: str, field: str) -> str:
    """Why SentencePiece refused ``text``: where it stops being valid Unicode, for the error message."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (
            f"{field}: character {e.start} is {text[e.start]!r}, an unpaired surrogate (not valid Unicode); "
            "send UTF-8 text (in JSON, a \\ud800-\\udfff escape must be half of a pair)"
        )
    return f"{field}: the tokenizer cannot read this text; send valid UTF-8 text"


@dataclass(frozen=True)
class Bundle:
    """A loaded, verified bundle."""

    path: Path
    manifest: Manifest
    spec: ModelSpec
    tokenizer: Tokenizer
    forms: dict[str, GraphForm]  # graph file -> its form (the manifest's graph_forms)

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def source_lang(self) -> str:
        return self.manifest.source_lang

    @property
    def target_lang(self) -> str:
        return self.manifest.target_lang

    @property
    def targets(self) -> dict[str, list[int]]:
        """Each served target language with the ids that open its sources: the manifest's ``targets`` (a
        multi-target model's ``>>xxx<<`` token), else ``target_lang`` with none."""
        entries = self.manifest.targets
        if not entries:
            return {self.target_lang: []}
        return {str(e["code"]): [int(i) for i in e["prefix"]] for e in entries}

    @property
    def default_variant(self) -> str:
        """The variant /translate serves unless ``ATTNSERVE_GRAPH_VARIANT`` names one (:class:`Manifest`)."""
        return self.manifest.default_variant

    def served_variant(self, override: str | None) -> str:
        """The variant /translate serves: ``override`` (the setting, for every bundle) when given, else its own."""
        return override or self.default_variant

    @property
    def variants(self) -> list[str]:
        """Graph variants besides float32 (e.g. ``int8``), as the manifest lists them."""
        return self.manifest.variants

    def has_graph(self, role: str, variant: str = "float32") -> bool:
        """Whether a variant has a graph of ``role`` (``forced_decoder``, ``device_decoder``: bundles exported before
        them have none)."""
        graphs = self.manifest.graphs
        if variant != "float32":
            graphs = graphs.get(variant, {})
        return isinstance(graphs.get(role), str)

    def graph(self, role: str, variant: str = "float32") -> Path:
        """The file of the ``encoder`` or ``decoder`` graph of a variant (float32 also has a ``fast_decoder`` and
        a ``forced_decoder``; float32 and float16 may have a ``device_decoder``: :meth:`has_graph`).

        Raises:
            BundleError: the bundle has no such variant.
        """
        graphs = self.manifest.graphs
        if variant == "float32":
            if role not in graphs:
                raise BundleError(f"{self.path}: no {role} graph (export it again with this version)")
            return self.path / str(graphs[role])
        if variant not in self.variants:
            raise BundleError(f"{self.path}: no {variant!r} graphs; this bundle has {self.variants}")
        return self.path / str(graphs[variant][role])

    def form(self, role: str, variant: str = "float32") -> GraphForm:
        """The form of the graph that :meth:`graph` names (its file checked at load to have one).

        Raises:
            BundleError: the bundle has no such graph.
        """
        return self.forms[self.graph(role, variant).name]


def bundle_dirs(paths: list[Path]) -> list[Path]:
    """``paths`` with each directory of bundles (no manifest.json of its own, bundles one level down) replaced by
    its bundles in name order; any other path is kept as it is, for loading to report."""
    found: list[Path] = []
    for path in paths:
        inner = [] if (path / MANIFEST).exists() or not path.is_dir() else sorted(path.glob(f"*/{MANIFEST}"))
        found.extend([m.parent for m in inner] or [path])
    return found


def load_bundle(path: Path, verify: bool = True) -> Bundle:
    """Read and check a bundle directory.

    Args:
        path: the bundle directory.
        verify: compare every file's sha256 with the manifest.

    The manifest's derived graphs (the int8 variant) that are missing are derived first
    (:mod:`service.runtime.derive`), in
    the bundle directory, which then must be writable.

    Raises:
        BundleError: no manifest, an unknown format, a missing file, a checksum mismatch, or a derived graph that is
            missing from a read-only directory.
    """
    manifest_path = path / MANIFEST
    try:
        manifest = Manifest.read(path)
    except ManifestError as e:
        raise BundleError(str(e)) from e
    if manifest.format != FORMAT:
        raise BundleError(
            f"{manifest_path}: format {manifest.format!r}, expected {FORMAT!r} — export it again with this "
            "version (`attnserve export CHECKPOINT DIR --force`, or `attnserve import-marian`)"
        )
    hashes = manifest.sha256
    tok = manifest.tokenizer
    needed = {tok["source"], tok["target"]}
    forms = graph_forms(manifest_path, manifest)
    needed |= set(forms)
    if tok.get("vocab"):
        needed.add(tok["vocab"])
    derived = derived_names(path, manifest)
    for name in sorted((needed | set(hashes)) - derived):  # the derived graphs' sources checked before they are read
        check_file(path, name, hashes if verify else None)
    derive_bundle(path, manifest, derived)
    for name in sorted(derived):
        check_file(path, name, hashes if verify else None, derived=manifest.derived[name])
    spec = ModelSpec.from_manifest(manifest.model)
    vocab = json.loads((path / tok["vocab"]).read_text()) if tok.get("vocab") else None
    affixes = source_affixes(manifest_path, tok, spec)
    prefix = target_prefix(manifest_path, tok, spec)
    tokenizer = Tokenizer(path / tok["source"], path / tok["target"], vocab, spec, affixes, prefix)
    bundle = Bundle(path=path, manifest=manifest, spec=spec, tokenizer=tokenizer, forms=forms)
    if bundle.default_variant not in bundle.variants:
        raise BundleError(
            f"{manifest_path}: default_variant {bundle.default_variant!r}, but the bundle has {bundle.variants}"
        )
    return bundle


def source_affixes(manifest_path: Path, tok: dict[str, Any], spec: ModelSpec) -> tuple[list[int], list[int]]:
    """The tokenizer entry's ``source_prefix`` and ``source_suffix``: the ids around a source's pieces (an Argos
    package's model may want a leading <s>, or no </s>). Absent: nothing before, </s> after.

    Raises:
        BundleError: either is not a list of ids of the vocabulary.
    """
    affixes = []
    for key, default in (("source_prefix", []), ("source_suffix", [spec.eos_id])):
        ids = tok.get(key, default)
        if not isinstance(ids, list) or not all(type(i) is int and 0 <= i < spec.vocab_size for i in ids):
            raise BundleError(f"{manifest_path}: tokenizer.{key} {ids!r}, expected a list of vocabulary ids")
        affixes.append(ids)
    return affixes[0], affixes[1]


def target_prefix(manifest_path: Path, tok: dict[str, Any], spec: ModelSpec) -> tuple[int, ...]:
    """The tokenizer entry's ``target_prefix``: the ids every target starts with (an Argos package's
    ``target_prefix``, a multilingual model's target language token). Absent: none.

    Raises:
        BundleError: not a list of vocabulary ids, or one of them </s> or the pad id.
    """
    ids = tok.get("target_prefix", [])
    if not isinstance(ids, list) or not all(
        type(i) is int and 0 <= i < spec.vocab_size and i not in (spec.eos_id, spec.pad_id) for i in ids
    ):
        raise BundleError(f"{manifest_path}: tokenizer.target_prefix {ids!r}, expected a list of vocabulary ids "
                          "other than </s> and the pad id")  # fmt: skip
    return tuple(ids)


def check_file(path: Path, name: str, hashes: dict[str, str] | None, derived: dict[str, Any] | None = None) -> None:
    """Raise unless the bundle's file ``name`` exists and, with ``hashes``, has the manifest's sha256.

    Raises:
        BundleError: naming the file; for a derived graph (``derived``: its manifest entry), how to derive it again.
    """
    file = path / name
    if not file.is_file():
        raise BundleError(f"{path}: {name} is missing")
    if hashes is None:
        return
    if name not in hashes:
        raise BundleError(f"{path / MANIFEST}: no sha256 for {name}")
    if sha256(file) == hashes[name]:
        return
    if derived is not None:
        import onnxruntime

        entry = derived
        raise BundleError(
            f"{file}: sha256 does not match the manifest — a derived graph that differs (damaged, or derived by "
            f"onnxruntime {onnxruntime.__version__}, the manifest's by {entry.get('onnxruntime', 'an unknown one')}): "
            f"delete it to derive it again, or run `attnserve derive {path} --force`"
        )
    raise BundleError(f"{file}: sha256 does not match the manifest — the file is corrupted or replaced")


def derived_names(path: Path, manifest: Manifest) -> set[str]:
    """The files of the manifest's ``derived`` (:mod:`service.runtime.derive`).

    Raises:
        BundleError: ``derived`` is malformed.
    """
    from service.runtime.derive import DeriveError, derived_entries

    try:
        return set(derived_entries(str(path / MANIFEST), manifest))
    except DeriveError as e:
        raise BundleError(str(e)) from None


def derive_bundle(path: Path, manifest: Manifest, names: set[str]) -> None:
    """Derive those of the derived graphs ``names`` that are missing (:func:`service.runtime.derive.derive_missing`).

    Raises:
        BundleError: a missing graph cannot be derived (a read-only directory).
    """
    if all((path / name).is_file() for name in names):
        return
    from service.runtime.derive import DeriveError, derive_missing

    try:
        derive_missing(path, manifest)
    except DeriveError as e:
        raise BundleError(str(e)) from None


def graph_forms(manifest_path: Path, manifest: Manifest) -> dict[str, GraphForm]:
    """The manifest's ``graph_forms``: one valid entry for every graph file that ``graphs`` names, of its role.

    Raises:
        BundleError: ``graph_forms`` is missing, lacks a graph's entry, or an entry is malformed.
    """
    graphs = manifest.graphs
    roles = {file: role for role, file in graphs.items() if isinstance(file, str)}
    for variant in (v for v in graphs.values() if isinstance(v, dict)):
        roles |= {file: role for role, file in variant.items()}
    entries = manifest.graph_forms
    if not isinstance(entries, dict):
        raise BundleError(f"{manifest_path}: no graph_forms object (export it again with this version)")
    forms: dict[str, GraphForm] = {}
    for file, role in sorted(roles.items()):
        where = f"{manifest_path}: graph_forms[{file!r}]"
        if file not in entries:
            raise BundleError(f"{where} is missing")
        forms[file] = GraphForm.from_manifest(where, entries[file])
        if forms[file].role != {"encoder": "encoder", "forced_decoder": "forced"}.get(role, "decoder"):
            raise BundleError(f"{where}: role {forms[file].role!r}, but graphs names it as the {role}")
    return forms
