"""The service's one settings object, read from ``ATTNSERVE_*`` environment variables (and ``.env``).

Built in the FastAPI lifespan (never at import) and validated there: a bad value stops start-up with a message that
names the variable.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.http.keys import KeysFileError, read_keys_file
from service.runtime.bundle import bundle_dirs
from service.serving.packages import argos_packages_dir, default_cache_dir

MODEL_BUNDLES = Path(__file__).resolve().parent.parent / "model" / "bundles"  # every bundle the repository ships
EN_JA = MODEL_BUNDLES / "en-ja"


class PairDecoding(BaseModel):
    """One pair's decoding defaults (``pair_defaults``' values): each field unset falls back to the global one."""

    model_config = ConfigDict(extra="forbid")

    beam_size: int | None = Field(None, ge=1, le=8)
    length_penalty: float | None = Field(None, ge=0.0, le=4.0)


class Settings(BaseSettings):
    """Every field is an environment variable: ``ATTNSERVE_<FIELD>`` (lists as JSON or comma-separated)."""

    model_config = SettingsConfigDict(env_prefix="ATTNSERVE_", env_file=".env", extra="ignore")

    bundles: Annotated[list[Path], NoDecode] = Field(
        default_factory=lambda: [MODEL_BUNDLES],
        description="Bundle directories to serve, one per language pair; a directory of bundles stands for each "
        "bundle in it, in name order (read again on a reload). Unset: every bundle under model/bundles.",
    )
    reload_interval_s: float = Field(
        2.0,
        ge=0,
        description="How often the directories of BUNDLES, the packages directory and argos_cache are looked at "
        "(their entries' names and times); on a change, as on SIGHUP, the bundles and packages are read again: new "
        "ones loaded and served, gone ones unloaded once their requests in flight end, broken ones skipped (logged, "
        "counted). 0 = only on SIGHUP.",
    )
    shipped_bundles: Path = Field(
        MODEL_BUNDLES,
        description="Where the bundles that come with attnserve are (model/bundles; the images set theirs): a "
        "pair that a bundle elsewhere in BUNDLES or a package also serves is served from that one, the user's, and "
        "the shipped bundle is shadowed (logged; `attnserve models` names it).",
    )
    argos_packages: Path | None = Field(
        None,
        description="A directory of unpacked Argos Translate packages (a LibreTranslate installation's), each "
        "served as a bundle imported into argos_cache; set alone (no BUNDLES, no --bundle), only the packages are "
        "served. Unset: argos-translate's own packages directory when it exists, beside BUNDLES. Empty: none.",
    )
    argos_cache: Path = Field(
        default_factory=default_cache_dir,
        description="Where the packages' bundles are kept, one a package's content (docs/MODELS.md): imported by "
        "`attnserve import-argos --packages`, or by serve itself, which imports what it lacks.",
    )
    models_memory_mb: int = Field(
        0,
        ge=0,
        description="Memory the loaded bundles may take, each counted by the weights its sessions hold at the "
        "precision it serves, its exact float32 graphs for /attention included (`attnserve models`, loaded; "
        "float16-stored weights count as the float32 they load as; what a bundle adds to the resident memory: "
        'docs/BENCHMARKS.md, "Memory of a loaded bundle"). Bundles load on first use; when one more would pass this, '
        "the least recently used bundle with no request in flight is unloaded first, and "
        "where none can be, the request gets 503 + Retry-After. Lower = less memory, and more first requests that "
        "wait for a load (docs/DEPLOY.md). 0 = no bound: a bundle once loaded stays.",
    )
    eager_models: int = Field(
        8,
        ge=0,
        description="Bundles loaded and warmed at start-up, the first of BUNDLES in order (as many as fit in "
        "models_memory_mb); /readyz says ready once they are. The others load when a request first needs them. "
        "More = a longer start and more memory; fewer = first requests that wait for a load.",
    )
    pivot_language: str = Field(
        "en",
        description="A pair that no bundle serves, X→Y, is served in two hops, X→this→Y, when bundles serve both; "
        "twice the decoding, and each hop's errors carry into the next. Empty = no pivoting.",
    )
    provider: Literal["auto", "cuda", "cpu"] = Field(
        "auto",
        description="ONNX Runtime execution provider: auto = CUDA when onnxruntime-gpu starts CUDA on a GPU, else "
        "CPU; cuda = CUDA or stop at start-up with the reason.",
    )
    gpu_mem_limit_mb: int = Field(
        0,
        ge=0,
        description="On CUDA, the bound on each ONNX Runtime session's device memory arena (the CUDA execution "
        "provider's gpu_mem_limit; a bundle runs several sessions: encoder, decoder, the cache helpers). An arena "
        "never shrinks, so the bound keeps one burst from holding the GPU's memory for good; a step that would "
        "pass it fails the texts it decodes (500). 0 = no bound.",
    )
    threads: int = Field(
        1,
        ge=0,
        description="Intra-op threads per ONNX Runtime session (0 = ONNX Runtime's default, all cores). One thread "
        "per worker is the safe choice on small machines: spinning thread pools collapse when cores are shared.",
    )
    decode_threads: int = Field(
        1,
        ge=1,
        le=64,
        description="Batching loops per graph variant, each on its own thread with its own batches, sharing the "
        "ONNX Runtime sessions; a request goes to the least busy one. ONNX Runtime calls of this small model "
        "scale little with intra-op threads, so on a few cores several decoding threads of one thread each serve "
        "more texts per second than one decoding thread of several (docs/BENCHMARKS.md).",
    )
    graph_variant: Literal["float32", "int8", "float16"] | None = Field(
        None,
        description="Graphs for /translate, for every bundle; unset, each bundle serves its own default (its "
        "manifest's default_variant: int8 for an Argos package whose weights were int8, else float32). int8 "
        "(dynamically quantized) is faster on CPU at a small accuracy cost (docs/BENCHMARKS.md); float16 is for GPUs "
        "(on a CPU it is no faster). /attention always uses the exact float32 graphs.",
    )
    host: str = Field("127.0.0.1", description="Listen address (0.0.0.0 in containers).")
    port: int = Field(8000, ge=1, le=65535)

    max_batch_size: int = Field(32, ge=1, description="Sequences decoded together (×beam); more = throughput.")
    max_batch_tokens: int = Field(
        8192, ge=16, description="Source tokens (padding included) in one batch; bounds memory per step."
    )
    max_wait_ms: float = Field(
        5.0, ge=0, description="How long a new batch waits for more requests; latency cost vs batching gain."
    )
    continuous_batching: bool = Field(
        True,
        description="Texts join and leave the batch between decoding steps; false = a batch runs to its end "
        "before the next one starts (request-level batching: long texts hold short ones back).",
    )
    encode_ahead: int = Field(
        16,
        ge=0,
        description="While the batch is full, rows' worth of queued texts encoded ahead with those that join now "
        "(one encoder call for many texts costs less a text); 0 = encode texts only when they join.",
    )
    # About a second of the fastest throughput, the p99 a service aims at: a shorter queue turns Poisson bursts into
    # 503s while answers are still fast (docs/BENCHMARKS.md).
    queue_size: int = Field(
        1024, ge=1, description="Texts waiting for a slot, per decoding thread; beyond it requests get 503."
    )
    request_timeout_s: float = Field(30.0, gt=0, description="Deadline per request; a missed one gets 504.")
    warmup: bool = Field(True, description="Translate once at start-up before /readyz says ready.")
    shutdown_timeout_s: float = Field(
        30.0,
        gt=0,
        description="On SIGTERM, the most seconds from the signal to the exit: requests in flight are answered in "
        "full meanwhile, new ones get 503; those still unanswered near the end get 503. Orchestrators' grace "
        "periods must be longer (docs/DEPLOY.md).",
    )
    # Below what one decoding thread of a busy 2-core machine sustains (docs/BENCHMARKS.md), with a margin, so that
    # the largest request the default allows ends in time.
    decode_rate: float = Field(
        2000,
        gt=0,
        description="Generated tokens per second (every beam hypothesis counted) one decoding thread sustains at "
        "least. A request that may generate more than request_timeout_s × decode_rate tokens (texts × beam_size × "
        "max_length) could never end in time and gets 413 at once. Raise it on faster machines (GPUs).",
    )
    small_request_share: float = Field(
        0.125,
        ge=0,
        le=0.5,
        description="Share of max_batch_size and max_batch_tokens kept for small requests (those whose texts fit "
        "in it all together): large requests take turns in the rest, so a small request joins the batch at the "
        "next step instead of waiting for a large one's rows to finish. 0 = no share kept (large requests still "
        "take turns); more = shorter waits for small requests, less throughput for large ones.",
    )
    memory_budget_mb: int = Field(
        512,
        ge=16,
        description="Memory that requests in flight may hold together, every pair's in one budget for the process "
        "(attention weights collected for /attention and return_details; tokens and scores), from queueing until "
        "their answer is built. Requests beyond it wait until their deadline, then get 503 + Retry-After; one that "
        "needs more than all of it gets 413.",
    )

    memory_trim_interval_s: float = Field(
        5.0,
        ge=0,
        description="Under steady load, the heap's free memory is handed back to the system at most this often "
        "(glibc malloc_trim; it is handed back anyway after a second with no request in flight). Without it, "
        "resident memory keeps the highest mark that coincidences of large requests ever reached; each trim makes "
        "the next decoding steps fault their freed pages in again. 0: only when idle.",
    )

    sched_batch: Literal["saturated", "always", "off"] = Field(
        "saturated",
        description="Linux: when the server's threads run under SCHED_BATCH, so that a request arriving does not "
        "interrupt the decoding step in progress. Where the event loop and decoding share a core that means fewer "
        "switches between them and more texts per second at saturation, but a request arriving at a busy core "
        "waits for the running thread's time slice, and other processes' threads preempt the server's "
        "(docs/BENCHMARKS.md). saturated: while a decoding batch holds 3/4 of max_batch_size rows or more, until "
        "every one has emptied; always: from start-up (bulk catalog runs); off: never.",
    )

    cache_mb: int = Field(
        0,
        ge=0,
        description="Memory for /translate's response cache, one for the process: a text already translated with "
        "the same pair and options is answered from it, least recently used dropped first, whatever its pair "
        "(return_details answers are not cached). 0 = off.",
    )

    max_chars: int = Field(5000, ge=1, description="Characters per text (413 beyond).")
    max_tokens: int = Field(256, ge=2, description="Source tokens per text, </s> included (413 beyond).")
    max_texts: int = Field(64, ge=1, description="Texts in one /translate request (413 beyond).")
    max_body_bytes: int = Field(1_000_000, ge=1024, description="Request body size (413 beyond).")
    max_beam_size: int = Field(8, ge=1, le=8, description="Largest beam_size a request may ask for.")
    max_length: int = Field(
        256, ge=1, description="Largest max_length (generated tokens); the default is min(this, 2 × source + 10)."
    )
    default_beam_size: int = Field(
        1,
        ge=1,
        le=8,
        description="The beam of a request that names no beam_size (at most max_beam_size): 1 = greedy, the "
        "fastest; LibreTranslate decodes with 4 (often better translations, several hypotheses decoded a text).",
    )
    default_length_penalty: float = Field(
        1.0,
        ge=0.0,
        le=4.0,
        description="The length penalty of a request that names none: finished beam hypotheses rank by score / "
        "length^this; LibreTranslate passes 0.2 to CTranslate2 (shorter hypotheses favoured more).",
    )
    pair_defaults: dict[str, PairDecoding] = Field(
        default_factory=dict,
        description='Per pair, decoding defaults over the two above, as JSON: {"en-de": {"beam_size": 4, '
        '"length_penalty": 0.2}}; a key is a served pair, source-target, a pivot pair\'s applying to both of its '
        "hops. A request's own beam_size or length_penalty wins over both.",
    )

    sentence_split_chars: int = Field(
        200,
        ge=1,
        description="Lines longer than this are cut into sentences, decoded together in one batch; shorter lines "
        "decode whole (a UI string's sentences read better together).",
    )
    repetition_guard: bool = Field(
        True,
        description="An output that loops where its source does not is decoded once more under a repetition guard "
        "(service/serving/unlooping.py); every other output is the model's. False: every output as decoded.",
    )
    glossary_dir: Path | None = Field(
        None,
        description="A directory of glossaries, one a pair: <source>-<target>.tsv, lines 'source term<TAB>target "
        "term' (# comments); a request's own glossary entries override the file's.",
    )
    frontend_timeout_ms: int = Field(
        500,
        ge=0,
        description="What /frontend/settings reports as frontendTimeout: milliseconds a LibreTranslate "
        "web frontend waits after typing before it translates (LibreTranslate's default).",
    )

    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="If set, /translate, /attention, /detect and /translate_file need one of these keys (api_key, or "
        "Authorization: Bearer); /languages, /frontend/settings, /download_file, /healthz, /readyz and /metrics "
        "never do.",
    )
    api_keys_file: Path | None = Field(
        None,
        description="A file of API keys: one per line (# comments), or JSON with per-key limits "
        '({"<key>": {"requests_per_minute": N, "chars_per_request": M, "chars_per_minute": C}}, each optional) on '
        "the endpoints api_keys guards (a /translate_file upload counts one request and the characters it "
        "translates); re-read when it changes.",
    )
    requests_per_minute: int | None = Field(
        None,
        ge=1,
        description="Requests a minute per client address on /translate, /attention, /detect and /translate_file "
        "when no API keys are set (a list of n texts counts n); "
        "unset = no limit. Behind a proxy, X-Forwarded-For counts when it comes from FORWARDED_ALLOW_IPS "
        "(uvicorn's).",
    )
    keep_alive_timeout_s: float = Field(
        5.0, gt=0, description="How long an idle keep-alive connection waits for its next request (uvicorn's)."
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A connection must send its request line and headers within this of opening or of its previous "
        "response, or it is closed: idle and byte-by-byte connections cannot hold sockets.",
    )
    max_header_bytes: int = Field(
        65536,
        ge=1024,
        description="Request line and headers, in bytes: a head still incomplete past it gets 431 and the "
        "connection closes.",
    )
    body_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A request's whole body must arrive within this of its headers (408 beyond); the default lets "
        "max_body_bytes arrive at 100 kB/s.",
    )
    metrics_token: str | None = Field(None, description="If set, /metrics needs `Authorization: Bearer <token>`.")
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list, description="Allowed CORS origins.")
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    files_dir: Path = Field(
        Path(tempfile.gettempdir()) / "attnserve-files",
        description="Where POST /translate_file keeps translated files until they are downloaded or expire; "
        "several workers may share it.",
    )
    max_file_bytes: int = Field(
        500_000,
        ge=1,
        description="Size of a file to translate (413 beyond); the upload also counts against max_body_bytes. "
        "A file's texts are decoded one batch after another, so a large one holds its request for long.",
    )
    file_ttl_s: float = Field(
        1800.0, gt=0, description="Seconds a translated file stays downloadable; then it is deleted (404)."
    )

    @field_validator("bundles", "api_keys", "cors_origins", mode="before")
    @classmethod
    def _split_list(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.strip()
            if value.startswith("["):
                import json

                return json.loads(value)
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("argos_packages", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    def packages_dir(self) -> Path | None:
        """The packages directory served: ``argos_packages`` when set (None when set empty), else argos-translate's
        own directory when it exists."""
        if "argos_packages" in self.model_fields_set:
            return self.argos_packages
        default = argos_packages_dir()
        return default if default.is_dir() else None

    def is_shipped(self, path: Path) -> bool:
        """Whether ``path`` is one of the bundles under ``shipped_bundles``."""
        return path.resolve().is_relative_to(self.shipped_bundles.resolve())

    def served_bundles(self) -> list[Path]:
        """The bundle directories served beside the packages: none when ``argos_packages`` is set and ``bundles``
        is not (a LibreTranslate installation's packages alone), else ``bundles``."""
        if self.argos_packages is not None and "bundles" not in self.model_fields_set:
            return []
        return self.bundle_paths()

    def bundle_paths(self) -> list[Path]:
        """``bundles`` with each directory of bundles replaced by the bundles in it now, in name order."""
        return bundle_dirs(self.bundles)

    def decoding(self, pair: tuple[str, str]) -> tuple[int, float]:
        """The beam size and length penalty a request to ``pair`` that names neither decodes with: the pair's
        entry of ``pair_defaults``, else the global defaults."""
        entry = self.pair_defaults.get("-".join(pair), PairDecoding())
        beam = self.default_beam_size if entry.beam_size is None else entry.beam_size
        penalty = self.default_length_penalty if entry.length_penalty is None else entry.length_penalty
        return beam, penalty

    @model_validator(mode="after")
    def _check_beams(self) -> Settings:
        beams: dict[str, int | None] = {"default_beam_size": self.default_beam_size}
        beams.update({f"pair_defaults[{k!r}].beam_size": v.beam_size for k, v in self.pair_defaults.items()})
        for name, beam in beams.items():
            if beam is not None and beam > self.max_beam_size:
                raise ValueError(f"{name}={beam} is over max_beam_size={self.max_beam_size}: lower it, or raise both")
        return self

    @model_validator(mode="after")
    def _check_keys_file(self) -> Settings:
        if self.api_keys_file is not None:
            try:
                read_keys_file(self.api_keys_file)
            except KeysFileError as e:
                raise ValueError(f"ATTNSERVE_API_KEYS_FILE: {e}") from None
        return self
