"""Architecture sweeps at one command: one training run per (variant, size, seed), each
evaluated, then the tables and plots (seq2seq/research/ablations.py).

  python -m seq2seq.research.sweep --config=configs/multi30k_sweep.py --workdir=DIR   # the default grid
  python -m seq2seq.research.sweep --config=... --workdir=DIR --variants=vanilla,swiglu --seeds=3
  python -m seq2seq.research.sweep --config=... --workdir=DIR --variants=vanilla,transformer++ \
      --sizes=small,base,large --seeds=1
  python -m seq2seq.research.sweep --config=... --workdir=DIR --variants=vanilla+lr0.004,transformer+++lr0.008 \
      --sizes=small,base,large --seeds=3   # each at its own peak learning rate (at the base size)
  python -m seq2seq.research.sweep --config=... --workdir=DIR --variants=prenorm,prenorm+rope --baseline=prenorm
  python -m seq2seq.research.sweep --config=... --workdir=DIR --list   # the runs as shell commands (an array job)
  python -m seq2seq.research.sweep --workdir=DIR --table [--output=docs/ablations.md]   # tables from the runs on disk
  python -m seq2seq.research.sweep --records=docs/runs/ablations.jsonl --table --output=docs/ablations.md  # from records

Variants are named bundles of overrides (seq2seq/research/variants.py); `--config.KEY=VALUE`
flags apply to every run, before the variant's own. Each run lives in DIR/NAME (NAME =
variant[@size]-sSEED) and is exactly `seq2seq-train ... && seq2seq-eval --workdir=DIR/NAME`,
as `--list` prints it, so rerunning the sweep skips finished runs (their test-set results
are on disk) and resumes unfinished ones from their checkpoints: a sweep may span several
sittings, and a killed one reruns only what is missing. DIR/sweep.json lists every run
the sweeps in DIR have named. `--table --output=docs/NAME.md` also writes the runs' records,
docs/runs/NAME.jsonl (seq2seq/research/records.py), which remake the report without DIR.
"""

from __future__ import annotations

import pathlib
import shlex
import sys

from absl import flags
from ml_collections import config_flags

from seq2seq.errors import ConfigError
from seq2seq import cli
from seq2seq.research import ablations, variants
# The runs' machinery, here by its old names too (Run, plan, execute, ...: seq2seq/research/runs.py).
from seq2seq.research.runs import MANIFEST, Run, execute, plan, run_all, user_overrides, write_manifest  # noqa: F401

_CONFIG = config_flags.DEFINE_config_file("config", None, "The base config (a shipped name or a file); "
                                          "--config.KEY=VALUE overrides apply to every run.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "The sweep's directory: one sub-directory per run.")
_VARIANTS = flags.DEFINE_list("variants", list(variants.DEFAULT),
                               f"Variants to run: {', '.join(variants.VARIANTS)}; a+b combines two, "
                               "and a last +lrRATE sets the peak learning rate at the base size.")
_SIZES = flags.DEFINE_list("sizes", ["base"], f"Model sizes ({', '.join(variants.SIZES)}): d_model and d_ff scaled.")
_SEEDS = flags.DEFINE_integer("seeds", 2, "Runs per variant and size, with config.seed, config.seed + 1, ...")
_LIST = flags.DEFINE_bool("list", False, "Print each run's commands, one line per run, and run nothing.")
_TABLE = flags.DEFINE_bool("table", False, "Only build the tables and plots from the runs in --workdir.")
_BASELINE = flags.DEFINE_string("baseline", "vanilla", "The variant the modifications table compares every row with.")
_OUTPUT = flags.DEFINE_string("output", "", "Where the markdown goes (plots beside it, the runs' records in "
                              "runs/NAME.jsonl beside that); default DIR/ablations.md.")
_RECORDS = flags.DEFINE_string("records", "", "With --table and --output: the report of a records file "
                               "(docs/runs/NAME.jsonl) instead of the runs in --workdir.")


def main(argv) -> None:
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {argv[1:]}")
  if _RECORDS.value:
    if not (_TABLE.value and _OUTPUT.value):
      raise ConfigError("--records takes --table and --output (the report to write)")
    print(ablations.write(None, _OUTPUT.value, records_path=_RECORDS.value))
    return
  if not _WORKDIR.value:
    raise ConfigError("--workdir is required (except with --records)")
  root = pathlib.Path(_WORKDIR.value)
  if _TABLE.value:
    print(ablations.write(root, _OUTPUT.value or root / "ablations.md", baseline=_BASELINE.value))
    return
  if _CONFIG.value is None:
    raise ConfigError("--config is required (except with --table)")
  config_arg = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--config="))
  runs = plan(_CONFIG.value, config_arg, user_overrides(sys.argv[1:]), _VARIANTS.value, _SIZES.value, _SEEDS.value)
  if _LIST.value:
    for run in runs:
      print(run.shell(root))
    return
  write_manifest(root, runs, shlex.join([*ablations.SWEEP.split(), *sys.argv[1:]]))
  failed = run_all(runs, root)
  print(ablations.write(root, _OUTPUT.value or root / "ablations.md", baseline=_BASELINE.value))
  if failed:
    raise SystemExit(f"{len(failed)} run(s) failed: {', '.join(failed)}; rerun the sweep to retry them")


if __name__ == "__main__":
  cli.run(main, __name__)
