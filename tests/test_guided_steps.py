"""The guided step-by-step walk. Its rows are head_steps' own matrices, its sentences
quote the true argmax and weights, the ·V parts add up to the output, and on the Lab page it
follows one query token one step at a time with that row highlighted."""
import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz.analysis import guided_steps, head_recompute
from attnviz.figures import step_figures
from attnviz.weights.catalogue import random_model
from tests.tiny import BERT, LLAMA

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "5_Lab.py")
IDS = torch.tensor([3, 17, 5, 42, 8, 9, 21, 30, 5, 11])
SENTENCE = "The animal didn't cross the street because it was too tired."


@pytest.fixture(scope="module", params=["llama", "bert"])
def result(request):
    """A causal GQA rotary Llama and a bidirectional BERT, one head's steps each."""
    m = random_model(LLAMA if request.param == "llama" else BERT, seed=3)
    tr = m.trace(IDS, states=True)
    return head_recompute.head_steps(m, tr, 1, 2)


def test_guide_rows_are_head_steps_rows(result):
    for q in (0, 4, len(IDS) - 1):
        walk = guided_steps.guide(result, q)
        assert [g.key for g in walk] == [k for k, _ in guided_steps.GUIDE]
        for g in walk:
            if g.key != "weighted":
                assert torch.equal(g.row, result.steps[g.key].value[q])   # exactly the model's numbers
            if g.key in ("scores", "scaled", "masked", "softmax"):
                assert g.top == int(result.steps[g.key].value[q].argmax())
        assert walk[-1].over == "d_model" and len(walk[-1].row) == result.steps["output"].value.shape[1]


def test_sentences_quote_the_true_argmax_and_weight(result):
    tokens = result.tokens
    for q in range(len(IDS)):
        said = {g.key: g.sentence for g in guided_steps.guide(result, q)}
        A = result.pattern[q]                                   # the verified softmax row
        j = int(A.argmax())
        assert f"{A[j]:.2f} of the attention of {guided_steps.quoted(tokens, q)} goes to " \
               f"{guided_steps.quoted(tokens, j, q)}" in said["softmax"]
        assert f"sums to {float(A.sum()):.3f}" in said["softmax"]
        s = result.steps["scores"].value[q]
        assert f"{guided_steps.quoted(tokens, int(s.argmax()), q)} best ({s.max():.2f})" in said["scores"]
        assert f"{guided_steps.quoted(tokens, int(s.argmin()), q)} least ({s.min():.2f})" in said["scores"]
        assert f"√{result.steps['Q'].value.shape[1]} = " in said["scaled"]


def test_masks_are_named_and_get_exactly_zero():
    m = random_model(LLAMA, seed=3)
    tr = m.trace(IDS, states=True)
    r = head_recompute.head_steps(m, tr, 0, 1, hidden_keys=(1,))
    n = len(IDS)
    for q in (2, 6):                                           # causal: keys > q, and key 1 hidden
        walk = {g.key: g for g in guided_steps.guide(r, q)}
        masked = sorted({1, *range(q + 1, n)})
        assert walk["masked"].masked == masked
        assert walk["masked"].sentence.startswith(f"{len(masked)} of {n} keys are masked for")
        assert torch.all(walk["softmax"].row[masked] == 0) and "masked keys get exactly 0" in walk["softmax"].sentence
        assert torch.all(torch.isneginf(walk["masked"].row[masked]))
    bert = random_model(BERT, seed=3)
    walk = guided_steps.guide(head_recompute.head_steps(bert, bert.trace(IDS, states=True), 0, 0), 3)
    assert walk[2].masked == [] and walk[2].sentence.startswith("Nothing is masked for")


def test_temperature_is_named_in_the_scale_step():
    m = random_model(BERT, seed=3)
    r = head_recompute.head_steps(m, m.trace(IDS, states=True), 0, 0, temperature=2.0)
    assert r.temperature == 2.0
    assert "divided by √8 = 2.83, then by the temperature 2:" in guided_steps.guide(r, 0)[1].sentence


def test_weighted_parts_add_up_to_the_output_row(result):
    A, V, z = result.pattern, result.steps["V"].value, result.steps["weighted"].value
    for q in (0, 5):
        parts = guided_steps.contributions(result, q)
        assert sorted(p.key for p in parts) == list(range(len(IDS)))
        assert [p.share for p in parts] == sorted((p.share for p in parts), reverse=True)
        for p in parts:
            assert p.weight == float(A[q, p.key]) and torch.equal(p.vector, A[q, p.key] * V[p.key])
        assert torch.allclose(sum(p.vector for p in parts), z[q], atol=1e-6)
        assert abs(sum(p.share for p in parts) - 1) < 1e-5
        g = guided_steps.guide(result, q)[4]
        assert g.top == parts[0].key and f"(weight {parts[0].weight:.2f}) contributes the most" in g.sentence
        assert guided_steps.sum_error(result, q) < 1e-6


