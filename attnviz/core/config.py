"""The shape of one model: everything the modules need to know, and nothing about weights.

A family (attnviz.weights.families) is written as structural fields here: the blocks read the
fields, never the family's name. Every field has the value that means "as the original
transformer" by default, so a family states only how it differs.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

# Core knows structure, not families: a family file (attnviz.weights.families) sets these fields,
# and `family` is only the label it signs the config with.
TASKS = ("encoder", "lm", "vision", "audio")
NORMS = ("layernorm", "rmsnorm")
POSITIONALS = ("learned", "rotary", "sinusoidal", "alibi", "relative", "conv", "none")
CONV_NORMS = ("group", "layer")
QK_NORMS = ("none", "head", "all")
ROPE_KINDS = ("default", "linear", "dynamic", "yarn", "llama3")


@dataclass(frozen=True)
class Config:
    family: str                  # the family that built it (a label: nothing branches on it)
    task: str                    # encoder | lm (an LM head) | vision (a patch embedding) | audio (a conv front end)
    n_layers: int
    n_heads: int                 # query heads
    n_kv_heads: int              # key/value heads (< n_heads: grouped-query attention; 1: multi-query)
    d_model: int
    d_head: int                  # may differ from d_model / n_heads (Gemma)
    d_ff: int                    # hidden width of the MLP (of each expert, in a mixture of experts)
    vocab_size: int = 0          # 0 for vision models
    max_positions: int = 512     # text: positions; vision: tokens of the reference grid
    norm: str = "layernorm"      # layernorm | rmsnorm
    norm_eps: float = 1e-12
    norm_bias: bool = True       # a LayerNorm's bias (RMSNorm has none)
    positional: str = "learned"  # learned | rotary | sinusoidal | alibi (a score bias per head) | relative |
                                 # conv (a grouped convolution over the frames, added to them) | none
    rel_buckets: int = 0         # a learned score bias per head from log-bucketed relative positions, one table
                                 # shared by every layer: the only position signal (positional "relative": T5) or
                                 # added to absolute positions (MPNet); 0: none
    rel_max_distance: int = 128  # distances from here on share the last bucket
    rope_theta: float = 10000.0
    rotary_dim: int = 0          # channels of each head that rotate (0: all; GPT-NeoX, GPT-J, Phi rotate a part)
    rope_scaling: tuple = ()     # (("rope_type", "llama3"), ("factor", 8.0), ...): sorted pairs, () = none
    local_rope_theta: float = 0.0  # base of the windowed layers' rotary (Gemma 3); 0: rope_theta and its scaling
    causal: bool = False
    pre_norm: bool = False       # BERT is post-norm: norm(x + f(x)); the rest x + f(norm(x))
    input_norms: bool = True     # pre-norm: each sub-layer's input is normed (OLMo 2 norms only outputs)
    output_norms: bool = False   # pre-norm: each sub-layer's output is normed before the sum (Gemma 2/3, OLMo 2)
    parallel: bool = False       # x + attn(norm1(x)) + mlp(norm2(x)) (GPT-NeoX, GPT-J, Phi, Falcon)
    shared_norm: bool = False    # parallel with one norm feeding both (GPT-J, Phi, Falcon-7B)
    activation: str = "gelu"     # gelu | gelu_tanh | silu | relu
    gated_mlp: bool = False      # act(gate) * up (SwiGLU, GeGLU)
    qkv_bias: bool = True
    out_bias: bool = True
    mlp_bias: bool = True
    qk_norm: str = "none"        # none | head (RMSNorm over each head: Qwen3, Gemma 3) | all (over every head: OLMo 2)
    attn_scale: float = 0.0      # multiplies q·kᵀ; 0: 1/√d_head (Gemma 2/3: query_pre_attn_scalar^-½; GPT-Neo: 1)
    attn_softcap: float = 0.0    # scores -> cap·tanh(scores / cap) (Gemma 2); 0: none
    final_softcap: float = 0.0   # the same on the logits
    windows: tuple = ()          # per layer: keys within this many positions (0: every key); () = none anywhere
    embed_scale: float = 1.0     # token embeddings multiplied by this (Gemma: √d_model)
    n_experts: int = 0           # a sparse mixture of MLP experts (Mixtral, Qwen3-MoE); 0: one dense MLP
    experts_per_token: int = 0
    expert_renorm: bool = True   # the chosen experts' router weights renormalised to sum to 1
    tie_embeddings: bool = False
    lm_head_bias: bool = False   # GPT-J and Phi's output layer has a bias
    type_vocab_size: int = 0     # BERT token types
    embedding_norm: bool = False  # a norm after the embeddings (BERT, BLOOM)
    final_norm: bool = True      # BERT has none after the last block
    mlm_head: bool = False       # BERT masked-LM head (transform + tied decoder)
    # encoders
    pad_position: int = -1       # RoBERTa, MPNet: tokens of this id (padding_idx) read this row of the position
                                 # table; the others count from the row after it, skipping such tokens; -1: none
    d_embed: int = 0             # the embeddings' width, projected up to d_model (ELECTRA); 0: d_model
    first_input_norm: bool = True  # pre-norm: the first block norms its attention input (ModernBERT's does not:
                                   # its embeddings are normed already)
    disentangled: tuple = ()     # position terms each layer adds to q·kᵀ from relative-position embeddings the
                                 # layers share (DeBERTa): "c2p" (query·position key), "p2c" (key·position query)
    rel_span: int = 0            # those embeddings cover relative positions -rel_span..rel_span-1
    rel_log_max: int = 0         # > 0: distances log-bucketed into the span, up to this one; 0: clamped as they are
    rel_shared_proj: bool = False  # the layer's own Q and K projections read the position embeddings
    rel_norm: bool = False       # the position embeddings are normed (LayerNorm) before use
    # vision
    image_size: int = 0
    patch_size: int = 0
    n_channels: int = 3
    layer_scale: bool = False    # DINOv2
    n_registers: int = 0
    cls_token: bool = True       # a learned CLS token before the patches (SigLIP's vision tower has none)
    distill_token: bool = False  # DeiT: a second learned token after CLS, with a position of its own
    patch_bias: bool = True      # the patch embedding's bias (CLIP's has none)
    rel_pos_bias: bool = False   # BEiT: each layer adds a learned per-head bias, by 2-D patch offset, to its scores
    # audio (wav2vec 2.0, HuBERT): raw 16 kHz samples through a stack of 1-D convolutions, then projected to d_model
    conv_layers: tuple = ()      # (channels, kernel, stride) of each convolution of the feature encoder
    conv_norm: str = "group"     # group: a GroupNorm per channel after the first convolution only; layer: a
                                 # LayerNorm over the channels after every convolution
    conv_bias: bool = False
    conv_activation: str = "gelu"  # of the convolutions and of the positional convolution
    feature_norm: bool = True    # a LayerNorm over the last convolution's channels before the projection
    pos_conv_kernel: int = 0     # positional "conv": the convolution's width in frames (an even one makes an
                                 # extra frame, dropped)
    pos_conv_groups: int = 1
    ctc_head: bool = False       # audio: a linear layer from each frame to CTC logits (Wav2Vec2ForCTC)
    head_dims: tuple[int, ...] | None = None  # per-layer query heads after pruning; None: n_heads everywhere
    kv_dims: tuple[int, ...] | None = None    # per-layer K/V heads after pruning

    def __post_init__(self):
        # a config read back from JSON (the conversion cache) has lists where tuples were
        for f in ("rope_scaling", "windows", "head_dims", "kv_dims", "disentangled", "conv_layers"):
            value = getattr(self, f)
            if isinstance(value, list):
                value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
                object.__setattr__(self, f, value)
        if not isinstance(self.family, str) or not self.family:
            raise ValueError(f"family must be a non-empty name; got {self.family!r:.40}")
        for name, value, known in (("task", self.task, TASKS), ("norm", self.norm, NORMS),
                                   ("positional", self.positional, POSITIONALS),
                                   ("qk_norm", self.qk_norm, QK_NORMS), ("conv_norm", self.conv_norm, CONV_NORMS),
                                   ("rope scaling", self.rope_kind, ROPE_KINDS)):
            if value not in known:
                raise ValueError(f"{name} must be one of {', '.join(known)}; got {value!r:.40}")
        if (self.task == "vision") != (self.patch_size > 0):
            raise ValueError("a vision config has a patch size (patch_size > 0), and only a vision config")
        if (self.task == "audio") != bool(self.conv_layers) or (self.ctc_head and self.task != "audio"):
            raise ValueError("an audio config has convolutions (conv_layers), and only an audio config; a CTC "
                             "head reads audio frames")
        if any(len(c) != 3 or min(c) < 1 for c in self.conv_layers):
            raise ValueError(f"conv_layers are (channels, kernel, stride) triples of positive numbers; "
                             f"got {self.conv_layers!r:.60}")
        if (self.positional == "conv") != (self.pos_conv_kernel > 0) or \
                (self.pos_conv_kernel and self.d_model % self.pos_conv_groups):
            raise ValueError("convolutional positions (and only they) have a kernel (pos_conv_kernel > 0), "
                             "in groups that divide d_model")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.windows and len(self.windows) != self.n_layers:
            raise ValueError(f"windows lists {len(self.windows)} layers; the model has {self.n_layers}")
        if (self.parallel or self.output_norms or not self.input_norms) and not self.pre_norm:
            raise ValueError("parallel blocks and output norms are pre-norm layouts (pre_norm=True)")
        if self.shared_norm and not self.parallel:
            raise ValueError("a shared norm feeds a parallel block's attention and MLP (parallel=True)")
        if not self.input_norms and not self.output_norms:
            raise ValueError("a block without input norms normalises its outputs (output_norms=True)")
        if self.n_experts and not 1 <= self.experts_per_token <= self.n_experts:
            raise ValueError(f"experts_per_token must lie in 1..{self.n_experts}")
        if self.d_embed < 0 or self.rel_buckets < 0 or self.pad_position < -1:
            raise ValueError("d_embed and rel_buckets must be >= 0, pad_position >= -1")
        if not set(self.disentangled) <= {"c2p", "p2c"} or (self.disentangled and self.rel_span < 1):
            raise ValueError(f"disentangled position terms are c2p and p2c, over a span of at least 1; "
                             f"got {self.disentangled!r:.40} over {self.rel_span}")
        if self.positional == "relative" and not self.rel_buckets:
            raise ValueError("relative positions need distance buckets (rel_buckets > 0)")
        if not 0 <= self.rotary_dim <= self.d_head or self.rotary_dim % 2:
            raise ValueError(f"rotary_dim must be an even number in 0..{self.d_head}; got {self.rotary_dim}")

    @property
    def is_vision(self) -> bool:
        return self.task == "vision"

    @property
    def is_audio(self) -> bool:
        return self.task == "audio"

    @property
    def hop(self) -> int:
        """Samples per frame of an audio model: the product of the convolutions' strides."""
        hop = 1
        for _, _, stride in self.conv_layers:
            hop *= stride
        return hop

    @property
    def n_positioned(self) -> int:
        """Tokens before the patches that carry a learned position (vision: CLS, DeiT's distillation token)."""
        return int(self.cls_token) + int(self.distill_token)

    @property
    def n_prefix(self) -> int:
        """Tokens before the patches (vision): CLS, the distillation token, registers."""
        return self.n_positioned + self.n_registers

    @property
    def group(self) -> int:
        """Query heads per K/V head."""
        return self.n_heads // self.n_kv_heads

    @property
    def embed_width(self) -> int:
        """Width of the token (and position, type) embeddings."""
        return self.d_embed or self.d_model

    @property
    def rope_kind(self) -> str:
        return dict(self.rope_scaling).get("rope_type", "default")

    @property
    def rope_dim(self) -> int:
        """Channels of each head that RoPE rotates."""
        return self.rotary_dim or self.d_head

    @property
    def scale(self) -> float:
        """What q·kᵀ is multiplied by before the softmax."""
        return self.attn_scale or self.d_head ** -0.5

    def window(self, layer: int) -> int:
        """Keys within this many positions of the query in `layer` (0: every key)."""
        return self.windows[layer] if self.windows else 0

    def heads_in(self, layer: int) -> int:
        return self.head_dims[layer] if self.head_dims else self.n_heads

    def kv_heads_in(self, layer: int) -> int:
        return self.kv_dims[layer] if self.kv_dims else self.n_kv_heads

    @property
    def grid(self) -> int:
        """Patches per side of the reference image (vision)."""
        return self.image_size // self.patch_size if self.patch_size else 0

    def replace(self, **changes) -> "Config":
        return replace(self, **changes)


def rope_pairs(params: dict | None) -> tuple:
    """A rope-parameters dict -> the sorted (key, value) pairs `Config.rope_scaling` holds
    (() for the default RoPE). Values are numbers, strings or None."""
    if not params or params.get("rope_type", params.get("type", "default")) == "default":
        return ()
    out = {k: v for k, v in params.items() if k not in ("type", "rope_theta")}
    out["rope_type"] = params.get("rope_type", params.get("type"))
    return tuple(sorted(out.items()))
