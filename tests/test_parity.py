"""Our modules against transformers eager on tiny random models of every family (minGPT style)."""
import re

import pytest
import torch
import transformers as tf

import attnviz
from attnviz.weights.families import convert
from attnviz.core.attention import attend, parse_variant
from attnviz.core.positional import alibi_slopes, log_bucket, relative_buckets
from attnviz.weights.families import gpt_neo

TOL = 1e-4
VOCAB, N = 99, 11


def tiny(family: str, **over):
    torch.manual_seed(0)
    if family == "bert":
        cfg = tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=37, max_position_embeddings=64, type_vocab_size=2, **over)
        cls = tf.BertForMaskedLM if over.pop("mlm", False) else tf.BertModel
    elif family == "bert_mlm":
        cfg = tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=37, max_position_embeddings=64, type_vocab_size=2)
        cls = tf.BertForMaskedLM
    elif family == "gpt2":
        cfg = tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)
        cls = tf.GPT2LMHeadModel
    elif family in ("llama", "llama_untied"):
        cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             tie_word_embeddings=family == "llama", rope_theta=500.0)
        cls = tf.LlamaForCausalLM
    elif family == "vit":
        cfg = tf.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=37)
        cls = tf.ViTModel
    elif family in ("dinov2", "dinov2_swiglu"):
        cfg = tf.Dinov2Config(image_size=28, patch_size=7, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=4, mlp_ratio=2, layerscale_value=0.5,
                              use_swiglu_ffn=family == "dinov2_swiglu")
        cls = tf.Dinov2Model
    elif family in VISION:
        cls_name, make, fields = VISION[family]
        cfg = getattr(tf, make)(**{**VISION_BASE, **fields, **over})
        cls = getattr(tf, cls_name)
    elif family in DECODERS:
        cls_name, make, fields = DECODERS[family]
        cfg = getattr(tf, make)(**{**DECODER_BASE, **fields, **over})
        cls = getattr(tf, cls_name)
    elif family in ENCODERS:
        cls_name, make, fields = ENCODERS[family]
        cfg = getattr(tf, make)(**{**ENCODER_BASE, **fields, **over})
        cls = getattr(tf, cls_name)
    elif family in AUDIO:
        cls_name, make, fields = AUDIO[family]
        cfg = getattr(tf, make)(**{**AUDIO_BASE, **fields, **over})
        cls = getattr(tf, cls_name)
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "_experts_implementation"):
        cfg._experts_implementation = "eager"  # the loop over experts, as ours (grouped kernels need aligned widths)
    model = cls(cfg).eval()
    with torch.no_grad():  # layer-scale, norms and biases start at constants: make them random too
        for name, p in model.named_parameters():
            if ("lambda1" in name or "lambda_" in name or "relative_position" in name or "probe" in name
                    or "norm" in name.lower() or name.endswith("position_embeddings")
                    or re.search(r"(^|\.)ln_", name) or name.endswith("bias")):
                p.add_(torch.randn_like(p) * 0.3)
    return model


# The decoder families: a row each (transformers' model class, its config class, how the tiny
# config differs from the shared base). Windows of 4 and mixed layer types, so that N tokens
# reach past them; a head width of 16 where the family allows one other than d / heads.
DECODER_BASE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
WINDOWED = dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"])
ROPE = dict(rope_theta=500.0, original_max_position_embeddings=16)
DECODERS = {
    "llama_llama3": ("LlamaForCausalLM", "LlamaConfig", dict(
        rope_parameters=dict(ROPE, rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0),
        attention_bias=True, mlp_bias=True, head_dim=16)),
    "llama_linear": ("LlamaForCausalLM", "LlamaConfig", dict(
        rope_parameters=dict(ROPE, rope_type="linear", factor=4.0))),
    "llama_dynamic": ("LlamaForCausalLM", "LlamaConfig", dict(
        rope_parameters=dict(ROPE, rope_type="dynamic", factor=2.0))),
    "llama_yarn": ("LlamaForCausalLM", "LlamaConfig", dict(
        rope_parameters=dict(ROPE, rope_type="yarn", factor=4.0))),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(sliding_window=4)),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(sliding_window=5, num_local_experts=4,
                                                            num_experts_per_tok=2)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(use_sliding_window=True, sliding_window=4,
                                                      max_window_layers=1)),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=16)),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(head_dim=16, num_experts=4, num_experts_per_tok=2,
                                                                moe_intermediate_size=19)),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(num_key_value_heads=1, head_dim=16)),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(WINDOWED, head_dim=16, query_pre_attn_scalar=12,
                                                         attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),
    "gemma3_text": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(WINDOWED, head_dim=16, query_pre_attn_scalar=12,
                                                                  rope_parameters={
                                                                      "full_attention": dict(rope_type="linear", factor=2.0,
                                                                                             rope_theta=1000.0),
                                                                      "sliding_attention": dict(rope_type="default",
                                                                                                rope_theta=50.0)})),
    # GPT-NeoX: a quarter of each head rotates in the Pythia checkpoints; half here, so 4 of 8 channels do
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(
        rope_parameters=dict(rope_theta=500.0, partial_rotary_factor=0.5))),
    "gpt_neox_sequential": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(
        use_parallel_residual=False, attention_bias=False, hidden_act="gelu_new",
        rope_parameters=dict(ROPE, rope_type="linear", factor=2.0, partial_rotary_factor=0.25))),
    "phi": ("PhiForCausalLM", "PhiConfig", dict(rope_parameters=dict(rope_theta=500.0, partial_rotary_factor=0.5))),
    "phi_tied": ("PhiForCausalLM", "PhiConfig", dict(
        tie_word_embeddings=True, num_key_value_heads=4,
        rope_parameters=dict(rope_theta=500.0, partial_rotary_factor=0.75))),
    # Phi-3's default special tokens lie past the tiny vocabulary
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(
        sliding_window=4, pad_token_id=None, eos_token_id=2,
        rope_parameters=dict(rope_theta=500.0, partial_rotary_factor=0.5))),
    # GPT-J rotates interleaved pairs of its first rotary_dim channels (6 of 8 here); n_inner is its MLP width
    "gptj": ("GPTJForCausalLM", "GPTJConfig", dict(rotary_dim=6, n_inner=37)),
    # Falcon's three fused query_key_value layouts (ffn_hidden_size is its MLP width): the new
    # architecture's K/V groups with two norms, or one; Falcon-7B's multi-query with a shared norm;
    # the original per-head layout, one sub-layer after the other
    "falcon": ("FalconForCausalLM", "FalconConfig", dict(
        new_decoder_architecture=True, num_kv_heads=2, bias=True, ffn_hidden_size=37, tie_word_embeddings=False)),
    "falcon_one_norm": ("FalconForCausalLM", "FalconConfig", dict(
        new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1, ffn_hidden_size=37,
        rope_parameters=dict(ROPE, rope_type="linear", factor=2.0))),
    "falcon_7b": ("FalconForCausalLM", "FalconConfig", dict(multi_query=True, ffn_hidden_size=37)),
    "falcon_sequential": ("FalconForCausalLM", "FalconConfig", dict(
        multi_query=False, parallel_attn=False, bias=True, ffn_hidden_size=37)),
    "opt": ("OPTForCausalLM", "OPTConfig", dict(ffn_dim=37)),
    "opt_post_ln": ("OPTForCausalLM", "OPTConfig", dict(ffn_dim=37, do_layer_norm_before=False, enable_bias=False,
                                                        tie_word_embeddings=False)),
    # OPT-350m's shape: word embeddings narrower than the blocks (project_in / project_out), post-norm
    "opt_350m": ("OPTForCausalLM", "OPTConfig", dict(ffn_dim=37, word_embed_proj_dim=16, do_layer_norm_before=False)),
    "gpt_neo": ("GPTNeoForCausalLM", "GPTNeoConfig", dict(attention_types=[[["local", "global"], 1]], window_size=4)),
    "bloom": ("BloomForCausalLM", "BloomConfig", dict(hidden_size=48, num_attention_heads=6)),  # slopes of 6 heads
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", dict(rope_theta=500.0, attention_bias=True)),
}