def test_default_query_and_bad_query():
    bert = ["[CLS]", "the", "animal", "didn", "'", "t", "cross", "the", "street", "because", "it", "was", "."]
    assert guided_steps.default_query(bert) == 10
    assert guided_steps.default_query(["The", "Ġanimal", "Ġsaid", "Ġit", "Ġwas"]) == 3
    assert guided_steps.default_query(["<s>", " hello", " world", ".", "</s>"]) == 2
    assert guided_steps.quoted(bert, 7) == "‘the’ at position 7" and guided_steps.quoted(bert, 2, 2) == "‘animal’ itself"
    m = random_model(BERT, seed=3)
    r = head_recompute.head_steps(m, m.trace(IDS, states=True), 0, 0)
    with pytest.raises(ValueError, match="outside 0..9"):
        guided_steps.guide(r, 10)


def test_referent_pair_is_the_followed_pronoun_and_the_noun_before_it():
    bert = ["[CLS]", "the", "animal", "didn", "'", "t", "cross", "the", "street", "because", "it", "was", "."]
    assert guided_steps.referent_pair(bert) == (10, 2)
    assert guided_steps.referent_pair(["The", " animal", " saw", " the", " animal", " and", " it", " ran"]) == (6, 4)
    assert guided_steps.referent_pair(["The", "Ġanimal", "Ġsaid", "Ġit", "Ġwas"]) == (3, 1)
    assert guided_steps.referent_pair(["it", "Ġwas", "Ġthe", "Ġanimal"]) is None      # no animal before it
    assert guided_steps.referent_pair(["The", "Ġanimal", "Ġsaid", "Ġshe", "Ġwas", "Ġit"]) is None  # follows 'she'
    assert guided_steps.referent_pair(["[CLS]", "hello", "world", "[SEP]"]) is None


def test_opening_head_is_the_largest_it_to_animal_weight_of_a_real_trace(monkeypatch):
    model = attnviz.load_model("minilm")
    ids = model.encode_text(SENTENCE)[0]
    tr = model.trace(ids)
    it, animal = tr.tokens.index("it"), tr.tokens.index("animal")
    w = tr.attentions[:, :, it, animal]                        # (L, H), every head
    found = guided_steps.opening_head(model, ids)
    assert (found.query, found.key) == (it, animal) and found.tokens == tr.tokens
    assert (found.layer, found.head) == divmod(int(w.argmax()), w.shape[1])
    assert found.weight == float(w.max()) and found.weight > float(w[0, 0])
    monkeypatch.setattr(type(model), "trace", lambda *a, **k: pytest.fail("no pair: nothing to trace"))
    assert guided_steps.opening_head(model, model.encode_text("A heron stood on one leg.")[0]) is None


def test_figures_outline_the_query_row_and_keep_the_values(result):
    q = 4
    walk = {g.key: g for g in guided_steps.guide(result, q)}
    for k in ("scores", "softmax", "weighted", "output"):
        fig = step_figures.guided_heatmap(result.steps[k], result.tokens, q)
        outline = [s for s in fig.layout.shapes if s.name == step_figures.QUERY_ROW]
        assert len(outline) == 1 and (outline[0].y0, outline[0].y1) == (q - 0.5, q + 0.5)
        z = np.asarray(fig.data[0].z, dtype=np.float32)
        assert np.array_equal(np.nan_to_num(z, nan=-np.inf), result.steps[k].value.numpy())
    bars = step_figures.guide_bars(walk["masked"], result.tokens, q)
    y = np.asarray(bars.data[0].y)
    row = walk["masked"].row.numpy()
    assert np.array_equal(y[np.isfinite(row)], row[np.isfinite(row)])
    assert [bars.data[0].text[j] for j in walk["masked"].masked] == ["−∞"] * len(walk["masked"].masked)
    parts = step_figures.parts_figure(guided_steps.contributions(result, q), result.steps["weighted"].value[q], result.tokens, q)
    rows = np.asarray(parts.data[0].z)
    assert np.allclose(rows[:-1].sum(0), rows[-1], atol=1e-6) and "= z of" in parts.layout.yaxis.ticktext[-1]


# ---------------------------------------------------------------- on the Lab page (AppTest)
def figure(at, name: str) -> dict:
    return json.loads(next(c.proto.spec for c in at.get("plotly_chart") if c.proto.id.endswith(f"-lab.{name}")))


