"""wav2vec 2.0 (Wav2Vec2Model, Wav2Vec2ForCTC): a BERT-like encoder over audio frames. The input
stage is `attnviz.core.audio_frames` (convolutions over the samples, a projection, positions from a
grouped convolution), written as the config's audio fields; the blocks are the core ones:
- `do_stable_layer_norm=False` (wav2vec2-base): post-norm blocks as BERT's, a LayerNorm after the
  positions (`embedding_norm`), none after the last block;
- `do_stable_layer_norm=True` (wav2vec2-large-lv60, XLS-R): pre-norm blocks and a final LayerNorm.
Checkpoints store the positional convolution weight-normed (`weight_g` / `weight_v`, or torch's
parametrization `original0` / `original1`): it is folded into the plain weight it stands for.

Not read, on purpose: `apply_spec_augment`, `mask_time_*`, `mask_feature_*` and `masked_spec_embed`
mask frames during training only (transformers applies them in training mode or to frames a caller
names; an evaluation pass never does), and the dropouts and `layerdrop` act only in training.
`use_weighted_layer_sum` serves the classification heads, which are not built here.
"""
from __future__ import annotations

import torch

from attnviz.core.config import CONV_NORMS, Config
from attnviz.weights.mapper import Mapper, activation, get

NAME = "wav2vec2"
TASK = "audio"
PREFIXES = ("wav2vec2.",)
RATE = 16_000
MAX_SECONDS = 30        # frames of this much audio bound a trace (max_positions): 1,500 at 20 ms
MAX_KERNEL = 4096       # a convolution's kernel or stride (samples or frames) a folder may declare
# Options of the family that change an evaluation pass and are not implemented: refused by name
UNSUPPORTED = {"add_adapter": "a convolutional adapter after the encoder",
               "adapter_attn_dim": "attention adapters in every layer",
               "conv_pos_batch_norm": "a BatchNorm before the positional convolution"}


# ---------------------------------------------------------------- config half
def refuse_unsupported(hf):
    for option, what in UNSUPPORTED.items():
        if get(hf, option, None) not in (None, False):
            raise ValueError(f"{option} ({what}) is not supported")
    if get(hf, "feat_extract_norm", "group") not in CONV_NORMS:
        raise ValueError(f"feat_extract_norm {get(hf, 'feat_extract_norm')!r:.40} is not supported; "
                         f"supported: {', '.join(CONV_NORMS)}")


def conv_layers(hf) -> tuple:
    """(channels, kernel, stride) of each convolution, from conv_dim / conv_kernel / conv_stride."""
    dims, kernels, strides = (list(get(hf, k) or ()) for k in ("conv_dim", "conv_kernel", "conv_stride"))
    n = get(hf, "num_feat_extract_layers", len(dims))
    if not dims or not len(dims) == len(kernels) == len(strides) == n:
        raise ValueError("conv_dim, conv_kernel and conv_stride must list one value per convolution "
                         "(num_feat_extract_layers)")
    return tuple((int(c), int(k), int(s)) for c, k, s in zip(dims, kernels, strides))


def audio_config(hf, sd: dict, family: str, **extra) -> Config:
    """wav2vec 2.0's config, and the parent of HuBERT's, written as its difference."""
    refuse_unsupported(hf)
    d, h = get(hf, "hidden_size"), get(hf, "num_attention_heads")
    stable = bool(get(hf, "do_stable_layer_norm", False))
    ctc = any(k.startswith("lm_head.") for k in sd)
    convs = conv_layers(hf)
    hop = 1
    for _, _, stride in convs:
        hop *= stride
    return Config(family=family, task=TASK, n_layers=get(hf, "num_hidden_layers"), n_heads=h, n_kv_heads=h,
                  d_model=d, d_head=d // h, d_ff=get(hf, "intermediate_size"),
                  vocab_size=get(hf, "vocab_size") if ctc else 0, max_positions=MAX_SECONDS * RATE // hop,
                  norm_eps=get(hf, "layer_norm_eps", 1e-5), positional="conv",
                  activation=activation(get(hf, "hidden_act", "gelu")), pre_norm=stable,
                  embedding_norm=not stable, final_norm=stable, conv_layers=convs,
                  conv_norm=get(hf, "feat_extract_norm", "group"), conv_bias=bool(get(hf, "conv_bias", False)),
                  conv_activation=activation(get(hf, "feat_extract_activation", "gelu")),
                  pos_conv_kernel=get(hf, "num_conv_pos_embeddings"),
                  pos_conv_groups=get(hf, "num_conv_pos_embedding_groups"), ctc_head=ctc, **extra)


