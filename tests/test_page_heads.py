"""Heads page (AppTest, MiniLM and SmolLM2): toggles, per-session masks, links, pruning, bad input."""
import base64
import dataclasses
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from streamlit.testing.v1 import AppTest

from attnviz.analysis import importance
from attnviz.base import jobs
from attnviz.base import limits
from attnviz.analysis import pruning
from attnviz.ui import common

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "2_Heads.py")


def app(**query) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=300)
    for k, v in query.items():
        at.query_params[k] = v
    return at.run()


SHAPES = {"minilm": "6x12", "smollm2": "30x9"}


def row_key(key, i):
    """The head editor's row of layer i (the heads that are on), for this model."""
    return f"heads.row:{key}:{SHAPES[key]}:{i}"


def layer_box(key, i):
    return f"heads.layer:{key}:{SHAPES[key]}:{i}"


def mask_of(at, key="minilm", L=6, H=12) -> torch.Tensor:
    keep = torch.zeros(L, H, dtype=torch.bool)
    for i in range(L):
        keep[i, list(at.session_state[row_key(key, i)])] = True
    return keep


def tool(at, name):
    """Choose the tool below the mask (one runs at a time)."""
    at.button_group(key="heads.tool").set_value(name).run()
    assert not at.exception
    return at


def switch(at, *heads, key="minilm"):
    """Click heads (layer, head) in the mask's rows; nothing happens until Apply."""
    for i, h in heads:
        row = at.button_group(key=row_key(key, i))
        row.unselect(h) if h in row.value else row.select(h)
    return at


def apply(at):
    """Apply the pending edits (a run first draws the grid they make, which enables Apply)."""
    at.run()
    return at.button(key="heads.apply").click().run()


def metric(at, label_start):
    return next(m for m in at.metric if m.label.startswith(label_start))


def chart(at, key):
    """The plotly figure JSON of the chart drawn with this key."""
    return json.loads(next(c for c in at.get("plotly_chart") if c.key == key).proto.spec)


