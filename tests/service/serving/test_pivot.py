"""Pairs served through the pivot language (service/serving/pivot.py), through the HTTP API: ja→de served as ja→en,
then en→de. Each answer equals the two hops asked by hand, with the whole text pipeline on each hop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.serving.catalog import Pivot
from service.serving.pivot import PivotRoute
from service.serving.translation import Options, Translation
from service.settings import PairDecoding, Settings
from tests.service.conftest import Server
from tests.service.pair_bundles import pair_bundle

TEXTS = ["ファイルを開く", "設定", "選択したファイルを削除しますか?\n%s を開けませんでした"]
PAIR_GLOSSARY = {"ファイル": "Datei"}  # ja-de.tsv: written by the first hop (a word of the unspaced text), kept


@pytest.fixture(scope="module")
def pivot_server(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """ja→en and en→de bundles (copies of the tiny one); a glossary file for each hop and one for ja→de."""
    root = tmp_path_factory.mktemp("pivot")
    glossaries = root / "glossaries"
    glossaries.mkdir()
    (glossaries / "ja-en.tsv").write_text("設定\tSETTINGSX\n", encoding="utf-8")
    (glossaries / "en-de.tsv").write_text("SETTINGSX\tEinstellungen\n", encoding="utf-8")
    (glossaries / "ja-de.tsv").write_text("".join(f"{k}\t{v}\n" for k, v in PAIR_GLOSSARY.items()), encoding="utf-8")
    bundles = [pair_bundle(tiny_bundle, root, "ja", "en"), pair_bundle(tiny_bundle, root, "en", "de")]
    with Server(Settings(bundles=bundles, glossary_dir=glossaries, max_wait_ms=1)) as s:
        yield s


def translate(server: Server, **body: Any) -> Any:
    response = server.client().post("/translate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def by_hand(server: Server, texts: list[str], **options: Any) -> list[str]:
    """ja→en with the ja→de glossary, then en→de keeping its terms, on its texts, as a client would ask them."""
    english = translate(server, q=texts, source="ja", target="en", glossary=PAIR_GLOSSARY, **options)
    keep = list(PAIR_GLOSSARY.values())
    return list(
        translate(server, q=english["translatedText"], source="en", target="de", keep=keep, **options)["translatedText"]
    )


def test_languages_list_the_pivot_pair(pivot_server: Server) -> None:
    languages = {x["code"]: x["targets"] for x in pivot_server.client().get("/languages").json()}
    assert languages == {"de": [], "en": ["de"], "ja": ["de", "en"]}


def test_a_pivot_translation_equals_the_two_hops_by_hand(pivot_server: Server) -> None:
    answer = translate(pivot_server, q=TEXTS, source="ja", target="de")["translatedText"]
    assert answer == by_hand(pivot_server, TEXTS)
    (one,) = by_hand(pivot_server, TEXTS[:1])
    assert translate(pivot_server, q=TEXTS[0], source="ja", target="de")["translatedText"] == one


def test_each_hop_applies_its_glossary_file_and_the_text_keeps_its_lines(pivot_server: Server) -> None:
    """設定 becomes SETTINGSX on the first hop (ja-en.tsv), which the second hop's file makes Einstellungen."""
    settings, lines = translate(pivot_server, q=[TEXTS[1], TEXTS[2]], source="ja", target="de")["translatedText"]
    assert settings.startswith("Einstellungen")
    assert lines.count("\n") == 1


def test_the_pairs_glossary_and_the_requests_reach_the_output_unchanged(pivot_server: Server) -> None:
    """ja→de terms (the ja-de.tsv file's and the request's, over the first hop's file) are written by the first hop
    and kept by the second."""
    text, terms = "設定 ファイル", {"設定": "Fenster", "ファイル": "Datei"}
    out = translate(pivot_server, q=text, source="ja", target="de", glossary={"設定": "Fenster"})["translatedText"]
    assert out == "Fenster Datei"
    english = translate(pivot_server, q=text, source="ja", target="en", glossary=terms)["translatedText"]
    kept = translate(pivot_server, q=english, source="en", target="de", keep=list(terms.values()))
    assert out == kept["translatedText"]


def test_return_details_name_each_hop_with_its_details(pivot_server: Server) -> None:
    body = translate(pivot_server, q=TEXTS[:2], source="ja", target="de", return_details=True)
    english = translate(
        pivot_server, q=TEXTS[:2], source="ja", target="en", glossary=PAIR_GLOSSARY, return_details=True
    )
    keep = list(PAIR_GLOSSARY.values())
    german = translate(
        pivot_server, q=english["translatedText"], source="en", target="de", keep=keep, return_details=True
    )
    for i, details in enumerate(body["details"]):
        first, second = details["hops"]
        assert (first["source"], first["target"], second["source"], second["target"]) == ("ja", "en", "en", "de")
        assert first["translatedText"] == english["translatedText"][i]
        assert second["translatedText"] == body["translatedText"][i] == german["translatedText"][i]
        assert {k: v for k, v in first.items() if k not in ("source", "target", "translatedText")} == english[
            "details"
        ][i]
        assert {k: v for k, v in second.items() if k not in ("source", "target", "translatedText")} == german[
            "details"
        ][i]


def test_auto_detects_the_source_of_a_pivot_pair(pivot_server: Server) -> None:
    body = translate(pivot_server, q=TEXTS[0], source="auto", target="de")
    assert body["detectedLanguage"]["language"] == "ja"
    assert body["translatedText"] == by_hand(pivot_server, TEXTS[:1])[0]


def test_attention_on_a_pivot_pair_names_the_two_pairs_to_ask(pivot_server: Server) -> None:
    response = pivot_server.client().post("/attention", json={"q": TEXTS[0], "source": "ja", "target": "de"})
    assert response.status_code == 400
    message = response.json()["error"]
    assert "ja→de is served through en" in message and "'ja', target 'en'" in message and "'en', target 'de'" in message


class Recorded:
    """A direct route that records the options of each call and echoes its texts."""

    def __init__(self, pair: tuple[str, str]) -> None:
        self.pair, self.options = pair, list[Options]()

    async def translate(self, texts: Any, options: Options, gone: Any = None, arrival: Any = None) -> list[Any]:
        self.options.append(options)
        return [Translation(t, [], None) for t in texts]

    async def attention(self, *args: Any) -> Any:
        raise AssertionError("not called")


def hop_decoding(decoding: PairDecoding | None, options: Options) -> list[tuple[int | None, float | None]]:
    first, second = Recorded(("ja", "en")), Recorded(("en", "de"))
    route = PivotRoute(Pivot("ja", "en", "de"), first, second, decoding=decoding)
    asyncio.run(route.translate(["設定"], options))
    return [(o.beam_size, o.length_penalty) for o in (*first.options, *second.options)]


def test_the_pivot_pairs_decoding_defaults_reach_both_hops_under_the_requests() -> None:
    assert hop_decoding(None, Options()) == [(None, None)] * 2  # each hop's engine applies its pair's defaults
    lt = PairDecoding(beam_size=4, length_penalty=0.2)
    assert hop_decoding(lt, Options()) == [(4, 0.2)] * 2
    assert hop_decoding(lt, Options(beam_size=2)) == [(2, 0.2)] * 2
    assert hop_decoding(PairDecoding(length_penalty=0.5), Options()) == [(None, 0.5)] * 2
