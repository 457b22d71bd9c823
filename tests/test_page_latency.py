"""The Latency page in AppTest: a tiny sweep on synthetic models draws every figure from the
results; bad input and over-budget sweeps are refused with a message and run nothing."""
import base64
import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import streamlit
import torch
from streamlit.testing.v1 import AppTest

from attnviz.base import jobs
from attnviz.latency import compare, published, quantize, results
from attnviz.figures import latency_figures
from attnviz.ui import common
from attnviz.base.limits import LIMITS

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "4_Latency.py")
TINY = "synthetic:layers=2,d=32,heads=4,ff=64,vocab=50,positions=64"
SMALL = dict(seq="8,16", variants=["fused"], heads="all", backends=["cpu", "pi4"])


def page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    assert not at.exception
    return at


def submit(at: AppTest, **fields) -> AppTest:
    at.multiselect(key="latency.models").set_value(fields.get("models", []))
    at.text_area(key="latency.synthetic").input(fields.get("synthetic", TINY))
    at.text_input(key="latency.seq").input(fields.get("seq", "8,16,32"))
    at.multiselect(key="latency.variants").set_value(fields.get("variants", ["fused", "eager"]))
    at.text_input(key="latency.heads").input(fields.get("heads", "2,4"))
    at.multiselect(key="latency.backends").set_value(fields.get("backends", ["cpu", "pi4"]))
    at.number_input(key="latency.repeats").set_value(fields.get("repeats", 1))
    at.number_input(key="latency.budget_s").set_value(fields.get("budget_s", 120))
    at.checkbox(key="latency.crossover").set_value(fields.get("crossover", False))  # on by default: its own test
    at.multiselect(key="latency.dtypes").set_value(fields.get("dtypes", ["fp32"]))
    at.button(key="FormSubmitter:latency.form-Run").click().run()
    assert not at.exception
    return at