def values(array) -> np.ndarray:
    """A plotly array: a list, or base64 with a dtype."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"])
    return np.asarray(array)


def frame_with(at, column):
    """The table that has this column (AppTest does not expose dataframe keys)."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def checksum(model) -> str:
    digest = hashlib.sha256()
    for name, p in sorted(model.net.state_dict().items()):
        digest.update(name.encode())
        digest.update(p.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def test_toggle_updates_outputs_and_link():
    at = app()
    assert not at.exception
    assert at.metric[0].value == "1.0000"  # every head on: the masked model is the full model
    apply(switch(at, (5, 3)))
    assert not at.exception
    assert float(at.metric[0].value) < 0.99
    keep = torch.ones(6, 12, dtype=torch.bool)
    keep[5, 3] = False
    assert at.query_params["heads"] == pruning.encode_mask(keep)
    at.checkbox(key=layer_box("minilm", 2)).uncheck().run()  # a whole layer off
    assert not at.exception and not mask_of(at)[2].any() and mask_of(at).sum() == 72 - 13
    at.checkbox(key=layer_box("minilm", 2)).check().run()
    assert mask_of(at)[2].all()
    at.selectbox(key="heads.only:minilm:6x12").set_value(1).run()
    at.button(key="heads.only_btn").click().run()
    assert mask_of(at).sum(1).tolist() == [0, 12, 0, 0, 0, 0]
    at.button(key="heads.reset").click().run()
    assert "heads" in at.query_params     # Reset waits for Apply, like every edit
    apply(at)
    assert mask_of(at).all() and "heads" not in at.query_params


def test_sessions_do_not_share_masks_and_the_cached_model_is_untouched():
    model = common.shared_model("minilm")
    before = checksum(model)
    first, second = app(), app()
    apply(switch(first, (0, 0)))
    second.checkbox(key=layer_box("minilm", 3)).uncheck().run()
    second.run()
    first.run()
    assert mask_of(first).sum() == 71 and mask_of(first)[3].all()
    assert mask_of(second).sum() == 60 and mask_of(second)[0, 0]
    tool(second, "Real pruning").multiselect(key="heads.lengths").set_value([16]).run()
    second.number_input(key="heads.repeats").set_value(3).run()
    second.button(key="heads.prune_go").click().run()
    assert not second.exception
    table = frame_with(second, "bound")
    assert table["tokens"].tolist() == [16] and (table["bound"] >= 1).all()
    assert checksum(common.shared_model("minilm")) == before
    assert common.shared_model("minilm") is model


def test_link_round_trip_and_bad_links():
    keep = torch.rand(6, 12, generator=torch.Generator().manual_seed(1)) > 0.5
    at = app(heads=pruning.encode_mask(keep), model="minilm")
    assert not at.exception and torch.equal(mask_of(at), keep)
    fresh = AppTest.from_file(PAGE, default_timeout=300)  # back from another page: the saved copy
    fresh.session_state["heads.saved:minilm:6x12"] = pruning.encode_mask(keep)
    assert torch.equal(mask_of(fresh.run()), keep)
    for bad, why in (("6x12-zz", "malformed"), ("30x9-1", "30 layers x 9 heads"), ("6x12-" + "f" * 30, "more bits")):
        at = app(heads=bad)
        assert not at.exception
        assert any(why in w.value for w in at.warning) and mask_of(at).all()


def test_every_head_off_is_explained_and_blocks_pruning():
    at = app(heads="6x12-0")
    assert not at.exception
    assert any("Every head is switched off" in e.value for e in at.error)
    assert tool(at, "Real pruning").button(key="heads.prune_go").disabled


def test_importance_run_then_top_k_preset_and_a_cancelled_run():
    at = app()
    at.radio(key="heads.imp_src").set_value("the text above").run()
    at.select_slider(key="heads.imp_window").set_value(32).run()
    at.button(key="heads.imp_go").click().run()
    assert not at.exception
    result, _ = at.session_state["heads.imp:minilm"]
    assert result.complete and len(frame_with(at, "rank")) == 72
    at.slider(key="heads.share").set_value(50).run()
    at.button(key="heads.top").click().run()
    assert torch.equal(mask_of(at), result.keep_top(0.5))
    # a run interrupted by Cancel: its partial result stays, with a message; the mask stays too
    model = common.shared_model("minilm")
    data = importance.eval_windows(model, None, 128, 32)
    partial = importance.gradient_importance(model, data, should_stop=lambda: True)
    at.session_state["heads.imp:minilm"] = (partial, 120)
    at.session_state["heads.imp:minilm:running"] = True
    at.run()
    assert not at.exception
    assert any("was cancelled after 0 of 4" in w.value for w in at.warning)
    assert torch.equal(mask_of(at), result.keep_top(0.5))


def test_too_short_evaluation_text():
    at = app()
    at.text_area(key="heads.text:enc").input("Hi").run()
    at.radio(key="heads.imp_src").set_value("the text above").run()
    assert not at.exception
    assert any("at least two are needed" in w.value for w in at.warning)
    assert at.button(key="heads.imp_go").disabled


def test_language_model_live_effect():
    at = app(model="smollm2")
    assert not at.exception
    labels = [m.label for m in at.metric]
    assert "perplexity (masked)" in labels and at.metric[2].value == "100.0%"
    apply(switch(at, (0, 1), key="smollm2"))
    assert not at.exception
    kl = float(at.metric[1].value)
    assert kl > 0
    assert at.query_params["model"] == "smollm2" and at.query_params["heads"].startswith("30x9-")


# ---------------------------------------------------------------- regressions
def test_head_edits_wait_for_apply_then_apply_together():
    """Clicking heads only edits the grid; one Apply shows the effect of every edit at once."""
    at = app()
    switch(at, (1, 2), (4, 7), (5, 0)).run()
    assert not at.exception
    keep = torch.ones(6, 12, dtype=torch.bool)
    keep[1, 2] = keep[4, 7] = keep[5, 0] = False
    assert torch.equal(mask_of(at), keep)             # the grid holds the edits...
    assert at.metric[0].value == "1.0000"             # ...the result is still the full model's
    captions = " ".join(c.value for c in at.caption)
    assert "72 of 72 heads on" in captions and "3 pending changes" in captions and "The grid has 69 heads on" in captions
    assert "heads" not in at.query_params
    apply(at)
    assert not at.exception
    assert torch.equal(mask_of(at), keep)
    assert float(at.metric[0].value) < 1.0
    captions = " ".join(c.value for c in at.caption)
    assert "69 of 72 heads on" in captions and "No pending changes" in captions
    assert at.query_params["heads"] == pruning.encode_mask(keep)
    assert not at.checkbox(key=layer_box("minilm", 4)).value   # layer 4 is no longer all on
    at.checkbox(key=layer_box("minilm", 4)).check().run()    # a layer box waits for Apply too
    assert mask_of(at)[4].all() and mask_of(at).sum() == 70
    assert any("69 of 72 heads on" in c.value for c in at.caption)
    apply(at)
    assert any("70 of 72 heads on" in c.value for c in at.caption)


def test_live_effect_of_a_language_model_one_scale_target_tokens_and_flips():
    at = app(model="smollm2")
    at.text_area(key="heads.text:lm").input("The capital of France is").run()
    at.text_input(key="heads.target:smollm2").input(" Paris").run()
    at.text_input(key="heads.other:smollm2").input("▁London").run()   # SentencePiece's space mark works too
    assert not at.exception
    p_paris = metric(at, "P(' Paris') next")
    diff = metric(at, "logit(' Paris') − logit(' London')")
    assert p_paris.value.endswith("%") and float(p_paris.value[:-1]) > 5   # the full model's favourite
    assert "vs full" in diff.delta
    assert not any("flips" in w.value for w in at.warning)
    # Every head but layer 0's: the prediction changes, and the page says so beyond perplexity
    at.selectbox(key="heads.only:smollm2:30x9").set_value(0).run()
    apply(at.button(key="heads.only_btn").click().run())
    assert not at.exception
    assert any("next-token prediction flips" in w.value for w in at.warning)
    top1 = metric(at, "top-1 agreement")
    assert "positions flip" in top1.delta
    spec = chart(at, "heads.topk")
    full_bars, masked_bars = spec["data"]
    x1, x2 = spec["layout"]["xaxis"]["range"], spec["layout"]["xaxis2"]["range"]
    assert x1 == x2                                   # one probability scale for both panels
    top = max(values(full_bars["x"]).max(), values(masked_bars["x"]).max())
    assert x1[0] == 0 and top <= x1[1] <= 1.0 and x1[1] == pytest.approx(min(1.0, 1.1 * top))
    # a word that is not one token: said plainly, with how it splits
    at.text_input(key="heads.target:smollm2").input(" unbelievably").run()
    assert not at.exception
    said = " ".join(w.value for w in at.warning)
    assert "3 tokens" in said and "not one" in said


def test_settings_that_name_a_layer_follow_the_model():
    def layer_box(at):
        return next(s for s in at.selectbox if s.label == "layer for the attention change")

    at = app()
    assert layer_box(at).value == 5                    # MiniLM's last layer
    at.sidebar.selectbox[0].set_value("smollm2").run()
    assert not at.exception
    assert layer_box(at).value == 29 and layer_box(at).options[-1] == "29"   # SmolLM2's last, not 5
    assert next(s for s in at.selectbox if s.label == "layer").value == 29
    at.button_group(key="heads.chart").set_value("attention change").run()   # the note sits under it
    notes = " ".join(c.value for c in at.caption)
    assert "270 of 270 heads on" in notes and "Every head is on" in notes
    at.sidebar.selectbox[0].set_value("minilm").run()
    assert not at.exception and layer_box(at).value == 5


def test_top_k_preset_is_enabled_as_soon_as_importance_is_computed():
    at = app()
    assert at.button(key="heads.top").disabled
    at.radio(key="heads.imp_src").set_value("the text above").run()
    at.select_slider(key="heads.imp_window").set_value(32).run()
    at.button(key="heads.imp_go").click().run()
    assert not at.exception
    assert not at.button(key="heads.top").disabled      # no other widget touched in between
    labels = [o for i in range(6) for o in at.button_group(key=row_key("minilm", i)).options]
    assert all(re.fullmatch(r":(gray|blue|orange|red)\[h\d+\]", o) for o in labels)   # coloured by importance
    assert {o.split("[")[0] for o in labels} == {":gray", ":blue", ":orange", ":red"}
    assert "Importance CSV" in [b.label for b in at.get("download_button")]
    at.button(key="heads.top").click().run()
    result, _ = at.session_state["heads.imp:minilm"]
    assert torch.equal(mask_of(at), result.keep_top(0.7))


def test_prune_and_measure_warms_up_takes_medians_and_shows_the_spread():
    at = tool(app(), "Real pruning")
    assert at.number_input(key="heads.repeats").min >= 3
    at.multiselect(key="heads.lengths").set_value([16]).run()
    at.number_input(key="heads.repeats").set_value(3).run()
    at.button(key="heads.prune_go").click().run()
    assert not at.exception
    table = frame_with(at, "speedup_q1")
    assert table["runs"].tolist() == [3]
    for col in ("full_ms", "pruned_ms", "speedup"):
        assert (table[f"{col}_q1"] <= table[col]).all() and (table[col] <= table[f"{col}_q3"]).all()
    spec = chart(at, "heads.latency")
    assert all("error_y" in trace for trace in spec["data"][:2])
    assert "Speed-up CSV" in [b.label for b in at.get("download_button")]


def test_importance_budget_is_capped_and_heavy_jobs_hold_a_server_slot(monkeypatch, set_limits):
    set_limits(max_importance_seconds=30.0, max_heavy_jobs=1)  # what ATTNVIZ_MAX_IMPORTANCE_SECONDS=30 would give
    at = app()
    for prefix, name in (("heads.imp", "Importance"), ("heads.curve", "Pruning curve")):
        assert tool(at, name).number_input(key=f"{prefix}_budget").max == 30
    with pytest.raises(ValueError, match="more than this server allows"):
        importance.time_budget(31)
    tool(at, "Real pruning").multiselect(key="heads.lengths").set_value([16]).run()
    with jobs.heavy_job("someone else's sweep"):          # the server's one slot is taken
        for button, name in (("heads.imp_go", "Importance"), ("heads.curve_go", "Pruning curve"),
                             ("heads.prune_go", "Real pruning")):
            tool(at, name).button(key=button).click().run()
            assert not at.exception
            assert any("already running" in e.value for e in at.error), button
    assert "heads.imp:minilm" not in at.session_state and "heads.speed:minilm" not in at.session_state
    tool(at, "Importance").button(key="heads.imp_go").click().run()         # free again
    assert not at.exception and at.session_state["heads.imp:minilm"][0].complete


def test_live_view_draws_the_chosen_chart_and_reuses_the_masked_run():
    """After each Apply the live view redraws the chart the user watches (each chart adds to every
    redraw); switching charts does not run the model again; the live charts are drawn without
    Streamlit's theme (bench/toggle_latency.py)."""
    def live_charts(at):
        return sorted(c.key for c in at.get("plotly_chart"))

    at = app(model="smollm2")
    at.text_area(key="heads.text:lm").input("The capital of France is Paris, and the capital of Italy is").run()
    switch(at, (17, 3), key="smollm2")
    apply(at)
    assert not at.exception
    assert at.button_group(key="heads.chart").value == "next token"        # the default
    assert live_charts(at) == ["heads.topk"]
    run = at.session_state["heads.masked"][1]
    for view, keys in (("per-token loss", ["heads.token_loss"]), ("attention change", ["heads.diff"]),
                       ("all three", ["heads.diff", "heads.token_loss", "heads.topk"])):
        at.button_group(key="heads.chart").set_value(view).run()
        assert not at.exception and live_charts(at) == keys
        assert at.session_state["heads.masked"][1] is run                   # no second masked run
    assert all(c.proto.theme == "" for c in at.get("plotly_chart"))        # theme=None
    # an encoder has no next token: its live view always shows the attention change
    at.sidebar.selectbox[0].set_value("minilm").run()
    assert not at.exception and live_charts(at) == ["heads.diff"]


def test_live_pickers_read_before_they_are_drawn_still_drive_the_run():
    """The live runs happen before the live view draws anything, with the pickers' values taken
    from the session state: a new layer must reach the masked run and the chart on its own rerun."""
    at = app()
    switch(at, (2, 0))
    apply(at)
    at.selectbox(key="heads.diff_layer:minilm:6x12").set_value(3).run()
    at.selectbox(key="heads.diff_head:minilm:6x12").set_value(1).run()
    assert not at.exception
    key, run = at.session_state["heads.masked"]
    assert key[2] == 3 and run.layer == 3
    spec = chart(at, "heads.diff")
    assert spec["layout"]["title"]["text"].startswith("layer 3, head 1")
    # layer 3 sees layer 2's changed output: the change is drawn, not the all-zero of another layer
    assert np.abs(np.nan_to_num(values(spec["data"][0]["z"]))).max() > 0


# ---------------------------------------------------------------- typed boxes are bounded
def counting(monkeypatch, module, name):
    """Wrap module.name so the test sees every call's arguments."""
    calls, real = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, wrapper)
    return calls


