"""service/decoding/decoder.py on a fake runner (no ONNX): batched beam search equals plain beam search, with
rows joining and leaving, ageing into the old batch, appended caches and caches written in place (grouped)."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import pytest

from service.decoding import BatchDecoder, DecodeRequest, DecodeResult, decode
from service.runtime.bundle import GraphForm, ModelSpec
from service.runtime.runner import Candidates, StepInput, StepOutput
from tests.service.fake_runner import APPENDED, IN_PLACE, FakeRunner

GATHERED = GraphForm("decoder", attentions=False, cache="gathered", candidates=True)  # as decoder.device.onnx

# BatchDecoder against a plain beam search, on a fake model whose next-token distribution depends on the whole
# prefix as the row's own cache holds it: a cache row moved to the wrong place, or a neighbour's slot read, changes
# the answer. Few tokens are possible after each prefix, so some beams get fewer than k continuations.
V, PAD, EOS = 12, 11, 0
SPEC = ModelSpec(
    vocab_size=V, d_model=4, h=2, n_encoder_layers=1, n_decoder_layers=1, max_positions=64,
    pad_id=PAD, eos_id=EOS, unk_id=1, decoder_start_id=PAD,
)  # fmt: skip
TABLE = np.random.default_rng(5).standard_normal((101, V)).astype(np.float32) * 2
TABLE[np.random.default_rng(6).random((101, V)) < 0.6] = -np.inf  # most tokens impossible after a prefix
TABLE[:, PAD] = -np.inf
TABLE[:, 2] = np.maximum(TABLE[:, 2], -3)  # one always possible


def next_log_probs(seed: int, prefix: list[int]) -> np.ndarray:
    h = (seed * 31 + sum((i + 1) * 7 * t for i, t in enumerate(prefix)) + 3 * len(prefix)) % 101
    row = TABLE[h]
    return row - (row.max() + np.log(np.exp(row - row.max()).sum()))


class PrefixModel(FakeRunner):
    """Caches keep each fed token (and its position); a row's next token depends on its source and its prefix.
    With ``form`` IN_PLACE its step writes them into the buffers it is given (slot = position), as the fast graphs
    do, and takes cross rows that serve G rows each; with GATHERED its step gathers each row's parent's caches and
    its source's cross row, and gives candidates, as the device decoder does."""

    spec = SPEC

    def __init__(self, form: GraphForm = APPENDED) -> None:
        super().__init__()
        self.form = form

    def step(self, step: StepInput) -> StepOutput:  # never asked for tokens: no greedy tokens
        if self.form.candidates:
            return self._candidates(step)
        input_ids, position_ids, self_mask = step.input_ids, step.position_ids, step.self_attention_mask
        cross_keys, past_keys, past_values = step.cross_keys, step.past_keys, step.past_values
        B = len(input_ids)
        self.step_rows.append(B)
        new = np.zeros((B, 2, 1, 2), np.float32)
        new[:, 0, 0, 0], new[:, 0, 0, 1] = input_ids[:, 0], position_ids[:, 0]
        if self_mask is None:  # in place: row b's tokens at slots 0 .. position
            keys = past_keys[0]
            keys[np.arange(B), :, position_ids[:, 0]] = new[:, :, 0]
            owned_slots = [np.arange(p + 1) for p in position_ids[:, 0].tolist()]
        else:
            keys = np.concatenate([past_keys[0], new], axis=2)
            owned_slots = [np.flatnonzero(self_mask[b] == 1) for b in range(B)]
        G = B // len(step.encoder_attention_mask)  # rows a cross row serves
        out = np.zeros((B, V), np.float32)
        for b in range(B):
            owned = keys[b, 0, owned_slots[b]]  # (t + 1, 2): start token, then the prefix, in position order
            prefix = [int(t) for t in owned[np.argsort(owned[:, 1]), 0][1:]]
            out[b] = next_log_probs(int(cross_keys[0][b // G, 0, 0, 0]), prefix)
        if self_mask is None:
            return StepOutput(out, past_keys, past_values, None, None)
        T = keys.shape[2]
        return StepOutput(out, [keys], [keys.copy()], np.zeros((1, B, 2, T), np.float32), None)

    def _candidates(self, step: StepInput) -> StepOutput:
        parent_rows, source_rows = step.parent_rows, step.source_rows
        assert parent_rows is not None and source_rows is not None
        input_ids, position_ids, cross_keys, past_keys = (
            step.input_ids,
            step.position_ids,
            step.cross_keys,
            step.past_keys,
        )
        B = len(input_ids)
        self.step_rows.append(B)
        new = np.zeros((B, 2, 1, 2), np.float32)
        new[:, 0, 0, 0], new[:, 0, 0, 1] = input_ids[:, 0], position_ids[:, 0]
        keys = np.concatenate([past_keys[0][parent_rows], new], axis=2)  # row b owns its last position + 1 slots
        out = np.zeros((B, V), np.float32)
        for b in range(B):
            owned = keys[b, 0, keys.shape[2] - 1 - position_ids[b, 0] :]
            prefix = [int(t) for t in owned[np.argsort(owned[:, 1]), 0][1:]]
            out[b] = next_log_probs(int(cross_keys[0][source_rows[b], 0, 0, 0]), prefix)
        tokens = np.argsort(-out, axis=1, kind="stable")[:, : step.candidates]  # the lower token first among equals
        top = out.max(axis=1)
        log_norm = top + np.log(np.exp(out - top[:, None]).sum(axis=1))
        chosen = Candidates(tokens, np.take_along_axis(out, tokens, axis=1), log_norm.astype(np.float32))
        return StepOutput(np.empty((0, V), np.float32), [keys], [keys.copy()], None, None, out.argmax(axis=1), chosen)


def reference(seed: int, k: int, max_length: int, lp: float) -> list[tuple[list[int], float]]:
    """Beam search as docs/ARCHITECTURE.md says, one request alone, in plain Python."""
    live: list[tuple[list[int], float]] = [([], 0.0)]
    finished: list[tuple[list[int], float]] = []
    for t in range(1, max_length + 1):
        scored = [(s + float(p[v]), i, v) for i, (tokens, s) in enumerate(live)
                  for p in [next_log_probs(seed, tokens)] for v in range(V)]  # fmt: skip
        ranked = sorted((c for c in scored if np.isfinite(c[0])), key=lambda c: (-c[0], c[1], c[2]))[: 2 * k]
        children = []
        for rank, (s, i, v) in enumerate(ranked):
            if v == EOS:
                if rank < k:
                    finished.append(([*live[i][0], v], s))
                continue
            children.append(([*live[i][0], v], s))
            if len(children) == k:
                break
        if len(finished) >= k or t >= max_length or not children:
            if t >= max_length:
                finished.extend(children)
            break
        live = children
    return sorted(finished, key=lambda h: -h[1] / len(h[0]) ** lp)


@pytest.mark.parametrize(
    ("form", "age"), [(APPENDED, 32), (APPENDED, 2), (IN_PLACE, 32), (GATHERED, 32), (GATHERED, 2)]
)  # 2: rows move to the old batch often, one or many at a time; caches written in place never age
def test_batched_beams_equal_plain_beam_search(form: GraphForm, age: int) -> None:
    rng = np.random.default_rng(0)
    requests = [
        DecodeRequest(src=[int(rng.integers(2, 10)), EOS], beam_size=int(k), max_length=int(n), n_best=int(k),
                      length_penalty=float(lp))
        for k, n, lp in zip(rng.choice([1, 2, 3, 4, 5], 24), rng.integers(1, 12, 24), rng.choice([0.6, 1.0], 24),
                            strict=True)
    ]  # fmt: skip
    model = PrefixModel(form)
    decoder = BatchDecoder(model, age=age)
    decoder.admit(list(enumerate(requests[:6])))
    assert decoder.num_rows == sum(r.beam_size for r in requests[:6]) > 6
    pending = list(enumerate(requests))[6:]
    results: dict[Hashable, DecodeResult] = {}
    both = 0  # steps with rows in both batches
    while decoder.num_rows:
        both += bool(decoder.young.num_rows and decoder.old.num_rows)
        done, _ = decoder.step()
        results.update(done)
        for _ in done[:2]:  # newcomers take the holes, or join at the end
            if pending:
                decoder.admit([pending.pop(0)])
    assert len(results) == len(requests)
    first = 6 if form != GATHERED else sum(r.beam_size for r in requests[:6])  # gathered: every row, ignored but one
    assert model.step_rows[0] == first  # the first step decodes one row a request: the other beams are still empty
    assert (both > 10) == (age == 2)
    for i, r in enumerate(requests):
        want = reference(r.src[0], r.beam_size, r.max_length, r.length_penalty)[: r.n_best]
        got = results[i].hypotheses
        assert [h.tokens for h in got] == [w[0] for w in want], f"request {i} ({r})"
        assert [h.score for h in got] == pytest.approx([w[1] for w in want], abs=1e-5)


def test_beams_of_one_width_share_their_sources_in_place() -> None:
    """Caches written in place in host buffers, beam requests of one width: one cross row serves a request's k
    rows through holes, compaction and newcomers of that width, until a greedy newcomer ungroups them; every
    answer is plain beam search's."""
    requests = [DecodeRequest(src=[2 + i % 7, EOS], beam_size=3, max_length=2 + i, n_best=3) for i in range(12)]
    requests.append(DecodeRequest(src=[5, EOS], max_length=6))  # greedy
    model = PrefixModel(IN_PLACE)
    decoder = BatchDecoder(model)
    decoder.admit(list(enumerate(requests[:8])))
    results: dict[Hashable, DecodeResult] = {}
    groups, pending = [], list(enumerate(requests))[8:]
    while decoder.num_rows:
        groups.append(decoder.young.caches.group)
        done, _ = decoder.step()
        results.update(done)
        if done and pending:
            decoder.admit([pending.pop(0)])
    assert groups[0] == 3 and groups[-1] == 1, groups
    for i, r in enumerate(requests):
        want = reference(r.src[0], r.beam_size, r.max_length, r.length_penalty)[: r.n_best]
        assert [h.tokens for h in results[i].hypotheses] == [w[0] for w in want], f"request {i} ({r})"


def prefixed_reference(
    seed: int, k: int, max_length: int, lp: float, prefix: list[int]
) -> list[tuple[list[int], float]]:
    """Beam search after a forced prefix as CTranslate2 does it (src/decoding.cc, ``target_prefix``), in plain
    Python: the prefix scores 0 and counts in the length; on the first step after it only the best continuation may
    be </s>, a lower one taking a child's place without being one; hypotheses come back without the prefix."""
    live: list[tuple[list[int], float]] = [(list(prefix), 0.0)]
    finished: list[tuple[list[int], float]] = []
    for t in range(len(prefix) + 1, max_length + 1):
        scored = [(s + float(p[v]), i, v) for i, (tokens, s) in enumerate(live)
                  for p in [next_log_probs(seed, tokens)] for v in range(V)]  # fmt: skip
        ranked = sorted((c for c in scored if np.isfinite(c[0])), key=lambda c: (-c[0], c[1], c[2]))[: 2 * k]
        children: list[tuple[list[int], float]] = []
        places = 0
        for rank, (s, i, v) in enumerate(ranked):
            dropped = v == EOS and rank >= 1 and t == len(prefix) + 1 and prefix
            if v == EOS and not dropped:
                if rank < k:
                    finished.append(([*live[i][0], v], s))
                continue
            places += 1
            if not dropped:
                children.append(([*live[i][0], v], s))
            if places == k:
                break
        if len(finished) >= k or t >= max_length or not children:
            if t >= max_length:
                finished.extend(children)
            break
        live = children
    ranked_all = sorted(finished, key=lambda h: -h[1] / len(h[0]) ** lp)
    return [(tokens[len(prefix) :], s) for tokens, s in ranked_all]


@pytest.mark.parametrize("form", [APPENDED, IN_PLACE, GATHERED])
def test_a_forced_prefix_decodes_as_ctranslate2s_target_prefix_batched_or_not(form: GraphForm) -> None:
    """Greedy, beam and forced requests with target prefixes of 0 to 2 tokens, joining a running batch or decoded
    alone, give CTranslate2's hypotheses (prefix scored 0, counted in lengths, left out) with the same scores. (A
    gathered decoder's candidates serve no forced request: the engine sends those to the exact runner.)"""
    rng = np.random.default_rng(1)
    requests = []
    for i in range(30):
        prefix = tuple(int(t) for t in rng.integers(2, 10, int(rng.integers(0, 3))))
        k, n = int(rng.choice([1, 2, 3, 4])), len(prefix) + int(rng.integers(1, 10))
        forced = [int(t) for t in rng.integers(2, 10, int(rng.integers(0, 4)))] + [EOS] if i % 10 == 9 else None
        forced = None if form == GATHERED else forced
        requests.append(DecodeRequest(src=[int(rng.integers(2, 10)), EOS], beam_size=1 if forced else k,
                                      max_length=n, n_best=1 if forced else k, length_penalty=0.2, forced=forced,
                                      prefix=prefix))  # fmt: skip
    alone = {i: decode(PrefixModel(form), [r])[0] for i, r in enumerate(requests)}
    decoder, results, pending = BatchDecoder(PrefixModel(form)), {}, list(enumerate(requests))[8:]
    decoder.admit(list(enumerate(requests[:8])))
    while decoder.num_rows:
        done, _ = decoder.step()
        results.update(done)
        for _ in done[:2]:
            if pending:
                decoder.admit([pending.pop(0)])
    assert sum(bool(r.prefix) for r in requests) > 15
    for i, r in enumerate(requests):
        got = results[i].hypotheses
        assert [h.tokens for h in got] == [h.tokens for h in alone[i].hypotheses], f"request {i} ({r})"
        if r.forced is not None:
            assert got[0].tokens == r.forced
            assert got[0].score == pytest.approx(
                sum(next_log_probs(r.src[0], [*r.prefix, *r.forced[:t]])[v] for t, v in enumerate(r.forced)), abs=1e-5
            )
            continue
        want = prefixed_reference(r.src[0], r.beam_size, r.max_length, r.length_penalty, list(r.prefix))[: r.n_best]
        assert [h.tokens for h in got] == [w[0] for w in want], f"request {i} ({r})"
        assert [h.score for h in got] == pytest.approx([w[1] for w in want], abs=1e-5)