def values(array) -> list:
    """Plotly JSON arrays arrive as lists or as base64 typed arrays."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


def figures(at: AppTest) -> dict[str, dict]:
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    return {s["layout"]["title"]["text"]: s for s in specs}


@pytest.fixture(scope="module")
def ran():
    return submit(page())


def test_page_opens_with_a_hint_and_no_results():
    at = page()
    assert any("press Run" in i.value for i in at.info)
    assert not at.get("plotly_chart") and not at.dataframe


VIEWS = ["Latency", "Split and fit", "Memory", "Tokens/s", "Comparisons", "Model error"]


def show(at: AppTest, view: str) -> AppTest:
    """Choose one results view (only the chosen one is drawn and computed)."""
    at.radio(key="latency.view").set_value(view).run()
    assert not at.exception
    return at


def test_tiny_sweep_draws_every_figure(ran):
    titles = []
    for view in VIEWS:
        titles += list(figures(show(ran, view)))
    titles = " | ".join(titles)
    for words in ("Latency of one forward pass", "log-log", "Where the time goes", "Quadratic fit",
                  "Peak memory", "Tokens per second", "Speed-ups", "Cost model error"):
        assert words in titles, words
    figs = figures(show(ran, "Latency"))
    latency = figs["Latency of one forward pass"]
    assert len(latency["data"]) == 2 * 2 * 2  # variants x heads x backends
    assert all(sorted(values(t["x"])) == [8, 16, 32] for t in latency["data"])
    split = next(s for t, s in figures(show(ran, "Split and fit")).items() if t.startswith("Where the time goes"))
    assert [t["name"] for t in split["data"]] == ["attention", "projections", "mlp", "other"]


def test_default_sweep_reaches_the_one_block_crossover_and_measures_int8():
    """The page's default times one block across its modelled crossover (marked
    in the Latency view, measured and modelled) and the chosen dtypes are measured rows."""
    at = page()
    assert at.checkbox(key="latency.crossover").value is True
    at = submit(at, **dict(SMALL, crossover=True, dtypes=["fp32", "int8"]))
    df = at.session_state["latency.results"]
    blocks = df[df["test"] == "block"]
    assert blocks["measured"].any() and (~blocks["measured"]).any()
    assert set(df[df["measured"] & df["test"].isna()]["dtype"]) == {"fp32", "int8"}
    figs = figures(show(at, "Latency"))
    title = next(t for t in figs if "ONE block" in t)
    assert "same shape" in title and any(t["name"].startswith("crossover") for t in figs[title]["data"])
    assert any("attention = rest" in c.value or "do not straddle" in c.value for c in at.caption)


def test_only_the_chosen_view_computes_and_the_choice_survives_reruns(monkeypatch):
    """No view's work runs unless it is shown; a button press or a download (a rerun)
    keeps the chosen view instead of jumping back to the first one."""
    calls = []
    for name in ("seed_claims", "host_model_error", "split_table"):
        real = getattr(compare, name)
        monkeypatch.setattr(compare, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    at = submit(page(), **SMALL)
    # the log-log view is the growth figure (slope-1 and slope-2 reference lines)
    assert calls == [] and set(figures(at)) == {"Latency of one forward pass", latency_figures.growth_figure(
        at.session_state["latency.results"]).layout.title.text}
    show(at, "Comparisons")
    assert calls == ["seed_claims"] and any(t.startswith("Speed-ups") for t in figures(at))
    at.run()  # what a download or any other widget's rerun does
    assert at.radio(key="latency.view").value == "Comparisons" and calls == ["seed_claims"] * 2
    at = submit(at, **SMALL)  # the Run button: new results, same view
    assert at.radio(key="latency.view").value == "Comparisons" and "host_model_error" not in calls
    assert any(t.startswith("Speed-ups") for t in figures(at)) and not any("Latency of" in t for t in figures(at))


def test_results_table_and_export(ran):
    table = ran.dataframe[0].value
    assert len(table) == 3 * 2 * 2 * 2 and set(table["backend"]) == {"cpu", "pi4"}
    assert list(table.columns[:3]) == ["backend", "engine", "dtype"]  # what tells two rows apart comes first
    assert any(c.value.startswith("The sweep took ") and c.value.endswith(" s of its 120 s budget.") for c in ran.caption)
    assert set(table["seq_len"]) == {8, 16, 32} and (table["median_ms"] > 0).all()
    exported = ran.session_state["latency.results"]
    assert len(results.read_results(results.to_csv(exported).encode())) == len(table)
    comparisons = show(ran, "Comparisons").dataframe[1].value
    assert {"n 32 → 16", "4 → 2 heads", "fused → eager"} <= set(comparisons["comparison"])
    assert show(ran, "Model error").metric[0].label.startswith("Largest cost-model error")


def test_split_and_fit_for_a_device_not_in_the_sweep(ran):
    show(ran, "Split and fit")
    ran.selectbox(key="latency.split_device").select("pi5").run()
    assert not ran.exception
    figs = figures(ran)
    fit_title = next(t for t in figs if t.startswith("Quadratic fit of latency"))  # + where crossovers lie
    assert "Where the time goes on pi5 (cost model)" in figs
    fit = figs[fit_title]
    assert values(fit["data"][0]["x"]) == [8, 16, 32] and "n²" in fit["data"][1]["name"]
    assert any("at most" in c.value for c in ran.caption)


@pytest.mark.parametrize("fields,words", [
    (dict(seq="0,16"), "positive"),
    (dict(seq="8,128"), "beyond"),
    (dict(synthetic="synthetic:layers=2,d=30,heads=4"), "multiple of heads"),
    (dict(heads="8"), "cannot keep 8"),
    (dict(variants=[]), "at least one attention variant"),
])
def test_bad_input_is_refused(fields, words):
    at = submit(page(), **fields)
    assert any(words in e.value for e in at.error), [e.value for e in at.error]
    assert "latency.results" not in at.session_state


def test_over_budget_sweep_is_refused_before_running():
    at = submit(page(), synthetic="synthetic:layers=12,d=768,heads=12,positions=8192", seq="4096",
                variants=["eager"], heads="all", budget_s=1, repeats=5)
    assert any("budget 1 s" in e.value for e in at.error)
    assert "latency.results" not in at.session_state and not at.get("plotly_chart")


def test_csv_import_errors_are_clear():
    """AppTest cannot upload a file: the page shows read_results' message, checked here."""
    with pytest.raises(ValueError, match="not written by `python -m attnviz.bench`"):
        results.read_results(b"step,loss\n1,0.5\n")