def test_token_boxes_are_bounded_cached_and_warn_briefly(monkeypatch):
    """100,000 CJK characters in a token box took 3.8 s and a 1.8 MB warning on every live rerun."""
    from attnviz.analysis import effects
    calls = counting(monkeypatch, effects, "single_token")
    at = app(model="smollm2")
    # set_value, not input: what a client that ignores the box's max length would send
    at.text_input(key="heads.target:smollm2").set_value("漢" * 100_000).run()
    assert not at.exception
    said = [w.value for w in at.warning if "instead" in w.value]
    assert len(said) == 1 and len(said[0]) < 500
    assert all(len(args[1]) <= 64 for args, _ in calls)       # never tokenized beyond the bound
    before = len(calls)
    at.button_group(key="heads.chart").set_value("per-token loss").run()   # live reruns
    apply(switch(at, (3, 1), key="smollm2"))
    assert not at.exception and len(calls) == before               # cached on the typed text
    assert any("instead" in w.value for w in at.warning)


def test_ranking_sentences_are_bounded(monkeypatch):
    """20 lines of 100,000 characters cost 6.6 s on every Apply: each line is cut, the page says so."""
    from attnviz.analysis import effects
    calls = counting(monkeypatch, effects, "outputs")
    at = app()
    at.text_area(key="heads.sentences").set_value("\n".join(["a cat " * 20_000] * 25)).run()
    apply(switch(at, (1, 1)))
    assert not at.exception
    sentences = [list(args[4]) for args, _ in calls if len(args) > 4 and args[4]]
    assert sentences and all(len(s) <= 20 and max(map(len, s)) <= 300 for s in sentences)
    assert any("Ranking the first 20 sentences, each cut to 300 characters" in c.value for c in at.caption)
    at.text_area(key="heads.sentences").input("\n".join(f"Sentence {i} is about a cat." for i in range(25))).run()
    assert not at.exception
    assert set(frame_with(at, "sentence")["sentence"]) == {f"Sentence {i} is about a cat." for i in range(20)}
    assert any("(of 25)" in c.value for c in at.caption)


