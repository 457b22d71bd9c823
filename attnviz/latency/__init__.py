"""Layer 5, latency (beside analysis): what a forward pass costs. `measure` (one point here: time
with the one timer, peak memory), `costmodel` (ops, device profiles, predict), `calibrate` (this
host's profile, profiles fitted to a device's CSV), `sweep` (plans, estimates, budgets, run_sweep),
`child` (other thread counts in a child process), `results` (the CSV), `compare` (fits, model
error, speed-ups of results), `speedup` (prune and measure), `latency_answers` and `int8_story` (the
headline answers as sentences; int8 modelled on the Pi beside measured here), `cli` (`python -m attnviz.bench`).

Imports: attnviz.base, core, toys, weights.
"""