# The encoder families: a row each, as DECODERS. A masked-LM row (its logits checked as well as
# its hidden states) and a base-model row where a family has both; padding ids other than
# RoBERTa's 1 so the offset is read, not assumed.
ENCODER_BASE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                    num_attention_heads=4, max_position_embeddings=64)
ENCODERS = {
    "roberta": ("RobertaForMaskedLM", "RobertaConfig", dict(type_vocab_size=1, layer_norm_eps=1e-5)),
    "roberta_base": ("RobertaModel", "RobertaConfig", dict(pad_token_id=3, type_vocab_size=2)),
    # the family file xlm_roberta.py: RoBERTa under its own name
    "xlm-roberta": ("XLMRobertaForMaskedLM", "XLMRobertaConfig", dict(pad_token_id=2, type_vocab_size=1)),
    "distilbert": ("DistilBertForMaskedLM", "DistilBertConfig", dict(hidden_dim=37)),
    "distilbert_base": ("DistilBertModel", "DistilBertConfig", dict(hidden_dim=37, activation="relu")),
    "electra": ("ElectraForMaskedLM", "ElectraConfig", dict(embedding_size=16)),
    "electra_base": ("ElectraModel", "ElectraConfig", dict(embedding_size=24, hidden_act="gelu_new")),
    # N tokens reach past MPNet's 8 exact relative-position buckets each way into its logarithmic ones
    "mpnet": ("MPNetForMaskedLM", "MPNetConfig", dict(layer_norm_eps=1e-5)),
    "mpnet_base": ("MPNetModel", "MPNetConfig", dict(hidden_act="relu")),
    # local layers of 2 keys either side (every third layer global: layer 0 here), two RoPE bases;
    # the base row with every bias ModernBERT can switch on
    "modernbert": ("ModernBertForMaskedLM", "ModernBertConfig", dict(local_attention=4, pad_token_id=0,
                                                                     bos_token_id=1, eos_token_id=2,
                                                                     cls_token_id=1, sep_token_id=2)),
    "modernbert_base": ("ModernBertModel", "ModernBertConfig", dict(
        local_attention=6, global_attn_every_n_layers=2, norm_bias=True, attention_bias=True, mlp_bias=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
        rope_parameters={"full_attention": dict(rope_type="default", rope_theta=500.0),
                         "sliding_attention": dict(rope_type="default", rope_theta=50.0)})),
    # DeBERTa-v3's layout (both terms through the layer's own projections, log buckets that N tokens
    # reach past, normed position embeddings, no input positions); v2's own projections, clamped
    # distances, one term, input positions and types; the newer masked-LM head. Weights ten times
    # the default spread, so that the position terms weigh in the scores
    "deberta-v2": ("DebertaV2ForMaskedLM", "DebertaV2Config", dict(
        relative_attention=True, pos_att_type="p2c|c2p", share_att_key=True, position_buckets=8,
        max_relative_positions=16, norm_rel_ebd="layer_norm", position_biased_input=False, layer_norm_eps=1e-7,
        initializer_range=0.2)),
    "deberta-v2_base": ("DebertaV2Model", "DebertaV2Config", dict(
        relative_attention=True, pos_att_type=["c2p"], max_relative_positions=6, type_vocab_size=2,
        initializer_range=0.2)),
    "deberta-v2_lm": ("DebertaV2ForMaskedLM", "DebertaV2Config", dict(
        relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=6, max_relative_positions=12,
        legacy=False, position_biased_input=False, initializer_range=0.2)),
}
# The vision families: a row each, as DECODERS. The two-tower and image-text families (CLIP,
# SigLIP, BLIP) are checked tower by tower in tests/test_image_text.py.
VISION_BASE = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=37)
VISION = {
    "deit": ("DeiTModel", "DeiTConfig", {}),
    "beit": ("BeitModel", "BeitConfig", dict(use_relative_position_bias=True)),
    "beit_shared": ("BeitModel", "BeitConfig", dict(use_shared_relative_position_bias=True,
                                                    use_absolute_position_embeddings=True, use_mean_pooling=False)),
}
# The speech encoders: a row each, as DECODERS, hearing AUDIO_SAMPLES samples (39 frames).
# wav2vec2-base's layout (a GroupNorm after the first convolution, post-norm blocks, an even
# positional kernel whose extra frame is dropped); the large models' (a LayerNorm after every
# convolution, their biases, pre-norm blocks) with a CTC head; HuBERT without the norm before its
# projection and with an odd kernel; HuBERT's large layout
AUDIO_BASE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                  conv_dim=(16, 16, 32), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2), num_conv_pos_embeddings=16,
                  num_conv_pos_embedding_groups=2)
