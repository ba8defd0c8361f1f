"""Batched greedy, beam and forced decoding on the key/value cache, with attention rows collected step by step.

request.py (what callers send and get back), decoder.py (:class:`BatchDecoder`, :func:`decode`), batch.py (a
batch's step), rows.py (the rows' bookkeeping), search.py (greedy, beam, forced), encoding.py (sources in one
encoder call), caches.py with appended.py and in_place.py (the key/value cache layouts), step_runner.py (what the
decoder needs from a runner).
"""

from service.decoding.decoder import BatchDecoder, decode
from service.decoding.encoding import PACK_WIDTHS, pack
from service.decoding.request import DecodeRequest, DecodeResult, Hypothesis
from service.decoding.search import beam_places, beam_top
from service.decoding.step_runner import StepRunner

__all__ = [
    "PACK_WIDTHS",
    "BatchDecoder",
    "DecodeRequest",
    "DecodeResult",
    "Hypothesis",
    "StepRunner",
    "beam_places",
    "beam_top",
    "decode",
    "pack",
]
