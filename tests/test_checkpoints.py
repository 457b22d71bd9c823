"""The bundled-checkpoint readers reproduce the reference implementations exactly.

SmolLM2: our GGUF state dict in transformers' LlamaForCausalLM vs transformers' own GGUF loading.
DINOv2: our backbone dict in transformers' Dinov2Model + our SaliencyDecoder vs onnxruntime.
"""

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest
import torch

from attnviz.core.saliency import PATCH_SIZE, SaliencyDecoder
from attnviz.weights.catalogue import bundled_path
from attnviz.weights.families.dinov2 import ONNX_INPUT_SIZE
from attnviz.weights.gguf import gguf_tokenizer, read_gguf
from attnviz.weights.onnx import read_onnx_dinov2

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def gguf_read():
    return read_gguf(bundled_path("smollm2"))


@pytest.fixture(scope="module")
def smollm2_ours(gguf_read):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg, state = gguf_read
    model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    result = model.load_state_dict(state, strict=False)
    return model, result


@pytest.fixture(scope="module")
def smollm2_reference():
    from transformers import AutoModelForCausalLM

    path = bundled_path("smollm2")
    # ~15-20 s: transformers dequantises the whole file itself; done once for this module.
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return gguf_tokenizer(bundled_path("smollm2"), tmp_path_factory.mktemp("tok") / "smollm2")


def test_gguf_config_matches_transformers_gguf_config(gguf_read, smollm2_reference):
    cfg, _ = gguf_read
    reference = smollm2_reference.config.to_dict()
    for key, value in cfg.items():
        assert reference[key] == value, key
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)


def test_gguf_keys_and_shapes_match_llama_state_dict(gguf_read, smollm2_ours):
    cfg, state = gguf_read
    model, result = smollm2_ours
    reference = model.state_dict()
    # Tied embeddings: the head is the embedding matrix, so lm_head.weight is the one key omitted.
    assert cfg["tie_word_embeddings"] is True
    assert set(reference) - set(state) == {"lm_head.weight"}
    assert set(state) <= set(reference)
    assert result.missing_keys == ["lm_head.weight"] and result.unexpected_keys == []
    for name, tensor in state.items():
        assert tensor.dtype == torch.float32, name
        assert tensor.shape == reference[name].shape, name
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_gguf_weights_equal_transformers_gguf_weights(gguf_read, smollm2_reference):
    _, state = gguf_read
    reference = smollm2_reference.state_dict()
    # Q and K carry llama.cpp's row permutation: equality here proves it was undone exactly.
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.29.self_attn.k_proj.weight",
                 "model.embed_tokens.weight", "model.layers.7.mlp.down_proj.weight"):
        assert torch.equal(state[name], reference[name]), name


def test_gguf_logits_match_transformers_gguf_loading(smollm2_ours, smollm2_reference, tokenizer):
    model, _ = smollm2_ours
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        ours = model(ids).logits[0]
        reference = smollm2_reference(ids).logits[0]
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))
    assert (ours - reference).abs().max().item() < 1e-4
    assert tokenizer.decode(ours[-1].argmax().item()) == " Paris"


def test_tokenizer_round_trips_and_keeps_chat_template(tokenizer):
    text = "Attention heads: naïve café, 東京, emoji 🙂 and\ttabs."
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text
    assert tokenizer(PROMPT).input_ids == [504, 3575, 282, 4649, 314]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_tokenizer_second_load_comes_from_cache(tokenizer, monkeypatch):
    import gguf

    cache_dir = Path(tokenizer.name_or_path)
    assert (cache_dir / "tokenizer.json").is_file() and (cache_dir / "gguf_source.txt").is_file()

    def no_gguf(*args, **kwargs):
        raise AssertionError("the cached tokenizer must not read the GGUF file")

    monkeypatch.setattr(gguf, "GGUFReader", no_gguf)
    again = gguf_tokenizer(bundled_path("smollm2"), cache_dir)
    assert again.name_or_path == str(cache_dir)
    assert again(PROMPT).input_ids == tokenizer(PROMPT).input_ids
    assert again.chat_template == tokenizer.chat_template


