"""The model.bin reader: files CTranslate2's converter wrote read back, and every inconsistency refused."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from model.importers.ct2_transformer import UnsupportedModel, map_transformer
from model.importers.ctranslate2 import ModelBin, ModelBinError, Variable, parse_model_bin, read_model_bin
from tests.bundles import tiny_spm
from tests.model.importers.argos_packages import onmt_package
from tests.numpy_models import name_bytes
from tests.numpy_models import write_model_bin as write


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    spm = tiny_spm(tmp_path_factory.mktemp("spm"))
    return {q or "float32": onmt_package(tmp_path_factory.mktemp(q or "float32"), spm, q, {}) for q in (None, "int8")}


def test_float32_weights_read_back_exactly(packages: dict[str, Path]) -> None:
    model = read_model_bin(packages["float32"] / "model" / "model.bin")
    ckpt = torch.load(packages["float32"].parent / "model.pt", weights_only=False)["model"]
    assert (model.version, model.spec) == (6, "TransformerSpec")
    got = model.float32("encoder/layer_1/ffn/linear_0/weight")
    np.testing.assert_array_equal(got, ckpt["encoder.transformer.1.feed_forward.w_1.weight"].numpy())
    pe = ckpt["encoder.embeddings.make_embedding.pe.pe"].squeeze(1).numpy()
    np.testing.assert_array_equal(model.float32("decoder/position_encodings/encodings"), pe)  # through an alias
    assert model.scalar("encoder/pre_norm") == 1.0 and model.scalar("decoder/num_heads") == 4.0
    assert write(model) == (packages["float32"] / "model" / "model.bin").read_bytes()


def test_int8_is_dequantized_as_ctranslate2_computes() -> None:
    q = np.stack([np.arange(-127, 128), np.arange(127, -128, -1)]).astype(np.int8)  # (2, 255)
    scale = np.array([127 / 0.3, 127 / 3.0], np.float32)
    variables = {"w": Variable("w", q.shape, "int8", q.tobytes()),
                 "w_scale": Variable("w_scale", (2,), "float32", scale.tobytes())}  # fmt: skip
    model = ModelBin(6, "TransformerSpec", 7, variables, {"alias": "w"})
    want = q.astype(np.float32) * (np.float32(1) / scale)[:, None]  # ops/dequantize_cpu.cc: x * (1.f / scale)
    np.testing.assert_array_equal(model.float32("w"), want)
    np.testing.assert_array_equal(model.float32("alias"), want)
    assert not np.array_equal(want, q.astype(np.float32) / scale[:, None]), "the two roundings should differ here"


def test_int8_package_weights_are_the_quantized_ones(packages: dict[str, Path]) -> None:
    model = read_model_bin(packages["int8"] / "model" / "model.bin")
    name = "decoder/layer_0/attention/linear_1/weight"
    assert model.get(name).dtype == "int8"
    exact = read_model_bin(packages["float32"] / "model" / "model.bin").float32(name)
    np.testing.assert_allclose(model.float32(name), exact, atol=np.abs(exact).max() / 127)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:-7], "truncated"),
        (lambda b: b[:100], "truncated"),
        (lambda b: b + b"\0", "bytes after its aliases"),
        (lambda b: struct.pack("<I", 99) + b[4:], "binary version 99"),
        (lambda b: struct.pack("<I", 3) + b[4:], "binary version 3"),
    ],
)
def test_damaged_files_are_refused(packages: dict[str, Path], damage: object, message: str) -> None:
    data = (packages["float32"] / "model" / "model.bin").read_bytes()
    with pytest.raises(ModelBinError, match=message):
        parse_model_bin(damage(data))  # type: ignore[operator]


def _one(name: str, shape: tuple[int, ...], dtype_id: int, size: int, payload: bytes) -> bytes:
    head = struct.pack("<I", 6) + name_bytes("TransformerSpec") + struct.pack("<II", 7, 1)
    var = name_bytes(name) + struct.pack("<B", len(shape)) + struct.pack(f"<{len(shape)}I", *shape)
    return head + var + struct.pack("<BI", dtype_id, size) + payload + struct.pack("<I", 0)


def test_inconsistent_variables_are_refused() -> None:
    with pytest.raises(ModelBinError, match="unknown type id 9"):
        parse_model_bin(_one("w", (2,), 9, 8, b"\0" * 8))
    with pytest.raises(ModelBinError, match="declares 12 bytes"):
        parse_model_bin(_one("w", (2,), 0, 12, b"\0" * 12))
    with pytest.raises(ModelBinError, match="quantized but has no w_scale"):
        parse_model_bin(_one("w", (2, 1), 1, 2, b"\1\2")).float32("w")
    good = parse_model_bin(_one("w", (2,), 0, 8, b"\0" * 8))
    alias = write(good)[:-4] + struct.pack("<I", 1) + name_bytes("a") + name_bytes("nothing")
    with pytest.raises(ModelBinError, match="points to nothing"):
        parse_model_bin(alias)


def test_shapes_that_disagree_with_the_spec_are_refused(packages: dict[str, Path]) -> None:
    model = read_model_bin(packages["float32"] / "model" / "model.bin")
    name = "decoder/layer_1/ffn/linear_1/weight"
    v = model.variables[name]
    bad = Variable(name, (v.shape[1], v.shape[0]), v.dtype, v.data)
    with pytest.raises(ModelBinError, match=f"{name} has shape"):
        map_transformer(ModelBin(6, model.spec, 7, {**model.variables, name: bad}, model.aliases), 1e-5)


@pytest.mark.parametrize(
    ("name", "feature"),
    [
        ("encoder/layer_0/self_attention/relative_position_keys", "relative positions"),
        ("decoder/layer_0/self_attention/rotary_dim", "rotary embeddings"),
        ("decoder/layer_0/self_attention/num_heads_kv", "multi-query attention"),
        ("encoder/layer_0/ffn/linear_0_noact/weight", "gated feed-forward"),
    ],
)
def test_features_our_model_lacks_are_named(packages: dict[str, Path], name: str, feature: str) -> None:
    model = read_model_bin(packages["float32"] / "model" / "model.bin")
    extra = Variable(name, (), "int32", b"\0" * 4)
    with pytest.raises(UnsupportedModel, match=feature):
        map_transformer(ModelBin(6, model.spec, 7, {**model.variables, name: extra}, model.aliases), 1e-5)
    alibi = Variable("decoder/alibi", (), "int8", b"\1")
    with pytest.raises(UnsupportedModel, match="ALiBi"):
        map_transformer(ModelBin(6, model.spec, 7, {**model.variables, "decoder/alibi": alibi}, model.aliases), 1e-5)
    with pytest.raises(UnsupportedModel, match="WhisperSpec"):
        map_transformer(ModelBin(6, "WhisperSpec", 1, model.variables, model.aliases), 1e-5)
