"""The tables and plots of an architecture sweep (`python -m seq2seq.research.sweep`), from
the runs' own files: DIR/sweep.json (which runs), each run's config.json, metrics.jsonl and
eval/*.json. The statistics are seq2seq/research/significance.py's.

- The modifications table (Narang et al. 2021): per variant at the base size, parameters,
  training FLOPs per target token, steps/s, early loss (validation NLL at 25% of the
  steps), final validation NLL and BLEU on each test set; mean ± std over seeds and the
  difference to the baseline. Final NLL and BLEU are tested against the baseline (Welch's
  t-test, `comparisons`), with Holm's correction over every test of the table, and marked *
  where significant at 0.05 after it; a second table gives each test's n, 95% interval, p
  and adjusted p.
- Transformer vs Transformer++ (Gu & Dao 2023): validation NLL against training FLOPs at each
  size, and the compute multiplier: the FLOPs vanilla needs to reach Transformer++'s final
  NLL (mean over seeds), interpolated on the best-so-far frontier of vanilla's mean curves
  (over seeds) at all its sizes, over the FLOPs Transformer++ spent; with an interval where
  both sides have 2 seeds or more (`multipliers`). Each side at its best of the learning rates
  it ran (`vanilla+lr0.004`, `transformer+++lr0.008`, ...).
"""

from __future__ import annotations

import json
import math
import pathlib
import statistics

from seq2seq.errors import ConfigError
from seq2seq.files import write_atomic
from seq2seq.research import multiplier, records, significance
from seq2seq.research.records import Result, read_run
from seq2seq.research.significance import Comparison, summary

# (Result field, heading, format, scale); params and FLOPs are exact, so differences carry no mark.
COLUMNS = (("params", "Params", "{:.2f}M", 1e-6), ("flops", "FLOPs / token", "{:.2f}M", 1e-6),
           ("steps_per_s", "Steps/s", "{:.2f}", 1), ("early_nll", "Early loss", "{:.3f}", 1),
           ("final_nll", "Final loss", "{:.3f}", 1))
EXACT = ("params", "flops")
# The columns tested against the baseline, with BLEU on every test set: the outcomes. Steps/s
# depends on what else the machine ran, and early loss is a point of the final loss's curve,
# so theirs are shown untested rather than added to the family the correction divides by.
TESTED = ("final_nll",)
# The margins within which a difference counts as none (TOST, significance.tost): 0.02 nats of
# validation NLL and 0.5 BLEU, below what any change in these tables is worth adopting for.
MARGINS = {"Final loss": 0.02, "BLEU": 0.5}
# The sweep command. Manifests written before the research tools had their own package name
# it `python -m seq2seq.sweep`, which still runs (seq2seq/sweep.py forwards); they read as this.
SWEEP, OLD_SWEEP = "python -m seq2seq.research.sweep", "python -m seq2seq.sweep"


def canonical(command: str) -> str:
  """A sweep command in the current form: `python -m seq2seq.sweep ...` becomes `SWEEP ...`."""
  return SWEEP + command[len(OLD_SWEEP):] if command.startswith(OLD_SWEEP + " ") else command


def collect(root: pathlib.Path, reader=None, command: str = SWEEP) -> tuple[list, list[str], list[str]]:
  """(finished runs, names of the unfinished ones, the sweep commands) of the sweeps in `root`,
  each run read by `reader(workdir, manifest entry)` (`read_run`; None while unfinished)."""
  manifest = root / "sweep.json"
  if not manifest.is_file():
    raise ConfigError(f"{manifest} does not exist: run `{command} --config=... --workdir={root}` first")
  results, missing = [], []
  listed = json.loads(manifest.read_text())
  for entry in listed["runs"]:
    result = (reader or read_run)(root / entry["name"], entry)
    (results.append(result) if result else missing.append(entry["name"]))
  return results, missing, list(dict.fromkeys(canonical(c) for c in listed.get("sweeps", [])))


def _columns(splits: list[str]) -> list[tuple]:
  """The table's columns after Seeds: (heading, format, scale, value of a Result, exact, tested)."""
  out = [(head, fmt, scale, lambda r, key=key: getattr(r, key), key in EXACT, key in TESTED)
         for key, head, fmt, scale in COLUMNS]
  return out + [(f"BLEU {s}", "{:.2f}", 1, lambda r, s=s: r.bleu.get(s, math.nan), False, True) for s in splits]


def _signed(value: float, fmt: str) -> str:
  """+0.105 / −0.105 in the column's format, with a minus sign."""
  return ("+" if value >= 0 else "−") + fmt.format(abs(value)).rstrip("M")


