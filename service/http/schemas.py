"""Request and response bodies of the HTTP API, with the examples that OpenAPI (/docs) shows."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

Kind = Literal["encoder", "decoder", "cross"]
SpanPath = Literal["decoded", "constrained", "attention", "appended"]  # service/serving/restoring.py's PATHS
# The shipped en→ja model's answers to {"q": ..., "kinds": ["cross"], "layers": [0], "heads": [0]}.
ATTENTION_EXAMPLES: list[JsonValue] = [
    {
        "source_tokens": ["▁Open", "▁file", "</s>"],
        "target_tokens": ["▁", "ファイルを開く", "</s>"],
        "decoder_input_tokens": ["<pad>", "▁", "ファイルを開く"],
        "translatedText": "ファイルを開く\n",
        "layers": {"cross": [0]},
        "heads": [0],
        "cross": [[[[0.513023, 0.006474, 0.480503], [0.648878, 0.017704, 0.333418], [0.023171, 0.069135, 0.907694]]]],
        "segments": [
            {
                "source_offsets": [0, 9],
                "target_offsets": [0, 7],
                "model_input": "Open file",
                "source_tokens": ["▁Open", "▁file", "</s>"],
                "target_tokens": ["▁", "ファイルを開く", "</s>"],
                "decoder_input_tokens": ["<pad>", "▁", "ファイルを開く"],
            }
        ],
    },
    {
        "translatedText": "%sを開く\n保存",
        "layers": {"cross": [0]},
        "heads": [0],
        "segments": [
            {
                "source_offsets": [0, 7],
                "target_offsets": [0, 5],
                "model_input": "Open {0}",
                "source_tokens": ["▁Open", "▁{0}", "</s>"],
                "target_tokens": ["▁{0}", "を開く", "</s>"],
                "decoder_input_tokens": ["<pad>", "▁{0}", "を開く"],
                "spans": "decoded",
                "cross": [
                    [[[0.622816, 0.191109, 0.186075], [0.820718, 0.087878, 0.091404], [0.015924, 0.028003, 0.956073]]]
                ],
            },
            {
                "source_offsets": [8, 12],
                "target_offsets": [6, 8],
                "model_input": "Save",
                "source_tokens": ["▁Save", "</s>"],
                "target_tokens": ["▁", "保存", "</s>"],
                "decoder_input_tokens": ["<pad>", "▁", "保存"],
                "cross": [[[[0.298188, 0.701812], [0.882526, 0.117474], [0.378097, 0.621903]]]],
            },
        ],
    },
]


RAW = (
    "The text goes to the model exactly as given, whole: no line or sentence split, no protected spans or numbers "
    "masked, no glossary or keep (422 with them), format 'text' only; its SentencePiece pieces are the whole text's."
)


class TranslateRequest(BaseModel):
    """LibreTranslate's /translate body, plus attnserve's optional decoding controls; any other field is a 422."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"q": "Open file", "source": "en", "target": "ja"},
                {"q": ["Save as…", "Delete the selected files?"], "source": "en", "target": "ja", "beam_size": 4},
            ]
        },
    )

    q: str | list[str] = Field(description="A text, or a list of texts (answers keep the order).")
    source: str = Field("auto", description="Source language code, or 'auto' (the pair serving the target).")
    target: str = Field(description="Target language code, as GET /languages lists it.")
    format: Literal["text", "html"] = Field(
        "text", description="'html': text nodes are translated, markup, attributes, scripts and styles kept."
    )
    alternatives: int = Field(
        0,
        ge=0,
        le=7,
        description="Extra translations: the beam's next best that read differently from the best and from each "
        "other (fewer when it finds fewer); the beam widens to at least alternatives + 1.",
    )
    api_key: str | None = Field(None, description="API key, when the server requires one.")
    beam_size: int | None = Field(
        None, ge=1, description="1 = greedy; up to the server's max_beam_size. Default: the server's (docs/API.md)."
    )
    max_length: int | None = Field(None, ge=1, description="Most tokens to generate per text.")
    length_penalty: float | None = Field(
        None, ge=0.0, le=4.0, description="Beam ranking: score / length^length_penalty. Default: the server's."
    )
    return_details: bool = Field(False, description="Add tokens, scores and a cross-attention alignment.")
    glossary: dict[str, str] | None = Field(
        None, description="Source term → target term: each term found in a text is in its translation as given."
    )
    keep: list[str] | None = Field(None, description="Terms copied into the translation verbatim.")
    raw: bool = Field(False, description=RAW)
    secret: str | None = Field(
        None, description="What LibreTranslate's web frontend sends with its API key (its key secret); not used."
    )
    alignments: bool = Field(
        False, description="Add word alignments: character spans of the text and of its translation (docs/API.md)."
    )
    alignment_layer: int | None = Field(
        None,
        description="The decoder layer the alignments read (negative: from the last); default the measured rule's.",
    )
    alignment_heads: list[int] | None = Field(
        None, min_length=1, description="The heads the alignments average; default the measured rule's."
    )


