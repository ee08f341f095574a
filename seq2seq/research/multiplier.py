"""Transformer vs Transformer++ (Gu & Dao 2023) in a sweep's report (seq2seq/research/ablations.py):
how many times the training FLOPs vanilla needs to reach Transformer++'s final validation NLL.

- **The same aggregation on both sides.** Transformer++'s final NLL and FLOPs at a size are
  means over its seeds. Vanilla's curve at a size is the mean of its seeds' curves, point by
  point (`mean_curve`); its frontier is the best mean NLL reached with at most each amount of
  FLOPs, over all its sizes (`frontier`).
- **Each at its best rate, chosen and confirmed by different seeds.** A sweep may run either
  architecture at several peak learning rates (variants `vanilla+lr0.004`,
  `transformer+++lr0.008`, ...; a name without a rate part runs at the config's). Each side
  chooses, at each size, the rate whose search run (seed `SEARCH_SEED`, 0) ends at the lowest
  final validation NLL (`best_rate`); Transformer++'s row and vanilla's curve at that size, on
  its frontier, are that rate's other seeds, which did not choose it (so a search run is
  never counted again in the figures it chose). A rate left behind adds no point to the
  frontier. At a size with one rate nothing is chosen, and all its seeds count.
- **The multiplier**: the FLOPs at which that frontier reaches Transformer++'s NLL,
  interpolated linearly in (log FLOPs, NLL) (`flops_to_reach`), over Transformer++'s FLOPs;
  infinite when vanilla never got there. Then no multiplier is measured: the report gives
  vanilla's largest run's FLOPs over Transformer++'s, which says which runs were made (a
  longer vanilla run may get there with fewer FLOPs than a wider one), and no interval.
- **Its interval**, from the seeds' spread, by taking the multiplier at the ends of an
  interval of NLL. The NLL gap between Transformer++'s final NLL and vanilla's frontier is
  uncertain by sqrt(s²/n + s_vanilla²/n_vanilla): s and n of Transformer++'s final NLL, and
  s_vanilla, n_vanilla the seeds' standard deviation and count on vanilla's frontier where it
  crosses that NLL (of the points either side of the crossing, the larger deviation and the
  fewer seeds; its last point when it never crosses). Welch's 95% half-width h of that gap
  (t distribution, Welch–Satterthwaite degrees of freedom: significance.welch_summary) moves the
  target: the interval is [multiplier at NLL + h, multiplier at NLL − h]. The FLOPs' own
  spread over seeds (the same steps; batches of different token counts) is left out. With
  one seed on either side there is no interval, and the report says so.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from seq2seq.research import significance


def mean_curve(runs: list) -> list[tuple[float, float, float, int]]:
  """The runs' (seeds') curves averaged point by point, up to the shortest: (mean training
  FLOPs so far, mean validation NLL, its standard deviation (nan for one run), runs) at each
  evaluation."""
  out = []
  for i in range(min(len(r.curve) for r in runs)):
    mean, std, n = significance.summary([r.curve[i][1] for r in runs])
    out.append((statistics.fmean(r.curve[i][0] for r in runs), mean, std, n))
  return out


def frontier(curves: list[list[tuple]]) -> list[tuple]:
  """The best NLL reached with at most each amount of FLOPs, over all the curves' points
  ((FLOPs, NLL, ...) each; the points are kept whole)."""
  best, out = math.inf, []
  for point in sorted((p for curve in curves for p in curve), key=lambda p: (p[0], p[1])):
    if point[1] < best:
      best = point[1]
      out.append(point)
  return out


def flops_to_reach(front: list[tuple], target: float) -> float:
  """FLOPs at which the frontier reaches `target` NLL, interpolated linearly in (log FLOPs,
  NLL) between its neighbouring points; inf if it never does."""
  for (f0, n0, *_), (f1, n1, *_) in zip([(math.nan, math.inf)] + front, front):
    if n1 <= target:
      if math.isnan(f0):
        return f1  # reached at the first point: no smaller amount was measured
      return math.exp(math.log(f0) + (n0 - target) / (n0 - n1) * (math.log(f1) - math.log(f0)))
  return math.inf


def spread_at(front: list[tuple], target: float) -> tuple[float, int]:
  """(seeds' standard deviation, seeds) of the frontier where it reaches `target`: of the points
  either side of the crossing the larger deviation and the fewer seeds; the last point's when
  it never does. (nan, n) where a point has one seed."""
  if not front:
    return math.nan, 0
  i = next((i for i, p in enumerate(front) if p[1] <= target), len(front) - 1)
  near = front[max(i - 1, 0):i + 1]
  n = min(p[3] if len(p) > 3 else 1 for p in near)
  return (max(p[2] for p in near) if n > 1 else math.nan), n


def architecture_of(variant: str) -> str | None:
  """A variant name without its learning-rate part (None for a name this version does not know)."""
  from seq2seq.research import variants

  try:
    return variants.architecture(variant)
  except ValueError:
    return None


SEARCH_SEED = 0  # where a size tried several rates, the seed whose runs chose one; the other seeds confirm it


def best_rate(runs: list, search_seed: int = SEARCH_SEED) -> tuple[str, list]:
  """Of runs of one architecture at one size, the variant (learning rate) taken and the runs that
  report it. At one rate nothing was chosen: all its runs. At several, the choice is made on
  the search seed's runs (the lowest final validation NLL among the rates that have one; every
  run's mean where none has), and reported by the chosen rate's other seeds, which did not
  choose it (its search run alone where it has no other)."""
  names = sorted({r.variant for r in runs})
  if len(names) == 1:
    return names[0], list(runs)
  searched = [r for r in runs if r.seed == search_seed] or list(runs)
  chosen = min(sorted({r.variant for r in searched}),
               key=lambda v: (statistics.fmean(r.final_nll for r in searched if r.variant == v), v))
  mine = [r for r in runs if r.variant == chosen]
  return chosen, [r for r in mine if r.seed != search_seed] or mine


def best_by_size(results: list, architecture: str) -> dict[str, tuple[str, list]]:
  """Per size `architecture` ran at: `best_rate` of its runs there (the variant taken, the runs
  that report it)."""
  own = [r for r in results if architecture_of(r.variant) == architecture]
  return {size: best_rate([r for r in own if r.size == size]) for size in {r.size for r in own}}


def confirmatory(results: list) -> list:
  """The runs a report's figures and tests take, in their order: where one architecture ran at
  several rates at a size, the chosen rate's runs without its search run (`best_rate`) and the
  other rates' search runs (one seed each: no test takes them); every other run as it is."""
  dropped = set()
  for arch, size in {(architecture_of(r.variant) or r.variant, r.size) for r in results}:
    at = [r for r in results if (architecture_of(r.variant) or r.variant) == arch and r.size == size]
    if len({r.variant for r in at}) > 1:
      chosen, kept = best_rate(at)
      dropped |= {id(r) for r in at if r.variant == chosen} - {id(r) for r in kept}
  return [r for r in results if id(r) not in dropped]


def base_rate(run) -> float:
  """The peak rate a run's size scaled from (the `+lrRATE` of its name, or the config's)."""
  from seq2seq.research import variants

  return float(f"{run.learning_rate * variants.SIZES.get(run.size, 1.0) ** 0.5:.3g}")


def search_table(results: list, architectures=("vanilla", "transformer++")) -> list[str]:
  """Markdown lines: the rate search, final validation NLL of each search run (seed SEARCH_SEED)
  per base-size rate (rows) and architecture and size (columns), the rate chosen in bold with
  its confirmatory seeds' mean ± std beside it; [] where no size tried several rates."""
  runs = [r for r in results if architecture_of(r.variant) in architectures]
  groups = sorted({(architecture_of(r.variant), r.size) for r in runs},
                  key=lambda g: (size_order(g[1]), architectures.index(g[0])))
  at = {g: [r for r in runs if (architecture_of(r.variant), r.size) == g] for g in groups}
  if not any(len({r.variant for r in a}) > 1 for a in at.values()):
    return []
  chosen = {g: best_rate(a) for g, a in at.items()}
  lines = ["| base-size rate | " + " | ".join(f"{a} {s}" for a, s in groups) + " |", "|---" * (len(groups) + 1) + "|"]
  for rate in sorted({base_rate(r) for r in runs}):
    cells = []
    for g in groups:
      searched = [r for r in at[g] if base_rate(r) == rate and r.seed == SEARCH_SEED]
      variant, kept = chosen[g]
      if not searched:
        cells.append("–")
      elif searched[0].variant != variant or len({r.variant for r in at[g]}) == 1:
        cells.append(f"{searched[0].final_nll:.3f}")
      else:
        seeds = ", ".join(str(r.seed) for r in sorted(kept, key=lambda r: r.seed))
        confirmed = (f" (seeds {seeds}: {_final(kept)})" if all(r is not searched[0] for r in kept)
                     else " (not confirmed)")
        cells.append(f"**{searched[0].final_nll:.3f}**{confirmed}")
    lines.append(f"| {rate:g} | " + " | ".join(cells) + " |")
  return lines + [""]


def smallest_against_best(results: list, strong: str = "transformer++", weak: str = "vanilla"):
  """`strong` at its smallest size against `weak` at the size where it ends lowest, each at its
  best rate there (best_rate's reporting runs): (size, strong's runs, weak's size, weak's runs);
  None where either did not run."""
  mine = {size: runs for size, (_, runs) in best_by_size(results, strong).items()}
  theirs = {size: runs for size, (_, runs) in best_by_size(results, weak).items()}
  if not mine or not theirs:
    return None
  small = min(mine, key=size_order)
  lowest = min(theirs, key=lambda size: (statistics.fmean(r.final_nll for r in theirs[size]), size_order(size)))
  return small, mine[small], lowest, theirs[lowest]


def smallest_reading(results: list) -> list[str]:
  """Markdown lines: Transformer++'s smallest size against vanilla's best size, tested on the
  runs' final NLLs (Welch), BLEU beside it untested; [] without both."""
  found = smallest_against_best(results)
  if not found or len({r.size for r in results}) < 2:  # at one size the modifications table tests it
    return []
  small, strong, size, weak = found
  w = significance.welch([r.final_nll for r in strong], [r.final_nll for r in weak])
  bleu = " / ".join(f"{statistics.fmean(r.bleu[t] for r in strong) - statistics.fmean(r.bleu[t] for r in weak):+.2f}"
                    for t in sorted(strong[0].bleu)).replace("-", "−")
  signed = lambda x: f"{x:+.3f}".replace("-", "−")
  test = (f"a difference of {signed(w.difference)}, 95% interval [{signed(w.low)}, {signed(w.high)}] (Welch, "
          f"{w.df:.1f} df, p = {w.p:.2g})" if w.tested else
          f"a difference of {signed(w.difference)} (untested: fewer than 2 seeds)")
  return [f"**Transformer++ {small} against vanilla at its best size ({size}, {weak[0].params / 1e6:.1f}M "
          f"parameters against {strong[0].params / 1e6:.1f}M).** Final NLL {_final(strong)} against {_final(weak)}, "
          + test + f"; BLEU {bleu} on {' / '.join(sorted(strong[0].bleu))} (secondary, untested "
          "here). Each side is reported by its runs that did not choose its rate, where it has them. Where no "
          "vanilla run reaches "
          "Transformer++'s NLL, the table's FLOPs ratio says which runs were made: a longer vanilla run, not a "
          "wider one, might get there with fewer FLOPs.", ""]


@dataclasses.dataclass(frozen=True)
class Multiplier:
  """One Transformer++ size of the report's scaling table: Transformer++ at its best rate there
  (variant, peak rate, rates tried, params, mean final NLL and FLOPs over its reporting seeds),
  the `weak` side likewise at that size (nan / "" where it did not run there), the FLOPs
  `weak`'s frontier needs to reach that NLL (inf: never), the multiplier, `weak`'s largest
  run's FLOPs over Transformer++'s, and the multiplier's interval (nan without one)."""
  size: str
  variant: str
  params: float
  learning_rate: float
  rates: int
  weak_variant: str
  weak_learning_rate: float
  weak_rates: int
  nll: float
  flops: float
  weak_flops: float
  multiplier: float
  weak_max: float
  weak_nll: float
  low: float
  high: float
  seeds: int
  weak_seeds: int


@dataclasses.dataclass(frozen=True)
class Alone:
  """The `weak` side at a size where Transformer++ did not run: its best rate there, the final
  NLL of its reporting seeds (mean, std, count), its FLOPs and the hardware its runs named."""
  size: str
  params: float
  learning_rate: float
  rates: int
  nll: float
  std: float
  seeds: int
  flops: float
  hardware: str


def multipliers(results: list, strong: str = "transformer++", weak: str = "vanilla") -> list[Multiplier]:
  """Per size of architecture `strong`: its final NLL and FLOPs (means over the seeds of its
  best rate there), the FLOPs architecture `weak` needs to reach that NLL on the frontier of
  its mean curves at its best rate at every size it ran, the multiplier, and its interval (low,
  high: nan without one; `seeds` and `weak_seeds` say why). Runs of one architecture at
  several rates are variants `ARCH+lrRATE` (seq2seq/research/variants.py); each row names the
  rate each side took at that size (`weak`'s: its best there, nan where it did not run) and
  how many it tried (`rates`, `weak_rates`)."""
  own = [r for r in results if architecture_of(r.variant) == weak]
  best = best_by_size(results, weak)
  front = frontier([mean_curve(runs) for _, runs in best.values()])
  spent_max = max((f for _, runs in best.values() for r in runs for f, _ in r.curve), default=math.nan)
  out = []
  theirs = [r for r in results if architecture_of(r.variant) == strong]
  for size in sorted({r.size for r in theirs}, key=size_order):
    at = [r for r in theirs if r.size == size]
    variant, runs = best_rate(at)
    nll, std, n = significance.summary([r.final_nll for r in runs])
    spent = statistics.fmean(r.curve[-1][0] for r in runs)
    needed = flops_to_reach(front, nll)
    weak_std, weak_n = spread_at(front, nll)
    gap = significance.welch_summary(0.0, std, n, 0.0, weak_std, weak_n)  # the interval of the NLL gap
    low, high = ((flops_to_reach(front, nll + gap.high) / spent, flops_to_reach(front, nll + gap.low) / spent)
                 if gap.tested else (math.nan, math.nan))
    weak_variant, same = best.get(size, ("", []))
    out.append(Multiplier(size, variant, runs[0].params, runs[0].learning_rate, len({r.variant for r in at}),
                          weak_variant, same[0].learning_rate if same else math.nan,
                          len({r.variant for r in own if r.size == size}), nll, spent, needed, needed / spent,
                          spent_max / spent, statistics.fmean(r.final_nll for r in same) if same else math.nan,
                          low, high, n, weak_n))
  return out


def section(results: list, plot: str | None = None) -> list[str]:
  """The report's Transformer vs Transformer++ section as markdown lines: what the multiplier
  is, the plot (a file name beside the report) and a row per Transformer++ size; [] without
  Transformer++ runs."""
  rows = multipliers(results)
  if not rows:
    return []
  out = ["## Transformer vs Transformer++ (Gu & Dao 2023)", "",
         "Validation NLL against training FLOPs. Both sides are means over seeds: Transformer++'s final NLL "
         "and FLOPs, and vanilla's curves averaged point by point at each size. The multiplier is the FLOPs "
         "vanilla needs to reach Transformer++'s final NLL (interpolated on the best-so-far frontier of "
         "vanilla's mean curves over all its sizes) divided by the FLOPs Transformer++ spent. Where no vanilla "
         "run got there, no multiplier is measured: the row gives the FLOPs of vanilla's largest run over "
         "Transformer++'s, a figure of which runs were made (a longer vanilla run might get there with fewer "
         "FLOPs than a wider one), not of what vanilla needs. The 95% "
         "interval is the multiplier at the ends of Welch's 95% interval of the NLL gap, sqrt(s²/n + "
         "s_vanilla²/n_vanilla), with s_vanilla from vanilla's seeds where its frontier crosses that NLL; with "
         "one seed on either side there is none. The table gives each side's peak learning rate at each size. "
         "Where one ran at several (variants named `+lrRATE`: the rate at the base size), it takes the rate "
         f"whose seed-{SEARCH_SEED} run ends at the lowest final validation NLL there, and reports it by that rate's "
         "other seeds (which did not choose it), for its row and, for vanilla, for its curve on the frontier. "
         "The sweep scales a rate with d_model^-0.5 across sizes.", ""]
  if plot:
    out += [f"![validation NLL against training FLOPs]({plot})", ""]
  if search := search_table(results):
    out += [f"The rate search: each size's seed-{SEARCH_SEED} run at each peak rate (named by the rate at the "
            "base size), its final validation NLL; in bold the rate chosen, and its confirmatory seeds' mean ± "
            "std, which the table after it reports:", "", *search]
  rate = lambda x, tried: ("not run" if not math.isfinite(x) else
                           f"{x:.4g}" + (f" (best of {tried})" if tried > 1 else ""))
  out += ["| size | Transformer++ params | its peak rate | its final NLL | vanilla's peak rate | vanilla's final NLL "
          "| its FLOPs | vanilla's FLOPs to match | multiplier | seeds (Transformer++ / vanilla) | 95% interval |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
  for m in rows:
    reached = math.isfinite(m.weak_flops)
    weak_nll = f"{m.weak_nll:.3f}" if math.isfinite(m.weak_nll) else "not run"
    out.append(f"| {m.size} | {m.params / 1e6:.2f}M | {rate(m.learning_rate, m.rates)} | {m.nll:.3f} "
               f"| {rate(m.weak_learning_rate, m.weak_rates)} | {weak_nll} | {m.flops:.3g} | "
               + (f"{m.weak_flops:.3g} | **{m.multiplier:.2f}x** |" if reached
                  else f"not reached | none measured (vanilla's largest run: {m.weak_max:.2f}x these FLOPs) |")
               + f" {m.seeds} / {m.weak_seeds} | {_interval(m)} |")
  out.append("")
  beyond = beyond_sizes(results)
  if beyond:
    out += ["Vanilla at sizes where Transformer++ did not run: they extend vanilla's frontier, so they "
            "raise the FLOPs ratios of vanilla's largest run above.", "",
            "| size | vanilla params | its peak rate | its final NLL | seeds | its FLOPs | hardware |", "|---|---|---|---|---|---|---|"]
    out += [f"| {b.size} | {b.params / 1e6:.2f}M | {rate(b.learning_rate, b.rates)} | {b.nll:.3f} ± "
            f"{b.std:.3f} | {b.seeds} | {b.flops:.3g} | {b.hardware} |" for b in beyond]
    out.append("")
  return out + smallest_reading(results)


def beyond_sizes(results: list, strong: str = "transformer++", weak: str = "vanilla") -> list[Alone]:
  """Per size where `weak` ran and `strong` did not: `weak`'s best rate there, its final NLL
  (mean, std, seeds), FLOPs and the hardware its runs named."""
  sizes = {r.size for r in results if architecture_of(r.variant) == strong}
  own = [r for r in results if architecture_of(r.variant) == weak and r.size not in sizes]
  out = []
  for size in sorted({r.size for r in own}, key=size_order):
    at = [r for r in own if r.size == size]
    _, runs = best_rate(at)
    nll, std, n = significance.summary([r.final_nll for r in runs])
    out.append(Alone(size, runs[0].params, runs[0].learning_rate, len({r.variant for r in at}), nll, std, n,
                     statistics.fmean(r.curve[-1][0] for r in runs),
                     ", ".join(sorted({r.hardware for r in runs if r.hardware})) or "?"))
  return out


def _final(runs: list) -> str:
  """The runs' final NLL as mean ± std (the value alone for one run)."""
  mean, std, n = significance.summary([r.final_nll for r in runs])
  return f"{mean:.3f}" + (f" ± {std:.3f}" if n > 1 else "")


def _interval(m: Multiplier) -> str:
  """A multiplier's interval as the report shows it, or why it has none."""
  times = lambda x: f"{x:.2f}x" if math.isfinite(x) else f"> {m.weak_max:.2f}x"
  if not math.isnan(m.low):
    return "none: not reached" if math.isinf(m.low) else f"[{times(m.low)}, {times(m.high)}]"
  few = [f"{n} seed{'' if n == 1 else 's'} of {name}" for name, n in (("Transformer++", m.seeds), ("vanilla", m.weak_seeds))
         if n < 2]
  return "no interval: " + (" and ".join(few) if few else "no spread between the seeds")


def size_order(size: str) -> int:
  """A size's place in variants.SIZES (small, base, large, xlarge); unknown sizes last."""
  from seq2seq.research import variants

  return list(variants.SIZES).index(size) if size in variants.SIZES else len(variants.SIZES)
