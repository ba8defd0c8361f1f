"""The model against the paper's math: DESIGN.md's worked example, masks, and cache = teacher forcing."""

from __future__ import annotations

import pytest
import torch

from model.transformer import MultiHeadAttention, causal_mask, greedy_decode, padding_mask, segment_mask
from tests.bundles import tiny_model


def test_worked_example_one_head() -> None:
    mha = MultiHeadAttention(d_model=2, h=1)
    W_K = torch.tensor([[1.0, 1.0], [1.0, -1.0]])
    W_V = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    with torch.no_grad():  # nn.Linear computes x Wᵀ + b: store the transposes, no bias
        for linear, W in ((mha.W_Q, torch.eye(2)), (mha.W_K, W_K), (mha.W_V, W_V), (mha.W_O, torch.eye(2))):
            linear.weight.copy_(W.T)
            linear.bias.zero_()
    Z = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    Q = mha.split_heads(mha.W_Q(Z))
    K, V = mha.project_kv(Z)
    out, weights = mha(Z, K, V, mask=None)
    expected = {
        "Q": [[1, 0], [0, 1], [1, 1]],
        "K": [[1, 1], [1, -1], [2, 0]],
        "V": [[2, 0], [0, 3], [2, 3]],
        "weights": [[0.248255, 0.248255, 0.503490], [0.575975, 0.140029, 0.283995], [0.445808, 0.108383, 0.445808]],
        "out": [[1.503490, 2.255235], [1.719942, 1.272074], [1.783233, 1.662575]],
    }
    got = {"Q": Q[0, 0], "K": K[0, 0], "V": V[0, 0], "weights": weights[0, 0], "out": out[0]}
    for name, value in expected.items():
        torch.testing.assert_close(got[name], torch.tensor(value, dtype=torch.float32), atol=1e-6, rtol=0)


@pytest.fixture
def model_and_batch() -> tuple:
    model = tiny_model(60, seed=3, h=4, n_encoder_layers=2, n_decoder_layers=3)
    src = torch.tensor([[5, 6, 7, 8, 9, 0], [10, 11, 0, 59, 59, 59]])
    src_attention_mask = (src != 59).long()
    tgt = torch.tensor([[59, 3, 4, 5, 6], [59, 7, 8, 9, 10]])
    return model, src, src_attention_mask, tgt


def test_masks_give_exact_zeros_and_rows_sum_to_one(model_and_batch: tuple) -> None:
    model, src, am, tgt = model_and_batch
    src_mask = padding_mask(am)
    memory, enc_w = model.encode(src, src_mask)
    T = tgt.size(1)
    positions = torch.arange(T).expand_as(tgt)
    _, _, self_w, cross_w = model.decode(tgt, positions, model.memory_kv(memory), src_mask, causal_mask(T))
    later = ~torch.ones(T, T, dtype=torch.bool).tril()
    for w in self_w:  # (B, h, T, T)
        assert torch.all(w[..., later] == 0), "a decoder position attended to a later one"
    padded = am == 0  # (B, S)
    for w in [*enc_w, *cross_w]:
        assert torch.all(w.permute(0, 3, 1, 2)[padded] == 0), "a padded source position got weight"
    for w in [*enc_w, *self_w, *cross_w]:
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-5, rtol=0)


def test_texts_packed_in_one_row_are_encoded_as_if_alone(model_and_batch: tuple) -> None:
    model, src, am, _ = model_and_batch
    a, b = src[0, :6], src[1, :3]  # both real tokens only
    packed = torch.cat([a, b, torch.tensor([59, 59])])[None]  # (1, 11): a, b, padding
    segments = torch.tensor([[1] * 6 + [2] * 3 + [0] * 2])
    positions = torch.tensor([[*range(6), *range(3), 0, 0]])
    memory, weights = model.encode(packed, segment_mask(segments), positions)
    for text, span in ((a, slice(0, 6)), (b, slice(6, 9))):
        alone, alone_weights = model.encode(text[None], padding_mask(torch.ones_like(text)[None]))
        # float32 sums in another order (another sequence length): states and weights up to 1.1e-5 apart on an
        # AMD EPYC; a text that attended to the other one is 1.3 apart
        torch.testing.assert_close(memory[:, span], alone, atol=1e-4, rtol=0)
        for w, w_alone in zip(weights, alone_weights, strict=True):
            torch.testing.assert_close(w[:, :, span, span], w_alone, atol=1e-4, rtol=0)
            others = torch.ones(packed.size(1), dtype=torch.bool)
            others[span] = False
            assert torch.all(w[:, :, span][..., others] == 0), "a text attended to another one or to padding"
    # Numbered 0/1, a padded row's mask is the plain padding mask (for real and padding queries alike).
    assert torch.equal(segment_mask(am).expand(-1, -1, am.size(1), -1), padding_mask(am).expand(-1, -1, am.size(1), -1))


def test_cached_steps_equal_teacher_forcing(model_and_batch: tuple) -> None:
    """Decoding one position at a time on the cache gives the logits and attention rows of the full pass."""
    model, src, am, tgt = model_and_batch
    src_mask = padding_mask(am)
    memory, _ = model.encode(src, src_mask)
    kv = model.memory_kv(memory)
    T = tgt.size(1)
    full, _, full_self, full_cross = model.decode(tgt, torch.arange(T).expand_as(tgt), kv, src_mask, causal_mask(T))
    past = None
    for t in range(T):
        step_mask = torch.ones(2, 1, 1, t + 1, dtype=torch.bool)
        x, past, self_w, cross_w = model.decode(tgt[:, t : t + 1], torch.full((2, 1), t), kv, src_mask, step_mask, past)
        torch.testing.assert_close(model.generator(x), model.generator(full[:, t : t + 1]), atol=1e-5, rtol=0)
        for layer in range(len(self_w)):
            torch.testing.assert_close(self_w[layer][:, :, 0], full_self[layer][:, :, t, : t + 1], atol=1e-5, rtol=0)
            torch.testing.assert_close(cross_w[layer][:, :, 0], full_cross[layer][:, :, t], atol=1e-5, rtol=0)


def test_greedy_never_emits_padding_and_stops_at_eos(model_and_batch: tuple) -> None:
    model, src, am, _ = model_and_batch
    out = greedy_decode(model, src, am, max_length=20)
    c = model.config
    for row in out.tolist():
        ended = row.index(c.eos_id) if c.eos_id in row else len(row)
        assert c.pad_id not in row[: ended + 1]
        assert all(t == c.pad_id for t in row[ended + 1 :])
