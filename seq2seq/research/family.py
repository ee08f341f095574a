"""The README's research claims as one family: every final-NLL comparison of the committed
reports, with Holm's correction over all of them together (docs/findings.md#one-family).

Final validation NLL is the primary metric; BLEU and chrF are secondary and stay in their
reports. The family holds each report's every tested variant (not only those the README
names), the main job's recipe against the former default, and Transformer++ small against
vanilla's best size (`scaling_claim`). Where a report keeps per-run records (docs/runs/), each
test is computed from them; where it keeps none, from its table's printed mean ± std (3
decimals), so its p is flagged as from rounded figures.

  python -m seq2seq.research.family [--update=docs/findings.md]
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

from seq2seq.research import ablations, multiplier, recipe_search, records, results, significance

START, END = "<!-- family:start -->", "<!-- family:end -->"
REPORTS = ("docs/ablations.md", "docs/ablations_prenorm.md", "docs/ablations_prenorm_norms.md",
           "docs/ablations_scaling.md")
MAIN_JOB = "docs/runs/main_job_search.jsonl"
SCALING = "docs/ablations_scaling.md"  # also: Transformer++'s smallest size against vanilla's best size
EDGE = 0.005  # a corrected p this close to 0.05 is flagged: rounding could move it across


@dataclasses.dataclass(frozen=True)
class Claim:
  source: str
  comparison: str
  difference: float
  p: float  # two-sided, before the correction
  inputs: str  # what p was computed from


def _mean_std(cell: str) -> tuple[float, float] | None:
  found = re.match(r"([\d.]+) ± ([\d.]+)", cell.strip())
  return (float(found[1]), float(found[2])) if found else None


def report_claims(path: pathlib.Path, name: str) -> list[Claim]:
  """Each variant's final NLL against the report's baseline: from its runs' records
  (docs/runs/NAME.jsonl) where it keeps them, else from its first table's mean ± std."""
  if (kept := records.path_for(path)).is_file():
    sweep = records.read(kept)
    found = ablations.comparisons(sweep.results, baseline=sweep.baseline)
    return [Claim(name, f"`{c.variant}` − `{sweep.baseline}`", c.welch.difference, c.welch.p, "run records")
            for c in found if c.column == "Final loss" and c.welch.tested]
  text = path.read_text(encoding="utf-8")
  baseline = re.search(r"in brackets the difference to `([^`]+)`", text)[1]
  rows = {}
  for line in text.split("| Variant | Seeds |", 1)[1].splitlines()[2:]:
    if not line.startswith("| `"):
      break
    cells = [c.strip() for c in line.split("|")[1:-1]]
    rows[cells[0].strip("`")] = (int(cells[1]), _mean_std(cells[6]))
  base_n, base = rows.pop(baseline)
  claims = []
  for variant, (n, stats) in rows.items():
    if n >= 2 and base_n >= 2 and stats and base:
      w = significance.welch_summary(*stats, n, *base, base_n)
      claims.append(Claim(name, f"`{variant}` − `{baseline}`", w.difference, w.p, "table's mean ± std"))
  return claims


def claims(root: str | pathlib.Path = ".") -> list[Claim]:
  root = pathlib.Path(root)
  found = [c for name in REPORTS for c in report_claims(root / name, name)]
  searched = recipe_search.load(root / MAIN_JOB)

  def seeds(prefix: str) -> str:
    return ", ".join(str(r.seed) for r in searched if r.run.startswith(prefix))

  for against, name in ((recipe_search.CHOSEN, "main job: chosen recipe"),
                        (recipe_search.ROWS64, "main job as shipped, rows of 64, 4200 steps (CPU)")):
    if any(r.run.startswith(against) for r in searched):
      rows, _ = recipe_search.comparison(searched, against)
      *_, w = rows[0]  # validation NLL, the search's primary metric
      found.append(Claim(MAIN_JOB, f"{name}, seeds {seeds(against)} − former default (GPU), seeds "
                         f"{seeds(recipe_search.BASELINE)}", w.difference, w.p, "run records"))
  if (kept := records.path_for(root / SCALING)).is_file():
    found.append(scaling_claim(records.read(kept).results))
  return found


def scaling_claim(results: list) -> Claim:
  """Transformer++ at its smallest size against vanilla at the size where it ends lowest, each
  at its best rate there and reported by the seeds that did not choose it."""
  small, strong, size, weak = multiplier.smallest_against_best(results)
  w = significance.welch([r.final_nll for r in strong], [r.final_nll for r in weak])
  return Claim(SCALING, f"Transformer++ {small} − vanilla {size}, vanilla's best size (each at its best rate)",
               w.difference, w.p, "run records")


def table(found: list[Claim]) -> str:
  adjusted = significance.holm([c.p for c in found])
  lines = [f"| comparison | report | final NLL difference | p | Holm p (all {len(found)}) | reading | p from |",
           "|---|---|---|---|---|---|---|"]
  order = sorted(range(len(found)), key=lambda i: found[i].p)
  for i in order:
    c, p_holm = found[i], adjusted[i]
    edge = " (at the edge: within rounding of 0.05)" if abs(p_holm - significance.ALPHA) < EDGE else ""
    reading = ("differs" if significance.significant(p_holm) else "inconclusive") + edge
    difference = f"{c.difference:+.3f}".replace("-", "−")
    lines.append(f"| {c.comparison} | [{pathlib.Path(c.source).name}]({pathlib.Path(c.source).relative_to('docs')}) "
                 f"| {difference} | {c.p:.2g} | {p_holm:.2g} | {reading} | {c.inputs} |")
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
  results.marked_command(__name__, "python -m seq2seq.research.family [--update=docs/findings.md]",
                         lambda _: table(claims()), 0, START, END, argv)


if __name__ == "__main__":
  main()
