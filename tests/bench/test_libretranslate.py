"""bench/libretranslate.py: the package both servers serve is the bundle (imported back, it decodes the bundle's
tokens); the request shapes; the outputs' comparison up to what LibreTranslate rewrites."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from libretranslate import argos_package, bodies, comparable, libretranslate_env

from model.importers.argos import import_argos
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import load_bundle
from service.runtime.runner import open_runner

TEXTS = ["Open file", "Save as…", "Delete the selected files?", "Settings", "Close window"]


def tokens(bundle_dir: Path) -> list[list[str]]:
    bundle = load_bundle(bundle_dir)
    tok = bundle.tokenizer
    requests = [DecodeRequest(src=tok.encode_source(t), max_length=12) for t in TEXTS]
    return [tok.pieces(r.hypotheses[0].tokens) for r in decode(open_runner(bundle, "cpu"), requests)]


def test_the_package_is_the_bundle(tiny_bundle: Path, tmp_path: Path) -> None:
    archive, meta = argos_package(tiny_bundle, tmp_path / "work")
    with zipfile.ZipFile(archive) as z:
        names = z.namelist()
        config = json.loads(z.read("translate-en_ja/model/config.json"))
    assert {n.split("/")[0] for n in names} == {"translate-en_ja"} and config["add_source_eos"] is True
    assert (meta["from_code"], meta["to_code"]) == ("en", "ja")
    index = json.loads((Path(libretranslate_env(tmp_path, meta)["ARGOS_PACKAGE_INDEX"][7:]) / "index.json").read_text())
    assert index == [meta]
    import_argos(archive, tmp_path / "imported")
    assert tokens(tmp_path / "imported") == tokens(tiny_bundle)


def test_shapes_and_the_comparison() -> None:
    assert bodies(TEXTS, 1, {})[1] == {"q": "Save as…", "source": "en", "target": "ja"}
    assert [b["q"] for b in bodies(TEXTS, 2, {"beam_size": 4})] == [TEXTS[:2], TEXTS[2:4], TEXTS[4:]]
    assert comparable("ファイルを開く。") == comparable("ファイルを開く.") == "ファイルを開く"
    assert comparable("Epilogue begin を設定") == comparable("epilogue_begin を設定")
    assert comparable("") == "" and comparable("設定") == "設定" and comparable("開く") != comparable("閉じる")
