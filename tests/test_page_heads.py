"""Heads page (AppTest, MiniLM and SmolLM2): toggles, per-session masks, links, pruning, bad input."""
import hashlib
from pathlib import Path

import torch
from streamlit.testing.v1 import AppTest

from attnviz import importance, pruning, ui

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "2_Heads.py")


def app(**query) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=300)
    for k, v in query.items():
        at.query_params[k] = v
    return at.run()


def mask_of(at, key="minilm", L=6, H=12) -> torch.Tensor:
    return torch.tensor([[bool(at.session_state[f"heads_cb:{key}:{i}:{h}"]) for h in range(H)] for i in range(L)])


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
    at.checkbox(key="heads_cb:minilm:5:3").uncheck().run()
    assert not at.exception
    assert float(at.metric[0].value) < 0.99
    keep = torch.ones(6, 12, dtype=torch.bool)
    keep[5, 3] = False
    assert at.query_params["heads"] == pruning.encode_mask(keep)
    at.checkbox(key="heads_layer:minilm:2").uncheck().run()  # a whole layer off
    assert not at.exception and not mask_of(at)[2].any() and mask_of(at).sum() == 72 - 13
    at.checkbox(key="heads_layer:minilm:2").check().run()
    assert mask_of(at)[2].all()
    at.selectbox(key="heads_only").set_value(1).run()
    at.button(key="heads_only_btn").click().run()
    assert mask_of(at).sum(1).tolist() == [0, 12, 0, 0, 0, 0]
    at.button(key="heads_reset").click().run()
    assert mask_of(at).all() and "heads" not in at.query_params


def test_sessions_do_not_share_masks_and_the_cached_model_is_untouched():
    model = ui.load_model("minilm")
    before = checksum(model)
    first, second = app(), app()
    first.checkbox(key="heads_cb:minilm:0:0").uncheck().run()
    second.checkbox(key="heads_layer:minilm:3").uncheck().run()
    second.run()
    first.run()
    assert mask_of(first).sum() == 71 and mask_of(first)[3].all()
    assert mask_of(second).sum() == 60 and mask_of(second)[0, 0]
    second.multiselect(key="heads_lengths").set_value([16]).run()
    second.number_input(key="heads_repeats").set_value(1).run()
    second.button(key="heads_prune_go").click().run()
    assert not second.exception
    table = frame_with(second, "bound")
    assert table["tokens"].tolist() == [16] and (table["bound"] >= 1).all()
    assert checksum(ui.load_model("minilm")) == before
    assert ui.load_model("minilm") is model


def test_link_round_trip_and_bad_links():
    keep = torch.rand(6, 12, generator=torch.Generator().manual_seed(1)) > 0.5
    at = app(heads=pruning.encode_mask(keep), model="minilm")
    assert not at.exception and torch.equal(mask_of(at), keep)
    fresh = AppTest.from_file(PAGE, default_timeout=300)  # back from another page: the saved copy
    fresh.session_state["heads_saved:minilm"] = pruning.encode_mask(keep)
    assert torch.equal(mask_of(fresh.run()), keep)
    for bad, why in (("6x12-zz", "malformed"), ("30x9-1", "30 layers x 9 heads"), ("6x12-" + "f" * 30, "more bits")):
        at = app(heads=bad)
        assert not at.exception
        assert any(why in w.value for w in at.warning) and mask_of(at).all()


def test_every_head_off_is_explained_and_blocks_pruning():
    at = app(heads="6x12-0")
    assert not at.exception
    assert any("Every head is switched off" in e.value for e in at.error)
    assert at.button(key="heads_prune_go").disabled


def test_importance_run_then_top_k_preset_and_a_cancelled_run():
    at = app()
    at.radio(key="heads_imp_src").set_value("the text above").run()
    at.select_slider(key="heads_imp_window").set_value(32).run()
    at.button(key="heads_imp_go").click().run()
    assert not at.exception
    result, _ = at.session_state["heads_imp:minilm"]
    assert result.complete and len(frame_with(at, "rank")) == 72
    at.slider(key="heads_k").set_value(50).run()
    at.button(key="heads_top").click().run()
    assert torch.equal(mask_of(at), result.keep_top(0.5))
    # a run interrupted by Cancel: its partial result stays, with a message; the mask stays too
    model = ui.load_model("minilm")
    data = importance.eval_windows(model, None, 128, 32)
    partial = importance.gradient_importance(model, data, should_stop=lambda: True)
    at.session_state["heads_imp:minilm"] = (partial, 120)
    at.session_state["heads_imp:minilm:running"] = True
    at.run()
    assert not at.exception
    assert any("was cancelled after 0 of 4" in w.value for w in at.warning)
    assert torch.equal(mask_of(at), result.keep_top(0.5))


def test_too_short_evaluation_text():
    at = app()
    at.text_area(key="heads_text:enc").input("Hi").run()
    at.radio(key="heads_imp_src").set_value("the text above").run()
    assert not at.exception
    assert any("at least two are needed" in w.value for w in at.warning)
    assert at.button(key="heads_imp_go").disabled


def test_language_model_live_effect():
    at = app(model="smollm2")
    assert not at.exception
    labels = [m.label for m in at.metric]
    assert "perplexity (masked)" in labels and at.metric[2].value == "100.0%"
    at.checkbox(key="heads_cb:smollm2:0:1").uncheck().run()
    assert not at.exception
    kl = float(at.metric[1].value)
    assert kl > 0
    assert at.query_params["model"] == "smollm2" and at.query_params["heads"].startswith("30x9-")
