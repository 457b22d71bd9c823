"""Tiny random-model configs shared by the library tests (a Llama with GQA and a BERT)."""
from attnviz.core.config import Config

LLAMA = Config(family="llama", task="lm", n_layers=3, n_heads=4, n_kv_heads=2, d_model=32, d_head=8, d_ff=64,
               vocab_size=50, max_positions=256, norm="rmsnorm", norm_eps=1e-6,
               positional="rotary", causal=True, pre_norm=True, activation="silu", gated_mlp=True,
               qkv_bias=False, out_bias=False, mlp_bias=False)
BERT = Config(family="bert", task="encoder", n_layers=2, n_heads=4, n_kv_heads=4, d_model=32, d_head=8, d_ff=64,
              vocab_size=50, max_positions=256, type_vocab_size=2, embedding_norm=True,
              final_norm=False)
