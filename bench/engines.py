"""The offline engines, token ids in (ending with </s>), generated ids out (without </s>), in batches sorted by
length: CTranslate2, transformers and attnserve's runner, on weights prepared from one bundle."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

BATCH = 32
SERVICE_MAX_LENGTH = 256  # service.settings.Settings.max_length's default, the offline runs' max_length


class BatchEngine(Protocol):
    def batch(self, sources: list[list[int]], beam: int, max_length: int) -> list[list[int]]: ...


def length_batches(lengths: Sequence[int], size: int) -> list[list[int]]:
    """Indices sorted by length (ties in input order), in chunks of ``size``: the batches every engine gets."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[i : i + size] for i in range(0, len(order), size)]


def translate(
    engine: BatchEngine, sources: list[list[int]], beam: int, max_length: int, batch_size: int = BATCH
) -> list[list[int]]:
    """Every source through ``engine`` in batches of ``batch_size`` sorted by length; outputs in input order."""
    out: list[list[int]] = [[] for _ in sources]
    for idx in length_batches([len(s) for s in sources], batch_size):
        for i, tokens in zip(idx, engine.batch([sources[i] for i in idx], beam, max_length), strict=True):
            out[i] = tokens
    return out


def strip_eos(tokens: Sequence[int], eos: int) -> list[int]:
    return list(tokens[:-1]) if tokens and tokens[-1] == eos else list(tokens)


class AttnserveEngine:
    """attnserve's runner without HTTP: ``decode(open_runner(bundle, provider, threads, variant, role, io_binding),
    requests)``, on the graphs /translate uses (float32 on the CPU: the fast decoder), or ``device_decoder``'s."""

    def __init__(
        self,
        bundle_dir: Path,
        variant: str = "float32",
        threads: int = 1,
        provider: str = "cpu",
        io_binding: bool | None = None,
        device_decoder: bool = False,
    ) -> None:
        from service.runtime.bundle import load_bundle
        from service.runtime.runner import DecoderRole, open_runner

        self.bundle = load_bundle(bundle_dir, verify=False)
        fast = variant == "float32" and provider == "cpu"  # /translate's on the CPU
        role: DecoderRole = "device_decoder" if device_decoder else "fast_decoder" if fast else "decoder"
        self.runner = open_runner(self.bundle, provider, threads, variant, role, io_binding)  # type: ignore[arg-type]
        self.eos = self.bundle.spec.eos_id

    def batch(self, sources: list[list[int]], beam: int, max_length: int) -> list[list[int]]:
        from service.decoding import DecodeRequest, decode

        # No scores, like CTranslate2's translate_batch by default (return_scores=False): greedy skips the softmax.
        requests = [DecodeRequest(src=s, beam_size=beam, max_length=max_length, scores=False) for s in sources]
        return [strip_eos(r.hypotheses[0].tokens, self.eos) for r in decode(self.runner, requests)]


class CTranslate2Engine:
    """``ctranslate2.Translator`` on a converted model; it takes token strings, so ids go through the vocabulary.

    Its Marian converter drops ``<pad>`` (our last id) from the vocabulary, so the other ids stay the same, and it
    does not append ``</s>``: the sources keep ours.
    """

    def __init__(
        self,
        ct2_dir: Path,
        vocab: dict[str, int],
        compute_type: str = "float32",
        threads: int = 1,
        device: str = "cpu",
    ) -> None:
        import ctranslate2

        self.translator = ctranslate2.Translator(
            str(ct2_dir), device=device, compute_type=compute_type, intra_threads=threads, inter_threads=1
        )
        self.ids = vocab
        self.pieces = {i: p for p, i in vocab.items()}
        self.unk = vocab.get("<unk>", 1)

    def batch(self, sources: list[list[int]], beam: int, max_length: int) -> list[list[int]]:
        results = self.translator.translate_batch(
            [[self.pieces[i] for i in s] for s in sources],
            max_batch_size=len(sources),  # the batch we were given (32 in the offline runs), sorted by length
            beam_size=beam,  # 1 = greedy search
            num_hypotheses=1,
            length_penalty=1.0,
            max_decoding_length=max_length,  # generated tokens, </s> included, as our max_length
            min_decoding_length=0,  # its default (1) would forbid </s> first; ours does not
            max_input_length=0,  # no truncation
            return_end_token=False,
        )
        return [[self.ids.get(p, self.unk) for p in r.hypotheses[0]] for r in results]


