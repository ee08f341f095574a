"""The length-extrapolation study of position encodings at one command (issue 49, part 4):
train each position type on short pairs, then measure BLEU and NLL on sources up to several
times that length (docs/positions.md).

  python -m seq2seq.research.positions --config=configs/multi30k_positions.py --workdir=DIR   # 4 types x 3 seeds
  python -m seq2seq.research.positions --config=... --workdir=DIR --positions=sinusoidal,learned --seeds=1
  python -m seq2seq.research.positions --config=... --workdir=DIR --list   # the runs as shell commands (an array job)
  python -m seq2seq.research.positions --workdir=DIR --table --output=docs/positions.md   # the report from the runs
  python -m seq2seq.research.positions --records=docs/runs/positions.jsonl --table --output=docs/positions.md  # records
  python -m seq2seq.research.positions --evaluate --workdir=DIR/NAME   # one trained run's evaluation

Each run is a sweep run (seq2seq/research/runs.py): DIR/NAME, NAME = variant-sSEED, the
variant being --base with the position type's override (`prenorm`, `prenorm+learned`,
`prenorm+rope`, `prenorm+relative`), and exactly `seq2seq-train ... && python -m
seq2seq.research.positions --evaluate --workdir=DIR/NAME --joins=...` as `--list` prints it.
Rerunning the study skips finished runs and resumes the others; DIR/sweep.json lists them.

The training length L is the config's data.max_len (the pipeline drops pairs longer than L
tokens on either side); the evaluation (seq2seq/research/lengths.py) translates and scores
the config's validation and test sets, and their pairs joined k at a time, and refuses any
source the model would cut. The report buckets sources at multiples of L.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shlex
import sys

from absl import flags
from ml_collections import config_flags

from seq2seq import cli
from seq2seq.errors import ConfigError
from seq2seq.research import lengths, positions_report, runs as sweep_runs, variants

POSITIONS = ("sinusoidal", "learned", "rope", "relative")

_CONFIG = config_flags.DEFINE_config_file("config", None, "The study's config (a shipped name or a file); "
                                          "--config.KEY=VALUE overrides apply to every run.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "The study's directory, one sub-directory per run; with --evaluate, "
                               "the run's.")
_POSITIONS = flags.DEFINE_list("positions", list(POSITIONS), "Position types to compare (config.model.positions); "
                               "by default those this version's model offers.")
_BASE = flags.DEFINE_string("base", "prenorm", "The variant (seq2seq/research/variants.py) whose positions each run "
                            "replaces.")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Runs per position type, with config.seed, config.seed + 1, ...")
_JOINS = flags.DEFINE_list("joins", ["1", "2", "3", "4"], "Evaluate each pair, and k consecutive pairs joined into "
                           "one for each further k.")
_SPLITS = flags.DEFINE_list("splits", [], "Evaluation sets (default: the config's validation and test splits).")
_LIST = flags.DEFINE_bool("list", False, "Print each run's commands, one line per run, and run nothing.")
_TABLE = flags.DEFINE_bool("table", False, "Only write the report from the runs in --workdir.")
_EVALUATE = flags.DEFINE_bool("evaluate", False, "Evaluate the trained run in --workdir by source length.")
_OUTPUT = flags.DEFINE_string("output", "", "Where the report goes: between the markers of an existing markdown file "
                              "(docs/positions.md), else a new file; the plot beside it. Default DIR/positions.md.")
_BASELINE = flags.DEFINE_string("baseline", "sinusoidal", "The position type every other is tested against.")
_RECORDS = flags.DEFINE_string("records", "", "With --table and --output: the results of a records file "
                               "(docs/runs/NAME.jsonl, written beside every report) instead of the runs in --workdir.")
_MULTIPLES = flags.DEFINE_list("multiples", ["1", "2", "3", "4"], "Bucket edges as multiples of the training length.")

MODULE = "seq2seq.research.positions"


@dataclasses.dataclass(frozen=True)
class StudyRun(sweep_runs.Run):
  """A sweep run whose evaluation is the study's: `--evaluate` with these flags."""
  evaluation: tuple[str, ...] = ()

  def commands(self, root: pathlib.Path) -> list[list[str]]:
    train = super().commands(root)[0]
    return [train, ["python", "-m", MODULE, "--evaluate", f"--workdir={self.workdir(root)}", *self.evaluation]]

  def finished(self, root: pathlib.Path) -> bool:
    return self.trained(root) and bool(lengths.saved(self.workdir(root) / "eval", self.steps))


def variant_names(base: str, positions: list[str], model: dict, vocab_size: int) -> list[str]:
  """The variant of each position type on `base`: the base itself where it has those
  positions, else base+type (the sweep's names: `learned` on vanilla, `prenorm+learned`)."""
  own = variants.overrides(base, model, vocab_size)["model.positions"]
  names = []
  for kind in positions:
    if kind != own and kind not in variants.VARIANTS:
      raise ConfigError(f"--positions: no variant sets positions {kind!r} on --base={base} (it has {own}); "
                        f"known: {', '.join(POSITIONS)}")
    names.append(base if kind == own else kind if base == "vanilla" else f"{base}+{kind}")
  return names


