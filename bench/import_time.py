"""A transformer-base OPUS-MT model (d_model 512, 6+6 layers, 8 heads, FFN 2048, 58,000 pieces: 74 M parameters,
random weights in Marian's layout, tests/numpy_models.py) written to DIR, for timing its import:

    python -m bench.import_time /tmp/base
    /usr/bin/time -v taskset -c 0 .venv-service/bin/attnserve import-marian /tmp/base /tmp/base-bundle
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.numpy_models import marian_directory

SPM = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tiny-en-ja" / "spm.model"


def main() -> None:
    out = marian_directory(Path(sys.argv[1]), SPM, d_model=512, heads=8, d_ff=2048, layers=(6, 6), vocab_size=58000,
                           positions=512)  # fmt: skip
    print(out)


if __name__ == "__main__":
    main()