class TransformersEngine:
    """``MarianMTModel.generate`` on the exported directory (the common choice)."""

    def __init__(self, hf_dir: Path, threads: int = 1, device: str = "cpu", dtype: str = "float32") -> None:
        import torch
        from transformers import MarianMTModel

        if device == "cpu":
            torch.set_num_threads(threads)
        self.device = device
        model: Any = MarianMTModel.from_pretrained(hf_dir, dtype=getattr(torch, dtype))
        self.model = model.to(device).eval()
        self.pad = int(self.model.config.pad_token_id)
        self.eos = int(self.model.config.eos_token_id)

    def batch(self, sources: list[list[int]], beam: int, max_length: int) -> list[list[int]]:
        import torch

        S = max(len(s) for s in sources)
        ids = torch.full((len(sources), S), self.pad, dtype=torch.long)  # (B, S)
        mask = torch.zeros((len(sources), S), dtype=torch.long)
        for i, s in enumerate(sources):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                num_beams=beam,
                do_sample=False,
                max_new_tokens=max_length,
                num_return_sequences=1,
            )
        return [self._generated(row) for row in out.tolist()]

    def _generated(self, row: list[int]) -> list[int]:
        row = row[1:]  # the decoder start token
        if self.eos in row:
            row = row[: row.index(self.eos)]
        return [t for t in row if t != self.pad]  # padding after a finished row (pad is never generated)


# ---------------------------------------------------------------------------------------------------------------
# Preparation (torch, in the parent): int8 graphs, the MarianMTModel directory, the CTranslate2 model.


@dataclass(frozen=True)
class Prepared:
    bundle: Path  # has float32 and int8 graphs
    hf: Path  # MarianMTModel directory
    ct2: Path  # CTranslate2 model directory
    vocab: dict[str, int]  # piece -> id

    @classmethod
    def read(cls, work: Path) -> Prepared:
        setup = json.loads((work / "setup.json").read_text())
        hf = Path(setup["hf"])
        vocab = Path(setup.get("vocab", hf / "vocab.json"))  # a model with no MarianMTModel directory: its own
        return cls(Path(setup["bundle"]), hf, Path(setup["ct2"]), json.loads(vocab.read_text()))


def prepare(
    bundle_dir: Path, work: Path, variants: Sequence[str] = ("int8",), with_ctranslate2: bool = True
) -> Prepared:
    """Make what the engines load, under ``work``; reused when ``work`` already holds them for this bundle.

    Args:
        bundle_dir: the bundle.
        work: a directory for a copy of the bundle with the ``variants`` it lacks, the MarianMTModel directory and
            the CTranslate2 model.
        variants: graph variants the bundle used must have (``int8``, ``float16``), made in the copy if missing.
        with_ctranslate2: convert the CTranslate2 model too (False: no CTranslate2 needed, and ``ct2`` is not made).

    Raises:
        service.runtime.bundle.BundleError: the bundle is missing or corrupted.
    """
    from model.export.quantize import ADD_VARIANT
    from model.importers.marian import export_marian
    from service.runtime.bundle import load_bundle
    from service.runtime.manifest import MANIFEST, is_bundle, sha256

    work.mkdir(parents=True, exist_ok=True)
    stamp = f"{bundle_dir.resolve()} {sha256(bundle_dir / MANIFEST)}"
    if (work / "stamp").exists() and (work / "stamp").read_text() != stamp:
        for name in ("bundle", "marian", "ctranslate2"):
            shutil.rmtree(work / name, ignore_errors=True)
    (work / "stamp").write_text(stamp)
    bundle = load_bundle(bundle_dir)
    missing = [v for v in variants if v not in bundle.variants]
    if missing:
        copy = work / "bundle"
        if not is_bundle(copy) or set(missing) - set(load_bundle(copy, verify=False).variants):
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(bundle_dir, copy)
            for variant in missing:
                ADD_VARIANT[variant](copy)
        bundle_dir = copy
    hf, ct2 = work / "marian", work / "ctranslate2"
    if not (hf / "config.json").exists():
        export_marian(bundle_dir, hf, force=True)
    if with_ctranslate2 and not (ct2 / "model.bin").exists():
        import ctranslate2

        ctranslate2.converters.TransformersConverter(str(hf)).convert(str(ct2), force=True)
    vocab = json.loads((hf / "vocab.json").read_text())
    return Prepared(bundle_dir, hf, ct2, vocab)


def make_engine(name: str, compute: str, threads: int, prepared: Prepared) -> BatchEngine:
    """Load one engine on the CPU.

    Args:
        name: ``ctranslate2``, ``transformers`` or ``attnserve``.
        compute: ``float32`` or ``int8`` (not for transformers).
    """
    if name == "ctranslate2":
        return CTranslate2Engine(prepared.ct2, prepared.vocab, compute, threads)
    if name == "transformers":
        if compute != "float32":
            raise ValueError("the transformers engine runs float32 only")
        return TransformersEngine(prepared.hf, threads)
    if name == "attnserve":
        return AttnserveEngine(prepared.bundle, compute, threads)
    raise ValueError(f"unknown engine {name!r}")
