"""The import check refuses a bundle that does not reproduce its checkpoint, naming the sentence, and untied
weights; --no-check skips it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import MarianMTModel

from model.importers.smoke import check_bundle, check_tied
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
    model = MarianMTModel.from_pretrained(checkpoints[0]).eval()
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() + 1)
    with pytest.raises(ValueError, match=r"lm_head\.weight differs from model\.shared\.weight"):
        check_tied(model)
