"""Repetition loops: flagged where the translation repeats a stretch and the source does not."""

from __future__ import annotations

from service.text.repetition import has_loop, loops


def test_a_repeated_stretch_is_a_loop_unless_the_source_has_one() -> None:
    assert loops("…の防御側の防御側の防御側…") == ["の防御側"]
    assert has_loop("Increases defense", "防御側の防御側の防御側の防御")
    assert not has_loop("Increases defense", "防御力を増加します")
    assert not has_loop("ha ha ha ha", "ははははははは")  # the source repeats itself
    assert not has_loop("Line", "------------")  # a rule is no loop
    assert not has_loop("Twice", "防御側の防御側")  # twice is not yet a loop


def test_one_letter_or_ideograph_four_times_is_a_loop() -> None:
    assert loops("すごーーーーい") == ["ー"]
    assert has_loop("Wonderful", "素晴らしいいいい")
    assert has_loop("Open", "Öffnennnn")
    assert not has_loop("Wonderful", "素晴らしいいい")  # three times is not yet a loop
    assert not has_loop("1 000 000 sold", "10000 verkauft")  # digits are no loop
    assert not has_loop("Wait", "待って!!!!")  # nor punctuation
    assert not has_loop("Zzzzz", "ZZZZZ")  # the source has one