# ---------------------------------------------------------------- deltas say good or bad
def delta_style(m):
    from streamlit.proto.Metric_pb2 import Metric as MetricProto
    return (MetricProto.MetricColor.Name(m.proto.color), MetricProto.MetricDirection.Name(m.proto.direction))


def test_metric_deltas_are_coloured_by_good_or_bad_and_plain_at_zero():
    at = app(model="smollm2")
    assert not at.exception
    perplexity, agreement = metric(at, "perplexity (masked)"), metric(at, "top-1 agreement")
    assert perplexity.delta.startswith("+0.00 vs full")
    assert delta_style(perplexity) == ("GRAY", "NONE")      # no change: no red up arrow
    assert delta_style(agreement) == ("GRAY", "NONE") and agreement.delta == "no position flips"
    at.selectbox(key="heads.only:smollm2:30x9").set_value(0).run()
    apply(at.button(key="heads.only_btn").click().run())
    assert not at.exception
    perplexity, agreement = metric(at, "perplexity (masked)"), metric(at, "top-1 agreement")
    assert float(perplexity.value) > float(perplexity.delta.split("vs full")[1])
    assert delta_style(perplexity) == ("RED", "UP")          # perplexity rose: bad
    assert "positions flip" in agreement.delta
    assert delta_style(agreement) == ("RED", "DOWN")         # agreement fell: down, red


