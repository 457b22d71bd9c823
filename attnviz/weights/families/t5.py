"""T5 (T5ForConditionalGeneration: T5 and T5 v1.1): a pre-norm encoder-decoder without absolute
positions. Each side's self-attention adds a learned bias per head and distance bucket (relative
positions), computed once and shared by every layer of that side (the cross-attention has none);
scores are not scaled by 1/√d; RMSNorm without a mean or bias; no biases anywhere; a ReLU MLP, or
v1.1's gated GELU; the head width `d_kv` is its own. The decoder's output is scaled by d^-1/2
before the output layer unless the config turns that off (v1.1). Builds `Seq2Seq`.
`mt5.py` is this file under its own name."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.core.seq2seq import Seq2SeqConfig
from attnviz.weights.mapper import Mapper, activation, get

NAME = "t5"
TASK = "translation"
MAX_POSITIONS = 512   # T5 has no position table; the length it was trained on


# ---------------------------------------------------------------- config half
def blocks(hf, family: str) -> Config:
    proj = get(hf, "feed_forward_proj", "relu")
    gated, act = proj.startswith("gated-"), proj.split("-")[-1]
    if gated and act == "gelu":
        act = "gelu_new"   # transformers reads T5's "gated-gelu" as the tanh GELU
    heads = get(hf, "num_heads")
    return Config(family=family, task="encoder", n_layers=get(hf, "num_layers"), n_heads=heads, n_kv_heads=heads,
                  d_model=get(hf, "d_model"), d_head=get(hf, "d_kv"), d_ff=get(hf, "d_ff"),
                  vocab_size=get(hf, "vocab_size"), norm="rmsnorm", norm_eps=get(hf, "layer_norm_epsilon", 1e-6),
                  norm_bias=False, positional="relative", rel_buckets=get(hf, "relative_attention_num_buckets", 32),
                  rel_max_distance=get(hf, "relative_attention_max_distance", 128), pre_norm=True,
                  activation=activation(act), gated_mlp=gated, qkv_bias=False, out_bias=False, mlp_bias=False,
                  attn_scale=1.0)   # T5 folds the 1/√d into its initialisation: scores are plain q·k


def config(hf, sd: dict, family: str = NAME, scaled: bool | None = None) -> Seq2SeqConfig:
    """`scaled`: whether the decoder's output is scaled by d^-1/2 (None: as the config says)."""
    if scaled is None:
        scaled = get(hf, "scale_decoder_outputs", get(hf, "tie_word_embeddings", True) is not False)
    start, pad = get(hf, "decoder_start_token_id"), get(hf, "pad_token_id")
    # an output layer of its own where the checkpoint holds one that differs from the embeddings
    untied = "lm_head.weight" in sd and not torch.equal(sd["lm_head.weight"], sd["shared.weight"])
    return Seq2SeqConfig.of(blocks(hf, family), n_dec_layers=get(hf, "num_decoder_layers") or get(hf, "num_layers"),
                            positional="none", decoder_start_id=pad if start is None else start,
                            eos_id=get(hf, "eos_token_id"), pad_id=pad, max_positions=get(hf, "n_positions", MAX_POSITIONS),
                            output_scale=get(hf, "d_model") ** -0.5 if scaled else 1.0, tie_output=not untied)


def size(hf, b) -> int:
    d, h, dh = b.width("d_model"), b.heads("num_heads"), b.width("d_kv")
    layers = b.layers("num_layers") + b.layers("num_decoder_layers", default=get(hf, "num_layers"))
    gated = str(get(hf, "feed_forward_proj", "relu")).startswith("gated-")
    return b.blocks(layers, d, h, h, dh, b.ff("d_ff"), gated) + 2 * b.vocab("vocab_size") * d


# ---------------------------------------------------------------- weights half
def _mlp(m: Mapper, ours: str, theirs: str, gated: bool):
    if gated:
        m.fused(ours + ".fc_in", [theirs + ".wi_0", theirs + ".wi_1"], bias=False)   # act(gate), then · up
    else:
        m.linear(ours + ".fc_in", theirs + ".wi", bias=False)
    m.linear(ours + ".fc_out", theirs + ".wo", bias=False)


def weights(cfg: Seq2SeqConfig, sd: dict) -> dict[str, torch.Tensor]:
    m, gated = Mapper(sd), cfg.blocks.gated_mlp
    m.put("tok.weight", m.take("shared.weight"))
    if not cfg.tie_output:
        m.put("lm_head.weight", m.take("lm_head.weight"))
    m.put("lm_head.bias", torch.zeros(cfg.vocab_size))
    for side, ours in (("encoder", "enc"), ("decoder", "dec")):
        m.put(f"{ours}_rel.table.weight", m.take(f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"))
        m.norm(f"{ours}_final_norm", f"{side}.final_layer_norm", bias=False)
    for i in range(cfg.n_enc_layers):
        p, o = f"encoder.block.{i}.layer.", f"encoder.{i}."
        m.fused(o + "attn.qkv", [p + f"0.SelfAttention.{n}" for n in "qkv"], bias=False)
        m.linear(o + "attn.out", p + "0.SelfAttention.o", bias=False)
        m.norm(o + "norm1", p + "0.layer_norm", bias=False)
        _mlp(m, o + "mlp", p + "1.DenseReluDense", gated)
        m.norm(o + "norm2", p + "1.layer_norm", bias=False)
    for i in range(cfg.n_dec_layers):
        p, o = f"decoder.block.{i}.layer.", f"decoder.{i}."
        for n, theirs, ours in ((0, "SelfAttention", "self_attn"), (1, "EncDecAttention", "cross")):
            m.linear(o + ours + ".q", f"{p}{n}.{theirs}.q", bias=False)
            m.fused(o + ours + ".kv", [f"{p}{n}.{theirs}.k", f"{p}{n}.{theirs}.v"], bias=False)
            m.linear(o + ours + ".out", f"{p}{n}.{theirs}.o", bias=False)
        m.norm(o + "norm_self", p + "0.layer_norm", bias=False)
        m.norm(o + "norm_cross", p + "1.layer_norm", bias=False)
        _mlp(m, o + "mlp", p + "2.DenseReluDense", gated)
        m.norm(o + "norm_ffn", p + "2.layer_norm", bias=False)
    return m.out