# ---------------------------------------------------------------- bounds, jobs, threads, uploads


def test_absurd_synthetic_shape_is_refused_before_any_work():
    at = submit(page(), synthetic="synthetic:layers=100000,d=8,heads=1", **SMALL)
    assert any("layers must be between 1 and 256" in e.value for e in at.error), [e.value for e in at.error]
    assert "latency.results" not in at.session_state


def test_sweep_leaves_the_process_thread_count_alone(monkeypatch):
    """torch.set_num_threads is process-wide: another thread count is measured in a child process."""
    def refuse(n):
        raise AssertionError(f"torch.set_num_threads({n}) called by the page")
    before = torch.get_num_threads()
    monkeypatch.setattr(torch, "set_num_threads", refuse)
    at = page()
    options = at.multiselect(key="latency.threads").options
    at.multiselect(key="latency.threads").set_value(sorted({before, 1 if before != 1 else 2} & {int(o) for o in options}))
    at = submit(at, **SMALL)
    assert not at.error, [e.value for e in at.error]
    table = at.dataframe[0].value
    assert set(table[table["measured"]]["threads"]) == set(at.session_state["latency.threads"])
    assert len(at.session_state["latency.threads"]) == 2 or (os.cpu_count() or 1) == 1
    assert torch.get_num_threads() == before


def test_a_busy_server_refuses_the_sweep_with_a_message():
    with contextlib.ExitStack() as held:
        for i in range(max(LIMITS.max_heavy_jobs, 1)):
            held.enter_context(jobs.heavy_job(f"someone else's job {i}"))
        at = submit(page(), **SMALL)
    assert any("already running" in e.value for e in at.error), [e.value for e in at.error]
    assert "latency.results" not in at.session_state
    assert jobs.running_jobs() == []


class StopsAfter(jobs.Deadline):
    """Expires after a few checks: tests the sweep's behaviour, not the clock."""
    checks = 4

    def expired(self):
        type(self).checks -= 1
        return type(self).checks < 0


def test_sweep_stops_at_its_deadline_and_shows_what_it_measured(monkeypatch):
    monkeypatch.setattr(jobs, "Deadline", StopsAfter)
    StopsAfter.checks = 4
    at = submit(page(), **dict(SMALL, seq="8,16,32"))
    assert any("stopped at its time limit" in w.value and "kept the" in w.value for w in at.warning)
    table = at.dataframe[0].value
    assert 0 < table["measured"].sum() < 3 and not at.error


def test_bad_input_after_a_run_keeps_the_results_on_screen():
    at = submit(page(), **SMALL)
    rows = len(at.dataframe[0].value)
    at = submit(at, **dict(SMALL, seq="0"))
    assert any("positive" in e.value for e in at.error)
    assert at.dataframe and len(at.dataframe[0].value) == rows and at.get("plotly_chart")


# ---------------------------------------------------------------- uploads (AppTest cannot upload: a stand-in uploader)
class Upload:
    def __init__(self, name: str, data: bytes):
        self.name, self.data, self.size = name, data, len(data)

    def getvalue(self) -> bytes:
        return self.data


EVIL = "[click](http:evil.example) **bold**.csv"


def upload_page(monkeypatch, upload: Upload) -> tuple[AppTest, list]:
    labels = []

    def uploader(label, *args, **kwargs):
        labels.append(label)
        return upload
    monkeypatch.setattr(streamlit, "file_uploader", uploader)
    streamlit.cache_data.clear()
    return page(), labels


def device_csv(model: str = "minilm", cpu: str = "Raspberry Pi 4 Model B Rev 1.4",
               times=((8, 5.0), (16, 7.0), (32, 12.0))) -> bytes:
    cfg = results.parse_synthetic(TINY)
    rows = []
    for n, ms in times:
        rows.append(dict(schema=results.SCHEMA, backend="cpu", measured=True, model=model,
                         shape=results.config_spec(cfg), variant="fused", seq_len=n, n_heads=4, threads=4,
                         median_ms=ms, p10_ms=ms * 0.9, p90_ms=ms * 1.1, peak_mem_mb=1.0, cpu=cpu, torch="2.x"))
    return results.to_csv(pd.DataFrame(rows)).encode()


