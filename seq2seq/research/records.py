"""A sweep's per-run records: what its report is made of, small enough to commit.

`python -m seq2seq.research.sweep --workdir=DIR --table --output=docs/NAME.md` reads the runs in
DIR and also writes docs/runs/NAME.jsonl (`path_for`): a first line with the sweep (its
commands, the runs not finished, the command that made the report, the baseline), then one
line per finished run, every figure of ablations.Result (variant, size, seed, rate, FLOPs,
the validation curve, final NLL and its count of validation tokens, test BLEU, time,
hardware, command, the commit it trained from). From that file alone

  python -m seq2seq.research.sweep --records=docs/runs/NAME.jsonl --table --output=docs/NAME.md

makes the same report, tables, tests and plots, with no workdir (tests/test_sweep.py checks
that the two agree).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Iterable

from seq2seq.errors import DataError
from seq2seq.files import write_atomic


@dataclasses.dataclass(frozen=True)
class Sweep:
  results: list  # ablations.Result, one per finished run
  missing: list[str]  # runs named but not finished
  sweeps: list[str]  # the commands that made the runs
  command: str  # the command that made the report
  baseline: str


def path_for(output: str | pathlib.Path) -> pathlib.Path:
  """docs/NAME.md -> docs/runs/NAME.jsonl."""
  output = pathlib.Path(output)
  return output.parent / "runs" / f"{output.stem}.jsonl"


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


def read(path: str | pathlib.Path) -> Sweep:
  """The sweep a records file holds; a missing or damaged file is a DataError naming it."""
  from seq2seq.research.ablations import Result

  path = pathlib.Path(path)
  try:
    head, *runs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    results = [Result(**{**run, "curve": [tuple(point) for point in run["curve"]]}) for run in runs]
    sweep = Sweep(results, head["missing"], head["sweeps"], head["command"], head["baseline"])
  except FileNotFoundError:
    raise DataError(f"{path} does not exist: `--table --output=...` on the sweep's workdir writes it") from None
  except (ValueError, KeyError, TypeError) as e:
    raise DataError(f"{path}: not a sweep's records file ({type(e).__name__}: {e})") from None
  one_tokenization(((r.name, r.val_tokens) for r in sweep.results), path)
  return sweep
