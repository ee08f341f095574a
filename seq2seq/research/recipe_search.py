"""The main-job recipe search (docs/results.md#choosing-the-main-job-recipe), generated from
its committed run records, docs/runs/main_job_search.jsonl: one JSON line a run, with its
command, the commit that trained it, the validation curve (NLL on all of val, BLEU on its
first 500 sentences, every eval_every steps) and `eval.py --split=val` on all 1014 sentences
(latest checkpoint and the average of the last 5). No record holds a test-set figure.

  python -m seq2seq.research.recipe_search docs/runs/main_job_search.jsonl [--update=docs/results.md]
  python -m seq2seq.research.recipe_search docs/runs/main_job_search.jsonl --add=WORKDIR --call="..."

prints (or writes between the search markers) the search's question, protocol and limits
(from the records), every run, then the confirmatory seeds of the
chosen recipe, and of the main job as shipped until 2026-12-01 (3600 steps), against the former
default, of the main job re-tuned at 3600 steps and of the chosen recipe's 7000 steps against
it, of the main job in rows of 64 (4200 steps) against both, and of that job with bf16 logits
against it (COMPARISONS), with Welch's t-test
and Holm's correction over each table's three metrics (seq2seq/research/significance.py), and
what survives of each comparison.
NLLs compare only between runs of one tokenization (one count of validation tokens, recorded
as `val_tokens`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Callable

from seq2seq.files import write_atomic
from seq2seq.research import records as records_lib
from seq2seq.research import results, significance

START, END = "<!-- search:start -->", "<!-- search:end -->"
# Run-name prefixes of the confirmatory seeds: the former default, the chosen recipe (7000
# steps), the main job as shipped until 2026-12-01 (the chosen recipe in 3600 steps, rows of
# 128), its re-tuning at 3600 steps (a peak rate of 0.007) and the main job as shipped since
# (rows of 64, whose faster step buys 4200 steps in the same time), and that job with its
# teacher-forced logits in bf16 (model.logits_dtype=bfloat16, issue 62: the same seeds, so the
# same initialisation and batches); each comparison is (runs, against).
BASELINE, CHOSEN, SHIPPED, RETUNED = "default_s", "d128_drop02_s", "m30k_3600_s", "m30k_3600_lr007_s"
ROWS64 = "m30k_p64_"  # seed 0 (the README's run: it chose nothing) and seeds 1, 2
LOGITS_BF16 = "m30k_logits_bf16"  # seeds 0 (no suffix), 1, 2
LABELS = {BASELINE: "former default", CHOSEN: "chosen, 7000 steps", SHIPPED: "main job, 3600 steps",
          RETUNED: "peak rate 0.007, 3600 steps", ROWS64: "main job, rows of 64, 4200 steps",
          LOGITS_BF16: "main job, bf16 logits"}
COMPARISONS = [(CHOSEN, BASELINE), (SHIPPED, BASELINE), (RETUNED, SHIPPED), (CHOSEN, SHIPPED), (ROWS64, SHIPPED),
               (ROWS64, BASELINE), (LOGITS_BF16, ROWS64)]


@dataclasses.dataclass(frozen=True)
class Record:
  run: str
  call: str  # which device call trained it
  commit: str
  config: str  # the config's name at `commit`
  seed: int
  overrides: list[str]
  steps: int  # planned
  reached: int  # the last validated step
  status: str
  val_curve: list[dict]  # {"step", "nll", "bleu500"}
  val_tokens: int  # validation target tokens: the NLL is a mean over them, so runs compare only at one count
  val_eval: dict  # "latest" / "average5": {"bleu", "chrf", "checkpoint", "sentences", "hardware"}
  command: str
  settings: dict  # the run's config.json, less data.dir and data.cache_dir

  @property
  def nll(self) -> float:
    return self.val_curve[-1]["nll"] if self.val_curve else math.nan

  def full(self, metric: str, checkpoint: str = "latest") -> float:
    return self.val_eval.get(checkpoint, {}).get(metric, math.nan)


def load(path: str | pathlib.Path) -> list[Record]:
  return [Record(**json.loads(line)) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]


def record_of(workdir: pathlib.Path, call: str) -> Record:
  """A finished or stopped run's record, from its own files (config.json, metrics.jsonl,
  provenance.jsonl, eval/val.*.json): paths under the workdir's parent become WORK."""
  from seq2seq import metrics, provenance
  from seq2seq.inference import evaluate

  workdir = pathlib.Path(workdir).resolve()
  hide = lambda text: text.replace(str(workdir.parent), "WORK")
  settings = json.loads(hide((workdir / "config.json").read_text()))
  for key in ("dir", "cache_dir"):
    settings["data"].pop(key, None)
  first = json.loads((workdir / "provenance.jsonl").read_text().splitlines()[0])
  command = hide(first["command"])
  overrides = [a for a in command.split()[2:] if a.startswith("--config.") and not a.startswith("--config.seed=")]
  config = pathlib.Path(command.split("--config=")[1].split()[0]).stem
  logged = metrics.read(workdir)
  by_step = {r["step"]: r for r in logged if "val_nll" in r}  # a resumed run may validate a step again: the last wins
  curve = [{"bleu500": round(r.get("val_bleu", math.nan), 4), "nll": round(r["val_nll"], 6), "step": step}
           for step, r in sorted(by_step.items())]
  steps = settings["train"]["steps"]
  found = evaluate.saved_results(workdir / "eval", "val", f"step{steps}")
  val_eval = {}
  if latest := records_lib.own_search(found, settings):
    val_eval["latest"] = {k: round(latest[k], 4) if k in ("bleu", "chrf") else latest[k]
                          for k in ("bleu", "chrf", "checkpoint", "sentences", "hardware") if k in latest}
  reached = curve[-1]["step"] if curve else 0
  return Record(workdir.name, call, provenance.commit_of(workdir), config, settings["seed"], overrides, steps, reached,
                "exit 0" if reached == steps else f"stopped at step {reached}", curve,
                int(records_lib.last_validation(logged).get("val_tokens", 0)), val_eval, command, settings)


