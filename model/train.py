"""Train the Transformer as the paper does (§5): Adam (0.9, 0.98, 1e-9), warm-up then inverse-square-root learning
rate, label smoothing 0.1, dropout 0.1, batches by token count.

Training on a small machine outlives any one process, so the run directory (outside the repo) holds ``last.pt``,
written at least every ``checkpoint_minutes`` and at each epoch's end, and ``best.pt`` (best dev chrF). A run
resumes exactly from ``last.pt``: weights, optimizer, schedule, data position and random state.

    attnserve train --corpus ~/.cache/attnserve/corpus/en-ja --run ~/.cache/attnserve/runs/en-ja
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from model.data import read_pairs
from model.transformer import Transformer, TransformerConfig, greedy_decode, make_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """Training hyperparameters; saved in every checkpoint."""

    max_tokens: int = 6000  # per batch, counting padding: batch size × longest sequence
    warmup: int = 1500  # steps of linear warm-up (the paper: 4000 at 25k-token batches)
    lr_factor: float = 1.0  # lrate = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)
    label_smoothing: float = 0.1
    epochs: int = 20
    seed: int = 1234
    checkpoint_minutes: float = 10.0
    bf16: bool = False  # bfloat16 autocast on the CPU (AVX-512-BF16) or CUDA
    dev_size: int = 1000  # dev sentences decoded for chrF after each epoch
    max_length: int = 128  # longer pairs are skipped (tokens, either side)
    keep_epochs: int = 5  # weights of the last this-many epochs kept in epochs/ for `attnserve average`
    plateau_epochs: int = 0  # stop once dev chrF has gained no more than plateau_gain over this many epochs (0: never)
    plateau_gain: float = 0.3


@dataclass
class Data:
    """Token ids of the training pairs: sources end with </s>; targets end with </s> (labels)."""

    src: list[np.ndarray]
    tgt: list[np.ndarray]

    def batches(self, max_tokens: int, seed: int, epoch: int) -> list[np.ndarray]:
        """Length-bucketed batches of indices for one epoch, in a shuffled order fixed by (seed, epoch).

        Sorting by length cuts padding; the random tie-break and batch order change each epoch.
        """
        rng = np.random.default_rng([seed, epoch])
        src_len = np.array([len(s) for s in self.src])
        tgt_len = np.array([len(t) for t in self.tgt]) + 1  # the decoder input has the start token
        order = np.lexsort((rng.random(len(src_len)), tgt_len, src_len))
        batches, start, longest = [], 0, 0
        for i, idx in enumerate(order):
            longest = max(longest, src_len[idx], tgt_len[idx])
            if (i + 1 - start) * longest > max_tokens:
                batches.append(order[start:i])
                start, longest = i, max(src_len[idx], tgt_len[idx])
        batches.append(order[start:])
        return [batches[i] for i in rng.permutation(len(batches))]

    def collate(self, idx: np.ndarray, c: TransformerConfig) -> dict[str, torch.Tensor]:
        """Pad one batch: src (B, S), src_mask (B, S), tgt_in (B, T) starting with decoder_start_id, labels (B, T)."""
        B = len(idx)
        S = max(len(self.src[i]) for i in idx)
        T = max(len(self.tgt[i]) for i in idx)
        src = np.full((B, S), c.pad_id, dtype=np.int64)
        tgt_in = np.full((B, T), c.pad_id, dtype=np.int64)
        labels = np.full((B, T), -100, dtype=np.int64)  # -100: ignored by the loss
        for row, i in enumerate(idx):
            s, t = self.src[i], self.tgt[i]
            src[row, : len(s)] = s
            tgt_in[row, 0] = c.decoder_start_id
            tgt_in[row, 1 : len(t)] = t[:-1]
            labels[row, : len(t)] = t
        return {
            "src": torch.from_numpy(src),
            "src_mask": torch.from_numpy((src != c.pad_id).astype(np.int64)),
            "tgt_in": torch.from_numpy(tgt_in),
            "labels": torch.from_numpy(labels),
        }


def encode_pairs(sp: Any, pairs: list[tuple[str, str]], eos_id: int, max_length: int) -> Data:
    """Tokenize with SentencePiece (ids are the model's ids) and append </s>; skip pairs over ``max_length``."""
    srcs = sp.encode([s for s, _ in pairs])
    tgts = sp.encode([t for _, t in pairs])
    data = Data([], [])
    for s, t in zip(srcs, tgts, strict=True):
        if len(s) < max_length and len(t) < max_length:
            data.src.append(np.array([*s, eos_id], dtype=np.int32))
            data.tgt.append(np.array([*t, eos_id], dtype=np.int32))
    return data


def learning_rate(step: int, d_model: int, t: TrainConfig) -> float:
    """The paper's schedule (§5.3); ``step`` counts from 1."""
    step = max(step, 1)
    return t.lr_factor * d_model**-0.5 * min(step**-0.5, step * t.warmup**-1.5)


@dataclass
class Progress:
    """Where a run stands; everything a resume needs besides weights, optimizer and random state."""

    step: int = 0
    epoch: int = 0
    batch: int = 0  # next batch index within the epoch
    best_chrf: float = -1.0
    history: list[dict[str, Any]] = field(default_factory=list)


class Trainer:
    """Owns the model, optimizer and data order of one run; :meth:`run` trains, checkpoints and evaluates."""

    def __init__(
        self,
        model_config: TransformerConfig,
        train_config: TrainConfig,
        data: Data,
        run_dir: Path,
        *,
        dev: list[tuple[str, str]] | None = None,
        sp: Any = None,
        meta: dict[str, Any] | None = None,
        device: str = "cpu",
    ) -> None:
        self.c, self.t, self.data, self.run_dir = model_config, train_config, data, run_dir
        self.dev, self.sp, self.meta, self.device = dev or [], sp, meta or {}, torch.device(device)
        torch.manual_seed(train_config.seed)
        self.model: Transformer = make_model(model_config).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
        self.progress = Progress()
        self._epoch_batches: list[np.ndarray] | None = None
        last = run_dir / "last.pt"
        if last.exists():
            self.load(last)
            p = self.progress
            log.info("resumed %s at step %d (epoch %d, batch %d)", last, p.step, p.epoch, p.batch)

    def epoch_batches(self) -> list[np.ndarray]:
        if self._epoch_batches is None:
            self._epoch_batches = self.data.batches(self.t.max_tokens, self.t.seed, self.progress.epoch)
        return self._epoch_batches

    def train_step(self, batch: dict[str, torch.Tensor]) -> tuple[float, int]:
        """One optimizer step; returns the mean token loss and the number of target tokens."""
        self.model.train()
        b = {k: v.to(self.device) for k, v in batch.items()}
        self.progress.step += 1
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.progress.step, self.c.d_model, self.t)
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16) if self.t.bf16 else contextlib.nullcontext()
        with autocast:
            logits = self.model(b["src"], b["src_mask"], b["tgt_in"])  # (B, T, V)
        loss = F.cross_entropy(
            logits.float().flatten(0, 1), b["labels"].flatten(), label_smoothing=self.t.label_smoothing
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        with torch.no_grad():  # the tied output projection trains the pad row; Marian and CTranslate2 need it zero
            self.model.src_embed.lut.weight[self.c.pad_id].zero_()
            self.model.tgt_embed.lut.weight[self.c.pad_id].zero_()
        return loss.item(), int((b["labels"] != -100).sum())

    def run(self, max_steps: int | None = None, show_progress: bool = True) -> list[float]:
        """Train until ``epochs`` (or ``max_steps`` more steps); returns the losses of the steps taken."""
        from tqdm import tqdm

        losses: list[float] = []
        last_save = time.monotonic()
        while self.progress.epoch < self.t.epochs and not self.plateaued():
            batches = self.epoch_batches()
            bar = tqdm(
                total=len(batches),
                initial=self.progress.batch,
                desc=f"epoch {self.progress.epoch + 1}/{self.t.epochs}",
                disable=not show_progress,
                unit="batch",
                dynamic_ncols=True,
            )
            tokens, t0 = 0, time.monotonic()
            while self.progress.batch < len(batches):
                loss, n = self.train_step(self.data.collate(batches[self.progress.batch], self.c))
                self.progress.batch += 1
                losses.append(loss)
                tokens += n
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens / (time.monotonic() - t0):.0f}")
                if time.monotonic() - last_save > self.t.checkpoint_minutes * 60:
                    self.save(self.run_dir / "last.pt")
                    last_save = time.monotonic()
                if max_steps is not None and len(losses) >= max_steps:
                    bar.close()
                    return losses
            bar.close()
            self.end_epoch(tokens / max(time.monotonic() - t0, 1e-9))
            last_save = time.monotonic()
        return losses

    def plateaued(self) -> bool:
        """Whether dev chrF's best of the last ``plateau_epochs`` epochs beats the best before them by no more than
        ``plateau_gain``: more epochs would only spend time."""
        scores = [r["dev_chrf"] for r in self.progress.history if "dev_chrf" in r]
        n = self.t.plateau_epochs
        if n <= 0 or len(scores) <= n:
            return False
        return max(scores[-n:]) - max(scores[:-n]) <= self.t.plateau_gain

    def end_epoch(self, tokens_per_s: float) -> None:
        """Dev chrF, keep the best, move to the next epoch and checkpoint."""
        record: dict[str, Any] = {
            "epoch": self.progress.epoch + 1,
            "step": self.progress.step,
            "target_tokens_per_s": round(tokens_per_s),
        }
        if self.dev and self.sp is not None:
            record["dev_chrf"] = self.dev_chrf()
            log.info("epoch %d: dev chrF %.2f", record["epoch"], record["dev_chrf"])
        self.progress.history.append(record)
        self.progress.epoch += 1
        self.progress.batch = 0
        self._epoch_batches = None
        self.save(self.run_dir / "last.pt")
        self.keep_epoch_weights()
        if record.get("dev_chrf", -1.0) > self.progress.best_chrf:
            self.progress.best_chrf = record["dev_chrf"]
            self.save(self.run_dir / "best.pt")
        (self.run_dir / "history.json").write_text(json.dumps(self.progress.history, indent=2) + "\n")

    def translate(self, texts: list[str], max_length: int = 128, batch_size: int = 64) -> list[str]:
        """Greedy translations with the PyTorch model (for dev chrF during training)."""
        self.model.eval()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[str] = [""] * len(texts)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            ids = [[*self.sp.encode(texts[i]), self.c.eos_id] for i in idx]
            S = max(map(len, ids))
            src = torch.full((len(ids), S), self.c.pad_id, dtype=torch.long)
            for row, seq in enumerate(ids):
                src[row, : len(seq)] = torch.tensor(seq)
            src = src.to(self.device)
            hyp = greedy_decode(self.model, src, (src != self.c.pad_id).long(), max_length).tolist()
            for i, seq in zip(idx, hyp, strict=True):
                seq = seq[: seq.index(self.c.eos_id)] if self.c.eos_id in seq else seq
                out[i] = self.sp.decode([t for t in seq if t != self.c.pad_id])
        return out

    def dev_chrf(self) -> float:
        import sacrebleu

        dev = self.dev[: self.t.dev_size]
        hyps = self.translate([s for s, _ in dev])
        return round(float(sacrebleu.corpus_chrf(hyps, [[t for _, t in dev]]).score), 2)

    def save(self, path: Path) -> None:
        """Atomically write a checkpoint: weights, optimizer, progress and random state."""
        _save_atomic(
            {
                "config": self.c.to_dict(),
                "train_config": asdict(self.t),
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "progress": asdict(self.progress),
                "rng": torch.get_rng_state(),
                "meta": self.meta,
            },
            path,
        )

    def keep_epoch_weights(self) -> None:
        """Write ``epochs/epoch<N>.pt`` (weights only, the format of :func:`average_checkpoints`'s output) for the
        epoch just ended, and delete those older than the last ``keep_epochs``."""
        if self.t.keep_epochs <= 0:
            return
        folder, epoch = self.run_dir / "epochs", self.progress.epoch
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        _save_atomic({"config": self.c.to_dict(), "model": state, "meta": self.meta}, folder / f"epoch{epoch}.pt")
        for old in folder.glob("epoch*.pt"):
            if int(old.stem.removeprefix("epoch")) <= epoch - self.t.keep_epochs:
                old.unlink()

    def load(self, path: Path) -> None:
        ckpt = torch.load(path, map_location=self.device, weights_only=False)
        if ckpt["config"] != self.c.to_dict():
            raise ValueError(f"{path} was trained with another model config: {ckpt['config']}")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.progress = Progress(**ckpt["progress"])
        torch.set_rng_state(ckpt["rng"])
        self._epoch_batches = None


