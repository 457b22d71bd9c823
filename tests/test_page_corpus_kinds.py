"""The one Corpus tool on Translate, Speech and Images (AppTest, bundled models): each page reaches
it with its own bundled corpus, runs a small mask run under the mask of its own head editor to
completion and shows the summary table; a stopped run shows its summary over the items done."""
import dataclasses
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest

from attnviz.analysis.pruning import decode_mask

PAGES = Path(__file__).resolve().parents[1] / "pages"


@pytest.fixture(autouse=True)
def results_dir(monkeypatch, tmp_path):
    from attnviz.ui import heads_corpus
    monkeypatch.delenv("ATTNVIZ_SCHEDULER", raising=False)
    monkeypatch.setenv("ATTNVIZ_PRIVATE_DIR", str(tmp_path / "private"))
    folder = tmp_path / "private" / "corpus-runs"    # what the tool makes on its first Run
    folder.mkdir(parents=True, mode=0o700)
    (tmp_path / "private").chmod(0o700)
    return folder


def summary_of(at) -> pd.DataFrame:
    frames = [d.value for d in at.dataframe if "metric" in d.value.columns and "ci_low" in d.value.columns]
    assert len(frames) == 1, [e.value for e in at.error]
    return frames[0].set_index("metric")


def run_mask(at, page: str, n: int) -> AppTest:
    at.selectbox(key=f"{page}.corpus_kind").set_value("mask").run()
    at.selectbox(key=f"{page}.corpus_n").set_value(n).run()
    assert not at.exception, at.exception
    at.button(key=f"{page}.corpus_go").click().run()
    assert not at.exception, at.exception
    return at


def test_translate_page_scores_its_editors_mask_against_full_and_native(results_dir):
    at = AppTest.from_file(str(PAGES / "6_Translate.py"), default_timeout=300).run()
    at.radio(key="translate.view").set_value("Switch heads off").run()
    at.checkbox(key="translate.layer:en-pt:2x8:1").uncheck().run()      # the page's own editor
    at.button(key="translate.apply").click().run()
    assert not at.exception, at.exception
    at.radio(key="translate.view").set_value("Corpus run").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="translate.corpus_pick").value == "gtk-en"
    at.selectbox(key="translate.corpus_reference").set_value("both").run()
    t = summary_of(run_mask(at, "translate", 5))
    assert {"chrf", "exact_match", "corpus_chrf", "chrf_native", "exact_match_native"} <= set(t.index)
    assert (t["n"] == 5).all() and (t["heads_kept"] == 8).all()       # layer 1's eight heads off
    assert t.loc["chrf", "value"] < 1.0 and t.loc["chrf", "value"] == t.loc["chrf_native", "value"]
    result = at.session_state["translate.corpus:en-pt"][0]
    assert result.complete and result.done == result.total == 5 and len(result.table) == 5
    assert "Per-text CSV" in [b.label for b in at.get("download_button")]
    assert not list(results_dir.iterdir())                            # complete: no results file left


def test_speech_page_runs_the_tool_on_the_librivox_clips():
    at = AppTest.from_file(str(PAGES / "7_Speech.py"), default_timeout=600)
    mask = "4x6-fff000"                              # the editor's state: half the decoder's heads off
    at.session_state["speech.applied:whisper-tiny-en:4x6"] = mask
    at.run()
    at.radio(key="speech.view").set_value("Corpus run").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="speech.corpus_pick").value == "librivox-austen"
    assert at.selectbox(key="speech.corpus_reference").disabled           # only translators have a native engine
    t = summary_of(run_mask(at, "speech", 5))
    assert set(t.index) == {"word_accuracy", "wer"} and (t["n"] == 5).all() and (t["heads_kept"] == 12).all()
    assert int(decode_mask(mask, 4, 6).sum()) == 12
    assert t.loc["wer", "value"] == pytest.approx(1 - t.loc["word_accuracy", "value"])
    result = at.session_state["speech.corpus:whisper-tiny-en"][0]
    assert result.complete and len(result.table) == 5
    assert "Per-clip CSV" in [b.label for b in at.get("download_button")]
    clips = sorted((Path(__file__).resolve().parents[1] / "attnviz" / "data" / "corpora" / "librivox").glob("*.wav"))
    at.selectbox(key="speech.corpus_pick").set_value("upload clips (.wav, .flac)").run()
    at.file_uploader(key="speech.corpus_files").set_value(
        [(p.name, p.read_bytes(), "audio/wav") for p in clips[:2]] + [("noise.wav", b"RIFF" + bytes(40), "audio/wav")]).run()
    assert not at.exception, at.exception
    assert any("noise" in e.value and "not audio" in e.value and "unchanged" in e.value for e in at.error)   # a bad file: named, nothing run
    at.file_uploader(key="speech.corpus_files").set_value([(p.name, p.read_bytes(), "audio/wav") for p in clips[:2]]).run()
    assert "2 clips" in " ".join(c.value for c in at.caption)
    at.button(key="speech.corpus_go").click().run()
    assert not at.exception, at.exception
    assert (summary_of(at)["n"] == 2).all()


