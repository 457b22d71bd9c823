"""Every decoder family from files, as users bring it: a saved folder (`save_pretrained`, safetensors)
and the same files in a Hugging Face cache loaded by name, each equal to transformers eager; and GGUF
files written the way llama.cpp's converter writes them, read back through transformers' GGUF
conversion into our modules."""
import numpy as np
import pytest
import torch

import attnviz
from tests import hub_cache
from tests.hub_cache import lay_out, model_folder
from tests.test_parity import DECODERS, ENCODERS, TOL, VISION, VOCAB, inputs, reference, tiny

ROWS = ["llama", *DECODERS]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    return hub_cache.offline_for_test(monkeypatch, tmp_path / "hf" / "hub", tmp_path / "converted")


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
# llama.cpp's architecture names, whether its converter stores Gemma's norms as 1 + w, and what the
# row's tiny model changes to be what a GGUF's metadata can say (transformers reads the rest as defaults)
GEMMA_GGUF = dict(sliding_window=4, query_pre_attn_scalar=256, rope_parameters=None, layer_types=None)
GGUF_ROWS = {
    "llama": ("llama", False, {}),
    "mistral": ("llama", False, dict(sliding_window=None)),      # llama.cpp writes Mistral as llama
    "qwen2": ("qwen2", False, {}),
    "qwen3": ("qwen3", False, dict(head_dim=128)),                # no head width in a qwen3 GGUF: 128
    "gemma3_text": ("gemma3", True, GEMMA_GGUF),
    "gemma2": ("gemma2", True, dict(GEMMA_GGUF, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "phi3": ("phi3", False, dict(sliding_window=None, rope_parameters=dict(rope_theta=500.0))),
    "falcon_7b": ("falcon", False, dict(ffn_hidden_size=128)),    # a falcon GGUF's MLP is 4 d wide
}

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
    w.add_feed_forward_length(getattr(c, "intermediate_size", None) or c.ffn_hidden_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(getattr(c, "num_key_value_heads", None) or c.num_kv_heads)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if hasattr(c, "rms_norm_eps"):
        w.add_layer_norm_rms_eps(c.rms_norm_eps)
    else:
        w.add_layer_norm_eps(c.layer_norm_epsilon)
    rope = getattr(c, "rope_parameters", None)
    if rope:
        rope = rope.get("full_attention", rope)
        w.add_rope_freq_base(rope["rope_theta"])
        w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    w.add_pad_token_id(0)
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
        if arch == "llama" and key.endswith(("q_proj.weight", "k_proj.weight")):
            # llama.cpp's converter reorders each head's rows from rotate-half to interleaved pairs
            heads = c.num_attention_heads if "q_proj" in key else c.num_key_value_heads
            data = data.reshape(heads, 2, -1, data.shape[-1]).swapaxes(1, 2).reshape(data.shape)
        w.add_tensor(name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("row", list(GGUF_ROWS))
def test_gguf_files_of_the_families(row, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "converted"))
    arch, plus_one, row_over = GGUF_ROWS[row]
    over = dict({"tie_word_embeddings": True, "use_sliding_window": False}, **row_over)
    hf = tiny(row, **over)
    path = tmp_path / f"{row}.gguf"
    write_gguf(hf, arch, plus_one, path)
    model = attnviz.load_model(str(path))
    assert "quantization F32" in model.info.source
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (11,))
    assert (model.trace(ids).logits - reference_logits(hf, ids)).abs().max() < TOL


def test_the_apps_local_entry_loads_a_gguf_file_inside_the_allow_list_only(tmp_path, monkeypatch, set_limits):
    from streamlit.testing.v1 import AppTest
    import streamlit as st
    from attnviz.ui.common import plain
    from tests.test_loading import APP, PICK
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "converted"))
    models, outside = tmp_path / "models", tmp_path / "elsewhere"
    models.mkdir()
    outside.mkdir()
    hf = tiny("qwen2", tie_word_embeddings=True, use_sliding_window=False)
    write_gguf(hf, "qwen2", False, models / "tiny.gguf")
    write_gguf(hf, "qwen2", False, outside / "secret.gguf")
    (models / "escape.gguf").symlink_to(outside / "secret.gguf")
    set_limits(allowed_model_dirs=str(models))

    def page(typed):
        st.cache_resource.clear()
        at = AppTest.from_file(APP, default_timeout=300)
        at.session_state[PICK] = "local folder…"
        at.session_state["model_custom_dir"] = typed
        return at.run()
    at = page("tiny.gguf")
    assert not at.exception and not at.error
    assert any(plain("tiny.gguf") in h.value and h.value.startswith("Loaded") for h in at.subheader)
    for typed in ("escape.gguf", str(outside / "secret.gguf"), "missing.gguf", "../elsewhere/secret.gguf"):
        at = page(typed)
        assert not at.exception
        [message] = [e.value for e in at.error]
        assert "is not a" in message and "elsewhere" not in message.replace(plain(repr(typed)), "")


@pytest.mark.parametrize("row", list(ENCODERS))
def test_encoder_folder_and_hub_cache_round_trip(row, cache, tmp_path):
    """Each encoder family from a saved folder and by name from the cache: its hidden states (and
    masked-LM logits, where it has the head) equal transformers eager."""
    folder = tmp_path / row
    hf = model_folder(folder, row)
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (11,))
    with torch.no_grad():
        out = hf(input_ids=ids[None], output_hidden_states=True)
    from_folder = attnviz.load_model(str(folder))
    lay_out(cache, f"org/{row}", folder)
    by_name = attnviz.load_model(f"org/{row}")
    assert by_name.cfg == from_folder.cfg
    for model in (from_folder, by_name):
        tr = model.trace(ids)
        assert (tr.hidden - out.hidden_states[-1][0]).abs().max() < TOL
        if hasattr(out, "logits"):
            assert (tr.logits - out.logits[0]).abs().max() < TOL
        assert model.has_tokenizer   # the folder's own tokenizer came with it


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