def test_tokenizer_cache_refuses_a_folder_it_did_not_write(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="dedicated folder"):
        gguf_tokenizer(bundled_path("smollm2"), tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_gguf_reader_rejects_wrong_paths(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_gguf(tmp_path / "missing.gguf")
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ValueError, match="not a .gguf file"):
        read_gguf(tmp_path / "weights.bin")


# ---------------------------------------------------------------------------------------------
# DINOv2 + saliency decoder vs onnxruntime
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dinov2_read():
    return read_onnx_dinov2(bundled_path("dinov2"))


@pytest.fixture(scope="module")
def dinov2_hf(dinov2_read):
    from transformers import Dinov2Config, Dinov2Model

    return Dinov2Model(Dinov2Config(**dinov2_read[0])).eval()


def test_dinov2_keys_match_transformers_model(dinov2_read, dinov2_hf):
    _, backbone, decoder = dinov2_read
    reference = dinov2_hf.state_dict()
    assert set(backbone) == set(reference)
    for name, tensor in backbone.items():
        assert tensor.dtype == torch.float32 and tensor.shape == reference[name].shape, name
    assert backbone["embeddings.position_embeddings"].shape == (1, 1 + 37 * 37, 384)
    assert torch.count_nonzero(backbone["embeddings.mask_token"]) == 0  # filled: not in the graph
    assert set(decoder) == set(SaliencyDecoder().state_dict())


def test_dinov2_and_decoder_match_onnxruntime(dinov2_read, dinov2_hf):
    import onnxruntime

    _, backbone_state, decoder_state = dinov2_read
    backbone = dinov2_hf
    backbone.load_state_dict(backbone_state, strict=True)
    decoder = SaliencyDecoder.from_state_dict(decoder_state)

    size = ONNX_INPUT_SIZE
    pixels = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = backbone(pixel_values=pixels).last_hidden_state  # (2, 257, 384)
        grid = (size // PATCH_SIZE, size // PATCH_SIZE)
        ours = decoder(hidden[:, 1:], grid)

    session = onnxruntime.InferenceSession(str(bundled_path("dinov2")),
                                           providers=["CPUExecutionProvider"])
    reference = session.run(["output_importance"], {"input_image": pixels.numpy()})[0]
    assert ours.shape == reference.shape == (2, 1, size, size)
    assert np.abs(ours.numpy() - reference).max() < 1e-4
    assert reference.std() > 1e-3  # a real map, not a constant a broken decoder could also match


def test_decoder_stays_in_inference_mode_and_checks_its_input(dinov2_read):
    decoder = SaliencyDecoder.from_state_dict(dinov2_read[2])
    tokens = torch.randn(1, 256, 384, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = decoder(tokens, (16, 16))
        decoder.train()  # BatchNorm must keep using the exported running statistics
        assert torch.equal(decoder(tokens, (16, 16)), expected)
        assert decoder(tokens, (16, 16), image_size=(100, 60)).shape == (1, 1, 100, 60)
    with pytest.raises(ValueError, match="CLS dropped"):
        decoder(torch.randn(1, 257, 384), (16, 16))


# ---------------------------------------------------------------- our modules on the bundled weights
import attnviz  # noqa: E402
from attnviz.weights import catalogue  # noqa: E402


def test_our_smollm2_matches_transformers_gguf(smollm2_reference):
    ours = attnviz.load_model("smollm2")
    tr = ours.trace(PROMPT + " a city of light and")
    with torch.no_grad():
        ref = smollm2_reference(input_ids=tr.ids[None], output_attentions=False).logits[0]
    assert (tr.logits.argmax(-1) == ref.argmax(-1)).all()
    assert (tr.logits - ref).abs().max() < 0.05
    paris = ours.trace(PROMPT, attentions=False).logits[-1]
    assert ours.tokenizer.decode([int(paris.argmax())]) == " Paris"
    assert tr.attentions.shape == (30, 9, tr.n, tr.n)


def test_our_smollm2_attentions_match_transformers_eager(smollm2_reference):
    ours = attnviz.load_model("smollm2")
    tr = ours.trace("Attention is all you need.")
    smollm2_reference.config._attn_implementation = "eager"
    with torch.no_grad():
        ref = smollm2_reference(input_ids=tr.ids[None], output_attentions=True).attentions
    assert (tr.attentions - torch.stack([a[0] for a in ref])).abs().max() < 1e-4


def test_our_dinov2_matches_transformers_and_onnxruntime(dinov2_read, dinov2_hf, tmp_path, monkeypatch):
    import onnxruntime

    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path))
    ours = attnviz.load_model("dinov2")            # converts and caches
    again = attnviz.load_model("dinov2")           # from the safetensors cache
    assert list(tmp_path.glob("dinov2-*/weights.safetensors"))
    dinov2_hf.load_state_dict(dinov2_read[1], strict=True)
    dinov2_hf.config._attn_implementation = "eager"
    pixels = torch.randn(3, 224, 224, generator=torch.Generator().manual_seed(3))
    tr = ours.trace(pixels)
    with torch.no_grad():
        ref = dinov2_hf(pixel_values=pixels[None], output_attentions=True)
    assert (tr.hidden - ref.last_hidden_state[0]).abs().max() < 1e-4
    assert (tr.attentions - torch.stack([a[0] for a in ref.attentions])).abs().max() < 1e-4
    session = onnxruntime.InferenceSession(str(bundled_path("dinov2")), providers=["CPUExecutionProvider"])
    sal = session.run(["output_importance"], {"input_image": pixels[None].numpy()})[0][0, 0]
    assert np.abs(tr.saliency.numpy() - sal).max() < 1e-4
    assert torch.equal(again.trace(pixels, attentions=False).hidden, ours.trace(pixels, attentions=False).hidden)


def test_our_minilm_matches_transformers():
    from transformers import AutoModel

    ours = attnviz.load_model("minilm")
    ref_model = AutoModel.from_pretrained(str(catalogue.bundled_path("minilm")),
                                          attn_implementation="eager").eval()
    tr = ours.trace("The animal didn't cross the street because it was too tired.")
    with torch.no_grad():
        ref = ref_model(input_ids=tr.ids[None], output_attentions=True)
    assert (tr.hidden - ref.last_hidden_state[0]).abs().max() < 1e-4
    assert (tr.attentions - torch.stack([a[0] for a in ref.attentions])).abs().max() < 1e-4
