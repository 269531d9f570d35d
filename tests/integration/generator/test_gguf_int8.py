"""The int8 cache built straight from a GGUF file: bit-identical to the float32 route, no float32
copy on disk, SHA-256 still checked. A tiny random Qwen2 model is written as GGUF here."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from gguf import MODEL_ARCH, GGMLQuantizationType, GGUFWriter, get_tensor_name_map, quantize
from safetensors import safe_open
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

from wmark import BackendError
from wmark.generator.models import gguf_int8, int8_store, smoothing
from wmark.generator.models.embedded import EmbeddedModel, prepare, remove_cache
from wmark.generator.models.fused import int8_layers
from wmark.generator.models.hf_session import HFModel
from wmark.generator.models.loading import _load_model
from wmark.generator.models.prepare import prepare_model

PROMPT = [5, 17, 42, 99, 3, 250, 7]


def _write_gguf(path: Path, model: Qwen2ForCausalLM) -> None:
    """`model` as the embedded files are: Q8_0 linears, a Q5_0 embedding, float32 norms and
    biases, a separate output layer, a GPT-2 style tokenizer."""
    config = model.config
    writer = GGUFWriter(str(path), "qwen2")
    for key, value in {
        "context_length": config.max_position_embeddings,
        "block_count": config.num_hidden_layers,
        "embedding_length": config.hidden_size,
        "feed_forward_length": config.intermediate_size,
        "attention.head_count": config.num_attention_heads,
        "attention.head_count_kv": config.num_key_value_heads,
    }.items():
        writer.add_uint32(f"qwen2.{key}", value)
    writer.add_float32("qwen2.rope.freq_base", float(config.rope_parameters["rope_theta"]))
    writer.add_float32("qwen2.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "ab"] + [f"w{i}" for i in range(config.vocab_size - 3)])
    writer.add_token_merges(["a b"])
    writer.add_token_types([1] * config.vocab_size)
    writer.add_eos_token_id(0)
    names = get_tensor_name_map(MODEL_ARCH.QWEN2, config.num_hidden_layers)
    for name, param in model.state_dict().items():
        module, _, suffix = name.rpartition(".")
        values = param.detach().numpy().astype(np.float32)
        gguf_name = f"{names.get_name(module)}.{suffix}"
        if values.ndim == 2:
            qtype = GGMLQuantizationType.Q5_0 if "embed" in name else GGMLQuantizationType.Q8_0
            writer.add_tensor(gguf_name, quantize(values, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory, tiny_qwen) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    _write_gguf(path, tiny_qwen(0))
    return path


def _logits(model: torch.nn.Module) -> torch.Tensor:
    """Root logits and a small tree's logits after PROMPT (the rowwise kernels for both)."""
    session = HFModel(model, frozenset({0})).session(PROMPT)
    root, _ = session.extend([], [])
    _, tree = session.extend([-1, -1, 0], [11, 12, 13])
    return torch.cat([root[None], tree])


def test_direct_conversion_equals_the_float32_route_bit_for_bit(gguf_file, tmp_path):
    out = tmp_path / "lean"
    out.mkdir()
    gguf_int8.convert(gguf_file, out)
    lean = prepare_model(gguf_int8.load(out), "int8", "cpu", int8_cache=out / gguf_int8.INT8_FILE)
    assert int8_store.is_packed(out / gguf_int8.INT8_FILE)  # the first load packed the plain file
    stamp = (out / gguf_int8.INT8_FILE).stat().st_mtime_ns
    again = prepare_model(gguf_int8.load(out), "int8", "cpu", int8_cache=out / gguf_int8.INT8_FILE)

    old_cache = tmp_path / "old-int8.safetensors"
    reference = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    reference = prepare_model(reference, "int8", "cpu", int8_cache=old_cache)
    assert torch.equal(_logits(lean), _logits(reference))
    assert torch.equal(_logits(again), _logits(reference))
    new, old = safetensors.torch.load_file(out / gguf_int8.INT8_FILE), safetensors.torch.load_file(old_cache)
    assert new.keys() == old.keys() and all(torch.equal(new[k], old[k]) for k in new)
    assert (out / gguf_int8.INT8_FILE).stat().st_mtime_ns == stamp  # read by the load, not rewritten
    # No float32 copy: the embedding stays in its GGUF encoding, only norms and biases are float.
    dense = safetensors.torch.load_file(out / gguf_int8.DENSE_FILE)
    assert dense["model.embed_tokens.weight"].dtype == torch.uint8
    assert sum(t.numel() for t in dense.values() if t.dtype == torch.float32) < 2000


