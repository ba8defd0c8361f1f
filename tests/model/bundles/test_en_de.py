"""The shipped en-de bundle, served as `make serve` serves it (every bundle under model/bundles): /languages lists
both pairs, and 20 common UI strings come back as their usual German translations."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from model.evaluate import UI_STRINGS
from service.settings import Settings
from tests.service.conftest import Server

# The German that free-software interfaces use for each string; more than one where programs differ.
USUAL_GERMAN = {
    "Open file": ["Datei öffnen"],
    "Save as…": ["Speichern unter …", "Speichern unter…"],
    "Delete the selected files?": ["Die ausgewählten Dateien löschen?", "Ausgewählte Dateien löschen?"],
    "Settings": ["Einstellungen"],
    "Cancel": ["Abbrechen"],
    "Close window": ["Fenster schließen"],
    "Print the current document": ["Das aktuelle Dokument drucken", "Aktuelles Dokument drucken"],
    "Could not open %s: permission denied": [
        "%s konnte nicht geöffnet werden: Zugriff verweigert",
        "%s konnte nicht geöffnet werden: Keine Berechtigung",
    ],
    "The file {0} already exists. Replace it?": [
        "Die Datei {0} existiert bereits. Soll sie überschrieben werden?",
        "Die Datei {0} existiert bereits. Soll sie ersetzt werden?",
        "Die Datei {0} existiert bereits. Ersetzen?",
    ],
    "Undo": ["Rückgängig", "Rückgängig machen", "Zurücknehmen"],
    "Copy to clipboard": ["In die Zwischenablage kopieren"],
    "Search": ["Suchen", "Suche"],
    "Preferences": ["Einstellungen"],
    "About this application": ["Über diese Anwendung"],
    "Quit": ["Beenden"],
    "New folder": ["Neuer Ordner"],
    "Rename file": ["Datei umbenennen"],
    "Show hidden files": ["Versteckte Dateien anzeigen", "Verborgene Dateien anzeigen"],
    "Downloading %d files…": ["%d Dateien werden heruntergeladen …", "%d Dateien werden heruntergeladen…"],
    "An error occurred while saving the document.": [
        "Beim Speichern des Dokuments ist ein Fehler aufgetreten.",
        "Beim Speichern des Dokuments trat ein Fehler auf.",
    ],
}


@pytest.fixture(scope="module")
def served() -> Iterator[Server]:
    with Server(Settings(max_wait_ms=20)) as server:
        yield server


def test_every_shipped_pair_is_listed(served: Server) -> None:
    with served.client() as client:
        languages = {entry["code"]: entry["targets"] for entry in client.get("/languages").json()}
    assert {"de", "ja"} <= set(languages["en"])


@pytest.mark.parametrize("beam_size", [1, 4])
def test_common_ui_strings_come_back_as_their_usual_german(served: Server, beam_size: int) -> None:
    assert set(USUAL_GERMAN) == set(UI_STRINGS)
    body = {"q": UI_STRINGS, "source": "en", "target": "de", "beam_size": beam_size}
    with served.client() as client:
        response = client.post("/translate", json=body)
    assert response.status_code == 200, response.text
    got = dict(zip(UI_STRINGS, response.json()["translatedText"], strict=True))
    unusual = {text: german for text, german in got.items() if german not in USUAL_GERMAN[text]}
    assert not unusual
