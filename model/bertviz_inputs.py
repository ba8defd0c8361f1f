"""An /attention answer as bertviz's ``head_view`` and ``model_view`` inputs (docs/API.md quotes it). bertviz needs
torch, which the service never imports, so the conversion lives here, on the client's side."""

from __future__ import annotations

from typing import Any

import torch


def bertviz_inputs(answer: dict[str, Any]) -> dict[str, Any]:
    """bertviz's keyword arguments for an /attention answer of one segment (``encoding`` json): per layer a
    (1, heads, rows, columns) tensor of each kind the answer has, and the token lists. Rows and columns of decoder
    and cross attention are ``decoder_input_tokens``, as bertviz labels them; a forced target prefix's P positions,
    which produce no token, get rows of zeros."""
    P = len(answer["decoder_input_tokens"]) - len(answer["target_tokens"])
    inputs: dict[str, Any] = {
        "encoder_tokens": answer["source_tokens"],
        "decoder_tokens": answer["decoder_input_tokens"],
    }
    for kind in ("encoder", "decoder", "cross"):
        if kind in answer:
            a = torch.tensor(answer[kind])  # (L, h, rows, columns)
            if kind != "encoder":
                a = torch.nn.functional.pad(a, (0, 0, P, 0))  # (L, h, P + T, columns)
            inputs[f"{kind}_attention"] = [layer.unsqueeze(0) for layer in a]  # per layer (1, h, rows, columns)
    return inputs