class WordLink(BaseModel):
    """Two words that translate each other: [start, end) code points of the request text and of the translation."""

    source: list[int] = Field(min_length=2, max_length=2)
    target: list[int] = Field(min_length=2, max_length=2)


class TranslateResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"translatedText": "ファイルを開く"}, {"translatedText": ["設定", "閉じる"]}]}
    )

    translatedText: str | list[str]
    alternatives: list[str] | list[list[str]] | None = None
    detectedLanguage: dict[str, str | float] | list[dict[str, str | float]] | None = Field(
        None, description="With source 'auto': each text's detected language and confidence (0–100)."
    )
    alignments: list[WordLink] | list[list[WordLink] | None] | None = Field(
        None,
        description="With alignments: the text's word pairs (a list of them per text for a list q), ordered by "
        "source then target; null for a text translated through a pivot language or with format 'html'.",
        examples=[[{"source": [0, 4], "target": [5, 7]}, {"source": [5, 9], "target": [0, 4]}]],
    )
    details: dict[str, Any] | list[dict[str, Any]] | None = Field(
        None,
        description="With return_details: source_tokens, tokens, score, token_scores, alignment, coverage (each "
        "source token's most attention from any step), confidence (0–1, calibrated on dev; null without a "
        "calibration), flags ('omission', 'copy', 'repetition') and spans (for a text with protected spans, how "
        "they were restored: 'decoded', 'constrained', 'attention' or 'appended'; else null); {} for a text that "
        "decoded nothing. Through a pivot language: {hops: [{source, target, translatedText, ...that hop's "
        "details}, ...]}.",
        examples=[
            {
                "source_tokens": ["▁Open", "▁file", "</s>"],
                "tokens": ["▁", "ファイルを開く", "</s>"],
                "score": -0.803315,
                "token_scores": [-0.565294, -0.146731, -0.09129],
                "alignment": [0, 0, 2],
                "coverage": [0.445907, 0.345928, 0.80343],
                "confidence": 0.76647,
                "flags": [],
                "spans": None,
            },
            {
                "source_tokens": ["▁Open", "▁{0}", "</s>"],
                "tokens": ["▁{0}", "を開く", "</s>"],
                "score": -0.573294,
                "token_scores": [-0.032027, -0.458038, -0.083228],
                "alignment": [1, 2, 2],
                "coverage": [0.417748, 0.74963, 0.902842],
                "confidence": 0.781602,
                "flags": [],
                "spans": "decoded",
            },
        ],
    )


class AttentionRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"q": "Open file", "source": "en", "target": "ja"},
                {"q": "Open file", "source": "en", "target": "ja", "target_text": "ファイルを開く", "kinds": ["cross"]},
                {"q": "Settings", "source": "en", "target": "ja", "layers": [0], "heads": [0, 1]},
                {"q": "Open %s\nSave", "source": "en", "target": "ja", "kinds": ["cross"], "layers": [0], "heads": [0]},
                {"q": "Open %s\nSave", "source": "en", "target": "ja", "target_text": "%sを開く\n保存"},
                {"q": ["Open file", "Settings"], "source": "en", "target": "ja", "kinds": ["cross"], "raw": True},
            ]
        },
    )

    q: str | list[str] = Field(
        description="A text (not empty: 400), cut into lines and sentences and its protected spans masked as "
        "/translate does: the translation is /translate's; or a list of texts, answered by a list of answers in "
        "the same order, each the answer its text gets alone."
    )
    source: str = "auto"
    target: str
    target_text: str | list[str] | None = Field(
        None,
        description="Force-decode this translation instead of searching: the same lines with text as q (and the "
        "same sentences on a line q's layout cuts into sentences), else 422; with a list q, a list of as many "
        "(each forcing its text).",
    )
    glossary: dict[str, str] | None = Field(None, description="As /translate's.")
    keep: list[str] | None = Field(None, description="As /translate's.")
    raw: bool = Field(False, description=RAW)
    layers: list[int] | None = Field(None, description="Layer indices to return (default all).")
    heads: list[int] | None = Field(None, description="Head indices to return (default all).")
    kinds: list[Kind] = Field(["encoder", "decoder", "cross"], min_length=1, description="Attention kinds.")
    beam_size: int | None = Field(None, ge=1, description="1 = greedy. Default: the server's, as /translate's.")
    max_length: int | None = Field(None, ge=1)
    api_key: str | None = None
    encoding: Literal["json", "float16", "uint8"] = Field(
        "json",
        description="How the arrays travel: 'json', nested lists (bertviz's layout); 'float16' or 'uint8' "
        "(weight = byte × scale), {dtype, shape, data: base64 of the C-order little-endian bytes}: smaller, above "
        "all with Accept-Encoding: gzip.",
    )
    alignments: bool = Field(False, description="Add word alignments, as /translate's.")
    alignment_layer: int | None = Field(None, description="As /translate's.")
    alignment_heads: list[int] | None = Field(None, min_length=1, description="As /translate's.")