def average_checkpoints(paths: list[Path], out: Path) -> Path:
    """Write a checkpoint whose weights are the mean of the given checkpoints' (the same model config), for export:
    averaging the last epochs smooths the noise of a still-high learning rate. No optimizer state: it is not for
    resuming.

    Raises:
        ValueError: the checkpoints are of different model configs.
    """
    ckpts = [torch.load(p, map_location="cpu", weights_only=False) for p in paths]
    if any(c["config"] != ckpts[0]["config"] for c in ckpts):
        raise ValueError("the checkpoints have different model configs: they cannot be averaged")
    state = {
        key: torch.stack([c["model"][key].float() for c in ckpts]).mean(0).to(value.dtype)
        if value.is_floating_point()
        else value
        for key, value in ckpts[-1]["model"].items()
    }
    meta = dict(ckpts[-1]["meta"])
    meta["provenance"] = {**meta.get("provenance", {}), "averaged": [str(p) for p in paths]}
    _save_atomic({"config": ckpts[-1]["config"], "model": state, "meta": meta}, out)
    return out


def _save_atomic(checkpoint: dict[str, Any], path: Path) -> None:
    """torch.save to a temporary file beside ``path``, then rename: a crash never leaves half a checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(checkpoint, tmp)
    os.replace(tmp, path)


DEFAULT_MODEL: dict[str, Any] = {
    "d_model": 256,
    "h": 8,
    "d_ff": 1024,
    "n_encoder_layers": 3,
    "n_decoder_layers": 3,
    "max_positions": 256,
}


def train(corpus: Path, run_dir: Path, *, name: str, t: TrainConfig, threads: int | None = None) -> Path:
    """``attnserve train``: train (or resume) on a corpus directory built by ``python -m model.corpus build``; returns
    best.pt."""
    import sentencepiece as spm

    if threads:
        torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sp = spm.SentencePieceProcessor(model_file=str(corpus / "spm.model"))
    V = sp.get_piece_size()
    c = TransformerConfig(
        vocab_size=V,
        pad_id=sp.pad_id(),
        eos_id=sp.eos_id(),
        unk_id=sp.unk_id(),
        decoder_start_id=sp.pad_id(),
        **DEFAULT_MODEL,
    )
    source_lang, target_lang = corpus.name.split("-")
    data = encode_pairs(sp, read_pairs(corpus / "train.tsv"), c.eos_id, t.max_length)
    log.info("%d training pairs, %d target tokens", len(data.tgt), sum(map(len, data.tgt)))
    meta = {
        "name": name,
        "source_lang": source_lang,
        "target_lang": target_lang,
        "spm": str(corpus / "spm.model"),
        "provenance": {"corpus": str(corpus), "train_config": asdict(t), "device": device},
    }
    trainer = Trainer(c, t, data, run_dir, dev=read_pairs(corpus / "dev.tsv"), sp=sp, meta=meta, device=device)
    trainer.run()
    return run_dir / "best.pt"