def plan(config, config_arg: str, overrides: list[str], base: str, positions: list[str], seeds: int,
         joins: list[int], splits: list[str] = ()) -> list[StudyRun]:
  """The study's runs, seeds outermost (a study cut short has every position type of the first seed)."""
  if len(set(positions)) != len(positions) or not positions:
    raise ConfigError(f"--positions must name each position type once, got {positions}")
  if not joins or min(joins) < 1:
    raise ConfigError(f"--joins must be numbers >= 1 (1: each pair as it is), got {joins}")
  names = variant_names(base, positions, config.model.to_dict(), config.data.vocab_size)
  evaluation = (f"--joins={','.join(map(str, joins))}",) + ((f"--splits={','.join(splits)}",) if splits else ())
  return [StudyRun(**{f.name: getattr(run, f.name) for f in dataclasses.fields(run)}, evaluation=evaluation)
          for run in sweep_runs.plan(config, config_arg, overrides, names, ["base"], seeds)]


def evaluate_run(workdir: pathlib.Path, joins: list[int], splits: list[str]) -> pathlib.Path:
  """Translates and scores the run's evaluation sets at its last step (lengths.evaluate),
  writes DIR/eval/lengths.CHECKPOINT.SEARCH.json and prints BLEU and NLL per bucket."""
  from seq2seq import data
  from seq2seq.inference import evaluate, load
  from seq2seq.inference.translate import Translator

  config = load.run_config(workdir)
  translator = Translator.from_workdir(workdir, checkpoint=int(config.train.steps))
  names = list(dict.fromkeys(splits or [config.data.validation_split, *config.data.test_splits]))
  record = lengths.evaluate(translator, {evaluate.result_name(s): data.eval_pairs(config, s) for s in names}, joins)
  record["hardware"] = evaluate.hardware()
  path = lengths.write(workdir / "eval", record, translator.settings.name())
  print(f"{workdir}: {len(record['sentences']['source'])} sentences of {', '.join(names)} (joined by "
        f"{', '.join(map(str, joins))}) in {record['translate_seconds'] + record['score_seconds']:.1f} s; {path}")
  for row in lengths.scores(record["sentences"], lengths.edges(int(config.data.max_len))):
    print(f"  {row['label']:>8} tokens: {row['sentences']:5d} sentences ({row['joined']} joined)  "
          f"BLEU {row['bleu']:6.2f}  NLL {row['nll']:.3f}")
  return path


def numbers(values: list[str], flag: str, kind=int) -> list:
  try:
    return [kind(v) for v in values]
  except ValueError:
    raise ConfigError(f"{flag} takes numbers separated by commas, got {','.join(values)}") from None


def main(argv) -> None:
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {argv[1:]}")
  joins, multiples = numbers(_JOINS.value, "--joins"), numbers(_MULTIPLES.value, "--multiples", float)
  if _RECORDS.value:
    if not (_TABLE.value and _OUTPUT.value):
      raise ConfigError("--records takes --table and --output (the page to write)")
    print(positions_report.write(None, _OUTPUT.value, multiples=multiples, records_path=_RECORDS.value))
    return
  if not _WORKDIR.value:
    raise ConfigError("--workdir is required (except with --records)")
  root = pathlib.Path(_WORKDIR.value)
  if _EVALUATE.value:
    evaluate_run(root, joins, _SPLITS.value)
    return
  output = _OUTPUT.value or root / "positions.md"
  if _TABLE.value:
    print(positions_report.write(root, output, baseline=_BASELINE.value, multiples=multiples))
    return
  if _CONFIG.value is None:
    raise ConfigError("--config is required (except with --table or --evaluate)")
  positions = _POSITIONS.value
  if not _POSITIONS.present:  # the default: every type this version's model offers
    positions = [p for p in positions if p == "sinusoidal" or variants.available(p)]
    for kind in sorted(set(POSITIONS) - set(positions)):
      print(f"note: positions={kind} is not in this version's model: left out", file=sys.stderr)
  config_arg = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--config="))
  runs = plan(_CONFIG.value, config_arg, sweep_runs.user_overrides(sys.argv[1:]), _BASE.value, positions,
              _SEEDS.value, joins, _SPLITS.value)
  if _LIST.value:
    for run in runs:
      print(run.shell(root))
    return
  sweep_runs.write_manifest(root, runs, shlex.join(["python", "-m", MODULE, *sys.argv[1:]]))
  failed = sweep_runs.run_all(runs, root)
  print(positions_report.write(root, output, baseline=_BASELINE.value, multiples=multiples))
  if failed:
    raise SystemExit(f"{len(failed)} run(s) failed: {', '.join(failed)}; rerun the study to retry them")


if __name__ == "__main__":
  cli.run(main, __name__)
