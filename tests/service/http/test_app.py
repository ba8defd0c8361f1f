"""The app's start-up (service/http/app.py's lifespan)."""

from __future__ import annotations

import gc

from tests.service.conftest import ServerFactory


def test_start_up_leaves_what_it_made_out_of_garbage_collection(make_server: ServerFactory) -> None:
    """Once ready, what start-up made is frozen (the cyclic collector skips it) and the young generation is
    collected every 10,000 allocations: less of the event loop's time in the collector."""
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    make_server()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (10_000, 10, 10)
