"""service/decoding/greedy_choice.py: the mode of each greedy step, from what each has cost a row lately at the
step's size."""

from __future__ import annotations

from service.decoding.greedy_choice import MARGIN, PROBE, GreedyChoice, size


def modes(choice: GreedyChoice, steps: int, cost: dict[bool, float], rows: int = 4) -> list[bool]:
    """The modes of ``steps`` steps of ``rows`` rows, each taking ``cost[mode]`` seconds a row."""
    out = []
    for _ in range(steps):
        tokens = choice.tokens(rows)
        choice.record(tokens, cost[tokens] * rows, rows)
        out.append(tokens)
    return out


def test_greedy_tokens_first_then_logits_tried_once_every_probe() -> None:
    choice = GreedyChoice()
    seen = modes(choice, 2 * PROBE, {True: 1e-3, False: 2e-3})
    assert [i + 1 for i, tokens in enumerate(seen) if not tokens] == [PROBE, 2 * PROBE]
    assert choice.cost == {(size(4), True): 1e-3, (size(4), False): 2e-3}


def test_the_cheaper_mode_wins_and_the_other_is_still_tried() -> None:
    choice = GreedyChoice()
    seen = modes(choice, 4 * PROBE, {True: 3e-3, False: 1e-3})
    assert seen[: PROBE - 1] == [True] * (PROBE - 1)  # logits not measured yet
    assert seen[PROBE:].count(True) == 3 and not any(seen[PROBE : 2 * PROBE - 1])


def test_a_change_in_costs_turns_the_choice_back() -> None:
    choice = GreedyChoice()
    assert not modes(choice, 3 * PROBE, {True: 3e-3, False: 1e-3})[-2]  # logits chosen
    seen = modes(choice, 6 * PROBE, {True: 1e-3, False: 3e-3})
    assert all(seen[-PROBE:-1]) and not seen[-1]  # tokens again, once probed and cheaper; logits probed


def test_a_mode_a_little_cheaper_does_not_take_over() -> None:
    choice = GreedyChoice()
    seen = modes(choice, 4 * PROBE, {True: 1e-3, False: 1e-3 / MARGIN * 1.01})
    assert [i + 1 for i, tokens in enumerate(seen) if not tokens] == [PROBE * k for k in range(1, 5)]


def test_steps_of_few_rows_leave_the_choice_at_full_size_alone() -> None:
    choice = GreedyChoice()
    modes(choice, 2 * PROBE, {True: 1e-3, False: 2e-3}, rows=32)  # both measured at 32 rows: tokens cheaper
    modes(choice, 2 * PROBE, {True: 9e-3, False: 4e-3}, rows=1)  # a row costs more in steps of one row
    assert choice.mode[size(1)] is False and choice.tokens(32)


def test_costs_are_a_row_s_by_size() -> None:
    choice = GreedyChoice()
    choice.record(True, 0.008, 8)
    choice.record(False, 0.002, 1)
    assert choice.cost == {(4, True): 0.001, (1, False): 0.002}
    assert [size(r) for r in (0, 1, 2, 3, 4, 31, 32)] == [1, 1, 2, 2, 3, 5, 6]
