"""A batch: rows decoded by one decoder call a step, their requests, and their caches (one
:class:`~service.decoding.caches.CacheLayout`, chosen when the decoder is built)."""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterator

import numpy as np

from service.decoding.caches import CacheLayout
from service.decoding.constraint import OUTSIDE
from service.decoding.encoding import Encoded
from service.decoding.repetition import penalize
from service.decoding.request import DecodeResult
from service.decoding.rows import Job, Plan, Rows
from service.decoding.search import CandidateScores, Scores, beam_choose, force, greedy
from service.decoding.step_runner import StepRunner
from service.runtime.bundle import ModelSpec
from service.runtime.runner import StepOutput


class Batch:
    """Rows decoded by one decoder call a step, padded to one cache length T and one source length S.

    The rows of a finished or cancelled request become holes rather than being copied out at once: newcomers take
    their places (their cache rows written in place; when the holes are too few, the batch grows by the rest, without
    compacting first), and the batch is compacted only when holes are a quarter of it and either MIN_HOLES or more,
    or nobody joined for QUIET steps. A hole is still computed by the decoder, and ignored.

    Args:
        runner: the step runner.
        numbers: request numbers, shared by the batches of one decoder.
        caches: empty caches of the decoder's layout.
    """

    # Compacting whenever a quarter of a small batch were holes, then growing it again for the next newcomer,
    # copies every cache each time under a steady stream of joins; an offline batch, where nobody joins, still
    # compacts as soon as a quarter are holes.
    MIN_HOLES, QUIET = 8, 8

    def __init__(self, runner: StepRunner, numbers: Iterator[int], caches: CacheLayout) -> None:
        self.runner = runner
        self.spec: ModelSpec = runner.spec
        self._numbers = numbers
        self.caches = caches
        self.reset()

    def reset(self) -> None:
        """Forget every row (after a runner failure, or when the last row left)."""
        self.rows = Rows()
        self._plan: Plan | None = None  # of self.rows; None when rows joined or left since
        self.jobs: dict[int, Job] = {}  # by request number (Rows.job)
        self.quiet = 0  # steps since requests last joined
        self.caches = self.caches.fresh()

    @property
    def num_rows(self) -> int:
        """Rows that decode a request (holes not counted)."""
        return int(np.count_nonzero(self.rows.job >= 0))

    @property
    def plan(self) -> Plan:
        """What a step does with the rows."""
        if self._plan is None:
            self._plan = Plan.of(self.rows)
        return self._plan

    @property
    def keys(self) -> set[Hashable]:
        """The keys of the requests it decodes."""
        return {job.key for job in self.jobs.values()}

    @property
    def slots(self) -> int:
        """T: the cache length."""
        return self.caches.slots

    @property
    def width(self) -> int:
        """S: the padded source length."""
        return self.caches.width

    def split(self, ix: np.ndarray) -> Batch:
        """Move rows ``ix`` (every row of their requests) into a new batch that keeps only the cache slots and
        source columns they use; here they become holes."""
        other = Batch(self.runner, self._numbers, self.caches)
        first = int(self.rows.start[ix].min())
        other.caches = self.caches.split(ix, first)
        other.rows = self.rows.take(ix)
        other.rows.start -= first
        other.jobs = {number: self.jobs.pop(number) for number in set(other.rows.job.tolist())}
        self._leave(ix)
        self._tidy()
        return other

    def absorb(self, other: Batch) -> None:
        """Take every row of ``other``, which is left empty. Caches are aligned at their ends: a row owns the last
        slots of its cache (from its start on), so the shorter batch gains masked slots in front."""
        self._compact()
        other._compact()
        T, S = max(self.slots, other.slots), max(self.width, other.width)
        for batch in (self, other):
            batch.rows.start += batch.caches.align(T, S)
        self.caches.join(other.caches)
        self.rows.join(other.rows)
        self._plan = None
        self.jobs.update(other.jobs)
        other.reset()

    def admit(self, enc: Encoded, ix: list[int]) -> None:
        """Add the rows of requests ``ix`` of ``enc`` (a beam request's k rows share its cross keys and values)."""
        requests, lengths, rows = [enc.requests[i] for i in ix], enc.lengths[ix], self.rows
        self.quiet = 0
        width = np.array([0 if r.forced is not None else r.beam_size for r in requests])  # as Rows.width
        rows_of = np.repeat(np.arange(len(requests)), np.maximum(width, 1))  # new row -> request
        self.caches.regroup(width, empty=not len(rows))
        sources = rows_of if self.caches.group == 1 else np.arange(len(requests))  # new cross cache row -> request
        mask = (np.arange(lengths.max())[None] < lengths[sources][:, None]).astype(np.int64)
        n, T = len(rows_of), self.slots
        holes = np.flatnonzero(rows.job < 0)
        if len(holes) < n:  # the rest at the end (a copy of every cache)
            m = n - len(holes)
            self.caches.grow(rows, m)
            holes = np.concatenate([holes, np.arange(len(rows), len(rows) + m)])
            rows.extend(m)
        at = holes[:n]
        self.caches.fill(at, enc, np.array(ix, np.int64)[sources], mask)
        numbers = np.array([next(self._numbers) for _ in requests])
        for number, i in zip(numbers.tolist(), ix, strict=True):
            self.jobs[number] = Job(enc.keys[i], enc.requests[i], enc.attentions[i])
        prefix = np.array([len(r.prefix) for r in requests], np.int64)
        limit = np.array([len(r.forced) if r.forced is not None else r.max_length for r in requests])
        limit += np.where(width == 0, prefix, 0)  # a forced target comes after the prefix
        rows.job[at], rows.width[at], rows.limit[at] = numbers[rows_of], width[rows_of], limit[rows_of]
        rows.prefix[at] = prefix[rows_of]
        rows.start[at], rows.length[at], rows.last[at], rows.score[at] = T, 0, self.spec.decoder_start_id, 0.0
        rows.alive[at] = np.concatenate([[True], rows_of[1:] != rows_of[:-1]])  # a request's first row
        rows.scored[at] = (np.array([r.scores for r in requests]) | (width >= 2))[rows_of]
        rows.constrained[at] = np.array([r.adjusted for r in requests])[rows_of]
        rows.state[at], rows.done[at] = OUTSIDE, 0
        for slot, i in zip(at.tolist(), rows_of.tolist(), strict=True):
            rows.attention[slot] = ([], []) if requests[i].attention else None
        self._plan = None

    def cancel(self, key: Hashable) -> None:
        """Drop the rows of a request whose caller went away."""
        for number in [number for number, job in self.jobs.items() if job.key == key]:
            self._leave(np.flatnonzero(self.rows.job == number))
            del self.jobs[number]
        self._tidy()

    def _leave(self, ix: np.ndarray) -> None:
        """Rows ``ix`` become holes."""
        self.rows.job[ix], self.rows.length[ix] = -1, 0
        self.rows.alive[ix] = False
        self._plan = None
        self.caches.leave(ix)
        for i in ix.tolist():
            self.rows.attention[i] = None

    def step(self) -> tuple[list[tuple[Hashable, DecodeResult]], float]:
        """One decoder call for every row; returns the requests that finished and the decoder seconds."""
        rows, plan, caches = self.rows, self.plan, self.caches
        self.quiet += 1
        if not (len(plan.one) or plan.widths):
            return [], 0.0
        slots = caches.prepare(rows)
        t0 = time.perf_counter()
        out = caches.run(self.runner, rows, plan.tokens)
        seconds = time.perf_counter() - t0
        caches.store(out)
        scores, token = self._choose(out)
        force(token, plan, rows, self.jobs, rows.prefixed())
        done: list[int] = []  # request numbers finished in this step
        finals: list[tuple[int, int]] = []  # (request number, new row) hypotheses that finish at max_length
        ix, parents = plan.one, plan.one  # the rows that hold a continued hypothesis after this step, their parents
        if plan.widths:
            assert scores is not None, "beam rows are scored"
            ix, parents = self._beams(scores, out, token, done, finals)
        self._extend(ix, parents, token[ix], slots, scores, out)
        one = plan.one
        for r in one[(token[one] == self.spec.eos_id) | (rows.length[one] >= rows.limit[one])].tolist():
            number = int(rows.job[r])
            self.jobs[number].finished.append(rows.hypothesis(r))
            done.append(number)
        for number, r in finals:
            self.jobs[number].finished.append(rows.hypothesis(r))
        return (self._finish(done) if done else []), seconds

    def _choose(self, out: StepOutput) -> tuple[Scores | CandidateScores | None, np.ndarray]:
        """The step's log-probabilities (when a row needs them) and each row's greedy next token: from every row's
        logits, or from a device decoder's candidates and greedy tokens."""
        plan = self.plan
        if out.candidates is not None:
            assert out.tokens is not None
            assert not (plan.forced or len(plan.constrained)), "forced and constrained rows read every logit"
            return CandidateScores(out.candidates, out.tokens), out.tokens.copy()
        logits = out.logits.astype(np.float32, copy=False)  # float16 graphs would give float16
        logits[:, self.spec.pad_id] = -np.inf  # never emit padding
        self._constrain(logits)
        scores = Scores(logits, self.rows.scored) if plan.scored else None
        return scores, greedy(plan, logits, out.tokens)

    def _extend(
        self, ix: np.ndarray, parents: np.ndarray, chosen: np.ndarray, slots: int,
        scores: Scores | CandidateScores | None, out: StepOutput,
    ) -> None:  # fmt: skip
        """Rows ``ix`` take their tokens ``chosen`` (the logits rows they come from: ``parents``)."""
        rows, n = self.rows, self.rows.length[ix]
        rows.reserve(slots)  # a row generates one token a cache slot it owns
        rows.tokens[ix, n] = rows.last[ix] = chosen
        if scores is not None:  # (an unscored row's token scores are NaN, filled in by Rows.hypothesis)
            logp = np.zeros(len(ix), np.float32)  # a prefix' tokens score 0
            searched = n >= rows.prefix[ix]
            logp[searched] = scores.logp(parents[searched], chosen[searched])
            rows.token_scores[ix, n] = logp
            rows.score[ix] += logp
        rows.length[ix] += 1
        if len(self.plan.constrained):
            self._advance(ix, chosen)
        if self.plan.attends:
            self._attend(ix, parents, out)

    def _constrain(self, logits: np.ndarray) -> None:
        """Constrained rows' forbidden tokens get no probability (service/decoding/constraint.py), and rows with a
        repetition penalty have it applied (service/decoding/repetition.py)."""
        rows = self.rows
        for r in self.plan.constrained.tolist():
            request = self.jobs[int(rows.job[r])].request
            if (constraint := request.constraint) is not None:
                constraint.allowed(int(rows.state[r]), int(rows.done[r])).apply(logits[r])
            if request.repetition_penalty != 1.0 or request.no_repeat_ngram_size:
                generated = rows.tokens[r, : rows.length[r]]
                penalize(logits[r], generated, request.repetition_penalty, request.no_repeat_ngram_size)

    def _advance(self, ix: np.ndarray, chosen: np.ndarray) -> None:
        """Constrained rows among ``ix`` read their new tokens ``chosen`` (a beam child carries its parent's state,
        moved with the row)."""
        rows = self.rows
        for r, token in zip(ix.tolist(), chosen.tolist(), strict=True):
            constraint = self.jobs[int(rows.job[r])].request.constraint if rows.constrained[r] else None
            if constraint is not None and (step := constraint.advance(int(rows.state[r]), int(rows.done[r]), token)):
                rows.state[r], rows.done[r] = step

    def _beams(
        self,
        scores: Scores | CandidateScores,
        out: StepOutput,
        token: np.ndarray,
        done: list[int],
        finals: list[tuple[int, int]],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Beam search for every beam width; the beam rows that continue another row's hypothesis take its cache.
        Returns the rows that hold a continued hypothesis (the greedy and forced ones too) and their parents."""
        rows = self.rows
        everyone = np.arange(len(rows))
        parent, stepped = everyone.copy(), np.zeros(len(rows), bool)
        stepped[self.plan.one] = True
        for k in self.plan.widths:
            self._beam(k, scores, out, parent, token, stepped, done, finals)
        ix = np.flatnonzero(stepped)
        if len(moved := np.flatnonzero(parent != everyone)):  # rows that continue another row's hypothesis
            src = parent[moved]
            rows.move(moved, src)
            self.caches.move(moved, src, rows)
        rows.alive = stepped  # a beam row that got no child holds no hypothesis until it gets one
        return ix, parent[ix]

    def _beam(
        self,
        k: int,
        scores: Scores | CandidateScores,
        out: StepOutput,
        parent: np.ndarray,
        token: np.ndarray,
        stepped: np.ndarray,
        done: list[int],
        finals: list[tuple[int, int]],
    ) -> None:
        """Beam search for the requests with k rows (:func:`~service.decoding.search.beam_choose`): the finished
        hypotheses join their requests', the children's parents and tokens are written into ``parent`` and
        ``token`` (``stepped`` marks their rows), and requests with k finished, at their limit or without a child
        are done."""
        rows, eos = self.rows, self.spec.eos_id
        choice = beam_choose(rows, k, scores, eos, token)
        for p in choice.ended.tolist():  # finished hypotheses: the parent's, plus </s>
            hyp = rows.hypothesis(p)
            hyp.tokens.append(eos)
            hyp.token_scores.append(float(scores.logp(np.array([p]), np.array([eos]))[0]))
            if rows.attention[p] is not None:
                self_row, cross_row = self._attention_rows(out, p)
                hyp.self_attention.append(self_row)
                hyp.cross_attention.append(cross_row)
            self.jobs[int(rows.job[p])].finished.append(hyp)
        ix, slot = choice.rows, choice.place
        parent[slot], token[slot], stepped[slot] = choice.parent, choice.token, True
        children = np.bincount(choice.request, minlength=len(ix))
        t = rows.length[ix].max(axis=1) + 1  # a row without a child keeps its length
        at_limit = t >= rows.limit[ix[:, 0]]
        for q in range(len(ix)):
            number = int(rows.job[ix[q, 0]])
            if len(self.jobs[number].finished) >= k or at_limit[q] or not children[q]:
                done.append(number)
                if at_limit[q]:
                    finals.extend((number, int(s)) for s in slot[choice.request == q])

    def _attention_rows(self, out: StepOutput, r: int) -> tuple[np.ndarray, np.ndarray]:
        """This step's self- and cross-attention rows of row r (computed from its own hypothesis)."""
        assert out.self_attentions is not None and out.cross_attentions is not None, "no attention outputs"
        source = len(self.jobs[int(self.rows.job[r])].request.src)
        start = int(self.rows.start[r])
        return out.self_attentions[:, r, :, start:].copy(), out.cross_attentions[:, r, :, :source].copy()

    def _attend(self, ix: np.ndarray, parents: np.ndarray, out: StepOutput) -> None:
        """Append this step's attention rows to those of rows ``ix`` that collect attention, each computed in its
        parent's row (``parents``, this step's rows)."""
        rows = self.rows
        for i, p in zip(ix.tolist(), parents.tolist(), strict=True):
            if (attention := rows.attention[i]) is not None:
                self_row, cross_row = self._attention_rows(out, p)
                rows.attention[i] = ([*attention[0], self_row], [*attention[1], cross_row])

    def _finish(self, done: list[int]) -> list[tuple[Hashable, DecodeResult]]:
        """The finished requests leave; their results, best hypotheses first."""
        self._leave(np.flatnonzero(np.equal.outer(self.rows.job, done).any(axis=1)))
        results = []
        for number in done:
            job = self.jobs.pop(number)
            lp, prefix = job.request.length_penalty, len(job.request.prefix)
            ranked = sorted(job.finished, key=lambda h: -h.score / max(len(h.tokens), 1) ** lp)
            best = [h.without_prefix(prefix) if prefix else h for h in ranked[: max(job.request.n_best, 1)]]
            results.append((job.key, DecodeResult(best, job.encoder_attention)))
        self._tidy()
        return results

    def _tidy(self) -> None:
        """After rows left: compact when holes are a quarter of the batch (see MIN_HOLES), then trim what no row
        needs."""
        live = np.flatnonzero(self.rows.job >= 0)
        if not len(live):
            self.reset()
            return
        holes = len(self.rows) - len(live)
        if holes * 4 >= len(self.rows) and (holes >= self.MIN_HOLES or self.quiet >= self.QUIET):
            self._compact()
        self.caches.trim(self.rows, np.flatnonzero(self.rows.job >= 0))

    def _compact(self) -> None:
        """No holes left."""
        live = self.rows.job >= 0
        n = int(np.count_nonzero(live))
        if n == len(self.rows):
            return
        self._plan = None
        self.rows = self.caches.compact(self.rows, live, n)
