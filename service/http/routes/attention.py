"""POST /attention: a text's translation (or each text's of a list), as /translate gives it, with every attention
weight of each of its segments (lines, sentences) and their tokens."""

from __future__ import annotations

import asyncio
import gzip
import time
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from service.http.alignments import links_json, rule
from service.http.arrays import Encoding, encode
from service.http.body import parse_body
from service.http.errors import EmptyText, InvalidField
from service.http.limits import check_options, check_texts
from service.http.middleware import count_under
from service.http.openapi import ERRORS, request_body
from service.http.schemas import AttentionRequest, AttentionResponse
from service.http.state import state_of
from service.serving.translation import AttentionResult, Filters, Options, SegmentAttention

router = APIRouter()
GZIP_LEVEL = 1  # the body is mostly digits or near-zero bytes: level 1 gets most of the gain for a fraction of the time


@router.post(
    "/attention",
    response_model=AttentionResponse | list[AttentionResponse],
    response_model_exclude_none=True,
    responses=ERRORS,
    openapi_extra=request_body("AttentionRequest", "application/json"),
)
async def attention(request: Request) -> Response:
    """Translate (or force-decode ``target_text``) a text, or each text of a list, as /translate does and return
    every attention weight of each of its segments with their tokens (a list q: a list of answers)."""
    arrival = time.monotonic()  # the deadline counts from here
    state = state_of(request)
    body = await parse_body(request, AttentionRequest)
    state.admission.check(request, body.api_key, body.q)
    texts = [body.q] if isinstance(body.q, str) else body.q
    check_texts(state.settings, texts)
    targets = _target_texts(body, len(texts))
    for i, text in enumerate(texts):
        if not text.strip():
            where = "q" if isinstance(body.q, str) else f"q[{i}]"
            raise EmptyText(f"{where} is empty; send a text with at least one non-space character")
    options = Options(
        beam_size=body.beam_size,
        max_length=body.max_length,
        glossary=body.glossary,
        keep=tuple(body.keep or ()),
        raw=body.raw,
        alignments=body.alignments,
    )
    sources = [body.source] * len(texts)
    if body.source == "auto":
        sources = [d.language for d in state.models.detect_sources(texts, body.target)]
    groups: dict[str, list[int]] = {}
    for i, source in enumerate(sources):
        groups.setdefault(source, []).append(i)
    routes = {source: state.models.route(source, body.target) for source in groups}  # every pair checked first
    count_under(request, routes[sources[0]].pair)
    check_options(state.settings, options)
    filters = Filters(body.kinds, body.layers, body.heads)
    gone = request.is_disconnected
    answered = await asyncio.gather(
        *(
            routes[source].attention(
                [texts[i] for i in idx], options, filters, [targets[i] for i in idx], gone, arrival
            )
            for source, idx in groups.items()
        )
    )
    by_text = {
        i: r for idx, group in zip(groups.values(), answered, strict=True) for i, r in zip(idx, group, strict=True)
    }
    results = [by_text[i] for i in range(len(texts))]
    chosen = rule(body.alignment_layer, body.alignment_heads)
    links = [links_json(r.alignable, chosen) for r in results]
    gzipped = "gzip" in request.headers.get("accept-encoding", "")
    one = (results[0], links[0]) if isinstance(body.q, str) else list(zip(results, links, strict=True))
    content = await asyncio.to_thread(render, one, body.encoding, gzipped)  # megabytes: off the event loop
    headers = {"Vary": "Accept-Encoding", **({"Content-Encoding": "gzip"} if gzipped else {})}
    return Response(content, media_type="application/json", headers=headers)


def _target_texts(body: AttentionRequest, n: int) -> list[str | None]:
    """Each text's forced target (None: search), as ``target_text`` gives them: like ``q``, a string or a list.

    Raises:
        InvalidField: a list where q is a string, or a list of another length than q's.
    """
    if body.target_text is None:
        return [None] * n
    if isinstance(body.q, str) != isinstance(body.target_text, str):
        raise InvalidField("target_text: a string for a string q, a list of as many texts for a list q")
    targets: list[str | None] = [body.target_text] if isinstance(body.target_text, str) else list(body.target_text)
    if len(targets) != n:
        raise InvalidField(f"target_text: {len(targets)} texts where q has {n}; send one for each text of q")
    return targets


def answer(result: AttentionResult, encoding: Encoding = "json") -> dict[str, Any]:
    """The response body: the translation and its segments, each with its offsets, tokens and [layer][head][query]
    [key] weights per kind. A text of one segment has its tokens and weights at the top level, where bertviz and
    the clients of one sentence read them, and its one segment entry has no weights of its own."""
    segments = [_segment(s) for s in result.segments]
    if len(segments) != 1:
        for entry, s in zip(segments, result.segments, strict=True):
            entry.update(_weights(s, encoding))
        return {"translatedText": result.text, "layers": result.layers, "heads": result.heads, "segments": segments}
    (only,) = result.segments
    return {
        "source_tokens": only.source_tokens,
        "target_tokens": only.target_tokens,
        "decoder_input_tokens": only.decoder_input_tokens,
        "translatedText": result.text,
        "layers": result.layers,
        "heads": result.heads,
        **_weights(only, encoding),
        "segments": segments,
    }


def _segment(s: SegmentAttention) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "source_offsets": list(s.source),
        "target_offsets": list(s.target),
        "model_input": s.model_input,
        "source_tokens": s.source_tokens,
        "target_tokens": s.target_tokens,
        "decoder_input_tokens": s.decoder_input_tokens,
    }
    if s.spans is not None:  # absent, as the route's other empty fields are
        entry["spans"] = s.spans
    return entry


def _with_links(result: AttentionResult, links: Links, encoding: Encoding) -> dict[str, Any]:
    body = answer(result, encoding)
    if links is not None:
        body["alignments"] = links
    return body


def _weights(s: SegmentAttention, encoding: Encoding) -> dict[str, Any]:
    return {kind: encode(weights, encoding) for kind, weights in s.weights.items()}


Links = list[dict[str, list[int]]] | None  # a text's word alignments, if asked (service/http/alignments.py)


def render(
    result: tuple[AttentionResult, Links] | list[tuple[AttentionResult, Links]], encoding: Encoding, gzipped: bool
) -> bytes:
    """The response's bytes (gzip-compressed when the client accepts it): one answer, or a list of them, each with
    its text's word alignments if asked."""
    body = _with_links(*result, encoding) if isinstance(result, tuple) else [_with_links(*r, encoding) for r in result]
    content = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    return gzip.compress(content, GZIP_LEVEL, mtime=0) if gzipped else content
