"""The plain FastAPI + transformers peer service that answers one request at a time."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from common import (
    PEERS,
    Server,
    free_port,
)
from engines import SERVICE_MAX_LENGTH
from pydantic import BaseModel

if TYPE_CHECKING:
    pass


class TranslateBody(BaseModel):
    q: str
    source: str = "auto"
    target: str = ""
    max_length: int | None = None


def serve_transformers(hf_dir: Path, port: int, threads: int) -> None:
    """``--serve-transformers DIR --port P``: a plain FastAPI + transformers service, one request at a time."""
    import threading

    import torch
    import uvicorn
    from fastapi import FastAPI
    from transformers import MarianMTModel, MarianTokenizer

    torch.set_num_threads(threads)
    model = MarianMTModel.from_pretrained(hf_dir).eval()
    tokenizer = MarianTokenizer.from_pretrained(hf_dir)
    max_positions = int(model.config.max_position_embeddings)
    lock = threading.Lock()
    app = FastAPI()

    @app.get("/readyz")
    def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/translate")
    def translate_one(body: TranslateBody) -> dict[str, str]:
        with lock, torch.inference_mode():  # one request at a time
            enc = tokenizer(body.q, return_tensors="pt")
            n = body.max_length or min(SERVICE_MAX_LENGTH, 2 * enc.input_ids.shape[1] + 10)  # attnserve's default
            out = model.generate(**enc, num_beams=1, do_sample=False, max_new_tokens=min(n, max_positions))
        return {"translatedText": tokenizer.decode(out[0], skip_special_tokens=True)}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def transformers_server(hf_dir: Path, threads: int) -> Server:
    port = free_port()
    command = [sys.executable, str(PEERS), "--serve-transformers", str(hf_dir)]
    command += ["--port", str(port), "--threads", str(threads)]
    return Server(command, port, {"OMP_NUM_THREADS": str(threads)})
