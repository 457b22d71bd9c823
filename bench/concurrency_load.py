"""Rerun time under load: 8 real browser sessions at once on the heads page, each with its own
text and head mask, against one server and one cached model. Prints p50 / p95 of the time from
committing a new text to this session's own results being painted.

    python bench/concurrency_load.py [--sessions 8] [--rounds 3] [--threads 0]
"""
import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.browser import ARTIFACTS, run_sessions, streamlit_server  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads in the server (0: default)")
    args = ap.parse_args()
    os.environ["ATTNVIZ_TORCH_THREADS"] = str(args.threads)
    ARTIFACTS.mkdir(exist_ok=True)
    with streamlit_server() as url:
        run_sessions(url, 1, 1)  # warm: model loaded, caches filled
        _, times = run_sessions(url, args.sessions, args.rounds)
    q = statistics.quantiles(times, n=20)
    print(f"{args.sessions} sessions x {args.rounds} reruns, torch threads {args.threads or 'default'}: "
          f"p50 {statistics.median(times):.2f} s, p95 {q[-1]:.2f} s, max {max(times):.2f} s "
          f"(n = {len(times)})")


if __name__ == "__main__":
    main()