def test_an_incomplete_int8_file_is_refused_not_requantised(gguf_file, tmp_path):
    out = tmp_path / "lean"
    out.mkdir()
    gguf_int8.convert(gguf_file, out)
    tensors = safetensors.torch.load_file(out / gguf_int8.INT8_FILE)
    del tensors["lm_head.q"], tensors["lm_head.scale"]
    safetensors.torch.save_file(tensors, out / gguf_int8.INT8_FILE)
    with pytest.raises(BackendError, match="lm_head"):
        gguf_int8.load(out)


@pytest.fixture()
def embedded_tiny(gguf_file, tmp_path, monkeypatch, install_parts) -> EmbeddedModel:
    """The tiny GGUF split into two part packages, like the real embedded models."""
    data = gguf_file.read_bytes()
    install_parts("wmark_tiny_gguf", [data[: len(data) // 2], data[len(data) // 2 :]])
    monkeypatch.setenv("WMARK_MODEL_CACHE", str(tmp_path / "cache"))
    return EmbeddedModel(
        name="Tiny",
        package="wmark_tiny_gguf",
        distribution="wmark-tiny-gguf",
        version="1",
        parts=2,
        sha256=hashlib.sha256(data).hexdigest(),
    )


def test_prepare_builds_int8_by_default_and_float32_only_when_asked(embedded_tiny):
    path = prepare(embedded_tiny)
    files = {p.name for p in path.iterdir()}
    assert {"tokenizer.json", "config.json", gguf_int8.INT8_FILE, gguf_int8.DENSE_FILE} <= files
    assert not any(name.startswith("model") for name in files)  # no float32 checkpoint
    assert not any(p.name.startswith(".") for p in path.parent.iterdir())  # the assembled GGUF is gone
    # as this (unsmoothed) model's float route below loads: one activation part, like a drafter
    lean = _load_model(path, "int8", "cpu", target=embedded_tiny.smoothed)
    assert prepare(embedded_tiny) == path  # cached: nothing rebuilt
    prepare(embedded_tiny, weights="float32")
    assert (path / "model.safetensors").is_file()
    float_route = _load_model(str(path), "int8", "cpu", target=embedded_tiny.smoothed)  # smoothed alike
    assert torch.equal(_logits(lean), _logits(float_route))


def test_a_corrupt_gguf_is_refused_before_conversion(embedded_tiny):
    corrupt = EmbeddedModel(**{**embedded_tiny.__dict__, "sha256": "0" * 64})
    with pytest.raises(BackendError, match="corrupt"):
        prepare(corrupt)


@pytest.mark.parametrize("scale_cols", [0, 8])  # a scale per channel, or per channel and 8 columns
def test_quantising_in_row_chunks_equals_quantising_the_whole_matrix(gguf_file, scale_cols):
    from gguf import GGUFReader, dequantize

    from wmark.generator.cpu.rowwise import RowInt8Linear

    tensor = next(t for t in GGUFReader(gguf_file).tensors if t.name == "blk.0.ffn_down.weight")
    dense = torch.from_numpy(np.array(dequantize(tensor.data, tensor.tensor_type)))
    whole = RowInt8Linear.quantize(dense, scale_cols)
    for chunk in (7, 64, 10_000):  # uneven, exact, larger than the matrix
        q, scale = gguf_int8._quantize_rows(
            tensor.data, tensor.tensor_type, "blk.0.ffn_down", None, scale_cols, chunk=chunk
        )
        assert torch.equal(q, whole[0]) and torch.equal(scale, whole[1])


def test_the_embedding_stays_encoded_and_its_rows_are_the_dequantised_table(gguf_file, tmp_path, monkeypatch):
    from gguf import dequantize

    out = tmp_path / "lean"
    out.mkdir()
    gguf_int8.convert(gguf_file, out)
    model = gguf_int8.load(out)
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, gguf_int8.GGUFEmbedding)
    assert not any("embed_tokens" in name for name, _ in model.named_parameters())  # no float table
    table = torch.from_numpy(np.asarray(dequantize(embedding.raw, embedding.encoding), dtype=np.float32))
    ids = torch.tensor([[5, 0, 5, embedding.num_embeddings - 1]])
    rows = embedding(ids)
    assert rows.shape == (1, 4, embedding.embedding_dim) and rows.dtype == torch.float32
    assert torch.equal(rows[0], table[ids[0]])
    # rows are kept once dequantised, and the keep starts over past its size: lookups that hit
    # it, miss it, or come after it was emptied all give the table's rows
    monkeypatch.setattr(gguf_int8, "CACHED_ROWS", 5)
    for step in ([[5]], [[0, 7, 7]], [[9, 11, 5]], [[5, 3]], [[]]):
        ids = torch.tensor(step, dtype=torch.long)
        rows = embedding(ids)
        assert rows.shape == (*ids.shape, embedding.embedding_dim)
        assert torch.equal(rows, table[ids]) and len(embedding._rows) <= 5 + ids.numel()


def test_both_routes_smooth_alike(gguf_file, tmp_path):
    """Smoothed, the direct conversion (calibration measured on dequantising layers, no float32
    copy) and the float32 route (measured on the float model) still give the same int8 weights."""
    calibration = [[5, 17, 42, 99, 3], [250, 7, 11, 12, 13, 14, 15]]
    out = tmp_path / "lean"
    out.mkdir()
    gguf_int8.convert(gguf_file, out, calibration=calibration)
    assert gguf_int8.smoothing_version(out) == smoothing.VERSION
    lean = prepare_model(gguf_int8.load(out), "int8", "cpu", int8_cache=out / gguf_int8.INT8_FILE)
    reference = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    float_route = prepare_model(reference, "int8", "cpu", calibration=calibration)
    assert torch.equal(_logits(lean), _logits(float_route))
    plain = tmp_path / "plain"
    plain.mkdir()
    gguf_int8.convert(gguf_file, plain)
    assert gguf_int8.smoothing_version(plain) == "none"
    unsmoothed = prepare_model(gguf_int8.load(plain), "int8", "cpu", int8_cache=plain / gguf_int8.INT8_FILE)
    assert not torch.equal(_logits(lean), _logits(unsmoothed))  # the smoothing did change the weights


def test_only_a_model_marked_smoothed_is_smoothed_and_a_change_rebuilds(embedded_tiny):
    plain = prepare(embedded_tiny)
    assert gguf_int8.smoothing_version(plain) == "none"  # a drafter's conversion
    smoothed = EmbeddedModel(**{**embedded_tiny.__dict__, "smoothed": True})
    path = prepare(smoothed)  # the same file, now to be smoothed: converted again
    assert path == plain and gguf_int8.smoothing_version(path) == smoothing.VERSION


def test_block_scaled_routes_agree_and_differ_from_per_channel(gguf_file, tmp_path):
    """With block scales (`--precision int8-fast`'s weights; 8 columns here, for several blocks
    in this tiny model) the direct conversion and the float32 route give the same layers, and
    these are not the per-channel ones."""
    calibration = [[5, 17, 42, 99, 3], [250, 7, 11, 12, 13, 14, 15]]
    out = tmp_path / "blocks"
    out.mkdir()
    gguf_int8.convert(gguf_file, out, calibration=calibration, scale_cols=8)
    cache = out / gguf_int8.INT8_FILE
    lean = prepare_model(gguf_int8.load(out), "int8", "cpu", int8_cache=cache, scale_cols=8)
    layers = int8_layers(lean)
    assert {layer.scale_cols for layer in layers} == {8} and min(layer.blocks for layer in layers) > 1
    reference = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    float_route = prepare_model(reference, "int8", "cpu", calibration=calibration, scale_cols=8)
    assert torch.equal(_logits(lean), _logits(float_route))
    again = prepare_model(gguf_int8.load(out), "int8", "cpu", int8_cache=cache, scale_cols=8)  # packed now
    assert int8_store.is_packed(cache) and torch.equal(_logits(again), _logits(lean))
    per_channel = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    per_channel = prepare_model(per_channel, "int8", "cpu", calibration=calibration)
    assert not torch.equal(_logits(lean), _logits(per_channel))


def test_block_scaled_int8_has_a_directory_of_its_own(embedded_tiny):
    plain = prepare(embedded_tiny)
    blocks = prepare(embedded_tiny, weights="int8-blocks")
    assert blocks != plain and blocks.parent == plain.parent and gguf_int8.has_int8(blocks)
    with safe_open(str(blocks / gguf_int8.INT8_FILE), framework="pt") as f:
        assert all(f.get_slice(name).get_shape()[1:] == [1] for name in f.keys() if name.endswith(".scale"))  # noqa: SIM118
    assert prepare(embedded_tiny, weights="int8-blocks") == blocks  # cached: nothing rebuilt
    remove_cache(embedded_tiny)
    assert not plain.exists() and not blocks.exists()
