"""Architecture sweeps at one command: one training run per (variant, size, seed), each
evaluated, then the tables and plots (seq2seq/research/ablations.py).

  python -m seq2seq.research.sweep --config=configs/multi30k_sweep.py --workdir=DIR   # the default grid
  python -m seq2seq.research.sweep --config=... --workdir=DIR --variants=vanilla,swiglu --seeds=3
  python -m seq2seq.research.sweep --config=... --workdir=DIR --variants=vanilla,transformer++ \
      --sizes=small,base,large --seeds=1
  python -m seq2seq.research.sweep --config=... --workdir=DIR --variants=prenorm,prenorm+rope --baseline=prenorm
  python -m seq2seq.research.sweep --config=... --workdir=DIR --list   # the runs as shell commands (an array job)
  python -m seq2seq.research.sweep --workdir=DIR --table [--output=docs/ablations.md]   # tables from the runs on disk

Variants are named bundles of overrides (seq2seq/research/variants.py); `--config.KEY=VALUE`
flags apply to every run, before the variant's own. Each run lives in DIR/NAME (NAME =
variant[@size]-sSEED) and is exactly `seq2seq-train ... && seq2seq-eval --workdir=DIR/NAME`,
as `--list` prints it, so rerunning the sweep skips finished runs (their test-set results
are on disk) and resumes unfinished ones from their checkpoints: a sweep may span several
sittings, and a killed one reruns only what is missing. DIR/sweep.json lists every run
the sweeps in DIR have named.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import pathlib
import shlex
import signal
import subprocess
import sys

from absl import flags
from ml_collections import config_flags

from seq2seq.errors import ConfigError
from seq2seq import cli
from seq2seq.research import ablations, variants
from seq2seq.inference import evaluate

_CONFIG = config_flags.DEFINE_config_file("config", None, "The base config (a shipped name or a file); "
                                          "--config.KEY=VALUE overrides apply to every run.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "The sweep's directory: one sub-directory per run.", required=True)
_VARIANTS = flags.DEFINE_list("variants", list(variants.DEFAULT),
                               f"Variants to run: {', '.join(variants.VARIANTS)}; a+b combines two.")
_SIZES = flags.DEFINE_list("sizes", ["base"], f"Model sizes ({', '.join(variants.SIZES)}): d_model and d_ff scaled.")
_SEEDS = flags.DEFINE_integer("seeds", 2, "Runs per variant and size, with config.seed, config.seed + 1, ...")
_LIST = flags.DEFINE_bool("list", False, "Print each run's commands, one line per run, and run nothing.")
_TABLE = flags.DEFINE_bool("table", False, "Only build the tables and plots from the runs in --workdir.")
_BASELINE = flags.DEFINE_string("baseline", "vanilla", "The variant the modifications table compares every row with.")
_OUTPUT = flags.DEFINE_string("output", "", "Where the markdown goes (plots beside it); default DIR/ablations.md.")

MANIFEST = "sweep.json"


@dataclasses.dataclass(frozen=True)
class Run:
  name: str  # the sub-directory: variant[@size]-sSEED
  variant: str
  size: str
  seed: int
  train: tuple[str, ...]  # seq2seq-train's arguments
  splits: tuple[str, ...]  # the test sets eval writes, as file-name stems
  steps: int

  def workdir(self, root: pathlib.Path) -> pathlib.Path:
    return root / self.name

  def commands(self, root: pathlib.Path) -> list[list[str]]:
    workdir = str(self.workdir(root))
    return [["seq2seq-train", *self.train, f"--workdir={workdir}"], ["seq2seq-eval", f"--workdir={workdir}"]]

  def shell(self, root: pathlib.Path) -> str:
    return " && ".join(shlex.join(c) for c in self.commands(root))

  def trained(self, root: pathlib.Path) -> bool:
    return (self.workdir(root) / "checkpoints" / str(self.steps)).is_dir()

  def finished(self, root: pathlib.Path) -> bool:
    """Trained and evaluated at the last step on every test set."""
    evaluated = self.workdir(root) / "eval"
    return self.trained(root) and all(evaluate.saved_results(evaluated, split, f"step{self.steps}")
                                      for split in self.splits)


def user_overrides(argv: list[str]) -> list[str]:
  """The --config.KEY=VALUE flags of the command line, in order."""
  out = []
  for arg in argv:
    if arg.startswith("--config."):
      if "=" not in arg:
        raise ConfigError(f"write {arg} as {arg}=VALUE: the sweep passes overrides on to each run")
      out.append(arg)
  return out


def plan(config, config_arg: str, overrides: list[str], names: list[str], sizes: list[str], seeds: int) -> list[Run]:
  """The runs of a sweep, in order: seeds outermost, so a sweep cut short has every variant
  of the first seed."""
  if seeds < 1:
    raise ConfigError(f"--seeds must be >= 1, got {seeds}")
  for name in names:
    try:
      variants.parts(name)
    except ValueError as e:
      raise ConfigError(f"--variants: {e}") from None
  model = config.model.to_dict()
  splits = tuple(evaluate.result_name(s) for s in config.data.test_splits)
  runs = []
  for i in range(seeds):
    seed = config.seed + i
    for size in sizes:
      for name in names:
        changes = variants.overrides(name, model, config.data.vocab_size, size)
        changes |= variants.size_learning_rate(size, config.train.learning_rate)
        mine = {f"--config.{k}" for k in changes} | {"--config.seed"}
        kept = [o for o in overrides if o.split("=", 1)[0] not in mine]  # the variant's settings win
        train = (f"--config={config_arg}", *kept, *(variants.flag(k, v) for k, v in changes.items()),
                 f"--config.seed={seed}")
        label = name if size == "base" else f"{name}@{size}"
        runs.append(Run(f"{label}-s{seed}", name, size, seed, train, splits, config.train.steps))
  return runs


def write_manifest(root: pathlib.Path, runs: list[Run], command: str) -> None:
  """DIR/sweep.json: every run and sweep command so far (earlier sweeps' are kept)."""
  path = root / MANIFEST
  old = json.loads(path.read_text()) if path.is_file() else {"runs": [], "sweeps": []}
  known = {r["name"]: r for r in old["runs"]}
  sweeps = [c for c in dict.fromkeys(map(ablations.canonical, old.get("sweeps", []))) if c != command] + [command]
  for run in runs:
    known[run.name] = {"name": run.name, "variant": run.variant, "size": run.size, "seed": run.seed,
                       "command": run.shell(root)}
  root.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps({"runs": list(known.values()), "sweeps": sweeps}, indent=1) + "\n")
  tmp.replace(path)


