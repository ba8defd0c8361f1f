"""Training resumes exactly: weights, optimizer, schedule, data position and random state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from model.train import Data, TrainConfig, Trainer, average_checkpoints, learning_rate
from model.transformer import TransformerConfig

CONFIG = TransformerConfig(
    vocab_size=40, d_model=16, h=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=2, pad_id=39, decoder_start_id=39
)
TRAIN = TrainConfig(max_tokens=64, warmup=4, epochs=3, seed=7, checkpoint_minutes=1e9)


def toy_data(n: int = 40) -> Data:
    """Copy-and-shift pairs of random lengths, so that batches differ in shape."""
    rng = np.random.default_rng(0)
    data = Data([], [])
    for _ in range(n):
        s = rng.integers(2, 39, size=rng.integers(2, 9))
        data.src.append(np.array([*s, 0], dtype=np.int32))
        data.tgt.append(np.array([*((s + 1) % 37 + 2), 0], dtype=np.int32))
    return data


def test_resumed_run_reproduces_the_uninterrupted_losses(tmp_path: Path) -> None:
    data = toy_data()
    per_epoch = len(data.batches(TRAIN.max_tokens, TRAIN.seed, 0))
    total = per_epoch + 3  # the resumed part crosses an epoch boundary

    straight = Trainer(CONFIG, TRAIN, data, tmp_path / "straight").run(max_steps=total, show_progress=False)

    first = Trainer(CONFIG, TRAIN, data, tmp_path / "resumed")
    head = first.run(max_steps=per_epoch - 2, show_progress=False)
    first.save(tmp_path / "resumed" / "last.pt")  # as the periodic checkpoint would
    second = Trainer(CONFIG, TRAIN, data, tmp_path / "resumed")  # a new process finds last.pt
    assert second.progress.step == per_epoch - 2
    tail = second.run(max_steps=total - len(head), show_progress=False)

    assert head == straight[: len(head)]
    assert tail == pytest.approx(straight[len(head) :], abs=0, rel=0)
    assert straight[-1] < straight[0]


def test_batches_respect_the_token_budget_and_cover_the_data() -> None:
    data = toy_data()
    batches = data.batches(64, seed=1, epoch=0)
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(len(data.src)))
    for b in batches:
        longest = max(max(len(data.src[i]), len(data.tgt[i]) + 1) for i in b)
        assert len(b) * longest <= 64 or len(b) == 1
    assert [b.tolist() for b in batches] != [b.tolist() for b in data.batches(64, seed=1, epoch=1)]


def test_learning_rate_warms_up_then_decays() -> None:
    rates = [learning_rate(step, 256, TrainConfig(warmup=100)) for step in (1, 50, 100, 400)]
    assert rates[0] < rates[1] < rates[2] > rates[3]
    assert rates[2] == pytest.approx(256**-0.5 * 100**-0.5)


def test_averaged_checkpoint_holds_the_mean_weights(tmp_path: Path) -> None:
    paths = []
    for seed in (1, 2, 3):
        trainer = Trainer(CONFIG, TrainConfig(seed=seed), toy_data(), tmp_path / str(seed), meta={"name": "toy"})
        trainer.save(tmp_path / f"{seed}.pt")
        paths.append(tmp_path / f"{seed}.pt")
    out = average_checkpoints(paths, tmp_path / "avg.pt")
    states = [torch.load(p, weights_only=False)["model"] for p in paths]
    avg = torch.load(out, weights_only=False)
    assert avg["config"] == CONFIG.to_dict() and avg["meta"]["provenance"]["averaged"] == [str(p) for p in paths]
    for key, value in avg["model"].items():
        torch.testing.assert_close(value, sum(s[key] for s in states) / 3)


def test_the_last_epochs_weights_are_kept_for_averaging(tmp_path: Path) -> None:
    t = TrainConfig(max_tokens=64, warmup=4, epochs=4, seed=7, checkpoint_minutes=1e9, keep_epochs=2)
    trainer = Trainer(CONFIG, t, toy_data(), tmp_path, meta={"name": "toy"})
    trainer.run(show_progress=False)
    assert sorted(p.name for p in (tmp_path / "epochs").iterdir()) == ["epoch3.pt", "epoch4.pt"]
    last = torch.load(tmp_path / "epochs" / "epoch4.pt", weights_only=False)
    for key, value in trainer.model.state_dict().items():
        torch.testing.assert_close(last["model"][key], value)
    average_checkpoints(sorted((tmp_path / "epochs").iterdir()), tmp_path / "avg.pt")  # the format it reads


@pytest.mark.parametrize(
    ("scores", "stops"),
    [
        ([40.0, 45.0, 45.2, 45.3], True),  # 0.3 over the last two: no more than plateau_gain
        ([40.0, 45.0, 45.2, 45.4], False),
        ([40.0, 45.0, 44.0, 43.0], True),  # worse is no gain either
        ([40.0, 45.0], False),  # nothing before the window to compare with
    ],
)
def test_training_stops_once_dev_chrf_plateaus(tmp_path: Path, scores: list[float], stops: bool) -> None:
    t = TrainConfig(max_tokens=64, warmup=4, epochs=10, seed=7, checkpoint_minutes=1e9, plateau_epochs=2)
    trainer = Trainer(CONFIG, t, toy_data(), tmp_path, meta={"name": "toy"})
    trainer.progress.history = [{"epoch": i + 1, "dev_chrf": s} for i, s in enumerate(scores)]
    assert trainer.plateaued() is stops
    trainer.progress.epoch = len(scores)
    trainer.run(show_progress=False)
    assert trainer.progress.epoch == (len(scores) if stops else t.epochs)  # toy runs have no dev set: no new scores
