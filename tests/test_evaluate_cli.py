"""`python -m attnviz.evaluate`: options documented, progress per item, the summary, CSVs, resume,
and bad input as one line with exit status 2."""
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from attnviz import evaluate

ROOT = Path(__file__).resolve().parents[1]


def test_help_documents_corpus_model_metric_kind_scheduler_and_resume():
    out = subprocess.run([sys.executable, "-m", "attnviz.evaluate", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for flag in ("--model", "--kind", "--column", "--label-column", "--metric", "--mask", "--scheduler", "--reference",
                 "ATTNVIZ_SCHEDULER", "--resume", "--out", "--seed", "--max-rows", "--max-tokens-per-row",
                 "importance", "pruning_curve", "heads_4_vs_8", "tcp://host:8786", "local"):
        assert flag in text, flag


def test_mask_run_prints_progress_and_summary_and_writes_csvs(tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("The cat sat on the mat.\nStock markets fell sharply today.\nI love you very much.\n")
    out = tmp_path / "table.csv"
    code = evaluate.main([str(texts), "--model", "minilm", "--kind", "mask", "--mask", "6x12-" + "f" * 17 + "0",
                          "--out", str(out)])
    got = capsys.readouterr()
    assert code == 0, got.err
    items = [x for x in got.err.splitlines() if x.startswith("item ")]
    assert [x.split(" · ")[0] for x in items] == ["item 1/3", "item 2/3", "item 3/3"]
    assert "s left" in items[-1] and got.err.startswith("estimate: ")   # priced first, then as it runs
    assert "cosine" in got.out and "ci_low" in got.out
    table = pd.read_csv(out)
    assert list(table["item"]) == [0, 1, 2] and (table["heads_kept"] == 68).all()
    summary = pd.read_csv(out.with_suffix(".summary.csv"))
    assert {"metric", "value", "ci_low", "ci_high", "n"} <= set(summary.columns)
    assert out.read_bytes().count(b"\r\n") == 4      # RFC 4180 rows


def test_resume_skips_finished_items(tmp_path, capsys):
    texts = tmp_path / "t.txt"
    texts.write_text("The cat sat on the mat.\nI love you very much.\n")
    resume = tmp_path / "run.jsonl"
    args = [str(texts), "--kind", "importance", "--resume", str(resume)]
    assert evaluate.main(args) == 0
    first = capsys.readouterr().out
    assert evaluate.main(args) == 0
    again = capsys.readouterr()
    assert "item" not in again.err and again.out == first     # nothing rerun, the same figures


def test_heads_4_vs_8_joins_the_pi_latency(capsys, tmp_path):
    texts = tmp_path / "t.txt"
    texts.write_text("The cat sat on the mat.\nI love you very much.\n")
    result = evaluate.run("minilm", evaluate.open_corpus(str(texts)), "heads_4_vs_8")
    lat = result.extra["latency"]
    assert list(lat["device"]) == ["pi4", "pi5"] and (lat["kept_ms"] < lat["full_ms"]).all()
    assert (lat["heads"] == 36).all()
    assert {"pi4 full ms", "pi4 kept ms", "pi5 full ms", "pi5 kept ms"} <= set(result.summary.columns)


@pytest.mark.parametrize("argv, message", [
    (["no-such-corpus"], "neither a bundled corpus"),
    (["alice-sentences", "--kind", "mask"], "needs a head mask"),
    (["alice-sentences", "--kind", "mask", "--mask", "2x2-f"], "2 layers x 2 heads"),
    (["alice-sentences", "--scheduler", "carrier-pigeon"], "scheduler"),
    ([], "name a corpus"),
])
def test_bad_input_is_one_line_and_status_2(argv, message, capsys):
    assert evaluate.main(argv + ["--max-rows", "3"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("note: ")]  # notes: what was cut
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_a_translators_kept_cross_heads_are_priced_on_both_pis():
    """Fewer cross-attention heads cost less on both Pis; all heads kept costs what the full model does."""
    from attnviz.core.seq2seq import Seq2SeqConfig
    from attnviz.latency import tradeoff
    cfg = Seq2SeqConfig(family="marian", vocab_size=1000, d_model=64, n_heads=8, d_ff=128, n_enc_layers=2, n_dec_layers=2)
    full = tradeoff.kept_heads_latency(cfg, [[True] * 8] * 2, 32)
    half = tradeoff.kept_heads_latency(cfg, [[True] * 4 + [False] * 4] * 2, 32)
    assert list(full.device) == ["pi4", "pi5"] and (full.speedup == 1).all()
    assert (half.kept_ms < half.full_ms).all() and (half.full_ms == full.full_ms).all()
    assert list(half.heads) == [8, 8]
    with pytest.raises(ValueError, match="decoder layers"):
        tradeoff.kept_heads_latency(cfg, [[True] * 8] * 3, 32)
