"""A LibreTranslate installation's packages directory, built as real packages are (tests/model/importers/
argos_packages.py: random OpenNMT-py checkpoints through CTranslate2's converter), and CTranslate2's translation of a
text as argos-translate asks it, the reference the served packages are held to. Needs the dev extra (torch,
ctranslate2); the tests that use it skip without them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# package folder -> (from_code, to_code, quantization, config.json changes, seed)
PACKAGES = {
    "translate-en_ja-1_0": ("en", "ja", None, {}, 0),
    "translate-ja_en-1_0": ("ja", "en", "int8", {}, 1),
    "translate-en_de-1_0": ("en", "de", None, {"add_source_bos": True, "add_source_eos": True}, 2),
}
BROKEN = "translate-en_fr-1_0"  # a truncated model.bin


def set_languages(folder: Path, source: str, target: str) -> None:
    path = folder / "metadata.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"from_code": source, "to_code": target}))


def build_installation(root: Path, spm: Path) -> Path:
    """``root/packages``: the three packages of :data:`PACKAGES` and the broken one."""
    from tests.model.importers.argos_packages import onmt_package

    packages = root / "packages"
    packages.mkdir()
    for name, (source, target, quantization, config, seed) in PACKAGES.items():
        work = root / "work" / name
        work.mkdir(parents=True)
        built = onmt_package(work, spm, quantization, config, seed)
        set_languages(built, source, target)
        shutil.copytree(built, packages / name)
    broken = Path(shutil.copytree(packages / "translate-en_ja-1_0", packages / BROKEN))
    set_languages(broken, "en", "fr")
    model_bin = broken / "model" / "model.bin"
    model_bin.write_bytes(model_bin.read_bytes()[:-100])
    return packages


def reference_text(package: Path, bundle: Path, text: str) -> str:
    """CTranslate2's greedy tokens for ``text`` (float32), with the server's default max_length for it, put into
    text by the bundle's tokenizer (the server's detokenization: the tokens are what is compared)."""
    from service.runtime.bundle import load_bundle
    from tests.model.importers.argos_packages import reference

    loaded = load_bundle(bundle)
    tok = loaded.tokenizer
    max_length = min(256, 2 * len(tok.encode_source(text)) + 10, loaded.spec.max_positions)
    (pieces,) = reference(package, [text], 1, max_length, 1.0)
    ids = {piece: i for i, piece in tok.pieces_by_id.items()}
    return tok.decode([ids[p] for p in pieces])