def _die_with_parent() -> None:
  """In the child: SIGKILL when the sweep dies (Linux), so a killed sweep leaves no run
  training on in the background while a rerun resumes it."""
  try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass


def execute(run: Run, root: pathlib.Path) -> int:
  """Trains (resuming) and evaluates one run with this Python; its exit status."""
  modules = {"seq2seq-train": "seq2seq.commands.train", "seq2seq-eval": "seq2seq.commands.eval"}
  for command in run.commands(root):
    if command[0] == "seq2seq-train" and run.trained(root):
      continue
    status = subprocess.run([sys.executable, "-m", modules[command[0]], *command[1:]],
                            preexec_fn=_die_with_parent).returncode
    if status:
      return status
  return 0


def main(argv) -> None:
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {argv[1:]}")
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
  failed = []
  for i, run in enumerate(runs, 1):
    if run.finished(root):
      print(f"[{i}/{len(runs)}] {run.name}: finished already", flush=True)
      continue
    print(f"[{i}/{len(runs)}] {run.name}: {run.shell(root)}", flush=True)
    if execute(run, root):
      failed.append(run.name)
  print(ablations.write(root, _OUTPUT.value or root / "ablations.md", baseline=_BASELINE.value))
  if failed:
    raise SystemExit(f"{len(failed)} run(s) failed: {', '.join(failed)}; rerun the sweep to retry them")


if __name__ == "__main__":
  cli.run(main, __name__)
