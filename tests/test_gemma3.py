"""The bundled Gemma 3 270M: assembled from its chunk packages and checked, then our modules on its
GGUF against transformers' own GGUF loading of the same file (logits and every attention)."""
import pytest
import torch

import attnviz
from attnviz.analysis import corpus, corpus_engine, corpus_metrics, corpus_runs
from attnviz.analysis.pruning import decode_mask
from attnviz.weights import catalogue

PROMPT = "English: Good morning.\nChinese: 早上好。\nEnglish: I love you.\nChinese:"


@pytest.fixture(scope="module")
def ours():
    # the process's one copy, the one a corpus run in this process uses too
    return corpus_engine.worker_model("gemma3-270m")


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


def test_the_pruning_curve_runs_over_the_chinese_django_messages(ours, monkeypatch):
    """The Heads page's Corpus tool asks "prune 30 % of heads" in Chinese: Gemma's pruning curve over
    the bundled django-zh sentences (the three shortest, two steps, one random order: small on purpose)."""
    monkeypatch.delenv(corpus_engine.SCHEDULER_ENV, raising=False)
    zh = corpus.open_corpus("django-zh")
    shortest = sorted(zh.items, key=len)[:3]
    small = corpus.Corpus(zh.key, zh.kind, shortest, None, [], zh.source, zh.licence)
    got = corpus_runs.run("gemma3-270m", small, "pruning_curve", fractions=(0.0, 0.5), random_orders=1, per_task=3)
    assert got.complete and (got.kind, got.corpus_key) == ("pruning_curve", "django-zh")
    L, H = int(ours.mask_layers), int(ours.cfg.n_heads)
    steps = got.extra["steps"]
    assert {(s["order"], s["fraction"]) for s in steps} == {(o, f) for o in ("importance", "random 1") for f in (0.0, 0.5)}
    summary = got.summary.set_index(["order", "fraction", "metric"])
    for order in ("importance", "random 1"):
        assert summary.loc[(order, 0.0, "top1"), "value"] == 1.0            # the full model agrees with itself
        assert summary.loc[(order, 0.0, "kl"), "value"] == pytest.approx(0.0, abs=1e-6)
        kept = [summary.loc[(order, f, "top1"), "heads_kept"] for f in (0.0, 0.5)]
        assert kept == [L * H, L * H // 2]                                  # half the 72 heads removed
        assert summary.loc[(order, 0.5, "kl"), "value"] > 0 and summary.loc[(order, 0.5, "top1"), "n"] == 3
    # one point of the curve, per text, is what the model gives for that mask alone
    point = next(s for s in steps if s["order"] == "importance" and s["fraction"] == 0.5)
    mask = decode_mask(point["code"], L, H).float()
    for index, text in enumerate(shortest):
        want = corpus_metrics.compare("lm", corpus_metrics.output(ours, text),
                                      corpus_metrics.output(ours, text, head_mask=mask))
        row = got.table[(got.table["item"] == index) & (got.table["order"] == "importance")
                        & (got.table["fraction"] == 0.5)].iloc[0]
        for metric in ("top1", "kl", "nll_pruned"):
            assert row[metric] == pytest.approx(want[metric], abs=1e-4), (index, metric)