def comparisons(results: list[Result], size: str = "base", baseline: str = "vanilla") -> list[Comparison]:
  """Welch's t-test and TOST of every variant at `size` against `baseline` in every tested
  column, in table order, with Holm's p over all of them (nan where a side has fewer than 2
  seeds: no test). Empty without the baseline. A rate search's runs count as
  multiplier.confirmatory says: a chosen rate by its confirmatory seeds only."""
  rows = [r for r in multiplier.confirmatory(results) if r.size == size]
  base = [r for r in rows if r.variant == baseline]
  if not base:
    return []
  out = []
  for v in _ordered({r.variant for r in rows}, baseline)[1:]:
    runs = [r for r in rows if r.variant == v]
    for head, fmt, scale, value, _, tested in _columns(sorted({s for r in rows for s in r.bleu})):
      if tested:
        values = [value(r) * scale for r in runs]
        mean, std, _ = summary(values)
        base_values = [value(r) * scale for r in base]
        margin = MARGINS["BLEU" if head.startswith("BLEU") else head]
        out.append(Comparison(v, head, (f"`{v}`", head), fmt, mean, std, significance.welch(values, base_values),
                              significance.tost(values, base_values, margin)))
  return significance.correct(out)


def _cell(values: list[float], baseline: list[float] | None, fmt: str, scale: float, exact: bool = False,
          marked: bool = False) -> str:
  """mean ± std, then the difference to the baseline: in percent for exact columns (params,
  FLOPs), else in the column's unit, with * where `marked` (significant after the correction)."""
  mean, std, n = summary([v * scale for v in values])
  if n == 0:
    return "–"
  text = fmt.format(mean) + (f" ± {fmt.format(std).rstrip('M')}" if n > 1 and std > 0 else "")
  if baseline is None:
    return text
  base = summary([v * scale for v in baseline])[0]
  diff = mean - base
  if exact:
    return text + (f" ({diff / base:+.2%})".replace("-", "−") if diff and base else "")
  if float(fmt.format(abs(diff)).rstrip("M")) == 0:
    return text
  return text + f" ({_signed(diff, fmt)}{'*' if marked else ''})"


def modifications_table(results: list[Result], size: str = "base", baseline: str = "vanilla") -> str:
  """Markdown: one row per variant at `size` (the baseline first), columns as in Narang et al.,
  with differences to the baseline, marked * where significant after Holm's correction."""
  rows = [r for r in multiplier.confirmatory(results) if r.size == size]
  variants = _ordered({r.variant for r in rows}, baseline)
  columns = _columns(sorted({s for r in rows for s in r.bleu}))
  by = {v: [r for r in rows if r.variant == v] for v in variants}
  base = by.get(baseline)
  marks = {(c.variant, c.column): significance.significant(c.adjusted) for c in comparisons(results, size, baseline)}
  head = ["Variant", "Seeds"] + [c[0] for c in columns]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for v in variants:
    cells = [f"`{v}`", str(len(by[v]))]
    for heading, fmt, scale, value, exact, _ in columns:
      ref = None if base is None or v == baseline else [value(r) for r in base]
      cells.append(_cell([value(r) for r in by[v]], ref, fmt, scale, exact, marks.get((v, heading), False)))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def tests_table(results: list[Result], size: str = "base", baseline: str = "vanilla") -> str:
  """Markdown: one row per test of `comparisons` (variant and column): n on each side, the
  variant's mean ± std, the difference, its 95% interval, Welch's degrees of freedom, p and
  Holm's adjusted p (* below 0.05); "n/a" where there is no test. Empty without tests."""
  return format_tests(comparisons(results, size, baseline), ("Variant", "Column"), baseline)


