"""A sweep's per-run records: what its report is made of, small enough to commit.

`python -m seq2seq.research.sweep --workdir=DIR --table --output=docs/NAME.md` reads the runs in
DIR and also writes docs/runs/NAME.jsonl (`path_for`): a first line with the sweep (its
commands, the runs not finished, the command that made the report, the baseline), then one
line per finished run, every figure of `Result` (variant, size, seed, rate, FLOPs,
the validation curve, final NLL and its count of validation tokens, test BLEU and chrF,
validation BLEU and chrF where the run translated the validation set, time, hardware,
command, the commit it trained from). `read_run` reads them from a run's files. From that
file alone

  python -m seq2seq.research.sweep --records=docs/runs/NAME.jsonl --table --output=docs/NAME.md

makes the same report, tables, tests and plots, with no workdir (tests/test_sweep.py checks
that the two agree).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import statistics
from collections.abc import Iterable

from seq2seq import metrics, provenance
from seq2seq.errors import DataError
from seq2seq.files import write_atomic


@dataclasses.dataclass
class Result:
  name: str
  variant: str
  size: str
  seed: int
  params: float
  flops: float  # training (forward + backward) matmul FLOPs per target token
  steps_per_s: float
  early_nll: float  # validation NLL at the evaluation nearest 25% of the steps
  final_nll: float
  bleu: dict[str, float]  # test set -> BLEU at the last step
  curve: list[tuple[float, float]]  # (training FLOPs so far, validation NLL) at each evaluation
  command: str = ""
  hardware: str = ""
  learning_rate: float = math.nan  # the peak of the schedule
  train_seconds: float = math.nan  # training wall time, summed over restarts
  eval_seconds: float = math.nan  # test-set translation, summed over the test sets
  commit: str = ""  # the code it trained from (seq2seq.provenance.commit_of); "" before runs recorded it
  val_tokens: int = 0  # the validation set's target tokens, NLL's denominator: one tokenization's runs compare
  chrf: dict[str, float] = dataclasses.field(default_factory=dict)  # test set -> chrF, beside `bleu`
  val_bleu: float = math.nan  # the validation split translated at the last step, where the run did
  val_chrf: float = math.nan  # (sweeps since 2026-11-28 do: runs.Run.evaluated)


def own_search(found: list[dict], config: dict) -> dict | None:
  """Of a checkpoint's results, one per search (a later seq2seq-eval with other settings adds
  files), the one decoded with the run's own beam size and alpha; else the first."""
  own = {k: config["eval"][k] for k in ("beam_size", "alpha")}
  return next((r for r in found if {k: r["decode"][k] for k in own} == own), found[0]) if found else None


def last_validation(logged: list[dict]) -> dict:
  """The validation record of the last step in a run's metrics ({} if none)."""
  return max((r for r in logged if "val_nll" in r), key=lambda r: r["step"], default={})


def read_run(workdir: pathlib.Path, entry: dict) -> Result | None:
  """A finished run's figures (None while it has no test-set result at its last step)."""
  from seq2seq.inference import evaluate
  from seq2seq.model import flops, transformer
  from seq2seq.model.config import ModelConfig

  config_path = workdir / "config.json"
  if not config_path.is_file():
    return None
  config = json.loads(config_path.read_text())
  steps = config["train"]["steps"]

  def scored(split: str) -> dict | None:
    """The split's result at the last step."""
    return own_search(evaluate.saved_results(workdir / "eval", evaluate.result_name(split), f"step{steps}"), config)

  bleu, chrf, hardware, eval_seconds = {}, {}, "", 0.0
  for split in config["data"]["test_splits"]:
    if not (result := scored(split)):
      return None
    stem = evaluate.result_name(split)
    bleu[stem], chrf[stem], hardware = result["bleu"], result.get("chrf", math.nan), result.get("hardware", "")
    eval_seconds += result.get("seconds", math.nan)
  data = config["data"]
  val = (scored(data["validation_split"]) if data.get("validation_split") else None) or {}
  cfg = ModelConfig.from_config(config["model"], data["vocab_size"])
  length = data.get("pack_length") or data["max_len"]  # FLOPs of rows of this length, per position
  per_token = flops.train_step_flops(cfg, 1, length, length) / length
  records = metrics.read(workdir)
  train = [r for r in records if "loss" in r]
  evals = [r for r in records if "val_nll" in r]
  if not train or not evals:
    raise DataError(f"{workdir / 'metrics.jsonl'}: no training or validation records for a finished run")
  rates = [(b["step"] - a["step"]) / (b["wall_time_s"] - a["wall_time_s"]) for a, b in zip(train, train[1:])
           if b["step"] > a["step"] and b.get("wall_time_s", 0) > a.get("wall_time_s", 0)]
  tokens, done, curve = 0.0, 0, []
  for r in sorted(evals, key=lambda r: r["step"]):
    tokens += sum(t.get("tokens", 0.0) for t in train if done < t["step"] <= r["step"])
    done = r["step"]
    curve.append((tokens * per_token, r["val_nll"]))
  last = last_validation(evals)
  early = min(evals, key=lambda r: abs(r["step"] - steps / 4))
  train_seconds = max((r["wall_time_s"] for r in train if "wall_time_s" in r), default=math.nan)  # summed over restarts
  return Result(entry["name"], entry["variant"], entry["size"], entry["seed"], float(transformer.count_params(cfg)),
                per_token, statistics.median(rates) if rates else math.nan, early["val_nll"],
                last["val_nll"], bleu, curve, entry.get("command", ""), hardware,
                config["train"]["learning_rate"], train_seconds, eval_seconds, provenance.commit_of(workdir),
                int(last.get("val_tokens", 0)), chrf, val.get("bleu", math.nan), val.get("chrf", math.nan))