def test_uploader_states_its_cap_and_refuses_bigger_files(monkeypatch):
    big = Upload("huge.csv", b"x" * (min(LIMITS.max_upload_bytes, results.MAX_CSV_BYTES) + 1))
    at, labels = upload_page(monkeypatch, big)
    assert "MB" in labels[0] and f"{results.MAX_CSV_ROWS:,} rows" in labels[0]
    assert any("Cannot use huge" in e.value and "at most" in e.value for e in at.error), [e.value for e in at.error]


def test_upload_name_and_cells_are_shown_as_typed(monkeypatch):
    at, _ = upload_page(monkeypatch, Upload(EVIL, b"step,loss\n1,0.5\n"))
    text = at.error[0].value
    assert "not written by" in text
    assert "[click](http:evil.example)" not in text and "**bold**" not in text
    assert r"\[click\]\(http\:evil\.example\) \*\*bold\*\*" in text
    evil_cpu = "=cmd|' /C calc'!A0 [x](http:evil.example)"
    at, _ = upload_page(monkeypatch, Upload("ok.csv", device_csv(model="**bold** [x](http:evil.example)",
                                                                 cpu=evil_cpu)))
    assert not at.exception and not at.error
    assert "](http" not in at.selectbox(key="latency.import_profile").help
    legend = [t["name"] for f in figures(at).values() for t in f["data"] if "name" in t]
    assert any("**bold**" in name for name in legend)  # plain text in plotly (markdown is not drawn there)


def test_import_is_checked_and_modelled_once_per_file(monkeypatch):
    calls, modelled = [], []
    real, real_error = results.read_results, compare.model_error
    monkeypatch.setattr(results, "read_results", lambda data: calls.append(1) or real(data))
    monkeypatch.setattr(compare, "model_error", lambda *a: modelled.append(1) or real_error(*a))
    at, _ = upload_page(monkeypatch, Upload("pi.csv", device_csv()))
    assert not at.exception and at.metric and len(calls) == 1 and len(modelled) == 1
    at.run()
    assert len(calls) == 1 and len(modelled) == 1  # a rerun re-checks and re-models nothing
    at.selectbox(key="latency.import_profile").select("pi5").run()
    assert not at.exception and len(calls) == 1 and len(modelled) == 2
    assert "pi5" in at.metric[-1].label


# ---------------------------------------------------------------- a CSV with a model name per row
def model_per_row_csv(rows: int = 2000) -> bytes:
    """A hostile file: one distinct model name per row (2,000 rows)."""
    lines = ["backend,measured,model,shape,variant,seq_len,n_heads,threads,median_ms,p10_ms,p90_ms,peak_mem_mb,"
             "cpu,torch"]
    for i in range(rows):
        n = 8 << (i % 4)
        lines.append(f'cpu,true,m{i},"{TINY}",fused,{n},4,4,{1 + n / 10:.2f},{1 + n / 11:.2f},{1 + n / 9:.2f},'
                     "1.0,Raspberry Pi 4,2.x")
    return ("\n".join(lines) + "\n").encode()


