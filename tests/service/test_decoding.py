"""The step scores of service/decoding.py: log-probabilities without the (N, V) array, exact beam candidates, and
the packing of sources into encoder rows."""

from __future__ import annotations

import itertools
from collections.abc import Hashable

import numpy as np
import pytest

from service import _beam
from service.bundle import ModelSpec
from service.decoding import BatchDecoder, DecodeRequest, DecodeResult, beam_places, beam_top, pack
from service.decoding.search import Scores
from service.runner import StepOutput
from tests.service.fake_runner import FakeRunner


def brute_force(logits: np.ndarray, rows: list[int], scores: np.ndarray, n: int) -> list[tuple[int, int]]:
    """One request's n best (row, token) continuations, from every log-probability written out."""
    logp = logits - (logits.max(1) + np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)))[:, None]
    ranked = sorted(
        ((scores[j] + logp[r, v], r, v) for j, r in enumerate(rows) for v in range(logits.shape[1])),
        key=lambda t: (-t[0], t[1], t[2]),
    )
    return [(r, v) for value, r, v in ranked[:n] if np.isfinite(value)]


@pytest.mark.parametrize("spread", [0.1, 3.0, 30.0])  # flat to peaked
@pytest.mark.parametrize("V", [256, 203, 53, 8])  # whole blocks of 64, a tail block, fewer tokens than a block
def test_beam_candidates_are_the_exact_best(spread: float, V: int) -> None:
    rng = np.random.default_rng(int(spread * 10) + V)
    logits = (rng.standard_normal((9, V)) * spread).astype(np.float32)
    logits[:, 7] = -np.inf  # padding
    logits[4, 2] = logits[4, 3] = logits[4].max() + 1  # a tie, broken by token
    logits[8] = logits[0]  # rows 8 and 0 of request 1, with equal scores: ties across rows, broken by row
    s = Scores(logits.copy(), np.ones(len(logits), bool))
    rows = np.array([[1, 2, 4], [8, 0, 6], [3, 5, 7]])  # three requests of three rows, not in batch order
    scores = np.array([[-0.5, -2.0, -np.inf], [-1.0, -1.0, -3.0], [-np.inf, -0.1, -np.inf]])  # -inf: not alive
    n = 6
    j, r, v, value = beam_top(s, rows, scores, n)
    assert np.all(np.diff(j) >= 0), "request by request"
    for q in range(len(rows)):
        want = brute_force(logits, sorted(rows[q]), scores[q][np.argsort(rows[q])], n)
        assert list(zip(r[j == q].tolist(), v[j == q].tolist(), strict=True)) == want
    assert not np.isin(v, 7).any() and np.isfinite(value).all()
    assert s.logp(np.array([2]), np.array([3]))[0] == pytest.approx(
        float(logits[2, 3] - np.log(np.exp(logits[2].astype(np.float64)).sum())), abs=1e-5
    )


def test_log_normalizers_and_block_maxima() -> None:
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((6, 8000)) * np.array([[0.01], [1], [10], [100], [1], [1]])).astype(np.float32)
    logits[:, 7999] = -np.inf  # padding
    logits[4, :4000] = -np.inf
    s = Scores(logits.copy(), np.array([True, True, True, True, True, False]))
    x = logits[:5].astype(np.float64)
    want = x.max(1) + np.log(np.exp(x - x.max(1, keepdims=True)).sum(1))
    np.testing.assert_allclose(s.log_norm[:5], want, rtol=2e-7, atol=2e-6)
    padded = np.pad(logits, ((0, 0), (0, 64 * 125 - 8000)), constant_values=-np.inf)
    np.testing.assert_array_equal(s.block_max[:5], padded[:5].reshape(5, 125, 64).max(2))
    assert np.isnan(s.log_norm[5]) and np.isnan(s.block_max[5]).all()


def test_the_c_step_refuses_arrays_it_cannot_read() -> None:
    logits = np.zeros((2, 70), np.float32)
    log_norm, block_max = np.zeros(2, np.float32), np.zeros((2, 2), np.float32)
    for bad in (
        (logits.astype(np.float64), np.arange(2), log_norm, block_max),  # wrong dtype
        (logits, np.array([0, 2]), log_norm, block_max),  # a row out of range
        (logits, np.arange(2), log_norm, np.zeros((2, 1), np.float32)),  # too few blocks
        (np.zeros((2, 140), np.float32)[:, ::2], np.arange(2), log_norm, block_max),  # not contiguous
    ):
        with pytest.raises((ValueError, BufferError)):
            _beam.scores(*bad)
    out = [np.zeros(4, np.int64), np.zeros(4, np.int64), np.zeros(4, np.int64), np.zeros(4)]
    with pytest.raises(ValueError):  # room for fewer than J n candidates
        _beam.top(logits, log_norm, block_max, np.array([[0, 1]]), np.zeros((1, 2)), 8, *out)


