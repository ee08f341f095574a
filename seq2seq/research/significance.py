"""The statistics of a sweep's tables (seq2seq/research/ablations.py): Welch's t-test of a
variant against the baseline with its 95% interval, and Holm's correction across a table.

- **Welch's t-test** (Welch 1947), two-sided, from each side's mean m, sample standard
  deviation s and count n: the difference d = m_a − m_b, its standard error
  se = sqrt(s_a²/n_a + s_b²/n_b), the Welch–Satterthwaite degrees of freedom
  ν = se⁴ / ((s_a²/n_a)²/(n_a − 1) + (s_b²/n_b)²/(n_b − 1)), the p-value 2·P(T_ν > |d|/se)
  and the interval d ± t_ν(0.975)·se, with T_ν Student's t distribution (scipy.stats.t).
  The same as scipy.stats.ttest_ind(a, b, equal_var=False) and R's t.test(a, b) on the
  values (tests/test_ablation_stats.py). With 2 seeds a side ν lies between 1 and 2, where
  t_ν(0.975) is 12.7 to 4.3: only a gap of many standard errors reaches p < 0.05.
- **No test** (p, interval: nan, shown "n/a") where either side has fewer than 2 values, or
  where neither side varies at all (se = 0: nothing to measure the difference against).
- **Equivalence (TOST**, Schuirmann 1987): "no difference" is a claim of its own, tested
  against a stated margin m. Two one-sided Welch tests, of d <= -m and of d >= +m; the
  larger of their p-values is the test's. Below 0.05 the difference lies within ±m
  (equivalently, its 90% interval does); else the comparison is inconclusive, however large
  the Welch p-value. A non-significant Welch test alone never says "level".
- **Holm's correction** (Holm 1979) over a family of m tests: the p-values sorted,
  p_(i) becomes max over j <= i of min(1, (m − j + 1)·p_(j)). Rejecting where the adjusted p is
  below 0.05 keeps the chance of any false claim in the family at 5% whatever the tests'
  dependence. Tests without a p-value are not counted in m.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

ALPHA = 0.05  # the family-wise error rate the marks control
LEVEL = 0.95  # the intervals' confidence


def summary(values: list[float]) -> tuple[float, float, int]:
  """(mean, sample standard deviation (nan for one value), count) of the values that are not nan."""
  values = [v for v in values if not math.isnan(v)]
  if not values:
    return math.nan, math.nan, 0
  return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan, len(values)


@dataclasses.dataclass(frozen=True)
class Welch:
  """Welch's t-test of a (mean m_a, n_a values) against b: nan where there is no test."""
  difference: float  # m_a − m_b
  se: float
  df: float  # Welch–Satterthwaite
  low: float  # the interval of the difference at `level`
  high: float
  p: float  # two-sided
  n: int
  base_n: int

  @property
  def tested(self) -> bool:
    return not math.isnan(self.p)


def student_t():
  """Student's t distribution, scipy.stats.t: imported when a test is computed (scipy takes
  over a second, which a research command's --help does not need)."""
  from scipy import stats

  return stats.t


def welch_summary(mean: float, std: float, n: int, base_mean: float, base_std: float, base_n: int,
                  level: float = LEVEL) -> Welch:
  """Welch's t-test from each side's mean, sample standard deviation and count (a table's
  published mean ± std over n seeds is enough)."""
  diff = mean - base_mean
  if n < 2 or base_n < 2:
    return Welch(diff, math.nan, math.nan, math.nan, math.nan, math.nan, n, base_n)
  va, vb = std**2 / n, base_std**2 / base_n
  se = math.sqrt(va + vb)
  if not se > 0:
    return Welch(diff, 0.0, math.nan, math.nan, math.nan, math.nan, n, base_n)
  df = (va + vb) ** 2 / (va**2 / (n - 1) + vb**2 / (base_n - 1))
  half = float(student_t().ppf(0.5 + level / 2, df)) * se
  p = float(2 * student_t().sf(abs(diff) / se, df))
  return Welch(diff, se, df, diff - half, diff + half, p, n, base_n)


def welch(values: list[float], baseline: list[float], level: float = LEVEL) -> Welch:
  """Welch's t-test of `values` (one per seed) against `baseline`'s; nan values left out."""
  return welch_summary(*summary(values), *summary(baseline), level=level)