@dataclasses.dataclass(frozen=True)
class Sweep:
  results: list[Result]  # one per finished run
  missing: list[str]  # runs named but not finished
  sweeps: list[str]  # the commands that made the runs
  command: str  # the command that made the report
  baseline: str


def path_for(output: str | pathlib.Path) -> pathlib.Path:
  """docs/NAME.md -> docs/runs/NAME.jsonl."""
  output = pathlib.Path(output)
  return output.parent / "runs" / f"{output.stem}.jsonl"


def span(values: Iterable[int], sep: str = "–") -> str:
  """How a report quotes counts that may differ between runs: "3", or "3–4" (`sep` between)."""
  values = sorted(values)
  return str(values[0]) if values[0] == values[-1] else f"{values[0]}{sep}{values[-1]}"


def one_tokenization(runs: Iterable[tuple[str, int]], where: str | pathlib.Path) -> int:
  """The one count of validation tokens of the (name, val_tokens) `runs` (0: not recorded,
  ignored; 0 if none is), else a DataError: each NLL is a mean over them, so runs of other
  tokenizers (another vocabulary, another sentencepiece version on another machine) do not
  compare."""
  counts = {}
  for name, tokens in runs:
    if tokens:
      counts.setdefault(tokens, []).append(name)
  if len(counts) > 1:
    raise DataError(f"{where}: the runs have other validation token counts, so their NLLs do not compare: "
                    + "; ".join(f"{n} in {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"
                                for n, names in sorted(counts.items())))
  return next(iter(counts), 0)


def write(path: str | pathlib.Path, sweep: Sweep) -> None:
  one_tokenization(((r.name, r.val_tokens) for r in sweep.results), path)
  head = {"sweeps": sweep.sweeps, "missing": sweep.missing, "command": sweep.command, "baseline": sweep.baseline}
  lines = [json.dumps(head)] + [json.dumps(dataclasses.asdict(r)) for r in sweep.results]
  write_atomic(path, "".join(line + "\n" for line in lines))


def read_lines(path: str | pathlib.Path, what: str, build):
  """`build(head, runs)` of a records file's JSON lines (the first line the study's, then one
  per run); a missing or damaged file is a DataError naming it and `what` it should be."""
  path = pathlib.Path(path)
  try:
    head, *runs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return build(head, runs)
  except FileNotFoundError:
    raise DataError(f"{path} does not exist: `--table --output=...` on the study's workdir writes it") from None
  except (ValueError, KeyError, TypeError) as e:
    raise DataError(f"{path}: not {what} ({type(e).__name__}: {e})") from None


def read(path: str | pathlib.Path) -> Sweep:
  """The sweep a records file holds; a missing or damaged file is a DataError naming it."""
  sweep = read_lines(path, "a sweep's records file", lambda head, runs: Sweep(
      [Result(**{**run, "curve": [tuple(point) for point in run["curve"]]}) for run in runs],
      head["missing"], head["sweeps"], head["command"], head["baseline"]))
  one_tokenization(((r.name, r.val_tokens) for r in sweep.results), path)
  return sweep
