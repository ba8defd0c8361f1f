"""``return_details``' confidence and flags on the test split, with the calibration the bundle's manifest holds
(``attnserve calibrate``, fitted on dev). Writes docs/BENCHMARKS.md's ``confidence`` section and
docs/confidence.png (reliability, and confidence against sentence chrF).

    python bench/confidence.py [--bundle model/bundles/en-ja] [--corpus ~/.cache/attnserve/corpus/en-ja]

Figures: Spearman's rank correlation between confidence and sentence chrF (and the mean token log-probability's,
the one-feature baseline); the omission flag's rate on translations the reference shows to be incomplete against
its rate on the others; the copy flag's precision (flagged outputs whose reference is not itself the source).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from common import DOCS, machine, versions, write_section
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from model.calibrate import INCOMPLETE_RATIO, Scored, translate_scored
from model.data import read_pairs
from service.serving.confidence import copy_share
from service.settings import EN_JA

BINS = 10  # reliability bins, equal counts


def same(a: str, b: str) -> bool:
    """Whether two texts are the same but for case and spaces."""
    return "".join(a.casefold().split()) == "".join(b.casefold().split())


def measure(rows: list[Scored]) -> dict[str, Any]:
    """The section's figures for translated, scored test rows."""
    details = [r.translation.details for r in rows]
    assert all(d is not None and d.confidence is not None for d in details), "the manifest has no calibration"
    conf = np.array([d.confidence for d in details if d is not None], np.float64)
    chrf = np.array([r.chrf for r in rows])
    mean_logprob = np.array([np.mean(r.evidence.token_scores) for r in rows])
    flags = [set(d.flags) for d in details if d is not None]
    incomplete = np.array([r.incomplete for r in rows])
    omission = np.array(["omission" in f for f in flags])
    copy = np.array(["copy" in f for f in flags])
    wrong_copy = np.array([not same(r.reference, r.source) for r in rows])
    verbatim = np.array([copy_share(r.source, r.translation.text) == 1.0 for r in rows])
    order = np.argsort(conf, kind="stable")
    bins = [(float(conf[b].mean()), float(chrf[b].mean()), len(b)) for b in np.array_split(order, BINS)]
    return {
        "n": len(rows),
        "spearman": float(spearmanr(conf, chrf).statistic),
        "spearman_logprob": float(spearmanr(mean_logprob, chrf).statistic),
        "ece": sum(n * abs(c - q) for c, q, n in bins) / len(rows),
        "bins": bins,
        "incomplete": int(incomplete.sum()),
        "omission_incomplete": float(omission[incomplete].mean()) if incomplete.any() else float("nan"),
        "omission_others": float(omission[~incomplete].mean()),
        "omission_fired": int(omission.sum()),
        "copy_fired": int(copy.sum()),
        "copy_precision": float(wrong_copy[copy].mean()) if copy.any() else float("nan"),
        "copy_verbatim": float(verbatim[copy].mean()) if copy.any() else float("nan"),
        "conf": conf,
        "chrf": chrf,
    }


def plot(m: dict[str, Any], path: Path) -> None:
    """Reliability (mean chrF / 100 against mean confidence, per bin) beside confidence against sentence chrF."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.4))
    xs, ys = [c for c, _, _ in m["bins"]], [q for _, q, _ in m["bins"]]
    a.plot([0, 1], [0, 1], color="0.7", linestyle="--", label="perfect calibration")
    a.plot(xs, ys, marker="o", label=f"test split, {BINS} equal-count bins")
    a.set(xlabel="mean confidence", ylabel="mean sentence chrF / 100", xlim=(0, 1), ylim=(0, 1))
    a.set_title(f"Reliability (ECE {m['ece']:.3f})")
    a.legend(loc="upper left")
    b.scatter(m["conf"], m["chrf"], s=4, alpha=0.25)
    b.set(xlabel="confidence", ylabel="sentence chrF / 100", xlim=(0, 1), ylim=(0, 1.02))
    b.set_title(f"Confidence against chrF (Spearman {m['spearman']:.3f}, n = {m['n']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def section(m: dict[str, Any], bundle: Path, corpus: Path) -> str:
    """The ``confidence`` section of docs/BENCHMARKS.md."""
    rows = "\n".join(f"| {c:.3f} | {q:.3f} | {n} |" for c, q, n in m["bins"])
    return f"""## Confidence and flags (`return_details`)

`python bench/confidence.py --bundle {bundle} --corpus {corpus}`; calibration fitted on dev by
`attnserve calibrate {bundle} --corpus {corpus}`. {machine()}; {versions("onnxruntime", "scikit-learn")};
load average {os.getloadavg()[0]:.1f}. Test split, greedy (the default decoding), {m["n"]} texts.

| measure | value |
|---|---|
| Spearman, confidence vs sentence chrF | {m["spearman"]:.3f} |
| Spearman, mean token log-probability alone vs sentence chrF | {m["spearman_logprob"]:.3f} |
| expected calibration error ({BINS} equal-count bins, chrF / 100) | {m["ece"]:.3f} |
| incomplete translations (characters < {INCOMPLETE_RATIO:g} × the reference's) | {m["incomplete"]} |
| `omission` fires on incomplete translations | {m["omission_incomplete"]:.1%} |
| `omission` fires on the others | {m["omission_others"]:.1%} |
| `copy` fired | {m["copy_fired"]} |
| `copy` precision (flagged outputs whose reference differs from the source) | {m["copy_precision"]:.1%} |
| flagged outputs that repeat the source whole | {m["copy_verbatim"]:.1%} |

Reliability on test (docs/confidence.png):

| mean confidence | mean chrF / 100 | texts |
|---|---|---|
{rows}

![confidence calibration](confidence.png)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=EN_JA)
    parser.add_argument("--corpus", type=Path, default=Path.home() / ".cache" / "attnserve" / "corpus" / "en-ja")
    parser.add_argument("--limit", type=int, default=None, help="first N test pairs only")
    args = parser.parse_args()
    bundle = Path(os.path.relpath(args.bundle.resolve()))
    rows = translate_scored(args.bundle, read_pairs(args.corpus / "test.tsv")[: args.limit])
    m = measure(rows)
    plot(m, DOCS / "confidence.png")
    text = section(m, bundle, Path(str(args.corpus).replace(str(Path.home()), "~")))
    write_section("confidence", text)
    print(text)


if __name__ == "__main__":
    main()
