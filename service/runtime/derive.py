"""Graphs a bundle derives instead of shipping: the int8 variant, quantized without torch (ONNX Runtime's dynamic
quantization) from the fast graphs that the bundle ships, written beside them on first load and checked against
the manifest's sha256.

The manifest's ``derived`` object maps each derived file to ``{"from": SOURCE, "by": HOW, "onnxruntime": VERSION}``:
``HOW`` is one of :data:`DERIVE`, ``VERSION`` the ONNX Runtime that derived the manifest's sha256 (another version's
optimizer and quantizer may write other bytes, which the sha256 check then refuses). A derived file is the cache:
present, it is verified like every other file; missing, it is derived again if the bundle directory is writable (a
read-only one, such as a Docker image's, derives at build time: ``attnserve derive DIR``).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.runtime.kernels import attention_kernels, kernel_session

log = logging.getLogger(__name__)


class DeriveError(ValueError):
    """A derived graph cannot be written; the message names the file."""


def inline(source: Path, tmp: Path) -> Path:
    """``source`` with its external data read in, as one file in ``tmp``: ONNX Runtime's optimized graphs and the
    quantizer's copies keep external references relative to where they are written."""
    import onnx

    whole = tmp / f"inline.{source.name}"
    onnx.save(onnx.load(str(source)), str(whole))
    return whole


def int8_encoder(source: Path, dest: Path, h: int) -> None:
    """The int8 encoder: the fast encoder (attnserve's kernels) optimized offline so that every MatMul's weight is a
    constant, then int8 weights for every MatMul (``quantize_dynamic``, QInt8)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        kernel_session(inline(source, Path(tmp)), optimized=prepared)
        quantize_dynamic(prepared, dest, weight_type=QuantType.QInt8)
    attention_kernels(dest, h, "attnserve")  # imports only the domains it uses


def int8_decoder(source: Path, dest: Path, h: int) -> None:
    """The int8 decoder: the fast decoder with ONNX Runtime's attention kernels (what ``quant_pre_process`` can
    load) prepared, quantized as :func:`int8_encoder` does, and switched back to attnserve's kernels."""
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        quant_pre_process(inline(source, Path(tmp)), prepared, skip_symbolic_shape=True)
        quantize_dynamic(prepared, dest, weight_type=QuantType.QInt8)
    attention_kernels(dest, h, "attnserve")


DERIVE: dict[str, Callable[[Path, Path, int], None]] = {"int8-encoder": int8_encoder, "int8-decoder": int8_decoder}


class Theirs(logging.Filter):
    """Drops the records below ERROR that code under ``package`` logs through the root logger itself; as a filter of
    the root logger it never sees the records that other loggers hand up to the root's handlers."""

    def __init__(self, package: Path) -> None:
        super().__init__()
        self.package = str(package) + os.sep

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not record.pathname.startswith(self.package)


@contextmanager
def quiet_quantizer() -> Iterator[None]:
    """Within it, ONNX Runtime's quantizer logs its errors only.

    The quantizer logs through the root logger (``logging.warning(...)``: advice such as "Please consider to run
    pre-processing before quantization", meant for calibrated quantization), which a logger's level cannot silence
    and whose first call gives a process without logging configured ``logging.basicConfig``'s handler for good; its
    helpers log through the ``onnxruntime`` loggers. Called around each derive, from the command line and from a
    server's first load alike.
    """
    import onnxruntime

    root, helpers = logging.getLogger(), logging.getLogger("onnxruntime")
    theirs, level = Theirs(Path(onnxruntime.__file__).parent), helpers.level
    # a handler keeps logging.warning from configuring the root; lastResort is what answers when there is none
    stand_in = None if root.handlers else (logging.lastResort or logging.NullHandler())
    root.addFilter(theirs)
    helpers.setLevel(logging.ERROR)
    if stand_in is not None:
        root.addHandler(stand_in)
    try:
        yield
    finally:
        if stand_in is not None:
            root.removeHandler(stand_in)
        helpers.setLevel(level)
        root.removeFilter(theirs)


def derived_entries(where: str, manifest: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The manifest's ``derived`` object as derived file -> (source file, how).

    Raises:
        DeriveError: the entry is malformed or names an unknown way.
    """
    entries = manifest.get("derived", {})
    if not isinstance(entries, dict):
        raise DeriveError(f"{where}: derived: expected an object")
    out = {}
    for name, entry in sorted(entries.items()):
        if not isinstance(entry, dict) or set(entry) - {"onnxruntime"} != {"from", "by"} or entry["by"] not in DERIVE:
            raise DeriveError(
                f"{where}: derived[{name!r}]: expected {{'from': FILE, 'by': one of {sorted(DERIVE)}, 'onnxruntime': "
                "VERSION}"
            )
        out[name] = (str(entry["from"]), str(entry["by"]))
    return out


def derive_missing(bundle_dir: Path, manifest: dict[str, Any], force: bool = False) -> list[Path]:
    """Derive every file of the manifest's ``derived`` that is missing (or every one, with ``force``) into
    ``bundle_dir``, each written to a temporary file and renamed, so that a reader never sees half a graph.

    Returns:
        The files derived.

    Raises:
        DeriveError: the directory is not writable, or a source is missing.
    """
    derived = []
    for name, (source, how) in derived_entries(str(bundle_dir / "manifest.json"), manifest).items():
        dest = bundle_dir / name
        if dest.is_file() and not force:
            continue
        if not (bundle_dir / source).is_file():
            raise DeriveError(f"{bundle_dir / source}: missing (the source of the derived {name})")
        if not os.access(bundle_dir, os.W_OK):
            raise DeriveError(
                f"{dest}: missing, and {bundle_dir} is read-only — run `attnserve derive {bundle_dir}` where it is "
                "writable (the Docker image derives at build time)"
            )
        log.info("deriving %s from %s (%s)", dest, source, how)
        fd, tmp_name = tempfile.mkstemp(dir=bundle_dir, prefix=f".{name}.", suffix=".tmp")
        os.close(fd)
        try:
            try:
                with quiet_quantizer():
                    DERIVE[how](bundle_dir / source, Path(tmp_name), int(manifest["model"]["h"]))
            except Exception as e:  # ONNX Runtime's and onnx's errors have no common base: one line, naming the file
                raise DeriveError(f"{dest}: cannot be derived from {source} ({type(e).__name__}: {e})") from e
            os.chmod(tmp_name, 0o644)  # readable as the shipped files are (mkstemp's are the owner's only)
            os.replace(tmp_name, dest)
        finally:
            Path(tmp_name).unlink(missing_ok=True)
        derived.append(dest)
    return derived