class EncodedArray(BaseModel):
    """A compact [layer][head][query][key] array (``encoding`` float16 or uint8)."""

    dtype: Literal["float16", "uint8"]
    shape: list[int]
    data: str = Field(description="base64 of the array's bytes, C order, little-endian.")
    scale: float | None = Field(None, description="uint8 only: weight = byte × scale (1/255).")


Weights = list[list[list[list[float]]]] | EncodedArray


class AttentionSegment(BaseModel):
    """One decoded line or sentence of the text: where it stands, what the model read, its tokens and (when the
    text has several segments) its weights, [layer][head][query][key] per kind."""

    source_offsets: list[int] = Field(description="[start, end): q[start:end] is the segment (Unicode code points).")
    target_offsets: list[int] = Field(description="[start, end): its translation in translatedText (code points).")
    model_input: str = Field(description="What the model read: the segment with its protected spans' stand-ins.")
    source_tokens: list[str]
    target_tokens: list[str]
    decoder_input_tokens: list[str]
    spans: SpanPath | None = Field(
        None,
        description="For a segment with protected spans, how they were restored, as /translate's details say: "
        "'decoded', 'constrained' (the tokens and weights are the constrained re-decode's), 'attention' or "
        "'appended' (the first decode's tokens and weights; the segment's translation is their text cleaned, with "
        "the spans placed, not their plain concatenation); absent without spans and with target_text.",
    )
    encoder: Weights | None = None
    decoder: Weights | None = None
    cross: Weights | None = None


class AttentionResponse(BaseModel):
    """Arrays are [layer][head][query][key]: encoder [S][S], decoder [T][P + T] (0 right of key P + t), cross [T][S].

    Query t of decoder and cross attention is the step that produced ``target_tokens[t]`` from
    ``decoder_input_tokens[P + t]`` (P: the length of the bundle's forced target prefix, an imported Argos
    package's ``target_prefix``, usually 0); decoder self-attention keys are ``decoder_input_tokens``. A text of one
    segment has its tokens and arrays at the top level (its segment entry has none); a text of several segments has
    them in each segment entry only.
    """

    model_config = ConfigDict(json_schema_extra={"examples": ATTENTION_EXAMPLES})

    source_tokens: list[str] | None = None
    target_tokens: list[str] | None = None
    decoder_input_tokens: list[str] | None = None
    translatedText: str
    layers: dict[str, list[int]]
    heads: list[int]
    encoder: Weights | None = None
    decoder: Weights | None = None
    cross: Weights | None = None
    segments: list[AttentionSegment]
    alignments: list[WordLink] | None = Field(None, description="With alignments: as /translate's for one text.")


class Language(BaseModel):
    code: str
    name: str
    targets: list[str]


class ErrorResponse(BaseModel):
    error: str = Field(description="What is wrong and how to fix it.")


class TranslateFileResponse(BaseModel):
    """Where the translated file can be downloaded (``GET /download_file/<name>``) until it expires."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"translatedFileUrl": "http://127.0.0.1:8000/download_file/3f2a9c0e5b7d41e8a6c4f1b2d3e4f5a6_app.po"}
            ]
        }
    )

    translatedFileUrl: str


class DetectRequest(BaseModel):
    """LibreTranslate's /detect body; any other field is a 422."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"q": "Datei öffnen"}, {"q": ["Open file", "ファイルを開く"]}]},
    )

    q: str | list[str] = Field(description="A text, or a list of texts (one list of candidates each).")
    api_key: str | None = Field(None, description="API key, when the server requires one.")


class DetectedLanguage(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"confidence": 99.0, "language": "de"}]})

    confidence: float = Field(description="0–100.")
    language: str = Field(description="Language code (ISO 639-1 where there is one).")


class LanguageChoice(BaseModel):
    code: str
    name: str


class FrontendSettings(BaseModel):
    """What LibreTranslate's web frontend reads at start."""

    charLimit: int = Field(description="Characters per text (max_chars).")
    frontendTimeout: int = Field(description="Milliseconds a frontend waits after typing before it translates.")
    apiKeys: bool = Field(description="Whether the server has API keys.")
    keyRequired: bool = Field(description="Whether /translate and /detect need one.")
    suggestions: bool = Field(description="Whether /suggest takes suggestions (never).")
    filesTranslation: bool = Field(description="Whether /translate_file translates files.")
    supportedFilesFormat: list[str] = Field(description="File extensions /translate_file accepts.")
    language: dict[str, LanguageChoice] = Field(description="The frontend's default 'source' and 'target'.")
