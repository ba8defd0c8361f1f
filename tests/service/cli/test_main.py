"""The command line: settings errors, a bad bundle, and the attention summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.cli.main import main
from service.runtime.runner import ProviderError, choose_provider

SHIPPED = Path(__file__).resolve().parents[3] / "model" / "bundles" / "en-ja"


def test_attention_summary(tiny_bundle: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["attention", "Open file", "--bundle", str(tiny_bundle), "--target-text", "ファイルを開く"]) == 0
    out = capsys.readouterr().out
    assert out.count("cross   L") == 2 * 4 and out.count("encoder L") == 2 * 4
    assert "→" in out and "entropy" in out


def test_attention_follows_translate_segment_by_segment(tiny_bundle: Path, capsys: pytest.CaptureFixture) -> None:
    text = "  Open %s\n\nSave the file\n"
    assert main(["translate", text, "--bundle", str(tiny_bundle), "--json"]) == 0
    (translated,) = json.loads(capsys.readouterr().out)
    assert main(["attention", text, "--bundle", str(tiny_bundle)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(translated + "\n")
    assert "segment 1: characters 2-9: Open {0}" in out and "segment 2: characters 11-24: Save the file" in out
    assert out.count("cross   L") == 2 * 2 * 4 and "<0x0A>" not in out.split("segment 1")[1].split("target:")[0]


def test_attention_on_the_shipped_model_explains_its_translation(capsys: pytest.CaptureFixture) -> None:
    assert main(["attention", "Open the selected file\n", "--bundle", str(SHIPPED)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("選択したファイルを開く\n\nsource: ▁Open ▁the ▁selected ▁file </s>\n")


def test_bad_bundle_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["translate", "x", "--bundle", str(tmp_path)]) == 2
    assert "no manifest.json" in capsys.readouterr().err


def test_invalid_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("ATTNSERVE_MAX_BATCH_SIZE", "zero")
    assert main(["translate", "x"]) == 2
    assert "max_batch_size" in capsys.readouterr().err


def test_cuda_requested_without_cuda() -> None:
    with pytest.raises(ProviderError, match="onnxruntime-gpu"):
        choose_provider("cuda")
    assert choose_provider("auto") == "CPUExecutionProvider"


def test_model_commands_are_handed_over() -> None:
    from model.cli import COMMANDS
    from service.cli.main import MODEL_COMMANDS

    assert MODEL_COMMANDS == COMMANDS  # service/cli/main.py names them without importing model/ (no torch there)


def _filled(path: Path) -> list[Any]:
    import polib

    catalog = polib.pofile(str(path))
    live = [e for e in catalog if not e.obsolete]
    assert all(e.msgstr or (e.msgstr_plural and all(e.msgstr_plural.values())) for e in live)
    return live


def test_translate_po_locally(tiny_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tests.service.catalogs import EMPTY_SLOTS, TEMPLATE, msgfmt_check

    (tmp_path / "in.pot").write_text(TEMPLATE)
    out = tmp_path / "out.po"
    argv = ["translate-po", str(tmp_path / "in.pot"), "-o", str(out), "--target", "ja", "--bundle", str(tiny_bundle)]
    assert main([*argv, "--batch-size", "2"]) == 0
    assert f"filled {EMPTY_SLOTS} msgstr" in capsys.readouterr().err
    live = _filled(out)
    assert all("fuzzy" in e.flags for e in live if e.msgid != "Save")
    msgfmt_check(out)
    assert main([*argv, "--no-fuzzy"]) == 0
    live = _filled(out)
    # the tiny model is random: what it filled without losing a directive is not fuzzy, the rest keeps the source
    assert any("fuzzy" not in e.flags for e in live if e.msgid not in ("Save", "Close"))
    msgfmt_check(out)


def test_translate_po_through_a_server(server: Any, tmp_path: Path, tiny_bundle: Path) -> None:
    from tests.service.catalogs import TEMPLATE, msgfmt_check

    (tmp_path / "in.pot").write_text(TEMPLATE)
    remote, local = tmp_path / "remote.po", tmp_path / "local.po"
    common = ["--target", "ja", "--batch-size", "3"]
    assert main(["translate-po", str(tmp_path / "in.pot"), "-o", str(remote), "--url", server.url, *common]) == 0
    assert (
        main(["translate-po", str(tmp_path / "in.pot"), "-o", str(local), "--bundle", str(tiny_bundle), *common]) == 0
    )
    assert remote.read_text() == local.read_text()  # the server decodes as this process does
    msgfmt_check(remote)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--target", "de"], "translates en→ja, not en→de"),
        (["--target", "ja", "--url", "http://127.0.0.1:9"], "http://127.0.0.1:9"),
    ],
)
def test_translate_po_errors(
    tiny_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], needle: str
) -> None:
    from tests.service.catalogs import TEMPLATE

    (tmp_path / "in.pot").write_text(TEMPLATE)
    argv = ["translate-po", str(tmp_path / "in.pot"), "-o", str(tmp_path / "o.po"), "--bundle", str(tiny_bundle)]
    assert main([*argv, *extra]) == 2
    assert needle in capsys.readouterr().err and not (tmp_path / "o.po").exists()


def test_translate_po_refuses_what_is_not_a_catalog(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "in.po").write_text("hello\n")
    assert main(["translate-po", str(tmp_path / "in.po"), "-o", str(tmp_path / "o.po"), "--target", "ja"]) == 2
    assert "not a gettext catalog" in capsys.readouterr().err
    assert main(["translate-po", str(tmp_path / "missing.po"), "-o", str(tmp_path / "o.po"), "--target", "ja"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_translate_picks_the_bundle_serving_the_target(tiny_bundle: Path, tmp_path: Path) -> None:
    from tests.service.pair_bundles import pair_bundle

    for target in ("de", "ja"):
        pair_bundle(tiny_bundle, tmp_path / "bundles", "en", target)
    assert main(["translate", "Open file", "--bundle", str(tmp_path / "bundles"), "--target", "ja"]) == 0
    assert main(["translate", "Open file", "--bundle", str(tmp_path / "bundles"), "--target", "de"]) == 0
    assert main(["translate", "Open file", "--bundle", str(tmp_path / "bundles" / "tiny-en-ja"), "--target", "de"])
