"""Research tools built on the core: they train, evaluate and report, and nothing in the
core imports them (tests/test_layout.py).

  sweep.py         python -m seq2seq.research.sweep: one run per (variant, size, seed), resumable
  runs.py          a sweep's runs as shell commands: planned, listed in DIR/sweep.json, run, resumed
  positions.py     python -m seq2seq.research.positions: the length-extrapolation study of positions
  lengths.py       BLEU and NLL by source length (the study's per-run evaluation)
  positions_report.py  the study's tables, tests and plot (docs/positions.md)
  variants.py      the named architecture variants a sweep runs (vanilla, swiglu, transformer++, ...)
  ablations.py     a sweep's tables (mean ± std, Welch tests, Holm-corrected marks) and plots
  family.py        python -m seq2seq.research.family: the README's claims as one Holm family (docs/findings.md)
  records.py       a sweep's per-run records (docs/runs/NAME.jsonl), from which its report is remade
  significance.py  Welch's t-test with its interval, Holm's correction (scipy.stats)
  multiplier.py    Transformer vs Transformer++: vanilla's frontier, the compute multiplier and its interval
  results.py       python -m seq2seq.research.results DIR...: the results table from eval JSON
  plot.py          python -m seq2seq.research.plot DIR: PNGs from metrics.jsonl

The old command lines `python -m seq2seq.sweep`, `seq2seq.results` and `seq2seq.plot`
still run: seq2seq/sweep.py, results.py and plot.py forward to these.
"""