def values(array) -> np.ndarray:
    """A plotly array from the figure JSON: a list, or base64 {"dtype", "bdata", "shape"}."""
    if isinstance(array, dict):
        out = np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"])
        return out.reshape([int(s) for s in str(array.get("shape", len(out))).split(",")])
    return np.asarray(array, dtype=float)


def sentence(at) -> str:
    said = [i.value for i in at.info if i.value.startswith("**Step ")]
    assert len(said) == 1, [i.value for i in at.info]
    return said[0].replace("\\", "")                       # the page markdown-escapes the tokens


def outlined_row(at) -> float:
    return next(s["y0"] for s in figure(at, "guide_heat")["layout"]["shapes"] if s.get("name") == step_figures.QUERY_ROW) + 0.5


def test_guided_mode_follows_one_token_one_step_at_a_time():
    model = attnviz.load_model("minilm")
    tr = model.trace(model.encode_text(SENTENCE)[0], states=True, layers=[0])
    it = tr.tokens.index("it")
    at = AppTest.from_file(PAGE, default_timeout=300).run()
    assert not at.exception
    at.number_input(key="lab.layer").set_value(0)          # a fixed head (a first open shows the
    at.number_input(key="lab.head").set_value(0).run()     # head where 'it' looks most at 'animal')
    assert not at.exception
    assert at.radio(key="lab.steps_mode").value.startswith("Guided")     # guided is the default
    assert at.selectbox(key="lab.query").value == it and at.radio(key="lab.step").value == 0
    said = sentence(at)
    scores = head_recompute.head_steps(model, tr, 0, 0).steps["scores"].value[it]
    j = int(scores.argmax())
    assert said.startswith("**Step 1 of 6 · Q·Kᵀ scores.**") and "Follow the row of ‘it’" in said
    assert f"{guided_steps.quoted(tr.tokens, j, it)} best ({scores[j]:.2f})" in said
    assert outlined_row(at) == it
    assert np.array_equal(values(figure(at, "guide_bars")["data"][0]["y"]), scores.numpy())

    at.button(key="lab.next").click().run()                # Next: step 2, its own sentence
    assert not at.exception and at.radio(key="lab.step").value == 1
    assert sentence(at).startswith("**Step 2 of 6 · scale.** Every score is divided by √32 = 5.66")
    at.button(key="lab.next").click().run()
    at.button(key="lab.next").click().run()                # step 4: softmax, against the captured pattern
    assert at.radio(key="lab.step").value == 3
    captured = tr.attentions[0, 0, it]                     # what the model itself computed
    k = int(captured.argmax())
    said = sentence(at)
    assert said.startswith("**Step 4 of 6 · softmax.**")
    assert f"{captured[k]:.2f} of the attention of ‘it’ goes to {guided_steps.quoted(tr.tokens, k, it)}" in said
    assert np.abs(values(figure(at, "guide_bars")["data"][0]["y"]) - captured.numpy()).max() < 1e-6
    assert outlined_row(at) == it

    animal = tr.tokens.index("animal")                     # another query: its row is outlined
    at.selectbox(key="lab.query").set_value(animal).run()
    assert not at.exception and outlined_row(at) == animal and "attention of ‘animal’" in sentence(at)
    at.number_input(key="lab.head").set_value(3).run()     # another head keeps the query and the step
    assert at.radio(key="lab.step").value == 3 and at.selectbox(key="lab.query").value == animal
    captured = model.trace(model.encode_text(SENTENCE)[0], layers=[0]).attentions[0, 3, animal]
    assert f"{captured.max():.2f} of the attention of ‘animal’" in sentence(at)
    at.radio(key="lab.steps_mode").set_value("All steps").run()   # the wall, then back: step kept
    assert not at.exception and len(at.get("plotly_chart")) == 15
    at.radio(key="lab.steps_mode").set_value(at.radio(key="lab.steps_mode").options[0]).run()
    assert at.radio(key="lab.step").value == 3

    at.button(key="lab.next").click().run()                # ·V: the parts figure adds up to z
    assert sentence(at).startswith("**Step 5 of 6 · weights · V.**") and "contributes the most" in sentence(at)
    parts = values(figure(at, "guide_parts")["data"][0]["z"])
    assert np.allclose(parts[:-1].sum(0), parts[-1], atol=1e-5)
    at.button(key="lab.next").click().run()
    assert at.radio(key="lab.step").value == 5 and at.button(key="lab.next").proto.disabled
    other = "The trophy did not fit in the suitcase because it was big."
    at.text_input(key="lab.text").input(other).run()
    assert not at.exception and at.radio(key="lab.step").value == 5        # new sentence: step kept,
    assert at.selectbox(key="lab.query").value == model.trace(model.encode_text(other)[0], layers=[0]).tokens.index("it")   # query: its "it"