def format_tests(found: list[Comparison], head: tuple[str, ...], baseline: str) -> str:
  """Markdown of the tests, one row per comparison (its `cells` under `head`): n on each side,
  the mean ± std, the difference, its 95% interval, Welch's degrees of freedom, p and Holm's
  adjusted p (* below 0.05), the equivalence test's p against its margin and the reading
  (differs / equivalent / inconclusive). Empty without tests."""
  if not found:
    return ""
  p = lambda x: "n/a" if math.isnan(x) else ("< 0.001" if x < 0.001 else f"{x:.3f}")
  lines = [f"| {' | '.join(head)} | n ({head[0].lower()} / `{baseline}`) | mean ± std | difference | 95% interval "
           "| Welch df | p | p, Holm | TOST p (margin) | reading |", "|---" * (len(head) + 9) + "|"]
  for c in found:
    w, fmt = c.welch, c.format
    spread = f" ± {fmt.format(c.std)}" if math.isfinite(c.std) else ""
    interval = f"[{_signed(w.low, fmt)}, {_signed(w.high, fmt)}]" if w.tested else "n/a"
    lines.append(f"| {' | '.join(c.cells)} | {w.n} / {w.base_n} | {fmt.format(c.mean)}{spread} | "
                 f"{_signed(w.difference, fmt)} | {interval} | {f'{w.df:.2f}' if w.tested else 'n/a'} | {p(w.p)} | "
                 f"{p(c.adjusted)}{'*' if significance.significant(c.adjusted) else ''} | "
                 f"{p(c.tost.p)} (±{c.tost.margin:g}) | {c.reading} |")
  return "\n".join(lines) + "\n"


def survives(tests: list[Comparison]) -> list[str]:
  """What the tests support, by reading (differs, equivalent, inconclusive), each test as
  variant, column and difference: the report's conclusions, generated with its tables."""
  readings = {}
  for c in tests:
    if c.welch.tested:
      said = f"`{c.variant}` {c.column.replace('Final loss', 'final NLL')} {_signed(c.welch.difference, c.format)}"
      readings.setdefault(c.reading, []).append(said)
  meaning = {"differs": "significant after Holm's correction", "equivalent": "within the margin by TOST",
             "inconclusive": "neither: no difference is claimed either way"}
  return ["What survives:", ""] + [f"- **{kind}** ({meaning[kind]}): {'; '.join(readings[kind])}."
                                   for kind in meaning if kind in readings]


def _ordered(names: set[str], baseline: str = "vanilla") -> list[str]:
  """Variant names in table order: the baseline, the single modifications in the order
  variants.py lists them (a combination after its first part), transformer++ last."""
  from seq2seq.research import variants

  known = list(variants.VARIANTS)

  def position(name: str) -> tuple:
    try:
      return tuple(known.index(p) for p in variants.split(name)[0])
    except ValueError:  # a variant this version does not know: last
      return (len(known),)

  return sorted(names, key=lambda v: (v != baseline, multiplier.architecture_of(v) == "transformer++", position(v), v))


def plot_scaling(results: list[Result], path: pathlib.Path, architectures=("vanilla", "transformer++")) -> bool:
  """Validation NLL against training FLOPs, one line per run of `architectures`: bold at each
  size's best rate (what the multiplier takes), faint at the other rates; False if none."""
  runs = [r for r in results if multiplier.architecture_of(r.variant) in architectures]
  if not runs:
    return False
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
  colours = dict(zip(architectures, ("tab:blue", "tab:red", "tab:green")))
  markers = {"small": "v", "base": "o", "large": "^", "xlarge": "D"}
  best = {(a, s): multiplier.best_rate([r for r in runs if multiplier.architecture_of(r.variant) == a and r.size == s])[0]
          for a, s in {(multiplier.architecture_of(r.variant), r.size) for r in runs}}
  several = len({r.variant for r in runs}) > len({multiplier.architecture_of(r.variant) for r in runs})
  for r in sorted(runs, key=lambda r: (architectures.index(multiplier.architecture_of(r.variant)),
                                      multiplier.size_order(r.size), r.variant, r.seed)):
    f, nll = zip(*r.curve)
    arch = multiplier.architecture_of(r.variant)
    first = r.seed == min(q.seed for q in runs if q.variant == r.variant and q.size == r.size)
    if best[arch, r.size] == r.variant:
      label = f"{arch} {r.size}" + (f" (peak rate {r.learning_rate:.3g})" if several else "")
      ax.plot(f, nll, color=colours.get(arch), marker=markers.get(r.size, "s"), markersize=4, alpha=0.8,
              label=label if first else None)
    else:
      ax.plot(f, nll, color=colours.get(arch), linewidth=0.8, alpha=0.25)
  if several:
    ax.plot([], [], color="grey", linewidth=0.8, alpha=0.4, label="other rates tried")
  ax.set(xscale="log", xlabel="training FLOPs (matmuls, forward + backward)", ylabel="validation NLL (nats / token)",
         title="Transformer vs Transformer++: validation loss against compute")
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return True