def test_a_model_per_row_draws_a_bounded_number_of_series_modelled_once(monkeypatch):
    from attnviz.figures import latency_figures
    modelled, drawn = [], []
    real_like, real_overlay = compare.modelled_like, latency_figures.overlay_figure
    monkeypatch.setattr(compare, "modelled_like", lambda *a, **k: modelled.append(1) or real_like(*a, **k))
    monkeypatch.setattr(latency_figures, "overlay_figure", lambda *a, **k: drawn.append(1) or real_overlay(*a, **k))
    at, _ = upload_page(monkeypatch, Upload("many.csv", model_per_row_csv()))
    assert not at.exception and not at.error, [e.value for e in at.error]
    overlay = next(f for t, f in figures(at).items() if t.startswith("Measured on the device"))
    assert len(overlay["data"]) == 2 * (latency_figures.MAX_SERIES + 1)   # 12 series each, and one grey trace of the rest
    names = [t["name"] for t in overlay["data"]]
    assert "1,988 more series measured" in names and "1,988 more series modelled" in names
    measured_points = sum(int(np.isfinite(np.array(values(t["y"]), dtype=float)).sum())
                          for t in overlay["data"] if t["name"].endswith("measured"))
    assert measured_points == 2000                             # every point is still drawn
    assert f"{latency_figures.MAX_SERIES} of 2,000 series drawn" in overlay["layout"]["title"]["text"]
    assert any("2,000 series in this file" in c.value for c in at.caption)
    assert len(at.dataframe[0].value) == 2000                  # the table lists every point
    assert modelled == [1] and drawn == [1]
    at.run()
    at.checkbox(key="latency.recalibrate").check().run()
    at.checkbox(key="latency.recalibrate").uncheck().run()
    assert not at.exception and modelled == [1, 1] and drawn == [1, 1]  # once per file and profile, not per rerun


def test_a_csv_import_holds_a_heavy_job_slot():
    """Checking and modelling a file is heavy work: on a busy server it is refused with a message."""
    data = model_per_row_csv(40)
    with contextlib.ExitStack() as held:
        for i in range(max(LIMITS.max_heavy_jobs, 1)):
            held.enter_context(jobs.heavy_job(f"someone else's job {i}"))
        mp = pytest.MonkeyPatch()
        try:
            at, _ = upload_page(mp, Upload("pi.csv", data))
        finally:
            mp.undo()
    assert any("Cannot import pi" in e.value and "busy" in e.value for e in at.error), [e.value for e in at.error]
    assert not at.get("plotly_chart") and jobs.running_jobs() == []


# ---------------------------------------------------------------- absurd numbers
@pytest.mark.parametrize("ms", [1e308, 1e-308])
def test_absurd_times_in_a_csv_are_refused_and_no_profile_is_kept(monkeypatch, ms):
    at, _ = upload_page(monkeypatch, Upload("pi.csv", device_csv(times=((8, ms), (16, ms), (32, ms)))))
    assert any("Cannot use pi" in e.value and "median\\_ms" in e.value for e in at.error), [e.value for e in at.error]
    assert not at.session_state["latency.profiles"] and not at.get("plotly_chart")


def test_a_fit_beyond_any_device_is_refused_and_the_profile_not_kept(monkeypatch):
    """Times a million times the pi4 profile's (seconds typed as microseconds): the fit is refused
    with a message, the page compares with the published profile, and later sweeps do too."""
    slow = device_csv(times=((8, 5e6), (16, 7e6), (32, 12e6)))
    at, _ = upload_page(monkeypatch, Upload("pi.csv", slow))
    assert not at.error, [e.value for e in at.error]
    at.checkbox(key="latency.recalibrate").check().run()
    assert any("beyond any real device" in e.value for e in at.error), [e.value for e in at.error]
    assert "pi4" not in at.session_state["latency.profiles"] and not at.exception
    assert "pi4" in at.metric[-1].label and "recalibrated" not in at.metric[-1].label


def test_edge_views_heads_table_and_quantization(monkeypatch):
    """The 4-vs-8-heads table; the quantization tables (measured behind a button)."""

    from attnviz.latency import int8_story
    fake = (pd.DataFrame([dict(model="minilm", mode="int8", latency_ratio=0.7)]),
            pd.DataFrame([dict(variant="softmax", flushed_share=0.2, mass_lost=0.003, l1_per_row=0.02),
                          dict(variant="relu", flushed_share=0.03, mass_lost=0.0004, l1_per_row=0.01)]))
    checks = []
    streamlit.cache_data.clear()   # the tables are cached per server
    monkeypatch.setattr(quantize, "probabilities_int8", lambda m: fake[1])
    monkeypatch.setattr(int8_story, "int8_table", lambda keys, **k: checks.append(k.get("check")) or pd.DataFrame(
        [{"model": "minilm", "this CPU int8 speed-up (measured)": "1.43×", "int8 fidelity": ""}]))
    at = page()
    at.button(key="latency.heads_tradeoff").click().run()
    heads = next(d.value for d in at.dataframe if "n_heads" in d.value.columns)
    assert set(heads["n_heads"]) == {4, 8} and "pi5 torch fp32 ms" in heads.columns
    assert "None" not in heads.astype(str).to_numpy().ravel().tolist()      # the shapes' accuracy is blank
    said = next(i.value for i in at.info if "8 heads of 48 instead of 4 of 96" in i.value)
    assert "on a Pi 4 with torch fp32" in said and "modelled ±25%" in said
    at.button(key="latency.quantize").click().run()
    assert not at.exception
    assert len(checks) == 1 and callable(checks[0])  # started with its session's cancel, as the int8 scan
    assert any("relu survives better" in c.value for c in at.caption)


