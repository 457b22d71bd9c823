"""The shape of one model: everything the modules need to know, and nothing about weights."""
from __future__ import annotations

from dataclasses import dataclass, replace

# Core knows structure, not families: a family file (attnviz.weights.families) sets these fields,
# and `family` is only the label it signs the config with.
TASKS = ("encoder", "lm", "vision")
NORMS = ("layernorm", "rmsnorm")
POSITIONALS = ("learned", "rotary", "sinusoidal", "none")


@dataclass(frozen=True)
class Config:
    family: str                  # the family that built it (a label: nothing branches on it)
    task: str                    # encoder | lm (an LM head) | vision (a patch embedding)
    n_layers: int
    n_heads: int                 # query heads
    n_kv_heads: int              # key/value heads (< n_heads: grouped-query attention)
    d_model: int
    d_head: int
    d_ff: int                    # hidden width of the MLP
    vocab_size: int = 0          # 0 for vision models
    max_positions: int = 512     # text: positions; vision: tokens of the reference grid
    norm: str = "layernorm"      # layernorm | rmsnorm
    norm_eps: float = 1e-12
    positional: str = "learned"  # learned | rotary | sinusoidal | none
    rope_theta: float = 10000.0
    causal: bool = False
    pre_norm: bool = False       # BERT is post-norm; GPT-2, Llama, ViT, DINOv2 are pre-norm
    activation: str = "gelu"     # gelu | gelu_tanh | silu | relu
    gated_mlp: bool = False      # SwiGLU (Llama)
    qkv_bias: bool = True
    out_bias: bool = True
    mlp_bias: bool = True
    tie_embeddings: bool = False
    type_vocab_size: int = 0     # BERT token types
    embedding_norm: bool = False  # a norm after the embeddings (BERT)
    final_norm: bool = True      # BERT has none after the last block
    mlm_head: bool = False       # BERT masked-LM head (transform + tied decoder)
    # vision
    image_size: int = 0
    patch_size: int = 0
    n_channels: int = 3
    layer_scale: bool = False    # DINOv2
    n_registers: int = 0
    head_dims: tuple[int, ...] | None = None  # per-layer query heads after pruning; None: n_heads everywhere
    kv_dims: tuple[int, ...] | None = None    # per-layer K/V heads after pruning

    def __post_init__(self):
        if not isinstance(self.family, str) or not self.family:
            raise ValueError(f"family must be a non-empty name; got {self.family!r:.40}")
        for name, value, known in (("task", self.task, TASKS), ("norm", self.norm, NORMS),
                                   ("positional", self.positional, POSITIONALS)):
            if value not in known:
                raise ValueError(f"{name} must be one of {', '.join(known)}; got {value!r:.40}")
        if (self.task == "vision") != (self.patch_size > 0):
            raise ValueError("a vision config has a patch size (patch_size > 0), and only a vision config")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")

    @property
    def is_vision(self) -> bool:
        return self.task == "vision"

    @property
    def group(self) -> int:
        """Query heads per K/V head."""
        return self.n_heads // self.n_kv_heads

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