def config(hf, sd: dict) -> Config:
    return audio_config(hf, sd, NAME)


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, h, L = b.width("hidden_size"), b.heads("num_attention_heads"), b.layers("num_hidden_layers")
    try:
        convs = conv_layers(hf)
    except (TypeError, ValueError) as err:
        raise b.fail(f"config.json: {err}") from None
    if len(convs) > b.MAX_LAYERS or any(not (1 <= c <= b.MAX_D_MODEL and 1 <= k <= MAX_KERNEL and 1 <= s <= MAX_KERNEL)
                                        for c, k, s in convs):
        raise b.fail(f"config.json: the convolutions must have 1..{b.MAX_D_MODEL:,} channels and kernels and "
                     f"strides of 1..{MAX_KERNEL}")
    k = b.int("num_conv_pos_embeddings", 1, MAX_KERNEL)
    groups = b.int("num_conv_pos_embedding_groups", 1, d)
    widths = [1] + [c for c, _, _ in convs]
    front = sum(widths[i] * c * kernel for i, (c, kernel, _) in enumerate(convs)) + widths[-1] * d + d * d // groups * k
    vocab = b.vocab("vocab_size", optional=True) or 0
    return b.blocks(L, d, h, h, None, b.ff("intermediate_size"), gated=False) + front + vocab * d


def feature_extractor(settings: dict | None):
    """transformers' Wav2Vec2FeatureExtractor from a folder's preprocessor_config.json (a dict), or
    its defaults (16 kHz, normalised to zero mean and unit variance) without one."""
    from transformers import Wav2Vec2FeatureExtractor
    return Wav2Vec2FeatureExtractor.from_dict(dict(settings or {}))


# ---------------------------------------------------------------- weights half
def fold_weight_norm(g: torch.Tensor, v: torch.Tensor, dim: int = 2) -> torch.Tensor:
    """A weight-normed convolution's weight as the plain weight it stands for: g · v / ‖v‖, the norm
    over every dimension but `dim` (torch's `weight_norm(dim=2)`: one norm per kernel tap)."""
    others = tuple(i for i in range(v.dim()) if i != dim)
    return v * (g / v.norm(dim=others, keepdim=True))


def positional_weight(m: Mapper, conv: str) -> torch.Tensor:
    if m.has(conv + ".weight"):
        return m.take(conv + ".weight")
    if m.has(conv + ".weight_g"):
        return fold_weight_norm(m.take(conv + ".weight_g"), m.take(conv + ".weight_v"))
    p = conv + ".parametrizations.weight."
    return fold_weight_norm(m.take(p + "original0"), m.take(p + "original1"))


def front(m: Mapper, cfg: Config):
    """The convolutions, the projection and the positional convolution."""
    for i in range(len(cfg.conv_layers)):
        m.linear(f"audio.convs.{i}", f"feature_extractor.conv_layers.{i}.conv", bias=cfg.conv_bias)
        if cfg.conv_norm == "layer" or i == 0:
            m.norm(f"audio.conv_norms.{i}", f"feature_extractor.conv_layers.{i}.layer_norm")
    if cfg.feature_norm:
        m.norm("audio.feature_norm", "feature_projection.layer_norm")
    m.linear("audio.proj", "feature_projection.projection")
    m.put("audio.pos_conv.weight", positional_weight(m, "encoder.pos_conv_embed.conv"))
    m.put("audio.pos_conv.bias", m.take("encoder.pos_conv_embed.conv.bias"))


def weights(cfg: Config, sd: dict, prefixes: tuple = PREFIXES) -> dict[str, torch.Tensor]:
    m = Mapper(sd, prefixes)
    front(m, cfg)
    m.norm("norm" if cfg.pre_norm else "emb_norm", "encoder.layer_norm")
    for i in range(cfg.n_layers):
        p, o = f"encoder.layers.{i}.", f"blocks.{i}."
        m.fused(o + "attn.qkv", [p + f"attention.{n}_proj" for n in "qkv"])
        m.linear(o + "attn.out", p + "attention.out_proj")
        m.norm(o + "norm1", p + "layer_norm")
        m.norm(o + "norm2", p + "final_layer_norm")
        m.linear(o + "mlp.fc_in", p + "feed_forward.intermediate_dense")
        m.linear(o + "mlp.fc_out", p + "feed_forward.output_dense")
    if cfg.ctc_head:   # beside the base model
        m.prefix = ""
        m.linear("lm_head", "lm_head")
    return m.out