def test_rows_are_copied_with_their_own_slot_counts() -> None:
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((6, 2, 5, 3)).astype(np.float32)
    dst, src, used = np.array([4, 0, 5]), np.array([1, 3, 2]), np.array([4, 0, 2])
    want = cache.copy()
    for d, s_, u in zip(dst, src, used, strict=True):
        want[d, :, :u] = want[s_, :, :u]
    _beam.copy_rows(cache, dst, cache, src, used)  # in place
    np.testing.assert_array_equal(cache, want)

    out = np.full((3, 2, 8, 3), 7, np.float32)  # another array, more slots: the rest left as it was
    _beam.copy_rows(out, np.array([2, 0]), cache, np.array([5, 1]), np.array([5, 1]))
    np.testing.assert_array_equal(out[2, :, :5], cache[5])
    np.testing.assert_array_equal(out[0, :, :1], cache[1, :, :1])
    assert (out[2, :, 5:] == 7).all() and (out[0, :, 1:] == 7).all() and (out[1] == 7).all()

    one = np.array([1])
    for bad in (
        (cache, dst, cache, src, np.array([4, 0, 6])),  # more slots than the cache has
        (out, one, cache, one, np.array([6])),  # more slots than the source has
        (cache, np.array([6]), cache, np.array([0]), one),  # a row out of range
        (cache, dst, cache, src[:2], used),  # unpaired rows
        (cache, dst, cache, src, used[:2]),  # unpaired counts
        (cache[0], dst, cache[0], src, used),  # not 4-d
        (np.zeros((6, 3, 5, 3), np.float32), dst, cache, src, used),  # other heads
        (cache.astype(np.float64), dst, cache, src, used),  # other type
        (cache[:, :, ::2], dst, cache, src, used),  # not contiguous
    ):
        with pytest.raises((ValueError, BufferError)):
            _beam.copy_rows(*bad)


def test_spans_are_copied_and_the_rest_zeroed() -> None:
    rng = np.random.default_rng(1)
    cache = rng.standard_normal((3, 2, 9, 4)).astype(np.float32)  # packed encoder rows
    out = np.full((5, 2, 6, 4), np.nan, np.float32)
    dst, src, start, used = np.array([4, 0, 2]), np.array([1, 1, 0]), np.array([0, 5, 3]), np.array([5, 4, 6])
    _beam.copy_spans(out, dst, cache, src, start, used)
    for d, s_, f, u in zip(dst, src, start, used, strict=True):
        np.testing.assert_array_equal(out[d, :, :u], cache[s_, :, f : f + u])
        assert (out[d, :, u:] == 0).all()
    assert np.isnan(out[[1, 3]]).all()  # other rows untouched
    one = np.array([0])
    for bad in (
        (out, one, cache, one, np.array([4]), np.array([6])),  # past the source row's end
        (out, one, cache, one, one, np.array([7])),  # more slots than out has
        (out, np.array([5]), cache, one, one, one),  # a row out of range
        (out, dst, cache, src, start[:2], used),  # unpaired
        (out, dst, cache.astype(np.float64), src, start, used),  # other type
    ):
        with pytest.raises((ValueError, BufferError)):
            _beam.copy_spans(*bad)


def test_no_live_row_gives_no_candidates() -> None:
    s = Scores(np.zeros((2, 5), np.float32), np.ones(2, bool))
    j, r, v, value = beam_top(s, np.array([[0, 1]]), np.array([[-np.inf, -np.inf]]), 4)
    assert len(j) == len(r) == len(v) == len(value) == 0


def test_beam_children_stay_in_their_parents_rows() -> None:
    rows = np.array([[4, 0, 7], [1, 6, 2], [3, 5, 8]])  # three requests of three rows, not in batch order
    j = np.array([0, 0, 0, 1, 1, 2])  # request 1 has two children, request 2 one
    parent = np.array([7, 7, 4, 6, 6, 5])  # best first
    place = beam_places(rows, j, parent)
    assert len(set(place.tolist())) == len(place), "one child a row"
    assert all(p in rows[q] for q, p in zip(j.tolist(), place.tolist(), strict=True)), "in its request's rows"
    assert place[[0, 2, 3, 5]].tolist() == [7, 4, 6, 5], "a parent's first child stays: no cache copied"
    assert place[1] == 0 and place[4] in (1, 2)  # the others take rows whose hypotheses got no child


