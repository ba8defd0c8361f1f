"""Hostile packages: each refusal is one line on stderr and exit code 2, with nothing written beside OUT and no
OUT left behind."""

from __future__ import annotations

import json
import logging
import shutil
import stat
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from model.importers.safe_zip import UnsafeZip, extract
from service.cli.main import main
from tests.bundles import tiny_spm
from tests.model.importers.argos_packages import onmt_package, zip_package


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("package")
    return onmt_package(work, tiny_spm(work), None, {})


def refused(caplog: pytest.LogCaptureFixture, source: Path, work: Path, message: str) -> None:
    """``import-argos source work/out`` exits 2 with one error line naming ``message`` and no traceback; ``work``
    gains nothing."""
    before = sorted(p.name for p in work.iterdir())
    caplog.clear()
    assert main(["import-argos", str(source), str(work / "out")]) == 2
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and message in errors[0].getMessage(), [r.getMessage() for r in errors]
    assert errors[0].exc_info is None and "\n" not in errors[0].getMessage()
    assert sorted(p.name for p in work.iterdir()) == before


def _zip(path: Path, entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for info, data in entries:
            z.writestr(info, data)
    return path


def _symlink(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([("pkg/../../evil.txt", b"x")], "climbs out"),
        ([("/etc/evil.txt", b"x")], "absolute path"),
        ([("C:/evil.txt", b"x")], "absolute path"),
        ([(_symlink("pkg/metadata.json"), b"/etc/passwd")], "symbolic link"),
    ],
)
def test_entries_that_climb_out_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, entries: list[tuple[zipfile.ZipInfo | str, bytes]], message: str
) -> None:
    archive = _zip(tmp_path / "evil.argosmodel", entries)
    refused(caplog, archive, tmp_path, message)
    assert not (tmp_path.parent / "evil.txt").exists()


def test_declared_size_over_the_bound_is_refused(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "big.argosmodel", [("pkg/a", b"\0" * 5000), ("pkg/b", b"\0" * 5000)])
    (tmp_path / "out").mkdir()
    with pytest.raises(UnsafeZip, match="declares 10000 bytes"):
        extract(archive, tmp_path / "out", max_bytes=8000)
    assert not any((tmp_path / "out").iterdir())


def test_an_entry_inflating_past_its_declared_size_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    archive = tmp_path / "bomb.argosmodel"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("pkg/bomb", b"\0" * 1_000_000)
    data = bytearray(archive.read_bytes())
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # uncompressed size: local, central
        at = data.find(signature)
        data[at + offset : at + offset + 4] = struct.pack("<I", 100)
    archive.write_bytes(bytes(data))
    refused(caplog, archive, tmp_path, "bomb")


def test_a_file_that_is_not_a_zip_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "junk.argosmodel").write_bytes(b"not a zip at all")
    refused(caplog, tmp_path / "junk.argosmodel", tmp_path, "not a readable zip")


def _edit_metadata(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        meta = json.loads((folder / "metadata.json").read_text())
        (folder / "metadata.json").write_text(json.dumps(edit(meta)))

    return apply


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: (f / "metadata.json").write_text("{not json"), "metadata.json is not UTF-8 JSON"),
        (_edit_metadata(lambda m: [m]), "holds a list, expected an object"),
        (_edit_metadata(lambda m: {k: v for k, v in m.items() if k != "to_code"}), "to_code None"),
        (_edit_metadata(lambda m: m | {"from_code": "../../x"}), "from_code '../../x'"),
        (_edit_metadata(lambda m: m | {"target_prefix": 3}), "target_prefix 3 is not a string"),
        (_edit_metadata(lambda m: m | {"target_prefix": "__ja__"}), "'__ja__' is not a token of the vocabulary"),
        (_edit_metadata(lambda m: m | {"target_prefix": "</s>"}), "is the end of sentence token"),
        (lambda f: (f / "metadata.json").write_bytes(b" " * (2 << 20)), "more than"),
        (lambda f: (f / "sentencepiece.model").unlink(), "no sentencepiece.model"),
        (lambda f: (f / "model" / "shared_vocabulary.json").write_text('["a", "a"]'), "a token twice"),
        (lambda f: (f / "model" / "config.json").write_text('{"layer_norm_epsilon": "x"}'), "layer_norm_epsilon"),
        (lambda f: (f / "model" / "model.bin").write_bytes((f / "model" / "model.bin").read_bytes()[:-9]), "truncated"),
    ],
)
def test_malformed_packages_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, package: Path, damage: Callable[[Path], None], message: str
) -> None:
    folder = Path(shutil.copytree(package, tmp_path / "pkg"))
    damage(folder)
    refused(caplog, folder, tmp_path, message)
    archive = zip_package(folder, tmp_path / "pkg.argosmodel")
    refused(caplog, archive, tmp_path, message)


def test_an_existing_bundle_is_kept_without_force(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, package: Path
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("mine")
    assert main(["import-argos", str(package), str(tmp_path / "out")]) == 2
    assert "--force" in caplog.text
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep"]


def test_the_refusal_is_one_line_on_stderr(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "evil.argosmodel", [("pkg/../../evil.txt", b"x")])
    run = subprocess.run(
        [str(Path(sys.executable).parent / "attnserve"), "import-argos", str(archive), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2
    assert len(run.stderr.strip().splitlines()) == 1 and "climbs out" in run.stderr and not run.stdout
