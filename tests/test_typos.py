"""Typos and impossible values are refused with what is allowed, before any work: CLI flags,
ATTNVIZ_* limits and the --out file."""
import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from attnviz.base import limits
from attnviz.latency import cli
from attnviz.latency import sweep

ROOT = Path(__file__).resolve().parents[1]
TINY = "synthetic:layers=2,d=32,heads=4,ff=64,vocab=50,positions=64"
PI_ONLY = ["--model", TINY, "--seq-lens", "8", "--backend", "pi4", "--no-crossover"]


def refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.main(list(argv))
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_an_unknown_dtype_is_refused_with_the_dtypes_there_are(capsys):
    err = refused(PI_ONLY + ["--dtype", "fp7"], capsys)
    assert "unknown dtype fp7" in err and "fp32, fp16, bf16, int8, q8_0, q4_0" in err
    with pytest.raises(ValueError, match="unknown dtype fp7"):
        sweep.SweepPlan(models=[TINY], seq_lens=[8], dtypes=["fp32", "fp7"]).check()


@pytest.mark.parametrize("flag,value", [("--max-seconds", "1e308"), ("--deadline", "1e308"),
                                        ("--max-mem-mb", "1e308"), ("--deadline", "604801")])
def test_budgets_beyond_any_sweep_are_refused_with_the_largest_allowed(flag, value, capsys):
    err = refused(PI_ONLY + [flag, value], capsys)
    assert flag in err and repr(value) in err and "the largest allowed" in err


def test_a_week_is_still_a_budget(capsys):
    assert cli.main(PI_ONLY + ["--max-seconds", "604800", "--deadline", "604800"]) == 0


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "-0.5", "1e999"])
@pytest.mark.parametrize("name,cast", [("MAX_SWEEP_SECONDS", float), ("MAX_TEXT_CHARS", int)])
def test_an_attnviz_limit_that_is_nan_inf_or_negative_is_refused(monkeypatch, name, cast, value):
    monkeypatch.setenv(f"ATTNVIZ_{name}", value)
    if cast is int and value in ("nan", "inf", "-0.5", "1e999"):  # not whole numbers: the old message
        with pytest.raises(ValueError, match=f"ATTNVIZ_{name}.*not a valid int"):
            limits.Limits.from_env()
        return
    with pytest.raises(ValueError, match=f"ATTNVIZ_{name}='{value}' must be a finite number of at least 0"):
        limits.Limits.from_env()


def test_valid_attnviz_limits_still_apply(monkeypatch):
    monkeypatch.setenv("ATTNVIZ_MAX_SWEEP_SECONDS", "30.5")
    monkeypatch.setenv("ATTNVIZ_TORCH_THREADS", "0")
    got = limits.Limits.from_env()
    assert got.max_sweep_seconds == 30.5 and got.torch_threads == 0


def test_a_bad_limit_stops_the_app_at_start_with_its_message():
    env = dict(os.environ, ATTNVIZ_MAX_HEAVY_JOBS="-3")
    out = subprocess.run([sys.executable, "-c", "import attnviz.base.limits"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert out.returncode != 0 and "ATTNVIZ_MAX_HEAVY_JOBS='-3' must be a finite number of at least 0" in out.stderr


def test_out_a_folder_a_missing_folder_or_a_read_only_place_is_refused_before_the_sweep(tmp_path, capsys,
                                                                                     monkeypatch):
    ran = []
    monkeypatch.setattr(cli, "run_sweep", lambda *a, **k: ran.append(1))
    assert "is a folder; give a file name" in refused(PI_ONLY + ["--out", str(tmp_path)], capsys)
    assert "does not exist" in refused(PI_ONLY + ["--out", str(tmp_path / "no" / "r.csv")], capsys)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):  # root can write anywhere: the permission case needs a user
            assert "cannot be written" in refused(PI_ONLY + ["--out", str(locked / "r.csv")], capsys)
    finally:
        locked.chmod(0o700)
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(cli.shutil, "disk_usage", lambda p: Usage(10**9, 10**9, 4096))
    assert "is full (4,096 bytes free)" in refused(PI_ONLY + ["--out", str(tmp_path / "r.csv")], capsys)
    assert not ran


def test_a_write_that_fails_after_the_sweep_is_a_message_not_a_traceback(capsys):
    if not Path("/dev/full").exists():
        pytest.fail("this test writes to /dev/full (a Linux device whose writes fail with ENOSPC)")
    with pytest.raises(SystemExit) as exit_:
        cli.main(PI_ONLY + ["--out", "/dev/full"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "/dev/full" in err and ("No space left" in err or "is full" in err)
