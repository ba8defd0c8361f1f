"""A bundle exported again from its own weights (``attnserve export BUNDLE OUT``), to store them in another dtype.

The weights are read back from the bundle's float32 graphs (:mod:`~model.export.weights`) and written by
:func:`~model.export.bundle.export_bundle` as a checkpoint's are: every graph rebuilt and checked against PyTorch,
the variants the bundle had (int8, float16) added again, and every manifest field that the export does not derive
from the weights kept as the bundle had it (languages, the tokenizer's fields, scores, calibration, provenance).
"""

from __future__ import annotations

import datetime as _dt
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from model.export.bundle import export_bundle, round_to_float16
from model.export.quantize import ADD_VARIANT
from model.export.store import stored_float16
from model.export.weights import load_model
from service.runtime.manifest import Manifest

# the manifest fields that export_bundle and the variants write; every other one is kept as it is
WRITTEN = {"format", "model", "graphs", "graph_forms", "weights", "sha256", "derived"}
LANGUAGES = ("model_languages", "targets")
TOKENIZER_FILES = ("kind", "source", "target", "vocab")


def _export_arguments(source: Path, manifest: Manifest, float16: bool) -> dict[str, Any]:
    """export_bundle's keyword arguments, but the model and the directory, from a bundle's manifest."""
    tok = manifest.tokenizer
    stored = "float16" if float16 else "float32"
    return {
        "name": manifest.name,
        "source_lang": manifest.source_lang,
        "target_lang": manifest.target_lang,
        "tokenizer": {role: source / tok[role] for role in ("source", "target")},
        "vocab": json.loads((source / tok["vocab"]).read_text()) if tok.get("vocab") else None,
        "tokenizer_fields": {k: v for k, v in tok.items() if k not in TOKENIZER_FILES},
        "scores": manifest.scores,
        "provenance": {
            **manifest.provenance,
            "re_exported": {"date": _dt.date.today().isoformat(), "store": stored},
        },
        "languages": {k: manifest.data[k] for k in LANGUAGES if k in manifest.data},
        "float16": float16,
    }


def export_from_bundle(source: Path, out_dir: Path, *, float16: bool | None = None, force: bool = False) -> Path:
    """Export the bundle ``source`` again into ``out_dir`` (which may be ``source`` itself, with ``force``).

    The new bundle is put together beside ``out_dir`` and replaces it only once every graph is written and checked.

    Args:
        source: a bundle directory.
        out_dir: the bundle to write; must not exist (or be empty) unless ``force``.
        float16: store the weights as float16 (each rounded to the nearest float16 value) or as float32; None keeps
            the dtype ``source`` stores them in.
        force: replace an existing ``out_dir``.

    Returns:
        ``out_dir``.

    Raises:
        FileExistsError: ``out_dir`` holds files and ``force`` is false.
        ValueError: a weight lies beyond float16's range, ONNX Runtime disagrees with PyTorch, or a weight does not
            read back exactly.
    """
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise FileExistsError(f"{out_dir} exists; pass --force to replace it")
    manifest = Manifest.read(source)
    if float16 is None:
        float16 = stored_float16(source / manifest.graphs["encoder"])
    model = load_model(source).eval()
    if float16:
        round_to_float16(model)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.") as tmp:
        staged = export_bundle(model, Path(tmp) / out_dir.name, **_export_arguments(source, manifest, float16))
        written = Manifest.read(staged)
        written.data |= {k: v for k, v in manifest.data.items() if k not in WRITTEN and k not in written.data}
        written.write(staged)
        for variant in (v for v in manifest.variants if v != "float32"):
            if variant not in ADD_VARIANT:
                raise ValueError(f"{source}: variant {variant!r} cannot be exported again")
            ADD_VARIANT[variant](staged)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staged.rename(out_dir)
    return out_dir
