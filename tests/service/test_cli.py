"""The command line: settings errors, a bad bundle, and the attention summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli import main
from service.runner import ProviderError, choose_provider


def test_attention_summary(tiny_bundle: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["attention", "Open file", "--bundle", str(tiny_bundle), "--target-text", "ファイルを開く"]) == 0
    out = capsys.readouterr().out
    assert out.count("cross   L") == 2 * 4 and out.count("encoder L") == 2 * 4
    assert "→" in out and "entropy" in out


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
    from service.cli import MODEL_COMMANDS

    assert MODEL_COMMANDS == COMMANDS  # service/cli.py names them without importing model/ (no torch there)
