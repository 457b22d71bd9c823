"""`python -m attnviz.bench`: the latency CLI (attnviz.latency.cli). Kept here so the command,
its flags and its CSV stay what users and scripts already call."""
from attnviz.latency.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