def add(path: str | pathlib.Path, workdir: str | pathlib.Path, call: str) -> None:
  """Appends (or replaces) `workdir`'s record in the records file at `path`."""
  new = record_of(pathlib.Path(workdir), call)
  kept = [r for r in load(path) if r.run != new.run] + [new]
  write_atomic(pathlib.Path(path), "".join(json.dumps(dataclasses.asdict(r), sort_keys=True) + "\n" for r in kept))


def _num(value: float, digits: int) -> str:
  return "-" if math.isnan(value) else f"{value:.{digits}f}"


def runs_table(records: list[Record]) -> str:
  lines = ["| run | trained on | config, seed | change | steps | validated to | val NLL | val BLEU (500) | "
           "val BLEU (all) | average of last 5 |", "|---|---|---|---|---|---|---|---|---|---|"]
  baseline_tokens = _tokens([b for b in records if b.run.startswith(BASELINE)])
  for r in records:
    change = ", ".join(o.removeprefix("--config.") for o in r.overrides) or "none"
    last = r.val_curve[-1] if r.val_curve else {"bleu500": math.nan}
    other_vocabulary = "*" if r.val_tokens != baseline_tokens else ""
    lines.append(f"| `{r.run}` | {r.call} (`{r.commit}`) | `{r.config}`, {r.seed} | {change} | {r.steps} | "
                 f"{r.reached} | {_num(r.nll, 3)}{other_vocabulary} | {_num(last['bleu500'], 2)} | {_num(r.full('bleu'), 2)} | "
                 f"{_num(r.full('bleu', 'average5'), 2)} |")
  return ("\n".join(lines) + "\n\n\\* NLL a token of another tokenization (its validation set has other tokens): not "
          "comparable with the other rows.\n")


def _tokens(records: list[Record]) -> int:
  """The one validation token count of `records` (a DataError if they differ)."""
  return records_lib.one_tokenization(((r.run, r.val_tokens) for r in records), "docs/runs/main_job_search.jsonl")


