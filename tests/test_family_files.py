"""Every decoder family from files, as users bring it: a saved folder (`save_pretrained`, safetensors)
and the same files in a Hugging Face cache loaded by name, each equal to transformers eager; and GGUF
files written the way llama.cpp's converter writes them, read back through transformers' GGUF
conversion into our modules."""
import numpy as np
import pytest
import torch

import attnviz
from attnviz.weights import hub
from tests.hub_cache import lay_out, model_folder
from tests.test_parity import DECODERS, TOL, VISION, VOCAB, inputs, reference, tiny

ROWS = ["llama", *DECODERS]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "converted"))

    def no_network(*args, **kwargs):
        raise AssertionError("a Hub call was made")
    monkeypatch.setattr(hub, "HfApi", no_network)
    monkeypatch.setattr(hub, "snapshot_download", no_network)
    return root


def reference_logits(hf, ids):
    with torch.no_grad():
        return hf(input_ids=ids[None]).logits[0]


@pytest.mark.parametrize("row", ROWS)
def test_folder_and_hub_cache_round_trip(row, cache, tmp_path):
    folder = tmp_path / row
    hf = model_folder(folder, row)
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (11,))
    want = reference_logits(hf, ids)
    from_folder = attnviz.load_model(str(folder))
    assert (from_folder.trace(ids).logits - want).abs().max() < TOL
    lay_out(cache, f"org/{row}", folder)
    by_name = attnviz.load_model(f"org/{row}")
    assert by_name.cfg == from_folder.cfg
    assert (by_name.trace(ids).logits - want).abs().max() < TOL


# ---------------------------------------------------------------- GGUF files
# llama.cpp's architecture names, and whether its converter stores Gemma's norms as 1 + w
GGUF_ROWS = {"qwen2": ("qwen2", False), "qwen3": ("qwen3", False), "gemma3_text": ("gemma3", True),
             "gemma2": ("gemma2", True)}


def write_gguf(hf, arch: str, plus_one: bool, path):
    """A float32 GGUF of a transformers model, named and laid out as llama.cpp's converter does
    (gguf's own tensor-name map), with the metadata transformers' GGUF reader needs."""
    import gguf
    c = hf.config
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch),
                                     c.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)
    w.add_rope_freq_base(rope["rope_theta"])
    if plus_one:  # Gemma: the windowed layers' width (Qwen2's files cannot say which layers have one)
        w.add_sliding_window(c.sliding_window)
    tokens = [f"t{i}" for i in range(c.vocab_size)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([1] * len(tokens))
    for key, tensor in hf.state_dict().items():
        if key == "lm_head.weight" and c.tie_word_embeddings:
            continue
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        data = tensor.detach().float().numpy()
        if plus_one and key.endswith("norm.weight"):
            data = data + 1.0      # llama.cpp stores Gemma's (1 + w)
        w.add_tensor(name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("row", list(GGUF_ROWS))
def test_gguf_files_of_the_families(row, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "converted"))
    arch, plus_one = GGUF_ROWS[row]
    over = {"tie_word_embeddings": True, "use_sliding_window": False}
    if row == "qwen3":   # transformers reads no head width from a qwen3 GGUF: its default, 128
        over.update(head_dim=128)
    if row in ("gemma2", "gemma3_text"):   # what llama.cpp's GGUF metadata can say: the defaults for the rest
        over.update(sliding_window=4, query_pre_attn_scalar=256, rope_parameters=None, layer_types=None)
    if row == "gemma2":
        over.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    hf = tiny(row, **over)
    path = tmp_path / f"{row}.gguf"
    write_gguf(hf, arch, plus_one, path)
    model = attnviz.load_model(str(path))
    assert "quantization F32" in model.info.source
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (11,))
    assert (model.trace(ids).logits - reference_logits(hf, ids)).abs().max() < TOL


# ---------------------------------------------------------------- vision families
@pytest.mark.parametrize("row", list(VISION))
def test_vision_folder_and_hub_cache_round_trip(row, cache, tmp_path):
    folder = tmp_path / row
    hf = model_folder(folder, row)
    x = inputs(hf)
    want, _, _ = reference(hf, x)
    from_folder = attnviz.load_model(str(folder))
    assert (from_folder.trace(x).hidden - want).abs().max() < TOL
    lay_out(cache, f"org/{row}", folder)
    by_name = attnviz.load_model(f"org/{row}")
    assert by_name.cfg == from_folder.cfg
    assert (by_name.trace(x).hidden - want).abs().max() < TOL
