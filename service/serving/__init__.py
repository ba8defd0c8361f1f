"""Serving one language pair: the engine, the batching scheduler, admission, the memory budget, the response cache,
core sharing, and the values the engine takes and gives."""