@dataclasses.dataclass(frozen=True)
class Equivalence:
  """TOST of a difference against ±margin: its 90% interval and the larger one-sided p."""
  margin: float
  low: float
  high: float
  p: float

  @property
  def equivalent(self) -> bool:
    return self.p < ALPHA


def tost(values: list[float], baseline: list[float], margin: float) -> Equivalence:
  """Two one-sided Welch tests of `values` against `baseline`: is the difference within ±margin?
  nan where Welch's test has none (fewer than 2 values a side, or no spread)."""
  w = welch(values, baseline, level=1 - 2 * ALPHA)
  if not w.tested:
    return Equivalence(margin, math.nan, math.nan, math.nan)
  above = float(student_t().sf((w.difference + margin) / w.se, w.df))  # H0: difference <= -margin
  below = float(student_t().cdf((w.difference - margin) / w.se, w.df))  # H0: difference >= +margin
  return Equivalence(margin, w.low, w.high, max(above, below))


def reading(adjusted: float, equivalence: Equivalence | None) -> str:
  """What a comparison may be called: "differs" (significant after the correction),
  "equivalent" (TOST within the margin), else "inconclusive"."""
  if significant(adjusted):
    return "differs"
  return "equivalent" if equivalence is not None and equivalence.equivalent else "inconclusive"


def df_range(tests: list[Welch]) -> tuple[int, int] | None:
  """The smallest and largest Welch degrees of freedom the tested comparisons' seed counts
  allow, whatever the spreads: min(n_a, n_b) − 1 (one side's variance of the mean dominates)
  to n_a + n_b − 2 (the two in the ratio (n_a − 1) : (n_b − 1)). None without a test."""
  sides = [(w.n, w.base_n) for w in tests if w.tested]
  if not sides:
    return None
  return min(min(a, b) for a, b in sides) - 1, max(a + b for a, b in sides) - 2


def seeds_note(tests: list[Welch]) -> str:
  """What the seed counts allow, for a report: the range of Welch's degrees of freedom and how
  many standard errors wide the interval is either side at its ends ("" without a test)."""
  bounds = df_range(tests)
  if bounds is None:
    return ""
  counts = sorted({n for w in tests if w.tested for n in (w.n, w.base_n)})
  seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
  wide = lambda df: float(student_t().ppf(0.5 + LEVEL / 2, df))
  return (f"With {seeds} seeds a side Welch's degrees of freedom are {bounds[0]} to {bounds[1]}, so the "
          f"interval spans {wide(bounds[1]):.1f} to {wide(bounds[0]):.1f} standard errors either side of the "
          "difference.")


def holm(pvalues: list[float]) -> list[float]:
  """Holm's step-down adjusted p-values, in the order given; nan (no test) stays nan and is
  not counted among the m tests. [0.01, 0.04, 0.03, 0.005] -> [0.03, 0.06, 0.06, 0.02]."""
  tested = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
  out, running = [math.nan] * len(pvalues), 0.0
  for rank, (p, i) in enumerate(tested):
    running = max(running, min(1.0, (len(tested) - rank) * p))
    out[i] = running
  return out


def significant(adjusted: float) -> bool:
  """Whether an adjusted p-value is below ALPHA (nan, no test: False)."""
  return adjusted < ALPHA


@dataclasses.dataclass
class Comparison:
  """One test of a report: `variant` against the baseline in `column` (`cells`: the first cells
  of its row in the report's tests table), the variant's mean ± std in the column's `format`,
  Welch's test, the equivalence test against the column's margin, and Holm's p over the
  report's tests (`correct` sets it; nan: no test)."""
  variant: str
  column: str
  cells: tuple[str, ...]
  format: str
  mean: float
  std: float
  welch: Welch
  tost: Equivalence
  adjusted: float = math.nan

  @property
  def reading(self) -> str:
    return reading(self.adjusted, self.tost)


def correct(found: list[Comparison]) -> list[Comparison]:
  """`found` with Holm's correction over all their tests (the report's family) set in place."""
  for c, adjusted in zip(found, holm([c.welch.p for c in found])):
    c.adjusted = adjusted
  return found
