"""Gemma 3 270M priced beside SmolLM2 on a Pi: the cost model reads their heads, K/V heads and
windows, a local layer's generated token reads at most its window of keys, and the Latency page
says the comparison in a sentence."""
import dataclasses
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attnviz.latency import decode, model_pair
from attnviz.latency.costmodel import PROFILES
from attnviz.ui import common

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "4_Latency.py")


@pytest.fixture(scope="module")
def configs():
    return {k: common.shared_model(k).cfg for k in model_pair.PAIR}


def test_the_shapes_are_the_two_models(configs):
    shapes = model_pair.shapes(configs).set_index("model")
    assert shapes.loc["gemma3-270m", ["layers", "query heads", "K/V heads", "head width"]].tolist() == [18, 4, 1, 256]
    assert shapes.loc["gemma3-270m", "local layers"] == "15 (window 512)"
    assert shapes.loc["smollm2", ["layers", "query heads", "K/V heads", "head width"]].tolist() == [30, 9, 3, 64]
    assert shapes.loc["smollm2", "local layers"] == "none"


def test_a_local_layer_reads_its_window_of_cached_keys(configs):
    gemma = configs["gemma3-270m"]
    pi4 = PROFILES["pi4"]
    glob = dataclasses.replace(gemma, windows=())          # the same model, every layer global
    # below the window the two are the same; beyond it only the 3 global layers read more keys
    assert decode.seconds(decode.decode_ops(gemma, 256), pi4) == pytest.approx(decode.seconds(decode.decode_ops(glob, 256), pi4))
    local_growth = decode.seconds(decode.decode_ops(gemma, 4096), pi4) - decode.seconds(decode.decode_ops(gemma, 512), pi4)
    global_growth = decode.seconds(decode.decode_ops(glob, 4096), pi4) - decode.seconds(decode.decode_ops(glob, 512), pi4)
    assert 0 < local_growth < global_growth * 0.25          # 3 of 18 layers grow (+ rounding)


def test_pi_prices_and_the_sentence(configs):
    prices = model_pair.pi_prices(configs)
    assert len(prices) == 2 * 2 * len(model_pair.LENGTHS)
    assert (prices["prompt ms"] > 0).all() and prices["attention share"].between(0, 1).all()
    at = prices.set_index(["model", "device", "tokens"])
    assert at.loc[("gemma3-270m", "pi5", 512), "prompt ms"] < at.loc[("gemma3-270m", "pi4", 512), "prompt ms"]
    # Gemma's output layer (262,144 rows) is most of its next token; SmolLM2's is not
    assert at.loc[("gemma3-270m", "pi4", 512), "output layer share"] > 0.4 > at.loc[("smollm2", "pi4", 512), "output layer share"]
    said = model_pair.verdict(prices, *model_pair.PAIR)
    assert said.startswith("On a Pi 4 (4 threads, modelled, ±25%), a 512-token prompt costs gemma3-270m ")


def test_the_latency_page_prices_the_pair_when_asked():
    at = AppTest.from_file(PAGE, default_timeout=300).run()
    assert not at.exception and "latency.model_pair" not in at.session_state     # nothing until asked
    at.button(key="latency.model_pair.go").click().run()
    assert not at.exception, at.exception
    said = [m.value.replace("\\", "") for m in at.markdown if "a 512-token prompt costs gemma3-270m" in m.value.replace("\\", "")]
    assert len(said) == 2 and "On a Pi 5" in said[1]
    prices = [f.value for f in at.dataframe if "next token ms" in f.value.columns]
    assert len(prices) == 1 and set(prices[0]["model"]) == set(model_pair.PAIR)