def test_pack_fills_rows_longest_first_and_packs_only_when_it_saves_tokens() -> None:
    lengths = np.array([3, 30, 5, 2, 28])
    row, start = pack(lengths, 32)
    # 30 and 28 open rows 0 and 1; 5 fits neither (35, 33 > 32) and opens row 2; 3 goes after 28; 2 after 30.
    assert row.tolist() == [1, 0, 2, 0, 1] and start.tolist() == [28, 0, 0, 30, 0]
    for r in range(3):  # no text overlaps another or the row's end
        spans = sorted((int(start[i]), int(start[i] + lengths[i])) for i in np.flatnonzero(row == r))
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans)) and spans[-1][1] <= 32
    row, start = pack(np.array([7, 8, 8]))  # 23 tokens in one row instead of 3 × 8 padded
    assert row.tolist() == [0, 0, 0] and sorted(start.tolist()) == [0, 8, 16]
    # A row each (20 + 20 > 32; 3 + 40 > 40), or packed no cheaper than padded (2 rows × 20 > 3 × 10): one a row.
    for lengths, width in (([20, 20], 32), ([40, 3], 32), ([10, 10, 10], 20)):
        row, start = pack(np.array(lengths), width)
        assert row.tolist() == list(range(len(lengths))) and not start.any()


def test_only_scored_rows_get_log_probabilities() -> None:
    logits = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    scored = np.array([True, False, True, False])
    s = Scores(logits.copy(), scored)
    want = np.log(np.exp(logits.astype(np.float64)).sum(1))
    np.testing.assert_allclose(s.log_norm[scored], want[scored], atol=1e-5)
    assert np.isnan(s.log_norm[~scored]).all()
    np.testing.assert_array_equal(Scores(logits.copy(), np.ones(4, bool)).log_norm[scored], s.log_norm[scored])


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
    """Caches keep each fed token (and its position); a row's next token depends on its source and its prefix."""

    spec = SPEC

    def step(
        self,
        input_ids,
        position_ids,
        encoder_mask,
        self_mask,
        cross_keys,
        cross_values,
        past_keys,
        past_values,
        tokens=False,  # never asked: appended caches
    ) -> StepOutput:
        B = len(input_ids)
        self.step_rows.append(B)
        new = np.zeros((B, 2, 1, 2), np.float32)
        new[:, 0, 0, 0], new[:, 0, 0, 1] = input_ids[:, 0], position_ids[:, 0]
        keys = np.concatenate([past_keys[0], new], axis=2)
        out = np.zeros((B, V), np.float32)
        for b in range(B):
            owned = keys[b, 0, self_mask[b] == 1]  # (t + 1, 2): start token, then the prefix, in position order
            prefix = [int(t) for t in owned[np.argsort(owned[:, 1]), 0][1:]]
            out[b] = next_log_probs(int(cross_keys[0][b, 0, 0, 0]), prefix)
        T = keys.shape[2]
        return StepOutput(out, [keys], [keys.copy()], np.zeros((1, B, 2, T), np.float32), None)


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


@pytest.mark.parametrize("age", [32, 2])  # 2: rows move to the old batch often, one or many at a time
def test_batched_beams_equal_plain_beam_search(age: int) -> None:
    rng = np.random.default_rng(0)
    requests = [
        DecodeRequest(src=[int(rng.integers(2, 10)), EOS], beam_size=int(k), max_length=int(n), n_best=int(k),
                      length_penalty=float(lp))
        for k, n, lp in zip(rng.choice([1, 2, 3, 4, 5], 24), rng.integers(1, 12, 24), rng.choice([0.6, 1.0], 24),
                            strict=True)
    ]  # fmt: skip
    model = PrefixModel()
    decoder = BatchDecoder(model, age=age)  # type: ignore[arg-type]
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
    assert model.step_rows[0] == 6  # the first step decodes one row a request: the other beams are still empty
    assert (both > 10) == (age == 2)
    for i, r in enumerate(requests):
        want = reference(r.src[0], r.beam_size, r.max_length, r.length_penalty)[: r.n_best]
        got = results[i].hypotheses
        assert [h.tokens for h in got] == [w[0] for w in want], f"request {i} ({r})"
        assert [h.score for h in got] == pytest.approx([w[1] for w in want], abs=1e-5)