def test_int8_sensitivity_is_computed_on_request_and_names_the_layer_to_keep(monkeypatch):
    """The int8 sensitivity scan runs behind a button and says which kind of layer to leave float32."""
    fake = pd.DataFrame([dict(float32_kept="none", float32_weight_share=0.0, **{"KL (nats/token)": 1.8}),
                         dict(float32_kept="fc_out", float32_weight_share=0.3, **{"KL (nats/token)": 0.45}),
                         dict(float32_kept="qkv", float32_weight_share=0.2, **{"KL (nats/token)": 1.5})])
    calls = []
    monkeypatch.setattr(quantize, "sensitivity", lambda model, mode="int8", check=None: calls.append(check) or fake)
    at = page()
    assert not calls and not any("float32_kept" in d.value.columns for d in at.dataframe)
    at.button(key="latency.sensitivity_run").click().run()
    assert not at.exception and len(calls) == 1 and callable(calls[0])  # the session's cancel is checked
    assert any("float32_kept" in d.value.columns for d in at.dataframe)
    assert any("`fc_out` float32" in c.value and "0.45" in c.value for c in at.caption)


def test_published_runs_are_shown_on_request_with_their_error():
    """The page shows every published Pi run with the model's prediction (hidden until asked)."""
    at = page()
    assert not any("published" in d.value.columns for d in at.dataframe)
    at.toggle(key="latency.published_show").set_value(True).run()
    assert not at.exception
    runs = next(d.value for d in at.dataframe if "error_pct" in d.value.columns)
    assert len(runs) == len(published.RUNS) and (runs["error_pct"].abs() <= 25).all()
    assert {"torch", "ncnn", "ggml"} <= set(runs["engine"]) and "ms per GFLOP (marginal)" in set(runs["unit"])
    assert any("no bf16" in c.value for c in at.caption)
    assert any("published Pi runs" in c.proto.spec for c in at.get("plotly_chart"))


def test_memory_view_draws_one_line_for_devices_whose_memory_is_the_same():
    """The memory model does not depend on the device: pi4 lay exactly under pi5."""
    at = show(submit(page(), **dict(SMALL, backends=["cpu", "pi4", "pi5"])), "Memory")
    memory = next(f for t, f in figures(at).items() if t.startswith("Peak memory"))
    names = [t["name"] for t in memory["data"]]
    assert len(names) == 2 and names[0].endswith("cpu · measured") and "pi4 = pi5" in names[1]
    assert names[1].endswith("modelled")
    assert "memory does not depend on the device" in memory["layout"]["title"]["text"]
    assert any(c.value.startswith("pi4 = pi5: the memory model does not depend on the device") for c in at.caption)
    latency = figures(show(at, "Latency"))["Latency of one forward pass"]
    assert len(latency["data"]) == 3 and all(t["name"].endswith(("measured", "modelled")) for t in latency["data"])


# ---------------------------------------------------------------- the sidebar's page links
HOME = str(Path(PAGE).parents[1] / "app.py")
NAV = ["Home", "Attention", "Heads", "Images", "Latency", "Lab", "Translate", "Speech", "Readouts"]


