"""Glossary files: a pair's enforced terms, source term → target term, read once when its engine loads.

Terms are enforced by masking (service/text/spans.py): a term is a protected span whose output is its target
term, so the translation has it by construction. Constrained decoding would let the model inflect around the term
at the cost of a decoder change and of search that can fail to place it; docs/ARCHITECTURE.md says more.
"""

from __future__ import annotations

from pathlib import Path

from service.runtime.bundle import BundleError


def read_glossary(directory: Path | None, source: str, target: str) -> dict[str, str]:
    """``directory/<source>-<target>.tsv`` as a dict, empty where there is no directory or no such file.

    Raises:
        BundleError: a line is not ``source term<TAB>target term``, naming the file and line.
    """
    if directory is None:
        return {}
    path = directory / f"{source}-{target}.tsv"
    if not path.exists():
        return {}
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            raise BundleError(f"{path}:{n}: a glossary line is 'source term<TAB>target term'")
        out[fields[0].strip()] = fields[1].strip()
    return out