def test_metric_delta_helper():
    from attnviz.ui.head_editor import metric_delta
    assert metric_delta(-0.3, "x", "lower") == dict(delta="x", delta_color="green", delta_arrow="down")
    assert metric_delta(0.3, "x", "lower")["delta_color"] == "red"
    assert metric_delta(0.004, "x", "higher") == dict(delta="x", delta_color="off", delta_arrow="off")
    with pytest.raises(ValueError):
        metric_delta(1, "x", "up")


# ---------------------------------------------------------------- prune and measure
def speed_table(tokens, full, q1, q3):
    import pandas as pd
    return pd.DataFrame(dict(tokens=tokens, runs=5, full_ms=full, full_ms_q1=q1, full_ms_q3=q3,
                             pruned_ms=[f * 0.9 for f in full], pruned_ms_q1=[f * 0.85 for f in full],
                             pruned_ms_q3=[f * 0.95 for f in full], speedup=1.1, speedup_q1=1.08,
                             speedup_q3=1.12, bound=1.3))


def test_a_row_whose_spread_exceeds_half_its_median_is_flagged():
    from attnviz.latency.speedup import noisy_lengths
    # the row: median 4,227 ms, first quartile 312 ms; the ratios of its rounds agree
    table = speed_table([16, 32, 64], [20.0, 4227.0, 90.0], [19.0, 312.0, 60.0], [21.0, 4300.0, 140.0])
    assert noisy_lengths(table) == [32, 64]          # 64: IQR 80 ms > half of 90 ms