def plot_modifications(results: list[Result], path: pathlib.Path, size: str = "base",
                       baseline: str = "vanilla") -> bool:
  """Final validation NLL per variant (mean, with each seed as a dot); False if no runs."""
  rows = [r for r in multiplier.confirmatory(results) if r.size == size]
  if not rows:
    return False
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = _ordered({r.variant for r in rows}, baseline)
  fig, ax = plt.subplots(figsize=(7, 0.35 * len(names) + 1.2), dpi=100)
  for y, name in enumerate(names):
    values = [r.final_nll for r in rows if r.variant == name]
    ax.barh(y, statistics.fmean(values), color="tab:red" if name == baseline else "tab:blue", alpha=0.5)
    ax.plot(values, [y] * len(values), "k.", markersize=5)
  ax.set_yticks(range(len(names)), names)
  ax.invert_yaxis()
  lows = [r.final_nll for r in rows]
  ax.set_xlim(min(lows) - 0.05, max(lows) + 0.05)
  ax.set(xlabel="final validation NLL (lower is better; dots: seeds)", title="Modifications")
  ax.grid(alpha=0.3, axis="x")
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return True


def scope(results: list[Result], baseline: str = "vanilla") -> list[str]:
  """The report's question and the limits its runs set, from the runs themselves."""
  base = [r for r in results if r.size == "base"]
  if not base:
    return []
  rates = sorted({r.learning_rate for r in base if math.isfinite(r.learning_rate)})
  tokens = sorted({r.val_tokens for r in base if r.val_tokens})
  params = [r.params for r in base if r.variant == baseline]
  limits = [
      (f"one peak learning rate for every variant, {rates[0]:g}: a variant that prefers another rate is "
       "measured away from its best" if len(rates) == 1 else
       f"peak learning rates {', '.join(f'{x:g}' for x in rates)}, as each variant's command set them"),
      ("one model size" + (f" ({params[0] / 1e6:.1f}M parameters for `{baseline}`)" if params else "")
       if len({r.size for r in results}) == 1 else "the modifications table at the base size only")
      + ", one schedule and one dataset: what holds here may not at another scale or training length",
      (f"one tokenization ({tokens[0]:,} validation target tokens): NLLs compare only with runs of the same "
       "count" if len(tokens) == 1 else "runs of several tokenizations: their NLLs do not compare"),
  ]
  limits = "; ".join(limits)
  return ["**Question.** Does each variant change `" + baseline + "`'s final validation NLL (the primary "
          "metric), and its BLEU on the test sets (secondary)? Test sets are reported, never chosen on.", "",
          f"**Limits.** {limits[0].upper()}{limits[1:]}.", ""]


