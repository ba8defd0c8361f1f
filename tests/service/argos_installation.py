"""A LibreTranslate installation's packages directory, built as real packages are (tests/model/importers/
argos_packages.py: random OpenNMT-py checkpoints through CTranslate2's converter), and CTranslate2's translation of a
text as argos-translate asks it, the reference the served packages are held to. Needs the dev extra (torch,
ctranslate2); the tests that use it skip without them.

For the installs without them, tests/fixtures/argos holds one such package and CTranslate2's translations of
FIXTURE_TEXTS with it, written by ``python -m tests.service.argos_installation``."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

# package folder -> (from_code, to_code, quantization, config.json changes, seed)
PACKAGES = {
    "translate-en_ja-1_0": ("en", "ja", None, {}, 0),
    "translate-ja_en-1_0": ("ja", "en", "int8", {}, 1),
    "translate-en_de-1_0": ("en", "de", None, {"add_source_bos": True, "add_source_eos": True}, 2),
}
BROKEN = "translate-en_fr-1_0"  # a truncated model.bin
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "argos"  # packages/ and reference.json
FIXTURE_PACKAGE = "translate-en_ja-1_0"
FIXTURE_TEXTS = ["Open file", "Delete the selected files?", "Settings"]


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


def fixture_reference(package: Path) -> dict[str, str]:
    """CTranslate2's translation of each of FIXTURE_TEXTS with ``package`` (imported here for its tokenizer)."""
    from model.importers.argos import import_argos

    with tempfile.TemporaryDirectory() as work:
        bundle = import_argos(package, Path(work) / "bundle")
        return {text: reference_text(package, bundle, text) for text in FIXTURE_TEXTS}


def write_fixture(root: Path = FIXTURE) -> None:
    """``root/packages`` with FIXTURE_PACKAGE alone, and ``root/reference.json``."""
    from tests.bundles import tiny_spm
    from tests.model.importers.argos_packages import onmt_package

    shutil.rmtree(root, ignore_errors=True)
    with tempfile.TemporaryDirectory() as work:
        source, target, quantization, config, seed = PACKAGES[FIXTURE_PACKAGE]
        built = onmt_package(Path(work), tiny_spm(Path(work) / "spm"), quantization, config, seed)
        set_languages(built, source, target)
        package = Path(shutil.copytree(built, root / "packages" / FIXTURE_PACKAGE))
    reference = {"package": FIXTURE_PACKAGE, "translations": fixture_reference(package)}
    (root / "reference.json").write_text(json.dumps(reference, ensure_ascii=False, indent=2) + "\n")


if __name__ == "__main__":
    write_fixture()