def test_prune_and_measure_has_progress_and_measures_unsettled_lengths_again(monkeypatch):
    from attnviz.latency import speedup
    calls = []

    def fake(model, keep, lengths, repeats, should_stop=None, progress=None, **kw):
        calls.append(list(lengths))
        assert progress is not None and should_stop is not None and not should_stop()
        progress(1, 2, lengths[0])
        noisy = len(calls) == 1
        table = speed_table(list(lengths), [100.0] * len(lengths), [20.0 if noisy else 99.0] * len(lengths),
                            [300.0 if noisy else 101.0] * len(lengths))
        return speedup.Speedup(10, 8, 70, 72, table, cfg_full=model.cfg, cfg_pruned=model.cfg)

    monkeypatch.setattr(speedup, "measure_speedup", fake)
    monkeypatch.setattr(speedup.Speedup, "modelled", lambda self, devices=(): None)
    at = tool(app(), "Real pruning")
    at.multiselect(key="heads.lengths").set_value([16, 32]).run()
    at.button(key="heads.prune_go").click().run()
    assert not at.exception
    assert calls == [[16, 32], [16, 32]]             # both unsettled: measured once more
    assert any("Measured again" in c.value and "16, 32 tokens" in c.value for c in at.caption)
    assert not any("Not settled" in w.value for w in at.warning)   # the second runs settled
    assert frame_with(at, "speedup_q1")["full_ms_q1"].tolist() == [99.0, 99.0]
    # milliseconds to three significant figures, as on Latency, never "4227.0381"
    table = next(d for d in at.dataframe if "speedup_q1" in d.value.columns)
    config = json.loads(table.proto.columns)
    assert {c for c, v in config.items() if v.get("type_config", {}).get("format") == "%.3g"} == \
        {"full_ms", "full_ms_q1", "full_ms_q3", "pruned_ms", "pruned_ms_q1", "pruned_ms_q3"}, config
    assert at.session_state["heads.speed:minilm:running"] is False