def test_sidebar_links_start_with_home_on_home_and_on_a_page_without_a_model_picker():
    """Streamlit's own list named the home page "app" (after app.py); ours says Home, then every page."""
    assert "showSidebarNavigation = false" in (Path(PAGE).parents[1] / ".streamlit" / "config.toml").read_text()
    at = AppTest.from_file(HOME, default_timeout=180).run()
    assert not at.exception
    links = at.sidebar.get("page_link")
    assert [link.value for link in links] == NAV
    assert links[0].proto.page == "" and [link.proto.page for link in links[1:]] == NAV[1:]
    at.switch_page("pages/4_Latency.py").run()   # the Latency page has no model picker: it draws them itself
    assert not at.exception and [link.value for link in at.sidebar.get("page_link")] == NAV


def test_int8_is_one_table_per_model_with_the_pi_modelled_and_this_cpu_measured(monkeypatch):
    """Before: the modelled Pi int8 rows and the copies measured here sat apart, unexplained, with
    "None" in empty cells, and every bundled model was quantized at once."""
    from attnviz.latency import int8_story
    from tests.tiny import LLAMA
    from attnviz.weights.catalogue import random_model
    loaded = []
    streamlit.cache_data.clear()   # the tables are cached per server
    monkeypatch.setattr(common, "shared_model", lambda key: loaded.append(key) or random_model(LLAMA, seed=1))
    monkeypatch.setattr(quantize, "probabilities_int8", lambda m: pd.DataFrame(
        [dict(variant="softmax", l1_per_row=0.02), dict(variant="relu", l1_per_row=0.01)]))
    at = page()
    assert not loaded and any("Computed only when you press the button" in c.value for c in at.caption)
    at.button(key="latency.quantize").click().run()
    assert not at.exception and loaded.count("minilm") >= 1 and "smollm2" not in loaded   # only those asked for
    table = next(d.value for d in at.dataframe if "int8 fidelity" in d.value.columns)
    cells = table.astype(str).to_numpy().ravel().tolist()
    assert "None" not in cells and "nan" not in cells
    assert {"Pi 4 int8 speed-up (modelled)", "Pi 4 band (±25%)", "this CPU int8 speed-up (measured)"} <= set(table.columns)
    said = next(i.value for i in at.info if i.value.startswith("minilm, int8:"))
    assert "on a Pi 4 (modelled, ±25%" in said and "on this CPU (measured)" in said and "it keeps" in said
    assert any(c.value.startswith(int8_story.why(table)[:30]) for c in at.caption)
    assert int8_story.why(pd.DataFrame({"this CPU int8 speed-up (measured)": ["0.51×"]})).startswith("Why x86 and ARM")
    assert int8_story.why(pd.DataFrame({"this CPU int8 speed-up (measured)": ["1.40×"]})).startswith("Here int8")
    # a kind the Pi cost model does not price here: its Pi cells are blank, its sentence says what was measured
    row = {"model": "en-pt", "Pi 4 int8 speed-up (modelled)": "", "this CPU int8 speed-up (measured)": "0.50×",
           "int8 fidelity": "translations identical 3/3"}
    assert int8_story.int8_sentence(row) == ("en-pt, int8: 2.00× slower on this CPU (measured); it keeps "
                                             "translations identical 3/3.")


def test_the_sweep_answers_in_a_sentence_with_its_bands(ran):
    """Before: the answer had to be read off the table and the charts."""
    said = next(i.value for i in ran.info if i.value.startswith("One forward pass of"))
    assert "over 32 tokens takes" in said and "p10–p90" in said                   # measured, with its spread
    assert "on a Pi 4 (modelled, ±25%" in said                                     # modelled, with its band
    assert "Doubling the text from 16 to 32 tokens multiplies the time by" in said


def test_a_one_length_sweep_draws_bars_and_the_table_says_what_memory_counts():
    at = show(submit(page(), seq="16", variants=["fused"], heads="all"), "Latency")
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert {t["type"] for t in specs[0]["data"]} == {"bar"} and len(specs) == 1     # no log-log of one point
    assert any("One sequence length" in c.value for c in at.caption)
    table = next(d for d in at.dataframe if "median_ms" in d.value.columns)
    config = json.loads(table.proto.column_config or "{}") if hasattr(table.proto, "column_config") else {}
    assert "activations" in json.dumps(config) or "activations" in str(table.proto)