def markdown(results: list[Result], missing: list[str], plots: dict[str, str], command: str,
             sweeps: list[str], baseline: str = "vanilla", records_name: str = "") -> str:
  """The whole report: what was run, the modifications table, the scaling comparison;
  `records_name`, the runs' records file beside it (runs/NAME.jsonl), is linked."""
  from seq2seq.research import variants

  hardware = sorted({r.hardware for r in results if r.hardware})
  out = ["# Architecture ablations", "",
         f"Generated by `{command}` from {len(results)} finished runs"
         + (f" on {', '.join(hardware)}" if hardware else "") + ". Do not edit: rerun the command."
         + (f" Every run's figures are kept in [{records_name}]({records_name}), from which `--records` "
            "remakes this report without the runs." if records_name else ""), ""]
  timed = [r for r in results if math.isfinite(r.train_seconds) and math.isfinite(r.eval_seconds)]
  if timed:
    minutes = lambda rs: (sum(r.train_seconds for r in rs) / 60, sum(r.eval_seconds for r in rs) / 60)
    base = [r for r in timed if r.size == "base"]
    out += ["Time: {:.1f} min of training and {:.1f} min of test-set translation for {} runs".format(
        *minutes(timed), len(timed)) + ("" if len(base) == len(timed) else
                                        ", of which {:.1f} and {:.1f} for the {} base-size runs".format(*minutes(base), len(base)))
            + "".join("; {:.1f} and {:.1f} for the {} runs on {}".format(*minutes(on), len(on), h) for h in hardware
                      if len(hardware) > 1 and (on := [r for r in timed if r.hardware == h]))
            + ". Wall time, summed: training to each run's last logged step, and decoding; starting processes and "
            "loading checkpoints are not counted.", ""]
  if missing:
    out += [f"**Partial:** {len(missing)} of the {len(results) + len(missing)} runs named are not finished (listed at "
            "the end); rerunning the sweep command resumes them.", ""]
  if results and not any(r.variant == baseline and r.size == "base" for r in results):
    out += [f"**No finished `{baseline}` run:** the table shows no differences (`--baseline` names the variant "
            "to compare with).", ""]
  if sweeps:
    out += ["The runs were made by:", "", "```bash", *sweeps, "```", ""]
  first = next((r for r in results if r.variant == baseline and r.size == "base"), None)
  if first and first.command:
    out += [f"One of them ({baseline}, first seed), as the sweep ran it:", "", f"```bash\n{first.command}\n```", ""]
  out += scope(results, baseline)
  tests = comparisons(results, baseline=baseline)
  tested = sum(c.welch.tested for c in tests)
  out += ["## Modifications (Narang et al. 2021)", "",
          "Mean ± standard deviation over the seeds (Seeds: how many runs"
          + ("; at a rate a search chose, its confirmatory seeds, not the search run that chose it"
             if len(multiplier.confirmatory(results)) < len(results) else "")
          + f"); in brackets the difference to "
          f"`{baseline}` (of the means). Final loss and BLEU are tested: Welch's t-test of each variant against `{baseline}` "
          "(two-sided, t distribution with Welch–Satterthwaite degrees of freedom), then Holm's correction over "
          + (f"all {tested} tests of the table (every variant x final loss and each BLEU column); * marks a "
             "difference significant at 0.05 after the correction." if tested else "the table's tests: none here.")
          + " A variant or baseline with fewer than 2 seeds gets no test (n/a) and no mark. The tests follow the "
          "table: n, the 95% interval of the difference, p and Holm's adjusted p, then the equivalence test "
          f"(TOST: two one-sided Welch tests against ±{MARGINS['Final loss']:g} NLL or ±{MARGINS['BLEU']:g} BLEU) "
          "and the reading: differs (significant after the correction), equivalent (TOST p below 0.05), or "
          "inconclusive; a difference that is not significant is never read as none. "
          + significance.seeds_note([c.welch for c in tests])
          + " Steps/s and early loss show the difference untested, params and FLOPs (exact) in percent. "
          "Early loss: validation NLL at 25% of the steps. FLOPs: matmul FLOPs of a training step (forward and "
          "backward) per target position. Gated feed-forwards have 2/3 of the width (equal parameters).", "",
          modifications_table(results, baseline=baseline)]
  if "modifications" in plots:
    out += [f"![final validation NLL per variant]({plots['modifications']})", ""]
  if tested:
    out += [f"Welch's t-tests against `{baseline}`, Holm-corrected over the {tested} tests (* below 0.05):", "",
            tests_table(results, baseline=baseline), *survives(tests), ""]
  out += ["Variants:", ""] + [f"- `{name}`: {variants.describe(name)}"
                              for name in _ordered({r.variant for r in results}, baseline)] + [""]
  out += multiplier.section(results, plots.get("scaling"))
  if missing:
    out += ["## Not finished yet", "", ", ".join(f"`{m}`" for m in missing), ""]
  return "\n".join(out)


def write(root: str | pathlib.Path | None, output: str | pathlib.Path, command: str = "", baseline: str = "vanilla",
          records_path: str | pathlib.Path | None = None) -> str:
  """Writes the report to `output`, its PNGs beside it (NAME_scaling.png, ...) and, read from the
  runs in `root`, their records (docs/runs/NAME.jsonl, seq2seq/research/records.py); or, given
  `records_path`, the report of those records alone. Returns a one-line account."""
  output = pathlib.Path(output)
  kept = records.path_for(output)
  if records_path:
    sweep = records.read(records_path)  # not dataclasses.astuple: it would turn each Result into a tuple
    results, missing, sweeps, command, baseline = sweep.results, sweep.missing, sweep.sweeps, sweep.command, sweep.baseline
  else:
    root = pathlib.Path(root)
    results, missing, sweeps = collect(root)
    command = command or (f"{SWEEP} --workdir={root} --table --output={output}"
                          + (f" --baseline={baseline}" if baseline != "vanilla" else ""))
    records_path = kept
    records.write(kept, records.Sweep(results, missing, sweeps, command, baseline))
  output.parent.mkdir(parents=True, exist_ok=True)
  draws = {"modifications": lambda path: plot_modifications(results, path, baseline=baseline),
           "scaling": lambda path: plot_scaling(results, path)}
  plots = {kind: path.name for kind, draw in draws.items()
           if draw(path := output.with_name(f"{output.stem}_{kind}.png"))}
  write_atomic(output, markdown(results, missing, plots, command, sweeps, baseline,
                                f"{kept.parent.name}/{kept.name}"))
  return f"{output}: {len(results)} finished runs, {len(missing)} unfinished (records: {records_path})"