@dataclasses.dataclass(frozen=True)
class Metric:
  label: str
  name: str
  value: Callable[[Record], float]
  digits: int
  margin: float | None  # TOST margin for "equivalent" (sweeps.md#protocol); None where none is stated


METRICS = [  # the first is the primary metric
    Metric("validation NLL (primary)", "NLL", lambda r: r.nll, 3, 0.02),
    Metric("validation BLEU, 1014 sentences", "BLEU", lambda r: r.full("bleu"), 2, 0.5),
    Metric("validation chrF, 1014 sentences", "chrF", lambda r: r.full("chrf"), 2, None),
]
MARGINS_TEXT = " or ".join(f"±{m.margin:g} {m.name}" for m in METRICS if m.margin)  # the TOST margins, as reports say them


def comparison(records: list[Record], runs: str = CHOSEN, against: str = BASELINE
               ) -> tuple[list[tuple[str, list[float], list[float], significance.Welch]], list[float]]:
  """Each metric's (label, values of the runs named `runs`*, values of those named
  `against`*, Welch test), and Holm's adjusted p-values."""
  chosen = [r for r in records if r.run.startswith(runs)]
  base = [r for r in records if r.run.startswith(against)]
  _tokens(chosen + base)
  rows = []
  for metric in METRICS:
    a, b = [metric.value(r) for r in chosen], [metric.value(r) for r in base]
    rows.append((metric.label, a, b, significance.welch(a, b)))
  return rows, significance.holm([w.p for *_, w in rows])


def readings(rows: list[tuple[str, list[float], list[float], significance.Welch]], adjusted: list[float]) -> list[str]:
  """Each metric's reading of a `comparison`: differs (Holm), equivalent (TOST within the
  metric's margin, where one is stated) or inconclusive (sweeps.md#protocol)."""
  found = []
  for (_, a, b, _), p_holm, metric in zip(rows, adjusted, METRICS):
    reading = significance.reading(p_holm, significance.tost(a, b, metric.margin) if metric.margin else None)
    found.append(f"{reading} (±{metric.margin:g})" if reading == "equivalent" else reading)
  return found


def comparison_table(records: list[Record], runs: str = CHOSEN, against: str = BASELINE) -> str:
  """The comparison, with each metric's reading."""
  rows, adjusted = comparison(records, runs, against)
  found = readings(rows, adjusted)
  seeds = lambda prefix: ", ".join(str(r.seed) for r in sorted(records, key=lambda r: r.seed) if r.run.startswith(prefix))
  lines = [f"| metric | {LABELS[runs]} (seeds {seeds(runs)}) | {LABELS[against]} (seeds {seeds(against)}) | "
           "difference [95% interval] | Welch p | Holm p | reading |",
           "|---|---|---|---|---|---|---|"]
  for (label, a, b, w), p_holm, metric, reading in zip(rows, adjusted, METRICS, found):
    digits = metric.digits
    side = lambda v: "{0:.{2}f} ± {1:.{2}f}".format(*significance.summary(v)[:2], digits)
    lines.append(f"| {label} | {side(a)} | {side(b)} | {w.difference:+.{digits}f} "
                 f"[{w.low:+.{digits}f}, {w.high:+.{digits}f}] | {w.p:.2g} | {p_holm:.2g} | {reading} |")
  return "\n".join(lines) + "\n"


def _made(records: list[Record]) -> list[tuple[str, str]]:
  """The comparisons (COMPARISONS) whose two sides both have runs."""
  return [(runs, against) for runs, against in COMPARISONS
          if any(r.run.startswith(runs) for r in records) and any(r.run.startswith(against) for r in records)]