def png(colour) -> bytes:
    buffer = io.BytesIO()
    pixels = np.zeros((64, 96, 3), np.uint8)
    pixels[:, 48:] = colour
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def test_images_page_runs_the_tool_on_photos_bundled_and_uploaded():
    at = AppTest.from_file(str(PAGES / "3_Images.py"), default_timeout=600)
    mask = "12x6-" + "f" * 17 + "0"                 # the last layer's heads off
    at.session_state["images.applied:dinov2:12x6"] = mask
    at.run()
    assert not at.exception, at.exception
    assert at.selectbox(key="images.corpus_pick").value == "skimage-photos"
    t = summary_of(run_mask(at, "images", 5))
    assert set(t.index) == {"cls_cosine", "saliency_iou"} and (t["n"] == 5).all()
    assert (t["heads_kept"] == int(decode_mask(mask, 12, 6).sum())).all() and t.loc["cls_cosine", "value"] < 1.0
    at.selectbox(key="images.corpus_pick").set_value("upload photos (.png, .jpg, …)").run()
    at.file_uploader(key="images.corpus_files").set_value(
        [("a.png", png((250, 0, 0)), "image/png"), ("b.png", png((0, 0, 250)), "image/png")]).run()
    assert not at.exception, at.exception
    assert "2 photos" in " ".join(c.value for c in at.caption)
    at.button(key="images.corpus_go").click().run()
    assert not at.exception, at.exception
    assert (summary_of(at)["n"] == 2).all()


def test_a_stopped_run_shows_its_summary_over_the_items_done(monkeypatch, results_dir, deadline_after_checks):
    deadline_after_checks(1)      # the first of two batches (3 and 2 messages) runs, then the budget is spent
    at = AppTest.from_file(str(PAGES / "6_Translate.py"), default_timeout=300).run()
    at.radio(key="translate.view").set_value("Corpus run").run()
    t = summary_of(run_mask(at, "translate", 5))
    result = at.session_state["translate.corpus:en-pt"][0]
    assert not result.complete and result.done == 3 and (t["n"] == 3).all()
    assert t.loc["chrf", "value"] == 1.0                 # every head on: the full model's own output
    assert any("after 3 of 5 steps" in w.value for w in at.warning)
    assert len(list(results_dir.iterdir())) == 1          # kept for resume


def test_a_run_interrupted_by_cancel_shows_its_running_summary():
    """What a Cancel click leaves (run_tracked's state: the last progress report, still marked
    running) is shown as the running summary over the texts done, with the cancelled note."""
    import torch

    from attnviz.analysis import corpus, corpus_runs
    sentences = corpus.open_corpus("alice-sentences")
    first = dataclasses.replace(sentences, items=sentences.items[:5])
    reports = []
    keep = torch.ones(6, 12)
    keep[0] = 0
    corpus_runs.run("minilm", first, "mask", mask=keep, progress=lambda d, t, p: reports.append(p),
                    should_stop=lambda: len(reports) >= 2, per_task=1)
    at = AppTest.from_file(str(PAGES / "2_Heads.py"), default_timeout=300)
    at.session_state["heads.corpus:minilm"] = (reports[-1], 300)
    at.session_state["heads.corpus:minilm:running"] = True
    at.session_state["heads.corpus:minilm:options"] = ("mask", "cosine")
    at.run()
    at.button_group(key="heads.tool").set_value("Corpus").run()
    assert not at.exception, at.exception
    assert any("was cancelled after 2 of 5 steps" in w.value for w in at.warning)
    assert any("Summary so far, over the 2 texts done" in c.value for c in at.caption)
    t = summary_of(at)
    assert list(t.index) == ["cosine"] and t.loc["cosine", "n"] == 2
    assert t.loc["cosine", "ci_low"] < t.loc["cosine", "value"] < t.loc["cosine", "ci_high"]
