"""source "auto" (service/serving/auto.py): texts grouped by detected language, each group to its pair, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from service.errors import UnknownPair
from service.serving.auto import detect_sources, translate_auto
from service.serving.translation import Gone, Options, Translation
from service.text.detect import Detector

EN, DE, JA = "Open the selected file", "Die ausgewählten Dateien löschen?", "ファイルを開く"


class FakeEngine:
    """Answers "<pair>: <text>" and records the batches it got."""

    def __init__(self, pair: tuple[str, str], fail: bool = False) -> None:
        self.pair = pair
        self.batches: list[list[str]] = []
        self.fail = fail

    async def translate(
        self, texts: Sequence[str], options: Options, gone: Gone | None = None, arrival: float | None = None
    ) -> list[Translation]:
        self.batches.append(list(texts))
        await asyncio.sleep(0)
        if self.fail:
            raise RuntimeError("engine failed")
        return [Translation(f"{self.pair[0]}→{self.pair[1]}: {t}", [], None) for t in texts]


@pytest.fixture(scope="module")
def detector() -> Detector:
    return Detector()


def test_texts_go_to_their_language_pair_and_come_back_in_order(detector: Detector) -> None:
    engines = {("en", "ja"): FakeEngine(("en", "ja")), ("de", "ja"): FakeEngine(("de", "ja"))}
    texts = [EN, DE, EN + ".", DE + "!"]
    translations, detections = asyncio.run(translate_auto(engines, detector, texts, "ja", Options()))
    assert [t.text for t in translations] == [
        f"en→ja: {EN}", f"de→ja: {DE}", f"en→ja: {EN}.", f"de→ja: {DE}!"
    ]  # fmt: skip
    assert [d.language for d in detections] == ["en", "de", "en", "de"]
    assert engines[("en", "ja")].batches == [[EN, EN + "."]]  # one batch per language
    assert engines[("de", "ja")].batches == [[DE, DE + "!"]]


def test_a_language_without_a_pair_into_the_target_is_refused_naming_the_text(detector: Detector) -> None:
    engines = {("en", "ja"): FakeEngine(("en", "ja"))}
    with pytest.raises(UnknownPair, match=r"q\[1\] was detected as 'de'.*no model translates de→ja"):
        asyncio.run(translate_auto(engines, detector, [EN, DE], "ja", Options()))
    assert engines[("en", "ja")].batches == []  # nothing decoded
    with pytest.raises(UnknownPair, match="no model translates into 'fr'"):
        detect_sources(detector, [EN], "fr", list(engines))


def test_blank_texts_follow_the_others(detector: Detector) -> None:
    pairs = [("de", "ja"), ("en", "ja")]
    detections = detect_sources(detector, [" ", EN, ""], "ja", pairs)
    assert [(d.language, d.confidence) for d in detections][0::2] == [("en", 0.0), ("en", 0.0)]
    assert [d.language for d in detect_sources(detector, ["", "\n"], "ja", pairs)] == ["de", "de"]  # first served


def test_a_failing_group_fails_the_request(detector: Detector) -> None:
    engines = {("en", "ja"): FakeEngine(("en", "ja")), ("de", "ja"): FakeEngine(("de", "ja"), fail=True)}
    with pytest.raises(RuntimeError, match="engine failed"):
        asyncio.run(translate_auto(engines, detector, [EN, DE], "ja", Options()))