def test_remeasure_replaces_only_the_noisy_rows():
    from attnviz.latency import speedup
    from attnviz.ui.heads_tools import remeasure
    sp = speedup.Speedup(1, 1, 1, 1, speed_table([16, 32], [10.0, 100.0], [9.0, 10.0], [11.0, 300.0]))
    out, again = remeasure(sp, lambda lengths: speedup.Speedup(1, 1, 1, 1, speed_table(lengths, [50.0], [49.0], [51.0])))
    assert again == [32] and out.table["full_ms"].tolist() == [10.0, 50.0]
    assert remeasure(sp, None, should_stop=lambda: True) == (sp, [])


def test_evaluation_length_never_offers_more_tokens_than_the_text_has():
    at = tool(app(), "Importance")
    bundled = at.select_slider(key="heads.imp_tokens")
    assert bundled.value == 256 and max(map(int, bundled.options)) <= limits.LIMITS.max_importance_tokens
    words = " ".join(["the cat sat on the mat"] * 7)             # 42 words: about 42 tokens
    at.text_area(key="heads.text:enc").input(words).run()
    at.radio(key="heads.imp_src").set_value("the text above").run()
    assert not at.exception
    slider = at.select_slider(key="heads.imp_tokens")
    n = int(slider.options[-1])
    assert slider.options[:-1] == ["32"] and 32 < n < 64   # ends on the text's own length
    assert int(slider.value) == n                          # 256 was asked: all the text has
    at.text_area(key="heads.text:enc").input("the cat sat on the mat").run()   # shorter than 32
    assert not at.exception and "heads.imp_tokens" not in [s.key for s in at.get("select_slider")]
    assert any("all the text has" in c.value for c in at.caption)


def test_importance_map_marks_the_heads_that_are_off():
    at = app()
    apply(switch(at, (1, 2), (4, 7)))
    at.radio(key="heads.imp_src").set_value("the text above").run()
    at.select_slider(key="heads.imp_window").set_value(32).run()
    at.button(key="heads.imp_go").click().run()
    assert not at.exception
    spec = chart(at, "heads.imp_map")
    marks = next(t for t in spec["data"] if t.get("name") == "off")
    assert sorted(zip(values(marks["y"]).tolist(), values(marks["x"]).tolist())) == [(1, 2), (4, 7)]
    assert any("× marks the heads that are off" in c.value for c in at.caption)


def test_a_stopped_pruning_curve_still_has_its_random_baseline_up_to_the_same_step():
    from tests.test_importance import data, lm_config
    from attnviz.weights.catalogue import random_model
    cfg = lm_config()
    calls = []
    curve = pruning.pruning_curve(random_model(cfg), data(cfg, windows=1), step=0.25, max_fraction=0.75,
                                  seeds=(0, 1), progress=lambda d, t, c: calls.append(d),
                                  should_stop=lambda: len(calls) >= 6)
    assert not curve.complete and curve.done == 6
    t = curve.table
    reached = t.groupby("order")["fraction"].max()
    assert reached["random"] == reached["importance"] == 0.25      # both curves, the same share removed
    assert (t[t["order"] == "random"].groupby("seed").size() == 2).all()


def test_pruning_curve_defaults_finish_with_the_random_baseline():
    at = tool(app(), "Pruning curve")
    at.button(key="heads.curve_go").click().run()
    assert not at.exception
    curve, budget = at.session_state["heads.curve:minilm"]
    assert budget == 120 and set(curve.table["order"]) == {"importance", "random"}   # even if stopped early
    lm = tool(app(model="smollm2"), "Pruning curve")
    assert lm.select_slider(key="heads.curve_tokens").value == 64   # small enough for 120 s
    assert lm.number_input(key="heads.curve_seeds").value == 3


