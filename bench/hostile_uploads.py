"""Peak memory and time of three hostile inputs, each in a fresh process (ru_maxrss is per process):

  images   2,000 one-colour 448 x 448 PNGs (about 2.5 MB uploaded) opened as a corpus, then every item
           made ready for the model one at a time, as a run does
  flac     128 FLAC clips of a 30 s slow tone (a few MB) opened as a corpus, then each clip made ready
  resume   a results file whose one record asks numpy for a huge dtype, opened for resuming
Prints one JSON line per case: seconds, peak resident MB, and the MB the opened corpus holds.
Usage: python bench/hostile_uploads.py [images flac resume]
"""
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from attnviz.analysis import corpus  # noqa: E402
from attnviz.analysis.corpus import CorpusLimits, open_corpus  # noqa: E402
from attnviz.analysis.corpus_engine import ResultsFile  # noqa: E402


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def held_mb(corpus) -> float:
    total = 0
    for item in corpus.items:
        total += getattr(item, "nbytes", None) or len(getattr(item, "data", b"") or b"")
    return total / 2**20


def ready_all(opened):
    ready = getattr(corpus, "ready_item", lambda x: x)    # before it existed, items were decoded already
    for item in opened.items:
        ready(item)


def pngs():
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (448, 448), (200, 30, 30)).save(buf, "PNG", optimize=True)
    return [(f"p{i}.png", buf.getvalue()) for i in range(2000)]


def flacs():
    import numpy as np
    import soundfile as sf
    t = np.arange(30 * 16000) / 16000
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * t)).astype(np.float32), 16000, format="FLAC")
    one = buf.getvalue()
    return [(f"c{i}.flac", one) for i in range(min(128, 5_000_000 // len(one)))]


def case(name):
    if name in ("images", "flac"):
        files = pngs() if name == "images" else flacs()
        uploaded = sum(len(d) for _, d in files) / 1e6
        base = peak_mb()
        start = time.perf_counter()
        try:
            got = open_corpus(files, limits=CorpusLimits(max_rows=2000, max_bytes=5_000_000))
            opened = time.perf_counter() - start
            held = held_mb(got)
            ready_all(got)
            note = "; ".join(got.notes)
        except ValueError as err:
            opened, held, note = time.perf_counter() - start, 0.0, f"refused: {err}"
        return dict(case=name, uploaded_mb=round(uploaded, 2), items=len(files),
                    open_s=round(opened, 2), total_s=round(time.perf_counter() - start, 2),
                    held_mb=round(held, 1), peak_mb=round(peak_mb(), 1), peak_over_start_mb=round(peak_mb() - base, 1),
                    note=note[:200])
    header = dict(model="minilm", corpus="c", items=2, kind="importance", seed=0, mask=None,
                  random_orders=3, fractions=[0.0], reference="full")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r.jsonl")
        record = {"phase": "importance", "index": 0,
                  "result": {"raw": {"__ndarray__": [0] * 35000, "dtype": "U2500"}, "tokens": 3}}
        with open(path, "w") as f:
            f.write(json.dumps({"run": header}) + "\n" + json.dumps(record) + "\n")
        line = os.path.getsize(path)
        base = peak_mb()
        start = time.perf_counter()
        try:
            got = ResultsFile(path, header)
            note = f"{len(got.records)} record(s) kept"
        except ValueError as err:
            note = f"refused: {err}"
        return dict(case=name, file_kb=round(line / 1024, 1), seconds=round(time.perf_counter() - start, 3),
                    peak_mb=round(peak_mb(), 1), peak_over_start_mb=round(peak_mb() - base, 1), note=note[:200])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(case(sys.argv[2])), flush=True)
    else:
        for name in sys.argv[1:] or ["images", "flac", "resume"]:
            subprocess.run([sys.executable, __file__, "--one", name], check=False)
