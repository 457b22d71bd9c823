"""Head toggle -> new outputs on the Heads page, MiniLM, texts of <= 64 tokens. Target: <= 0.3 s.

Prints two figures: the library path (the masked run the page recomputes on a toggle: one
trace capturing one layer, the sentence embeddings for the ranking, the comparison) and a whole
AppTest rerun of the page after clicking one head's checkbox (script, 72+6 checkboxes, figures;
no browser paint). Medians over several toggles; timings on a shared machine vary run to run.
"""
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import attnviz  # noqa: E402
from attnviz import effects  # noqa: E402

TARGET_S = 0.3
SENTENCES = ["A kitten is resting on a rug.", "The dog sleeps on the sofa.", "A man is playing a guitar.",
             "Stock markets fell sharply today.", "The cat is lying on a carpet."]
TEXT = ("The quick brown fox jumps over the lazy dog while the cat sits on the mat and watches "
        "the old man who lives next door paint his fence a bright shade of blue, humming a tune that "
        "the birds in the garden, wondering whether the rain will come before the evening ends and "
        "everyone goes home.")


def library_path(model, ids, toggles=20):
    layer = model.cfg.n_layers - 1
    full = effects.outputs(model, ids, None, layer, SENTENCES)
    for _ in range(3):  # warm-up: first calls of a shape pay one-off kernel set-up
        effects.outputs(model, ids, torch.ones(model.cfg.n_layers, model.cfg.n_heads), layer, SENTENCES)
    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(model.cfg.n_layers, model.cfg.n_heads)
    times, cpu = [], []
    for _ in range(toggles):
        i, h = (int(torch.randint(n, (1,), generator=gen)) for n in mask.shape)
        mask[i, h] = 1 - mask[i, h]
        t0, c0 = time.perf_counter(), time.process_time()
        masked = effects.outputs(model, ids, mask, layer, SENTENCES)
        effects.compare(full, masked, SENTENCES)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(times), statistics.median(cpu)


def apptest_rerun(text, toggles=10):
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(ROOT / "pages" / "2_Heads.py"), default_timeout=300).run()
    at.text_area(key="heads_text:enc").input(text).run()  # warms the full-model cache too
    times = []
    for k in range(toggles):
        box = at.checkbox(key=f"heads_cb:minilm:{5 - k % 6}:{k % 12}")
        box.set_value(not box.value)
        t0 = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - t0)
        if at.exception:
            raise RuntimeError(at.exception[0].value)
    return statistics.median(times)


def main():
    model = attnviz.load_model("minilm")
    for n_target in (16, 64):
        ids = model.encode_text(TEXT)[0][:n_target].tolist()
        ids[-1] = model.tokenizer.sep_token_id
        lib, cpu = library_path(model, ids)
        print(f"MiniLM {len(ids):3d} tokens, library path (masked run + comparison): {lib * 1e3:6.1f} ms "
              f"({lib / TARGET_S:.2f} x the {TARGET_S} s target); CPU time {cpu * 1e3:.1f} ms "
              "(all threads; wall > CPU / threads means the machine is busy)")
    words = model.tokenizer.decode(model.encode_text(TEXT)[0][1:63])
    rerun = apptest_rerun(words)
    print(f"MiniLM {len(model.encode_text(words)[0]):3d} tokens, AppTest rerun after a toggle: {rerun * 1e3:6.1f} ms "
          f"({rerun / TARGET_S:.2f} x the {TARGET_S} s target; browser paint not included)")
    print(f"torch threads: {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
