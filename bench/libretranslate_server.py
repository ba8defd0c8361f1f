"""LibreTranslate offline, for bench/libretranslate.py; run with LibreTranslate's own Python (its venv).

``python libretranslate_server.py --install PACKAGE`` installs an .argosmodel into argos-translate's packages
directory (``ARGOS_PACKAGES_DIR``); ``python libretranslate_server.py ARGS`` runs ``libretranslate ARGS`` with its
sentence splitter (MiniSBD, whose model it would download) replaced by one that keeps each text whole, and the MiniSBD
download at start-up skipped. Nothing else of LibreTranslate or argos-translate is changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/libretranslate.py would shadow the libretranslate package
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]


class WholeText:
    """A sentence splitter that keeps a text whole: the bench sends one sentence a text."""

    def __init__(self, pkg: object) -> None:
        self.pkg = pkg

    def split_sentences(self, text: str) -> list[str]:
        return [text]


def main(argv: list[str]) -> None:
    if argv[:1] == ["--install"]:
        from argostranslate import package

        package.install_from_path(argv[1])
        return
    import libretranslate.init
    from argostranslate import translate
    from libretranslate.main import main as libretranslate_main

    translate.MiniSBDSentencizer = WholeText
    libretranslate.init.download_models = lambda *args, **kwargs: None
    sys.argv = ["libretranslate", *argv]
    libretranslate_main()


if __name__ == "__main__":
    main(sys.argv[1:])
