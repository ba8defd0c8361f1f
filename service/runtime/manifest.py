"""``manifest.json``, a bundle's description of itself (docs/ARCHITECTURE.md, "The bundle"): the one place that reads
and writes it, for service/, model/ and bench/ alike. :class:`Manifest` holds the parsed object and names the fields
that code reads and changes; the checks of what they hold are :mod:`service.runtime.bundle`'s."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"


class ManifestError(ValueError):
    """``manifest.json`` is missing or not a JSON object; the message names the file."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_bundle(path: Path) -> bool:
    """Whether ``path`` holds a manifest.json (a bundle directory, or one being written)."""
    return (path / MANIFEST).is_file()


@dataclass
class Manifest:
    """A bundle's manifest: ``data`` is the JSON object as read (every field, known or not, written back as it is).

    Fields that an older manifest lacks read as their defaults."""

    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, bundle_dir: Path) -> Manifest:
        """``bundle_dir``'s manifest.json.

        Raises:
            ManifestError: none there, or not a JSON object.
            OSError: it cannot be read.
        """
        path = bundle_dir / MANIFEST
        if not path.is_file():
            raise ManifestError(f"{bundle_dir}: no {MANIFEST} — is this a bundle directory? (see `attnserve export`)")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ManifestError(f"{path}: not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise ManifestError(f"{path}: holds a {type(data).__name__}, expected a JSON object")
        return cls(data)

    def write(self, bundle_dir: Path) -> None:
        """Write manifest.json as it is (its sha256 as they are: a change to the manifest alone): every field in the
        order it holds them, indented by two, non-ASCII characters as they are, a newline at the end."""
        (bundle_dir / MANIFEST).write_text(json.dumps(self.data, indent=2, ensure_ascii=False) + "\n")

    def write_with_checksums(self, bundle_dir: Path) -> None:
        """Write manifest.json with the sha256 of every other file in ``bundle_dir``; a derived graph (``derived``)
        that is not there keeps the sha256 the manifest gives it."""
        files = sorted(p for p in bundle_dir.iterdir() if p.is_file() and p.name != MANIFEST)
        absent = set(self.derived) - {p.name for p in files}
        kept = {name: h for name, h in self.sha256.items() if name in absent}
        self.data["sha256"] = dict(sorted({**kept, **{p.name: sha256(p) for p in files}}.items()))
        self.write(bundle_dir)

    @property
    def format(self) -> Any:
        return self.data.get("format")

    @property
    def name(self) -> str:
        return str(self.data["name"])

    @name.setter
    def name(self, name: str) -> None:
        self.data["name"] = name

    @property
    def source_lang(self) -> str:
        return str(self.data["source_lang"])

    @source_lang.setter
    def source_lang(self, code: str) -> None:
        self.data["source_lang"] = code

    @property
    def target_lang(self) -> str:
        return str(self.data["target_lang"])

    @target_lang.setter
    def target_lang(self, code: str) -> None:
        self.data["target_lang"] = code

    @property
    def targets(self) -> list[dict[str, Any]]:
        """``targets`` (a model with several targets: ``[{"code", "model_code", "prefix"}]``), else none."""
        targets: list[dict[str, Any]] = self.data.get("targets") or []
        return targets

    @property
    def calibration(self) -> Any:
        """``calibration`` (model/calibrate.py), or None; checked by service/serving/confidence.py."""
        return self.data.get("calibration")

    @calibration.setter
    def calibration(self, calibration: dict[str, Any]) -> None:
        self.data["calibration"] = calibration

    @property
    def scores(self) -> list[dict[str, Any]]:
        """``scores`` (``attnserve evaluate --write``): ``[{"metric", "value", "decoding", "test_set", "command"}]``."""
        scores: list[dict[str, Any]] = self.data.get("scores") or []
        return scores

    @scores.setter
    def scores(self, scores: list[dict[str, Any]]) -> None:
        self.data["scores"] = scores

    @property
    def graphs(self) -> dict[str, Any]:
        """``graphs``: role -> file for float32, and variant -> {role -> file} for the others; add a graph or a
        variant by setting its key."""
        graphs: dict[str, Any] = self.data["graphs"]
        return graphs

    @property
    def graph_files(self) -> list[str]:
        """The float32 graphs' files, in ``graphs``' order (the variants' left out)."""
        return [file for file in self.graphs.values() if isinstance(file, str)]

    @property
    def graph_forms(self) -> Any:
        return self.data.get("graph_forms")

    def add_graph_forms(self, entries: dict[str, dict[str, Any]]) -> None:
        """Add ``entries`` (graph file -> its ``graph_forms`` entry, ``GraphForm.to_manifest()``) to ``graph_forms``,
        replacing a file's entry that is there."""
        self.data["graph_forms"] = {**(self.graph_forms or {}), **entries}

    @property
    def derived(self) -> dict[str, Any]:
        """``derived``: derived file -> {"from", "by", "onnxruntime"} (service/runtime/derive.py)."""
        derived: dict[str, Any] = self.data.get("derived", {})
        return derived

    def add_derived(self, entries: dict[str, dict[str, Any]]) -> None:
        """Add ``entries`` (derived file -> ``{"from", "by", "onnxruntime"}``) to ``derived``."""
        self.data["derived"] = {**self.derived, **entries}

    @property
    def sha256(self) -> dict[str, str]:
        hashes: dict[str, str] = self.data.get("sha256", {})
        return hashes

    @property
    def default_variant(self) -> str:
        """The variant /translate serves unless ``ATTNSERVE_GRAPH_VARIANT`` names one: ``default_variant`` (an Argos
        package whose weights were int8 records ``int8``), else float32."""
        return str(self.data.get("default_variant", "float32"))

    @default_variant.setter
    def default_variant(self, variant: str) -> None:
        self.data["default_variant"] = variant

    @property
    def variants(self) -> list[str]:
        """float32 and the variants ``graphs`` lists (e.g. ``int8``)."""
        return ["float32", *(k for k, v in self.graphs.items() if isinstance(v, dict))]

    @property
    def model(self) -> dict[str, Any]:
        model: dict[str, Any] = self.data["model"]
        return model

    @property
    def tokenizer(self) -> dict[str, Any]:
        tokenizer: dict[str, Any] = self.data["tokenizer"]
        return tokenizer

    @property
    def weight_aliases(self) -> dict[str, str]:
        """``weights.aliases``: state-dict key -> the key whose initializer holds the same tensor (tied embeddings)."""
        aliases: dict[str, str] = self.data["weights"]["aliases"]
        return aliases

    @property
    def provenance(self) -> dict[str, Any]:
        provenance: dict[str, Any] = self.data.get("provenance", {})
        return provenance
