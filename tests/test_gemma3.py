"""The bundled Gemma 3 270M: assembled from its chunk packages and checked, then our modules on its
GGUF against transformers' own GGUF loading of the same file (logits and every attention)."""
import pytest
import torch

import attnviz
from attnviz.weights import catalogue

PROMPT = "English: Good morning.\nChinese: 早上好。\nEnglish: I love you.\nChinese:"


@pytest.fixture(scope="module")
def ours():
    return attnviz.load_model("gemma3-270m")


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoModelForCausalLM
    path = catalogue.assembled_gguf("gemma3-270m")
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def test_assembled_file_matches_its_packages_sums(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path))
    path = catalogue.assembled_gguf("gemma3-270m")
    sums = (catalogue.bundled_path_folder("gemma3-270m") / "data" / "SHA256SUMS").read_text()
    assert catalogue.digest(path) in sums and path.stat().st_size == 253_113_024
    path.write_bytes(b"tampered")            # a damaged copy is assembled again, never used
    assert catalogue.digest(catalogue.assembled_gguf("gemma3-270m")) in sums


def test_our_gemma3_matches_transformers_gguf(ours, reference):
    cfg = ours.cfg
    assert (cfg.family, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_head) == ("gemma3_text", 18, 4, 1, 256)
    assert cfg.windows.count(512) == 15 and cfg.qk_norm == "head" and cfg.local_rope_theta == 10000.0
    assert "quantization" in ours.info.source and "Gemma Terms" in ours.info.licence
    ids = ours.inputs(PROMPT)["ids"]
    tr = ours.trace(ids)
    with torch.no_grad():
        out = reference(input_ids=ids[None], output_attentions=True)
    assert (tr.logits - out.logits[0]).abs().max() < 1e-3
    assert (tr.attentions - torch.stack([a[0] for a in out.attentions])).abs().max() < 1e-4
    assert tr.tokens[-2:] == ["Chinese", ":"] or tr.tokens[-1] == ":"