def test_every_edit_waits_for_apply_a_partial_layer_says_so_and_discard_undoes():
    """One Apply everywhere: before, a layer box and a preset applied at once on this page while
    head clicks waited; a layer with some heads on showed an empty box."""
    at = app()
    switch(at, (2, 0), (2, 1)).run()
    box = at.checkbox(key=layer_box("minilm", 2))
    assert box.label == "layer 2 ◐" and not box.value           # partial, not an empty "layer 2"
    assert at.checkbox(key=layer_box("minilm", 3)).label == "layer 3"
    at.checkbox(key=layer_box("minilm", 5)).uncheck().run()            # a whole layer off: pending
    at.button(key="heads.reset").click().run()
    at.checkbox(key=layer_box("minilm", 1)).uncheck().run()
    assert not at.exception and mask_of(at).sum() == 60
    assert at.metric[0].value == "1.0000" and "heads" not in at.query_params   # nothing applied yet
    assert any("12 pending changes" in c.value for c in at.caption)
    at.button(key="heads.discard").click().run()
    assert mask_of(at).all() and any("No pending changes" in c.value for c in at.caption)
    at.checkbox(key=layer_box("minilm", 1)).uncheck().run()
    apply(at)
    assert float(at.metric[0].value) < 1.0 and at.query_params["heads"].startswith("6x12-")


def test_a_head_that_is_off_is_struck_through_and_a_pending_one_marked():
    from attnviz.ui import head_editor
    assert head_editor.head_label(":red[h3]", False, False) == "~~:red[h3]~~"   # an alignment head off
    assert head_editor.head_label("h3", True, True) == "h3\\*"
    assert head_editor.layer_label(4, 3, 6) == "layer 4 ◐"
    assert head_editor.layer_label(4, 0, 6) == head_editor.layer_label(4, 6, 6) == "layer 4"


def test_heads_answer_in_sentences_with_their_numbers():
    """Before: a metric with "+0.0000 vs full 1" and charts; now the answer is said, and a change that
    rounds to nothing reads "= full"."""
    at = app()
    assert any(i.value.startswith("Every head is on: embedding cosine is the full model's") for i in at.info)
    assert at.metric[0].delta == "= full"
    apply(switch(at, (5, 3)))
    said = next(i.value for i in at.info if i.value.startswith("With 1 of 72 heads off"))
    assert f"embedding cosine is {float(at.metric[0].value):.4f} against the full model's 1.0000" in said
    lm = app(model="smollm2")
    apply(switch(lm, (0, 1), key="smollm2"))
    said = next(i.value for i in lm.info if i.value.startswith("With 1 of 270 heads off"))
    assert "top-1 agreement" in said and "next-token prediction" in said


def verdicts_of_a_run_stopped_at_zero():
    from attnviz.analysis import head_answers
    return head_answers.curve_sentence(pd.DataFrame([dict(order="importance", fraction=0.0, top1_mean=1.0,
                                                          top1_std=0.0, runs=1)]), "top1", 72)


def test_the_pruning_curve_is_said_at_thirty_percent_against_random_order():
    from attnviz.analysis import head_answers
    summary = pd.DataFrame([dict(order="importance", fraction=0.3, top1_mean=0.57, top1_std=0.0, runs=1),
                            dict(order="random", fraction=0.3, top1_mean=0.33, top1_std=0.05, runs=3)])
    assert head_answers.curve_sentence(summary, "top1", 72) == (
        "Removing 30% of the heads (22 of 72) by importance keeps top-1 agreement at 0.570 against 0.330 ± 0.050 "
        "in random order (mean ± sd over 3 orders): importance order does better.")
    assert verdicts_of_a_run_stopped_at_zero() is None
    at = tool(app(), "Pruning curve")
    at.select_slider(key="heads.curve_tokens").set_value(32).run()
    at.number_input(key="heads.curve_seeds").set_value(1).run()
    at.button(key="heads.curve_go").click().run()
    assert not at.exception
    assert any(i.value.startswith("Removing 30% of the heads (22 of 72) by importance keeps embedding cosine at")
               for i in at.info)
