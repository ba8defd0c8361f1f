"""tools/import_cycles.py finds circles through lazy and relative imports, leaves TYPE_CHECKING imports out, and
finds none in the project."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.import_cycles import main

ROOT = Path(__file__).resolve().parents[2]


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_lazy_import_closes_a_circle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import f\n",
            "pkg/b.py": "def f():\n    from pkg.sub import c\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/c.py": "from .. import a\n",
        },
    )
    assert main([str(tmp_path / "pkg")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("import circle: pkg.a -> pkg.b -> pkg.sub.c -> pkg.a (")
    assert f"{tmp_path / 'pkg/b.py'}:2" in out


def test_type_checking_imports_and_plain_chains_are_no_circle(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import pkg.b\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import x\nimport os\n",
        },
    )
    assert main([str(tmp_path / "pkg")]) == 0


def test_the_project_has_no_circle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main([]) == 0
