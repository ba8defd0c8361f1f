"""The import check refuses a bundle that does not reproduce its checkpoint, naming the sentence, and untied
weights; --no-check skips it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import MarianMTModel

from model.importers.marian_weights import check_tied, read_hf_weights
from model.importers.smoke import check_bundle
from service.cli.main import main
from tests.bundles import tiny_spm
from tests.model.importers.checkpoints import Layout, random_marian


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    work = tmp_path_factory.mktemp("smoke")
    spm = tiny_spm(work)
    one = random_marian(work / "opus-mt-en-ja", spm, Layout("opus-mt-en-ja", ("en", "ja")))
    other = random_marian(work / "other", spm, Layout("other", ("en", "ja"), seed=9))
    assert main(["import-marian", str(other), str(work / "bundle"), "--no-check"]) == 0
    return one, other, work / "bundle"


def test_a_bundle_of_other_weights_is_refused_naming_the_sentence(checkpoints: tuple[Path, Path, Path]) -> None:
    one, _, bundle = checkpoints
    with pytest.raises(ValueError, match=r"import check: 'Open file' \(target ja\) gives"):
        check_bundle(bundle, MarianMTModel.from_pretrained(one).eval(), one, ["Open file"])


def test_untied_weights_are_refused(checkpoints: tuple[Path, Path, Path]) -> None:
    weights = read_hf_weights(checkpoints[0])
    weights["lm_head.weight"] = weights["model.shared.weight"] + 1
    with pytest.raises(ValueError, match=r"lm_head\.weight differs from model\.shared\.weight"):
        check_tied(weights)


def test_a_pytorch_checkpoint_without_torch_is_one_line_naming_the_fix(
    checkpoints: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only pytorch_model.bin, and no torch: install torch, or convert it to model.safetensors."""
    torch.save(MarianMTModel.from_pretrained(checkpoints[0]).state_dict(), tmp_path / "pytorch_model.bin")
    read, saved = read_hf_weights(tmp_path), read_hf_weights(checkpoints[0])  # torch reads it here
    assert all(np.array_equal(read[k], v) for k, v in saved.items())
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else find_spec(name, *a))
    with pytest.raises(ValueError, match=r"pytorch_model\.bin: reading it needs torch; install torch .* or convert"):
        read_hf_weights(tmp_path)
