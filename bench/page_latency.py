"""Warm rerun time of the Attention page (AppTest, no browser): MiniLM on a 32-token sentence
(target <= 0.5 s) and SmolLM2 (target <= 1.5 s). Median of several reruns after the first run
has loaded the model and filled the caches. With --long also SmolLM2 on ~350 tokens (the largest
text captured whole) and ~1,000 tokens (the bounded, layer-by-layer path), without targets.
Prints the figures; asserts nothing about time."""
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from streamlit.testing.v1 import AppTest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAGE = str(ROOT / "pages" / "1_Attention.py")
TARGETS = {"minilm": 0.5, "smollm2": 1.5}
RERUNS = 7


def sentence_of(model_key: str, n_tokens: int = 32) -> str:
    """A natural sentence cut to exactly n_tokens tokens of this model (special tokens included)."""
    from attnviz import ui
    model = ui.load_model(model_key)
    words = ("The animal didn't cross the street because it was too tired, and the trophy "
             "doesn't fit into the brown suitcase because it is too large, said the city "
             "councilmen who refused the demonstrators a permit.").split()
    for count in range(1, len(words) + 1):
        text = " ".join(words[:count])
        if model.trace(text, attentions=False).hidden.shape[0] >= n_tokens:
            return text
    return " ".join(words)


def rerun_times(model_key: str, text: str | None = None) -> tuple[int, list[float], float]:
    at = AppTest.from_file(PAGE, default_timeout=600)
    at.run()
    at.selectbox(key="model_choice:encoder/lm").set_value(model_key)
    at.run()
    text = text or sentence_of(model_key)
    at.text_area(key="att_text_input").input(text)
    start = time.perf_counter()
    at.button[0].click()
    at.run()                        # cold for this text: capture, statistics, rollout
    cold = time.perf_counter() - start
    if at.exception:
        sys.exit(f"page raised: {at.exception}")
    times = []
    for i in range(RERUNS):
        # Alternate the chosen head so every rerun rebuilds the figures, as a user's click does.
        at.selectbox(key="att_head").set_value(i % 2)
        start = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - start)
    return len(at.session_state["att_text"].split()), times, cold


def long_text(model_key: str, n_tokens: int) -> str:
    """The first n_tokens tokens of the bundled evaluation text, as text."""
    from attnviz.base import texts
    from attnviz import ui
    model = ui.load_model(model_key)
    ids = model.tokenizer(texts.eval_text())["input_ids"][:n_tokens]
    return model.tokenizer.decode(ids, skip_special_tokens=True)


def main():
    for model_key, target in TARGETS.items():
        words, times, cold = rerun_times(model_key)
        median = statistics.median(times)
        print(f"{model_key:8s} 32 tokens ({words} words): first run for the text {cold:.2f} s, "
              f"warm rerun median {median:.3f} s (min {min(times):.3f}, max {max(times):.3f}) "
              f"target <= {target} s -> {'OK' if median <= target else 'OVER'}")
    if "--long" in sys.argv:   # no target: shows what the bounded paths cost on this machine
        for n_tokens in (350, 1000):
            words, times, cold = rerun_times("smollm2", long_text("smollm2", n_tokens))
            print(f"smollm2  ~{n_tokens} tokens: first run {cold:.1f} s, warm rerun median "
                  f"{statistics.median(times):.3f} s")


if __name__ == "__main__":
    main()