def scope(records: list[Record]) -> list[str]:
  """The search's question, protocol and the limits its records set, from the records themselves."""
  made = _made(records)
  confirm = {r.run for r in records for pair in made for prefix in pair if r.run.startswith(prefix)}
  sides = [sum(r.run.startswith(prefix) for r in records) for pair in made for prefix in pair]
  where = sorted({r.call.split(" ", 1)[-1].split(" call")[0].removeprefix("CPU, ") for r in records})
  tokens = sorted({r.val_tokens for r in records})
  limits = [f"each table is its own family of {len(METRICS)} tests (Holm over its metrics), not the page's "
            f"{len(METRICS) * len(made)}: the README's claims are corrected in one family of their own "
            "(docs/findings.md#one-family)",
            f"{len(records) - len(confirm)} of the {len(records)} runs are in no comparison: single runs (a stage's "
            "probes, reruns and reproductions), untested: none is read as a finding",
            *([f"{records_lib.span(sides, ' to ')} seeds a side: Welch's degrees of freedom are {min(sides) - 1} to "
               f"{2 * max(sides) - 2}, so only large differences count"] if made else []),
            f"the runs trained on {len(where)} kinds of machine ({', '.join(where)}): wall times compare only "
            "within one sitting on one machine",
            (f"{len(tokens)} tokenizations ({', '.join(f'{t:,}' for t in tokens)} validation target tokens): NLLs "
             "compare only within one (the starred rows), BLEU and chrF across" if len(tokens) > 1 else
             f"one tokenization ({tokens[0]:,} validation target tokens)"),
            "one dataset, one direction (en→de) and models of this budget's size: a recipe for the budget, not a "
            "claim about larger models or corpora"]
  return ["**Question.** Which recipe, trained in the main job's budget on a 2-core CPU, gives the lowest final "
          "validation NLL (primary) and the highest validation BLEU and chrF on all 1014 sentences (secondary), "
          "and do its confirmatory seeds differ from those of the recipes it replaces?", "",
          f"**Protocol.** {len(records)} runs, each with its record (command, commit, validation curve, "
          "`eval.py --split=val`); no record holds a test-set figure, so no choice read one. A setting is chosen "
          "by seed 0 and tested by seeds that did not choose it; each comparison below is "
          "Welch's t-test per metric on those seeds with Holm's correction over its three metrics, and the "
          f"equivalence test (TOST) at {MARGINS_TEXT}.", "",
          "**Limits.** " + "; ".join(limits)[0].upper() + "; ".join(limits)[1:] + ".", ""]


def survives(records: list[Record]) -> list[str]:
  """One line a comparison: each metric's reading and difference."""
  out = []
  for runs, against in _made(records):
    rows, adjusted = comparison(records, runs, against)
    found = ", ".join(f"{metric.name} {w.difference:+.{metric.digits}f} {reading}".replace("-", "−")
                      for (_, _, _, w), metric, reading in zip(rows, METRICS, readings(rows, adjusted)))
    out.append(f"- {LABELS[runs]} against {LABELS[against]}: {found}.")
  return ["What survives (each comparison: each metric's difference and reading):", "", *out, ""] if out else []


def report(records: list[Record]) -> str:
  """The search's question, protocol and limits, the runs' table, then each comparison whose
  runs exist and what survives of them."""
  made = _made(records)
  return ("\n".join(scope(records)) + "\n" + runs_table(records)
          + "".join("\n" + comparison_table(records, *pair) for pair in made)
          + (f"\nReading: differs (Holm p < 0.05), equivalent (TOST within {MARGINS_TEXT}) or inconclusive.\n\n"
             + "\n".join(survives(records)) if made else ""))


def main(argv: list[str] | None = None) -> None:
  from absl import flags

  workdir = flags.DEFINE_string("add", "", "First append (or replace) this run's record, made from its workdir.")
  call = flags.DEFINE_string("call", "", "With --add: where and when it trained, e.g. '2026-11-29 CPU, 2-core AMD EPYC'.")

  def make(args):
    if workdir.value:
      add(args[0], workdir.value, call.value)
    return report(load(args[0]))

  results.marked_command(__name__, "python -m seq2seq.research.recipe_search RECORDS.jsonl [--add=WORKDIR --call=WHERE] "
                         "[--update=FILE]", make, 1, START, END, argv)


if __name__ == "__main__":
  main()