LARGE_AUDIO = dict(feat_extract_norm="layer", do_stable_layer_norm=True, conv_bias=True)
AUDIO = {
    "wav2vec2": ("Wav2Vec2Model", "Wav2Vec2Config", {}),
    "wav2vec2_ctc": ("Wav2Vec2ForCTC", "Wav2Vec2Config", dict(LARGE_AUDIO, vocab_size=VOCAB)),
    "hubert": ("HubertModel", "HubertConfig", dict(num_conv_pos_embeddings=15, feat_proj_layer_norm=False)),
    "hubert_large": ("HubertModel", "HubertConfig", LARGE_AUDIO),
}
AUDIO_SAMPLES = 800
ENCODER_MLMS = [r for r, (cls_name, _, _) in ENCODERS.items() if cls_name.endswith("MaskedLM")]
AUDIO_CTC = [r for r, (cls_name, _, _) in AUDIO.items() if cls_name.endswith("CTC")]
LMS = ["bert_mlm", "gpt2", "llama", "llama_untied", *DECODERS, *ENCODER_MLMS, *AUDIO_CTC]
FAMILIES = ["bert", "bert_mlm", "gpt2", "llama", "llama_untied", "vit", "dinov2", "dinov2_swiglu", *DECODERS,
            *ENCODERS, *VISION, *AUDIO]


# Options a family has that we do not implement: each refused by its name, never ignored
LONGROPE = dict(rope_type="longrope", rope_theta=1e4, short_factor=[1.0] * 4, long_factor=[1.0] * 4,
                original_max_position_embeddings=16)
REFUSED = [("phi", dict(qk_layernorm=True), "qk_layernorm"),
           ("phi3", dict(rope_parameters=LONGROPE), "longrope"),
           ("falcon_7b", dict(alibi=True), "alibi"),
           ("falcon_7b", dict(new_decoder_architecture=True, parallel_attn=False), "parallel_attn")]


@pytest.mark.parametrize("row,over,option", REFUSED)
def test_unsupported_options_are_refused_by_name(row, over, option):
    with pytest.raises(ValueError, match=option):
        attnviz.from_hf(tiny(row, **over))


def test_gptj_without_rotary_dim_is_refused_by_name():
    """transformers' GPTJConfig will not hold None; a config given as a dict can."""
    with pytest.raises(ValueError, match="rotary_dim"):
        convert(dict(model_type="gptj", n_embd=32, n_head=4, n_layer=2, vocab_size=VOCAB, n_positions=64,
                     rotary_dim=None), {})


def inputs(model, size=None):
    if model.main_input_name == "input_values":   # samples as the feature extractor gives them
        torch.manual_seed(1)
        return torch.randn(AUDIO_SAMPLES)
    if model.main_input_name == "pixel_values":
        side = size or model.config.image_size
        torch.manual_seed(1)
        return torch.randn(3, side, side)
    torch.manual_seed(1)
    return torch.randint(0, VOCAB, (N,))


