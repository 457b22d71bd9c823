"""Work at another torch thread count, in a child process: `python -m attnviz.bench ARGS`.

torch's thread count is process-wide, so a shared server (the app) never changes it; a sweep point
or a calibration at another count runs in the CLI, a process of its own, with a hard timeout.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnviz.base.jobs import Deadline, JobTimeout
from attnviz.latency.results import COLUMNS, config_spec, read_results
from attnviz.weights.catalogue import BUNDLED

CHILD_GRACE_S = 60.0      # a child sweep is killed this long after its deadline (start-up, last point, CSV)
CALIBRATE_TIMEOUT_S = 300.0  # a child calibration is killed after this
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
STOPPED_EXIT = 3          # the CLI's exit status when --deadline stopped it (the CSV holds what it measured)
MAX_SECONDS = 7 * 24 * 3600.0  # the CLI's largest --max-seconds / --deadline: a week (a typo beyond it is refused)


def tail(text: str, chars: int = 300) -> str:
    """The last non-empty line of a child's stderr (its error message), shortened."""
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "no message")[-chars:]


def run_child(args: list[str], timeout: float | None, what: str) -> subprocess.CompletedProcess:
    """`python -m attnviz.bench ARGS` in a child process (its own torch thread count), killed after
    `timeout` seconds."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    try:
        return subprocess.run([sys.executable, "-m", "attnviz.bench", *args], capture_output=True, text=True,
                              env=env, cwd=str(PACKAGE_ROOT), timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise JobTimeout(f"{what} stopped at its time limit of {timeout:,.0f} s (a separate process, "
                         "stopped)") from None
    except OSError as err:
        raise ValueError(f"{what} could not start a separate process: {err}") from None


def child_model_arg(key: str, model) -> str:
    """What the child loads for this model: its key when it can load it, else a random model of its shape."""
    key = key.strip()
    if key.startswith("synthetic:") or key in BUNDLED or os.path.isdir(key):
        return key
    return config_spec(model.cfg)


def measure_in_child(plan, models: dict, threads: int, deadline: Deadline | None) -> tuple[list, bool]:
    """The cpu rows of `plan` (a `sweep.SweepPlan`) at `threads` threads, measured by the CLI in a
    child process, and whether the deadline stopped it (the rows are then those it finished)."""
    args = {key: child_model_arg(key, model) for key, model in models.items() if key in plan.models}
    argv = [a for key in plan.models for a in ("--model", args[key])]
    variants = [v if isinstance(v, str) else v.name for v in plan.variants]
    argv += ["--seq-lens", ",".join(str(int(n)) for n in plan.seq_lens), "--variants", ",".join(variants),
             "--heads", "all" if plan.heads is None else ",".join(str(int(k)) for k in plan.heads),
             "--threads", str(int(threads)), "--repeats", str(plan.repeats), "--warmup", str(plan.warmup),
             "--backend", "cpu", "--clock", plan.clock, "--max-seconds", repr(MAX_SECONDS), "--no-crossover",
             "--dtype", ",".join(plan.measured_dtypes())]  # the one-block crossover is measured by the caller
    if not plan.memory:
        argv.append("--no-memory")
    timeout = None
    if deadline is not None and deadline.seconds is not None:
        remaining = max(deadline.remaining, 0.0)
        argv += ["--stop-at", repr(time.time() + remaining)]
        timeout = remaining + CHILD_GRACE_S
    what = f"measuring at {threads} threads"
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "sweep.csv")
        out = run_child(argv + ["--out", out_file], timeout, what)
        if out.returncode not in (0, STOPPED_EXIT) or not os.path.isfile(out_file):
            raise ValueError(f"{what} in a separate process failed: {tail(out.stderr)}")
        with open(out_file, "rb") as f:
            data = f.read()
    stopped = out.returncode == STOPPED_EXIT
    if stopped and len(data.strip().splitlines()) < 2:  # stopped before its first point
        return [], True
    df = read_results(data)
    back = {arg: key for key, arg in args.items()}
    df["model"] = df["model"].map(lambda m: back.get(m, m))
    df["shape"] = df["model"].map(lambda m: config_spec(models[m].cfg) if m in models else None)
    return df.reindex(columns=COLUMNS).to_dict("records"), stopped
