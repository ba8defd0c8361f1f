"""A pair's segments with spans decode constrained from the start while its model breaks most first decodes, with a
probe of the unconstrained decode among them, and stop once its first decodes come out whole; the answers are the
ones recovery gives."""

from __future__ import annotations

from service.serving.constrained_first import PROBE, SEEN, ConstrainedFirst
from service.serving.translation import Options
from tests.service.mangler import mangler_engine
from tests.service.serving.test_engine import recorded_decodes


def test_constrained_first_while_most_first_decodes_come_out_broken_with_probes_and_back() -> None:
    policy = ConstrainedFirst()
    for _ in range(SEEN - 1):
        assert not policy.now()
        policy.record(True)
    assert not policy.now()  # too few outcomes yet
    policy.record(True)
    asked = [policy.now() for _ in range(3 * PROBE)]
    assert asked.count(False) == 3  # a probe in every PROBE
    while policy.share > 0.5:
        policy.record(False)  # the model now copies its stand-ins
    assert not any(policy.now() for _ in range(2 * PROBE))


def test_an_engine_whose_model_breaks_stand_ins_decodes_them_constrained_at_once() -> None:
    engine = mangler_engine()
    calls = recorded_decodes(engine)
    for _ in range(SEEN):
        (t,) = engine.translate_now(["C %s C"], Options(details=True))
        assert t.text == "A %s" and t.details is not None and t.details.spans == "constrained"
    assert len(calls) == 2 * SEEN and not any(r.constraint for r in calls[0])  # decoded, then constrained
    del calls[:]
    for _ in range(PROBE):
        t, _ = engine.translate_now(["C %s C", "C C"], Options(details=True))
        assert t.text == "A %s" and t.details is not None and t.details.spans == "constrained"
        assert t.details.tokens == ["▁A", "▁{", "0", "}", "</s>"]
    firsts = [c for c in calls if len(c) == 2]  # each call's first decode, the plain segment beside
    assert len(firsts) == PROBE and [bool(c[0].constraint) for c in firsts].count(False) == 1  # the probe
    assert not any(c[1].constraint for c in firsts)  # no spans, no constraint
    assert len(calls) == PROBE + 1  # only the probe decoded twice