def reference(model, x, head_mask=None):
    """transformers eager with output_attentions; head masks through a pre-hook on the output
    projection that scales each head's slice (transformers 5 has no head_mask argument)."""
    hooks = []
    if head_mask is not None:
        for layer, proj in enumerate(out_projections(model)):
            def hook(mod, args, layer=layer):
                (h,) = args
                dh = h.shape[-1] // head_mask.shape[1]
                scale = head_mask[layer].repeat_interleave(dh).to(h.dtype)
                return (h * scale,)
            hooks.append(proj.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            if model.main_input_name == "input_values":
                out = model(input_values=x[None], output_attentions=True, output_hidden_states=True)
            elif x.is_floating_point():
                kw = {"interpolate_pos_encoding": True} if isinstance(model, (tf.ViTModel, tf.BeitModel)) else {}
                out = model(pixel_values=x[None], output_attentions=True, **kw)
            else:
                out = model(input_ids=x[None], output_attentions=True, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    att = torch.stack([a[0] for a in out.attentions])
    if hasattr(out, "last_hidden_state") and out.last_hidden_state is not None:
        hidden = out.last_hidden_state[0]
    else:
        hidden = out.hidden_states[-1][0]
    return hidden, att, getattr(out, "logits", None)


def out_projections(model):
    base = model.base_model
    base = getattr(base, "decoder", base)  # OPT
    encoder = getattr(base, "encoder", None) or getattr(base, "transformer", None)  # DistilBERT: transformer
    layers = (getattr(base, "h", None) or getattr(base, "layers", None) or getattr(encoder, "layers", None)
              or encoder.layer)   # wav2vec 2.0: encoder.layers
    return [output_projection(layer) for layer in layers]


def output_projection(module):
    """The linear layer that mixes the heads' outputs, under whichever name the family gives it."""
    for name in ("c_proj", "o_proj", "out_proj", "dense", "out_lin", "o", "Wo"):
        if hasattr(getattr(module, name, None), "weight"):  # Linear, or GPT-2's Conv1D
            return getattr(module, name)
    for name in ("attn", "self_attn", "self_attention", "attention", "output"):
        if hasattr(module, name):
            return output_projection(getattr(module, name))
    raise AttributeError(f"no output projection in {type(module).__name__}")


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    hf = tiny(request.param)
    return request.param, hf, attnviz.from_hf(hf)


def close(a, b, tol=TOL):
    assert a.shape == b.shape, (a.shape, b.shape)
    assert (a - b).abs().max().item() < tol, (a - b).abs().max().item()


def test_outputs_and_attentions_match(pair):
    name, hf, ours = pair
    x = inputs(hf)
    hidden, att, logits = reference(hf, x)
    tr = ours.trace(x)
    close(tr.attentions, att)
    torch.testing.assert_close(tr.attentions.sum(-1), torch.ones_like(tr.attentions.sum(-1)))
    if name in LMS:
        close(tr.logits, logits[0])
    else:
        close(tr.hidden, hidden)
        assert tr.logits is None


def test_fast_path_equals_weights_path(pair):
    _, hf, ours = pair
    x = inputs(hf)
    slow, fast = ours.trace(x), ours.trace(x, attentions=False)
    assert fast.attentions is None
    close(fast.hidden, slow.hidden, 1e-5)


def test_head_mask_matches_reference(pair):
    _, hf, ours = pair
    x = inputs(hf)
    torch.manual_seed(2)
    mask = torch.rand(ours.cfg.n_layers, ours.cfg.n_heads)
    mask[0, 1] = 0.0
    hidden, att, logits = reference(hf, x, head_mask=mask)
    tr = ours.trace(x, head_mask=mask)
    out = tr.logits if logits is not None else tr.hidden
    close(out, logits[0] if logits is not None else hidden)
    close(tr.attentions, att)  # a masked head still shows what it would attend to


def test_prune_equals_masked_trace_and_leaves_original(pair):
    _, hf, ours = pair
    x = inputs(hf)
    before = {k: v.clone() for k, v in ours.net.state_dict().items()}
    keep = torch.ones(ours.cfg.n_layers, ours.cfg.n_heads, dtype=torch.bool)
    keep[0, 0] = keep[0, 3] = keep[1, 1] = False
    small = ours.prune(keep)
    masked, pruned = ours.trace(x, head_mask=keep.float()), small.trace(x)
    close(pruned.hidden, masked.hidden, 1e-5)
    if masked.logits is not None:
        close(pruned.logits, masked.logits, 1e-4)
    close(pruned.attentions[keep], masked.attentions[keep], 1e-5)
    assert pruned.attentions[~keep].abs().sum() == 0
    assert small.num_params() < ours.num_params()
    for k, v in ours.net.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_prune_whole_layer_and_everything():
    hf = tiny("llama")
    ours = attnviz.from_hf(hf)
    x = inputs(hf)
    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[1] = False
    keep[0, 0] = keep[0, 1] = False  # removes K/V head 0 of layer 0 entirely (GQA group of 2)
    small = ours.prune(keep)
    assert small.net.blocks[0].attn.n_kv == 1 and small.net.blocks[1].attn.n_heads == 0
    close(small.trace(x).logits, ours.trace(x, head_mask=keep.float()).logits, 1e-4)
    twice = small.prune(torch.ones(2, 4, dtype=torch.bool))
    assert twice.kept.equal(keep)  # already-pruned heads stay gone


def test_uneven_gqa_pruning_keeps_shared_kv():
    hf = tiny("llama")
    ours = attnviz.from_hf(hf)
    x = inputs(hf)
    keep = torch.tensor([[True, False, False, True], [False, True, True, True]])
    small = ours.prune(keep)
    assert [b.attn.n_kv for b in small.net.blocks] == [2, 2]
    close(small.trace(x).logits, ours.trace(x, head_mask=keep.float()).logits, 1e-4)


def test_pruning_under_a_layer_wide_qk_norm_stays_exact():
    """OLMo 2 norms all of a layer's queries (keys) at once: after pruning, twice, and dropping a
    whole K/V group, the kept heads' normed queries and keys are those of the full model."""
    hf = tiny("olmo2")
    ours = attnviz.from_hf(hf)
    x = inputs(hf)
    first = torch.tensor([[False, False, True, True], [True, True, True, False]])
    second = first & torch.tensor([[True, True, True, False], [False, True, True, True]])
    small = ours.prune(first).prune(second)
    assert small.net.blocks[0].attn.k_rest is not None and small.net.blocks[1].attn.k_rest is None
    masked, pruned = ours.trace(x, head_mask=second.float(), states=True), small.trace(x)
    close(pruned.logits, masked.logits, 1e-4)
    close(pruned.attentions[second], masked.attentions[second], 1e-5)
    for layer in range(2):
        state = masked.states[layer][None]
        full = ours.net.blocks[layer].explain(state, **ours.net.shared(len(x)))
        part = small.net.blocks[layer].explain(state, **small.net.shared(len(x)))
        kv = sorted({h // 2 for h in second[layer].nonzero().flatten().tolist()})
        close(part.q_normed, full.q_normed[:, second[layer]], 1e-5)
        close(part.k_normed, full.k_normed[:, kv], 1e-5)


@pytest.mark.parametrize("family,size", [("vit", 48), ("dinov2", 42), ("dinov2", 21), ("beit", 48), ("beit", 24)])
def test_vision_position_interpolation(family, size):
    hf = tiny(family)
    ours = attnviz.from_hf(hf)
    x = inputs(hf, size)
    hidden, att, _ = reference(hf, x)
    tr = ours.trace(x)
    close(tr.hidden, hidden)
    close(tr.attentions, att)
    g = size // hf.config.patch_size
    assert tr.grid == (g, g) and tr.n == 1 + g * g


def test_layers_subset_captures_only_those():
    hf = tiny("gpt2")
    ours = attnviz.from_hf(hf)
    x = inputs(hf)
    full, part = ours.trace(x), ours.trace(x, layers=[1])
    assert part.layers == [1] and part.attentions.shape[0] == 1
    close(part.attentions[0], full.attentions[1], 1e-6)


# Options a row's family reads that the rows above leave at their defaults: logits against eager.
OPTIONS = [("opt", dict(_remove_final_layer_norm=True)),
           ("opt", dict(word_embed_proj_dim=16, tie_word_embeddings=False))]


@pytest.mark.parametrize("row,over", OPTIONS)
def test_family_options_match_reference(row, over):
    hf = tiny(row, **over)
    x = inputs(hf)
    _, att, logits = reference(hf, x)
    tr = attnviz.from_hf(hf).trace(x)
    close(tr.attentions, att)
    close(tr.logits, logits[0])


# What a family does not implement is refused by name, never ignored.
REFUSED = [("bloom", dict(apply_residual_connection_post_layernorm=True), "apply_residual_connection_post_layernorm"),
           ("opt", dict(layer_norm_elementwise_affine=False), "layer_norm_elementwise_affine")]


@pytest.mark.parametrize("row,over,message", REFUSED)
def test_unsupported_options_are_refused_by_name(row, over, message):
    with pytest.raises(ValueError, match=message):
        attnviz.from_hf(tiny(row, **over))


@pytest.mark.parametrize("variant", ["fused", "local:3", "temp:2", "chunked:4", "topk:3", "relu"])
def test_a_score_bias_takes_the_fast_path_as_the_written_out_one(variant):
    """ALiBi's bias reaches the fused kernel as its float mask (or the explicit path for variants
    that have none): the same output as the written-out weights, with a cached prefix and a
    padding mask that leaves one query no key (it gets zero output, as without a bias)."""
    torch.manual_seed(3)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    bias = (alibi_slopes(4)[:, None, None] * torch.arange(7))[None]
    var = parse_variant(variant)
    for allowed in (None, torch.tensor([[1] * 7, [0] * 7]).bool()[:, None, None, :]):
        fast, _ = attend(q, k, v, causal=True, allowed=allowed, variant=var, bias=bias)
        slow, w = attend(q, k, v, causal=True, allowed=allowed, variant=var, bias=bias, need_weights=True)
        close(fast, slow, 1e-5)
        if variant != "relu":  # rows sum to 1; the padded sequence's rows see nothing
            sums = torch.ones(2, 4, 5) if allowed is None else torch.tensor([1.0, 0.0])[:, None, None].expand(2, 4, 5)
            close(w.sum(-1), sums)
    with pytest.raises(ValueError, match="linear attention has no scores"):
        attend(q, k, v, causal=True, variant=parse_variant("linear"), bias=bias)


def test_gpt_neo_attention_types_are_read_or_refused_by_name():
    hf = dict(hidden_size=32, num_heads=4, num_layers=3, vocab_size=99, max_position_embeddings=64, window_size=5,
              attention_types=[[["global"], 1], [["local"], 2]])
    assert gpt_neo.config(hf, {}).windows == (0, 5, 5)
    assert gpt_neo.config(dict(hf, attention_types=[[["global"], 3]]), {}).windows == ()
    with pytest.raises(ValueError, match="attention type 'sparse' is not supported"):
        gpt_neo.config(dict(hf, attention_types=[[["global", "sparse"], 1], [["local"], 1]]), {})
    with pytest.raises(ValueError, match="lists 2 layers"):
        gpt_neo.config(dict(hf, attention_types=[[["global", "local"], 1]]), {})


@pytest.mark.parametrize("row", ENCODER_MLMS)
def test_masked_lm_encoders_hidden_states_match(row):
    """The rows above compare a masked-LM model's logits; its hidden states too."""
    hf = tiny(row)
    x = inputs(hf)
    hidden, _, _ = reference(hf, x)
    close(attnviz.from_hf(hf).trace(x).hidden, hidden)


@pytest.mark.parametrize("row", ["roberta", "roberta_base", "xlm-roberta", "mpnet"])
def test_padding_tokens_take_the_padding_position(row):
    """RoBERTa's positions count only tokens other than padding, which reads its own row."""
    hf = tiny(row)
    pad = hf.config.pad_token_id
    x = torch.tensor([0, 5, pad, 7, pad, pad, 9, 2])
    hidden, att, _ = reference(hf, x)
    tr = attnviz.from_hf(hf).trace(x)
    close(tr.hidden, hidden)
    close(tr.attentions, att)


ENCODER_REFUSED = [("roberta_base", dict(is_decoder=True), "is_decoder"),
                   ("electra", dict(hidden_act="relu"), "hidden_act"),
                   ("roberta_base", dict(pad_token_id=None), "pad_token_id"),
                   ("roberta_base", dict(pad_token_id=70), "pad_token_id"),   # past the 64-row position table
                   ("mpnet_base", dict(relative_attention_num_buckets=16), "relative_attention_num_buckets"),
                   ("deberta-v2_base", dict(conv_kernel_size=3), "conv_kernel_size"),
                   ("deberta-v2_base", dict(embedding_size=16), "embedding_size"),
                   ("deberta-v2_base", dict(pos_att_type=["c2p", "p2p"]), "p2p"),
                   ("deberta-v2", dict(norm_rel_ebd="layer_norm|other"), "norm_rel_ebd"),
                   ("roberta", dict(tie_word_embeddings=False), "tie_word_embeddings"),
                   ("distilbert", dict(tie_word_embeddings=False), "tie_word_embeddings")]


@pytest.mark.parametrize("row,over,option", ENCODER_REFUSED)
def test_encoder_options_we_do_not_implement_are_refused_by_name(row, over, option):
    hf = tiny(row)
    hf.config.update(over)   # set after building: transformers itself would not build some of these
    with pytest.raises(ValueError, match=option):
        attnviz.from_hf(hf)


def test_relative_buckets_are_mpnets():
    """Far past the tiny texts: every distance up to twice the max distance, both ways."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder
    d = torch.arange(-300, 301)
    assert torch.equal(relative_buckets(d, True, 32, 128), MPNetEncoder.relative_position_bucket(d))


def test_one_pair_of_bucket_fields_serves_relative_positions_alone_and_added_to_absolute_ones():
    """T5 (positions only through the buckets) and MPNet (buckets added to learned positions) read
    the same two Config fields; relative positions without buckets are refused."""
    from attnviz.core.config import Config
    t5, mpnet = tiny_seq2seq("t5").config, tiny("mpnet").config
    ours_t5, ours_mpnet = attnviz.from_hf(tiny_seq2seq("t5")).cfg.block_config(), attnviz.from_hf(tiny("mpnet")).cfg
    assert (ours_t5.positional, ours_t5.rel_buckets, ours_t5.rel_max_distance) == (
        "relative", t5.relative_attention_num_buckets, t5.relative_attention_max_distance)
    assert (ours_mpnet.positional, ours_mpnet.rel_buckets, ours_mpnet.rel_max_distance) == ("learned", 32, 128)
    assert mpnet.relative_attention_num_buckets == 32
    with pytest.raises(ValueError, match="relative positions need distance buckets"):
        Config(family="x", task="encoder", n_layers=1, n_heads=1, n_kv_heads=1, d_model=4, d_head=4, d_ff=4,
               positional="relative")


@pytest.mark.parametrize("span,max_position", [(256, 512), (8, 16), (6, 12)])
def test_log_buckets_are_debertas(span, max_position):
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position
    d = torch.arange(-3 * max_position, 3 * max_position + 1)
    assert torch.equal(log_bucket(d, span, max_position), make_log_bucket_position(d, span, max_position).long())


@pytest.mark.parametrize("family", ["beit", "beit_shared"])
def test_relative_position_bias_is_read_by_analyses_from_the_block(family):
    """BEiT's bias lives in the attention module: what a block explains (`Scored`) gives the
    traced weights, whole and row by row, at the trained grid and at another."""
    hf = tiny(family)
    ours = attnviz.from_hf(hf)
    for side in (32, 48):
        tr = ours.trace(inputs(hf, side), states=True)
        for layer in range(ours.cfg.n_layers):
            scored = ours.net.blocks[layer].explain(tr.states[layer][None], **ours.net.shared(tr.n))
            close(scored.weights()[0], tr.attentions[layer], 1e-5)
            close(scored.weights(3, 7)[0], tr.attentions[layer][:, 3:7], 1e-5)


# ---------------------------------------------------------------- encoder-decoders
# A row per encoder-decoder family (transformers' model class, its config class, the tiny config).
# T5's head width (d_kv) differs from d / heads and its 8 distance buckets reach the logarithmic
# ones within N tokens; M2M100 is NLLB's architecture.
S2S_BASE = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64)
T5_BASE = dict(vocab_size=VOCAB, d_model=32, d_kv=12, d_ff=37, num_layers=2, num_decoder_layers=3, num_heads=4,
               relative_attention_num_buckets=8, relative_attention_max_distance=12)
SEQ2SEQ = {
    "marian": ("MarianMTModel", "MarianConfig", dict(S2S_BASE, pad_token_id=VOCAB - 1, eos_token_id=0,
                                                     decoder_start_token_id=VOCAB - 1, scale_embedding=True)),
    "bart": ("BartForConditionalGeneration", "BartConfig", S2S_BASE),
    "mbart": ("MBartForConditionalGeneration", "MBartConfig", dict(S2S_BASE, scale_embedding=True)),
    "m2m_100": ("M2M100ForConditionalGeneration", "M2M100Config", dict(S2S_BASE, scale_embedding=True)),
    "t5": ("T5ForConditionalGeneration", "T5Config", T5_BASE),
    "t5_v1_1": ("T5ForConditionalGeneration", "T5Config", dict(T5_BASE, feed_forward_proj="gated-gelu",
                                                                tie_word_embeddings=False)),
    "mt5": ("MT5ForConditionalGeneration", "MT5Config", dict(T5_BASE, d_kv=8, feed_forward_proj="gated-gelu")),
}
S2S_REPOS = {"marian": "Helsinki-NLP/opus-mt-en-zh"}   # a Marian pair by its Hub name (random weights)
LANGUAGES = {"m2m_100": ("w60", "w61")}   # a multilingual row: language tokens, the target's forced first
S2S_SRC = [5, 9, 17, 3, 22, 40, 8, 11, 13, 14, 19, 20, 21, 30]   # the end of sentence follows
S2S_TGT = [7, 8, 11, 30, 12, 4, 6, 9, 10, 33, 34]


def tiny_seq2seq(row: str, seed: int = 0):
    cls_name, make, fields = SEQ2SEQ[row]
    torch.manual_seed(seed)
    hf = getattr(tf, cls_name)(getattr(tf, make)(**fields, attn_implementation="eager")).eval()
    with torch.no_grad():  # norms and biases start at constants: make them random too
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias") or "relative_attention_bias" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return hf


def seq2seq_tokenizer(hf, languages=()) -> tf.PreTrainedTokenizerFast:
    """A word-level tokenizer over a tiny model's vocabulary ("w5" is id 5; the model's own special
    ids named; `languages`: words that are its language tokens), built here: no download, no sentencepiece."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    cfg = hf.config
    specials = {cfg.pad_token_id: "<pad>", cfg.eos_token_id: "</s>"}
    if getattr(cfg, "bos_token_id", None) is not None:
        specials.setdefault(cfg.bos_token_id, "<s>")
    specials.setdefault(next(i for i in range(3, VOCAB) if i not in specials), "<unk>")
    backend = Tokenizer(models.WordLevel({specials.get(i, f"w{i}"): i for i in range(VOCAB)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                                      extra_special_tokens=list(languages))


def s2s_ids(ours):
    """(source ids (1, S) with the end of sentence, decoder input (1, T): the start, then the target)."""
    return torch.tensor([S2S_SRC + [ours.cfg.eos_id]]), torch.tensor([[ours.cfg.decoder_start_id] + S2S_TGT])


def s2s_attentions(hf):
    """{"encoder", "self", "cross"}: each layer's attention module, as the family names it."""
    if hasattr(hf, "model"):   # the BART layout (Marian, BART, mBART, M2M100)
        enc, dec = hf.model.encoder.layers, hf.model.decoder.layers
        return {"encoder": [l.self_attn for l in enc], "self": [l.self_attn for l in dec],
                "cross": [l.encoder_attn for l in dec]}
    return {"encoder": [b.layer[0].SelfAttention for b in hf.encoder.block],
            "self": [b.layer[0].SelfAttention for b in hf.decoder.block],
            "cross": [b.layer[1].EncDecAttention for b in hf.decoder.block]}


def s2s_reference(hf, src, dec, masks=None):
    """transformers eager with every attention and hidden state; head masks as pre-hooks scaling
    each head's slice before the output projection."""
    hooks = []
    for side, mask in (masks or {}).items():
        for layer, attn in enumerate(s2s_attentions(hf)[side]):
            def hook(mod, args, row=mask[layer]):
                (h,) = args
                return (h * row.repeat_interleave(h.shape[-1] // len(row)).to(h.dtype),)
            hooks.append(output_projection(attn).register_forward_pre_hook(hook) if not hasattr(attn, "o")
                         else attn.o.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            return hf(input_ids=src, decoder_input_ids=dec, output_attentions=True, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()


@pytest.fixture(scope="module", params=list(SEQ2SEQ))
def s2s_pair(request):
    hf = tiny_seq2seq(request.param)
    specials = LANGUAGES.get(request.param, ("<extra_id_0>",) if "t5" in request.param else ())   # T5: a sentinel
    return request.param, hf, attnviz.from_hf(hf, seq2seq_tokenizer(hf, specials))


def test_seq2seq_hidden_states_logits_and_every_attention_match(s2s_pair):
    row, hf, ours = s2s_pair
    src, dec = s2s_ids(ours)
    ref = s2s_reference(hf, src, dec)
    with torch.no_grad():
        memory, enc_att = ours.net.encode(src, need_weights=True)
        out = ours.net.step(dec, ours.net.start(memory), need_weights=True, need_self=True)
        hidden = ours.net.step(dec, ours.net.start(memory), logits=False).logits / ours.cfg.output_scale
    close(memory, ref.encoder_last_hidden_state)
    close(hidden, ref.decoder_hidden_states[-1])
    close(out.logits, ref.logits)
    for ours_att, theirs in ((enc_att, ref.encoder_attentions), (out.self_att, ref.decoder_attentions),
                             (out.cross, ref.cross_attentions)):
        close(torch.cat([ours_att[i] for i in range(len(theirs))]), torch.cat(theirs))
    # the public trace: the same tensors, teacher-forced on the target
    tr = ours.trace(S2S_SRC, target=S2S_TGT + [ours.cfg.eos_id])
    close(tr.encoder_attentions, torch.cat(ref.encoder_attentions))
    close(tr.self_attentions, torch.cat(ref.decoder_attentions))
    close(tr.cross_attentions, torch.cat(ref.cross_attentions))
    want = torch.log_softmax(ref.logits[0], -1).gather(1, torch.tensor(S2S_TGT + [ours.cfg.eos_id])[:, None])[:, 0]
    close(tr.logprobs, want)


def test_seq2seq_head_masks_match(s2s_pair):
    row, hf, ours = s2s_pair
    src, dec = s2s_ids(ours)
    masks = {"encoder": torch.ones(2, 4), "self": torch.ones(3, 4), "cross": torch.ones(3, 4)}
    masks["encoder"][0, 1] = masks["encoder"][1, 3] = masks["self"][2, 0] = 0
    masks["cross"][0, 2] = masks["cross"][1, 0] = masks["cross"][1, 1] = 0.0
    masks["self"][0, 1] = 0.5
    ref = s2s_reference(hf, src, dec, masks)
    assert not torch.allclose(ref.logits, s2s_reference(hf, src, dec).logits, atol=1e-3)
    tr = ours.trace(S2S_SRC, target=S2S_TGT + [ours.cfg.eos_id], head_mask=masks["cross"],
                    encoder_head_mask=masks["encoder"], self_head_mask=masks["self"])
    want = torch.log_softmax(ref.logits[0], -1).gather(1, torch.tensor(S2S_TGT + [ours.cfg.eos_id])[:, None])[:, 0]
    close(tr.logprobs, want)
    close(tr.cross_attentions, torch.cat(ref.cross_attentions))   # what the masked heads would attend to


def hf_generate(hf, ours, n: int) -> list[int]:
    """transformers' greedy generation, the target language forced first where the model has one."""
    config = tf.GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=n, min_new_tokens=0,
                                 decoder_start_token_id=ours.cfg.decoder_start_id, eos_token_id=ours.cfg.eos_id,
                                 pad_token_id=ours.cfg.pad_id, forced_eos_token_id=None,
                                 forced_bos_token_id=ours.forced_first if ours.forced_first >= 0 else None)
    hf.generation_config.forced_eos_token_id = None   # Marian's: an end forced at the length limit, where we stop
    with torch.no_grad():
        # without transformers' cache: it sizes T5's by the encoder's layer count, fewer than the decoder's here
        out = hf.generate(torch.tensor([S2S_SRC + [ours.cfg.eos_id]]), generation_config=config, use_cache=False)
    return out[0, 1:].tolist()


def test_seq2seq_greedy_generation_equals_transformers(s2s_pair):
    row, hf, ours = s2s_pair
    assert ours.languages == list(LANGUAGES.get(row, ()))   # language tokens, never T5's sentinels
    if row in LANGUAGES:   # a multilingual model: the target language's token forced first
        assert ours.target_language is None
        ours = ours.into("w61")
        assert ours.target_language == "w61" and ours.info.key.endswith("→ w61")
    tr = ours.translate(S2S_SRC, max_tokens=10)
    assert tr.target_ids.tolist() == hf_generate(hf, ours, 10)
    if row in LANGUAGES:
        assert tr.target_tokens[0] == "w61" and float(tr.logprobs[0]) == 0.0
    full = ours.translate(S2S_SRC, max_tokens=10, cache=False)
    assert torch.equal(tr.target_ids, full.target_ids)
    close(tr.self_attentions, full.self_attentions)
    close(tr.cross_attentions, full.cross_attentions)


@pytest.mark.parametrize("row", list(SEQ2SEQ))
def test_seq2seq_folder_round_trip_and_hub_cache_by_name(row, tmp_path, monkeypatch):
    from tests import hub_cache
    from attnviz.weights import hub
    hf = tiny_seq2seq(row, seed=1)
    hf.save_pretrained(tmp_path / "src")
    seq2seq_tokenizer(hf).save_pretrained(tmp_path / "src")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HfApi", None)   # no Hub call can happen
    name = S2S_REPOS.get(row, f"org/tiny-{row.replace('_', '-')}")
    hub_cache.lay_out(tmp_path / "hub", name, tmp_path / "src")
    text = " ".join(f"w{i}" for i in S2S_SRC)
    for ours in (attnviz.load_model(str(tmp_path / "src")), attnviz.load_model(name)):
        assert ours.cfg.family == row.split("_v1")[0]
        tr = ours.trace(text, target=S2S_TGT)   # read with the folder's own tokenizer
        assert tr.source_ids.tolist() == S2S_SRC + [ours.cfg.eos_id] and tr.source_tokens[0] == "w5"
        ref = s2s_reference(hf, *s2s_ids(ours))
        close(tr.cross_attentions, torch.cat(ref.cross_attentions))
        close(tr.logprobs, torch.log_softmax(ref.logits[0], -1).gather(
            1, torch.tensor(S2S_TGT + [ours.cfg.eos_id])[:, None])[:, 0])


def test_relative_position_bias_is_computed_once_per_side_as_transformers_does(s2s_pair):
    row, hf, ours = s2s_pair
    if not hasattr(hf, "encoder") or hasattr(hf, "model"):
        assert ours.position_bias(5) is None
        return
    for side, stack in (("encoder", hf.encoder), ("decoder", hf.decoder)):
        with torch.no_grad():
            want = stack.block[0].layer[0].SelfAttention.compute_bias(N + 9, N + 9)[0]
        close(ours.position_bias(N + 9, side), want)
    with pytest.raises(ValueError, match="side"):
        ours.position_bias(3, "cross")


def test_seq2seq_pruning_equals_the_masked_model_and_leaves_it_untouched(s2s_pair):
    row, hf, ours = s2s_pair
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[0, 2] = keep[1, 0] = keep[1, 1] = False
    keep[2] = False                                   # a whole layer's cross-attention
    target = S2S_TGT + [ours.cfg.eos_id]
    before = ours.trace(S2S_SRC, target=target)
    small = ours.prune(keep)
    assert small.info.key.endswith("(pruned 7/12)") and [len(b.cross.heads) for b in small.net.decoder] == [3, 2, 0]
    masked, pruned = ours.trace(S2S_SRC, target=target, head_mask=keep.float()), small.trace(S2S_SRC, target=target)
    close(pruned.logprobs, masked.logprobs)
    close(pruned.cross_attentions, masked.cross_attentions * keep[:, :, None, None])   # pruned heads: zero rows
    close(pruned.self_attentions, masked.self_attentions)
    assert small.translate(S2S_SRC, max_tokens=8).target_ids.tolist() == \
        ours.translate(S2S_SRC, max_tokens=8, head_mask=keep.float()).target_ids.tolist()
    again = small.prune(torch.ones(3, 4, dtype=torch.bool))    # heads already pruned stay gone
    close(again.trace(S2S_SRC, target=target).logprobs, pruned.logprobs)
    close(ours.trace(S2S_SRC, target=target).logprobs, before.logprobs, tol=1e-6)   # the original is untouched
    with pytest.raises(ValueError, match="shape"):
        ours.prune(torch.ones(2, 4, dtype=torch.bool))
