"""The statistics of the sweep's tables (seq2seq/research/significance.py, multiplier.py):
Welch's t-test against scipy and against published values, Holm's correction against a
hand-worked example, no test for a side with one seed, the marks meaning "significant after
the correction", the compute multiplier's aggregation and interval, and the report built from
run files on disk carrying the new columns."""

import json
import math
import pathlib
import statistics

import pytest
import report_tables
from report_tables import signed, words
from scipy import stats

from seq2seq import configs
from seq2seq.research import ablations, multiplier, significance


def result(variant, seed, final, bleu=30.0, size="base", curve=None):
  return ablations.Result(f"{variant}-s{seed}", variant, size, seed, params=1e6, flops=2e6, steps_per_s=2.0,
                          early_nll=final + 1, final_nll=final, bleu={"test": bleu},
                          curve=curve or [(1e12, final + 1), (2e12, final)])


@pytest.mark.parametrize("a, b", [([2.41, 2.404, 2.398], [2.49, 2.53, 2.51, 2.52]), ([27.85, 28.1], [26.7, 27.2]),
                                  ([1.0, 2.0, 4.0, 8.0, 16.0], [3.0, 3.5])])
def test_welch_matches_scipys_ttest_ind_on_fixed_samples(a, b):
  test, scipy = significance.welch(a, b), stats.ttest_ind(a, b, equal_var=False)
  assert math.isclose(test.p, scipy.pvalue, rel_tol=1e-9) and math.isclose(test.df, scipy.df, rel_tol=1e-9)
  assert math.isclose(test.difference / test.se, scipy.statistic, rel_tol=1e-9)
  interval = scipy.confidence_interval(0.95)
  assert math.isclose(test.low, interval.low, rel_tol=1e-9) and math.isclose(test.high, interval.high, rel_tol=1e-9)
  assert (test.n, test.base_n) == (len(a), len(b))


def test_welch_matches_published_examples():
  # R's t.test (Welch by default) as printed in its output: t = -1.8325, df = 17.9,
  # p-value = 0.08356, 95 percent confidence interval -2.1469104 0.1469104.
  test = significance.welch([11, 9, 10, 11, 10, 12, 9, 11, 12, 9], [11, 13, 10, 13, 12, 9, 11, 12, 12, 11])
  assert round(test.difference / test.se, 4) == -1.8325 and round(test.df, 1) == 17.9
  assert round(test.p, 5) == 0.08356 and (round(test.low, 7), round(test.high, 7)) == (-2.1469104, 0.1469104)
  # Wikipedia, "Welch's t-test", examples 1 and 2: t = -2.46, ν = 25.0, p = 0.021; t = -1.57, ν = 9.9, p = 0.149.
  a1 = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
  a2 = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4]
  test = significance.welch(a1, a2)
  assert (round(test.difference / test.se, 2), round(test.df, 1), round(test.p, 3)) == (-2.46, 25.0, 0.021)
  b1 = [17.2, 20.9, 22.6, 18.1, 21.7, 21.4, 23.5, 24.2, 14.7, 21.8]
  b2 = [21.5, 22.8, 21.0, 23.0, 21.6, 23.6, 22.5, 20.7, 23.4, 21.8, 20.7, 21.7, 21.5, 22.5, 23.6, 21.5, 22.5, 23.5,
        21.5, 21.8]
  test = significance.welch(b1, b2)
  assert (round(test.difference / test.se, 2), round(test.df, 1), round(test.p, 3)) == (-1.57, 9.9, 0.149)


def test_welch_from_a_tables_mean_std_and_n_equals_welch_from_the_values():
  a, b = [2.404, 2.416], [2.486, 2.538]
  test = significance.welch(a, b)
  assert significance.welch_summary(*significance.summary(a), *significance.summary(b)) == test
  scipy = stats.ttest_ind_from_stats(*significance.summary(a), *significance.summary(b), equal_var=False)
  assert math.isclose(test.p, scipy.pvalue, rel_tol=1e-9)
  # 2 seeds a side: 1 to 2 degrees of freedom.
  assert 1 <= test.df <= 2


def test_the_reports_degrees_of_freedom_follow_the_seed_counts():
  two = significance.welch([2.404, 2.416], [2.486, 2.538])
  three = significance.welch([2.41, 2.404, 2.398], [2.49, 2.53, 2.51])
  assert significance.df_range([two]) == (1, 2) and significance.df_range([three]) == (2, 4)
  assert significance.df_range([significance.welch([1.0], [2.0, 3.0])]) is None  # no test
  assert significance.seeds_note([two]) == ("With 2 seeds a side Welch's degrees of freedom are 1 to 2, so the "
                                            "interval spans 4.3 to 12.7 standard errors either side of the difference.")
  assert significance.seeds_note([three, significance.welch([1.0, 2.0, 4.0, 8.0], [3.0, 3.5, 3.2])]).startswith(
      "With 3 to 4 seeds a side Welch's degrees of freedom are 2 to 5, so the interval spans 2.6 to 4.3 ")
  # The bounds hold whatever the spreads: the extremes are reached, never passed.
  for s_a in (1e-6, 0.01, 0.1, 1.0, 100.0):
    for n_a, n_b in ((2, 2), (3, 3), (3, 5), (5, 2)):
      df = significance.welch_summary(0.0, s_a, n_a, 1.0, 0.1, n_b).df
      assert min(n_a, n_b) - 1 - 1e-6 <= df <= n_a + n_b - 2 + 1e-6
  equal = significance.welch_summary(0.0, 0.1 * math.sqrt(3 * 2 / (4 * 5)), 3, 1.0, 0.1, 5)  # means' variances 2 : 4
  assert math.isclose(equal.df, 6, rel_tol=1e-9)


def test_holm_against_a_hand_worked_example():
  # Sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06 (never below the one before).
  adjusted = significance.holm([0.01, 0.04, 0.03, 0.005])
  assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
  assert [significance.significant(p) for p in adjusted] == [True, False, False, True]
  # No test (nan) is not counted among m and stays nan; adjusted p-values stop at 1.
  adjusted = significance.holm([0.01, math.nan, 0.04, 0.6])
  assert adjusted[0] == pytest.approx(0.03) and math.isnan(adjusted[1]) and adjusted[2:] == pytest.approx([0.08, 0.6])
  assert significance.holm([0.5, 0.7]) == [1.0, 1.0] and significance.holm([]) == []


def rows_of(table: str) -> dict[str, list[str]]:
  lines = table.splitlines()[2:]
  return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines}


def test_rows_with_fewer_than_two_seeds_get_no_p_value_and_no_mark():
  results = [result("vanilla", 0, 2.50, 26.0), result("vanilla", 1, 2.51, 26.1),
             result("rope", 0, 1.50, 36.0)]  # far better, but one seed
  assert not significance.welch([1.5], [2.5, 2.51]).tested and not significance.welch([1.5, 1.6], [2.5]).tested
  final = rows_of(ablations.modifications_table(results))["`rope`"][5]
  assert final == "1.500 (−1.005)"  # no mark
  tests = [c.strip() for c in ablations.tests_table(results).splitlines()[2].split("|")[1:-1]]
  assert tests == ["`rope`", "Final loss", "1 / 2", "1.500", "−1.005", "n/a", "n/a", "n/a", "n/a", "n/a (±0.02)",
                   "inconclusive"]
  report = ablations.markdown(results, [], {}, "cmd", [])
  assert "the table's tests: none here." in report and "Welch's t-tests against" not in report
  # No spread on either side (se = 0): no test either.
  assert not significance.welch([1.0, 1.0], [2.0, 2.0]).tested


def test_marks_mean_significant_after_holms_correction():
  """Five seeds each: `rope` is far better (survives the correction), `gelu` has p < 0.05
  alone but not after Holm's correction over the table's 4 tests (final loss and BLEU, whose
  means do not differ)."""
  base = [2.00, 2.02, 2.04, 2.06, 2.08]
  gelu, rope = [1.95, 1.97, 1.99, 2.01, 2.03], [1.50, 1.52, 1.54, 1.56, 1.58]
  bleu = [30.0, 30.5, 31.0, 30.2, 30.8]  # the same for every variant: p = 1
  results = [result(name, i, v, bleu[i]) for name, values in (("vanilla", base), ("gelu", gelu), ("rope", rope))
             for i, v in enumerate(values)]
  raw = {name: stats.ttest_ind(values, base, equal_var=False).pvalue for name, values in (("gelu", gelu), ("rope", rope))}
  assert raw["gelu"] < 0.05 and 3 * raw["gelu"] > 0.05 and 4 * raw["rope"] < 0.05
  found = {(c.variant, c.column): c for c in ablations.comparisons(results)}
  assert len(found) == 4  # 2 variants x final loss and BLEU
  assert found["gelu", "BLEU test"].welch.p == 1.0 and found["gelu", "BLEU test"].adjusted == 1.0
  # Holm: the smallest p (rope's) x 4, the next (gelu's) x 3.
  assert found["rope", "Final loss"].adjusted == pytest.approx(4 * raw["rope"])
  assert found["gelu", "Final loss"].adjusted == pytest.approx(3 * raw["gelu"])
  rows = rows_of(ablations.modifications_table(results))
  assert rows["`gelu`"][5] == "1.990 ± 0.032 (−0.050)" and rows["`rope`"][5] == "1.540 ± 0.032 (−0.500*)"
  assert rows["`rope`"][4] == "2.540 ± 0.032 (−0.500)"  # early loss: shown untested, never marked
  gelu_row, _, rope_row, _ = ablations.tests_table(results).splitlines()[2:]
  assert gelu_row.startswith("| `gelu` | Final loss | 5 / 5 | 1.990 ± 0.032 | −0.050 | [−0.0")
  # gelu: not significant after the correction, and -0.050 is far outside ±0.02: inconclusive, not level.
  tost = max(stats.ttest_ind([g + 0.02 for g in gelu], base, equal_var=False, alternative="greater").pvalue,
             stats.ttest_ind([g - 0.02 for g in gelu], base, equal_var=False, alternative="less").pvalue)
  assert gelu_row.endswith(f"| {raw['gelu']:.3f} | {3 * raw['gelu']:.3f} | {tost:.3f} (±0.02) | inconclusive |")
  assert rope_row.startswith("| `rope` | Final loss |") and rope_row.endswith("| < 0.001 | < 0.001* | 1.000 (±0.02) | differs |")
  report = ablations.markdown(results, [], {}, "cmd", [])
  assert "then Holm's correction over all 4 tests of the table" in report
  assert "* marks a difference significant at 0.05 after the correction" in report and "twice its standard" not in report


def test_the_multiplier_takes_means_on_both_sides_with_an_interval_from_the_seeds():
  # Vanilla's two seeds: 3.0 / 2.0 / 1.0 and 3.2 / 2.2 / 1.2 at 1e12 / 1e13 / 1e14 FLOPs; their
  # mean curve 3.1 / 2.1 / 1.1. Transformer++'s two seeds end at 1.5 and 1.7, mean 1.6, at 1e13.
  results = [result("vanilla", 0, 1.0, curve=[(1e12, 3.0), (1e13, 2.0), (1e14, 1.0)]),
             result("vanilla", 1, 1.2, curve=[(1e12, 3.2), (1e13, 2.2), (1e14, 1.2)]),
             result("transformer++", 0, 1.5, curve=[(1e12, 2.5), (1e13, 1.5)]),
             result("transformer++", 1, 1.7, curve=[(1e12, 2.7), (1e13, 1.7)]),
             result("transformer++", 0, 1.0, size="large", curve=[(1e13, 1.0)])]
  for point, expected in zip(multiplier.mean_curve(results[:2]), [(1e12, 3.1), (1e13, 2.1), (1e14, 1.1)], strict=True):
    assert point[:2] == pytest.approx(expected) and point[2:] == (pytest.approx(0.02**0.5), 2)
  rows = {m.size: m for m in multiplier.multipliers(results)}
  base = rows["base"]
  # 1.6 is halfway from 2.1 to 1.1 in log FLOPs: 10^13.5, 10^0.5 times Transformer++'s. Vanilla's
  # best seed alone (2.0 -> 1.0) would have given 10^0.4.
  assert base.nll == pytest.approx(1.6) and base.multiplier == pytest.approx(10**0.5)
  # The NLL gap's se is sqrt(0.02/2 + 0.02/2), with 2 degrees of freedom: NLL 1.6 +- h. At
  # 1.6 + h vanilla's mean curve is reached between 1e12 (3.1) and 1e13 (2.1); at 1.6 - h never.
  h = stats.t.ppf(0.975, 2) * 0.02**0.5
  assert base.low == pytest.approx(10 ** (12 + (3.1 - (1.6 + h)) - 13)) and math.isinf(base.high)
  assert (base.seeds, base.weak_seeds) == (2, 2)
  large = rows["large"]
  assert math.isnan(large.low) and large.seeds == 1
  report = ablations.markdown(results, [], {}, "cmd", [])
  assert f"| **3.16x** | 2 / 2 | [{base.low:.2f}x, > 10.00x] |" in report
  assert ("| not reached | none measured (vanilla's largest run: 10.00x these FLOPs) | 1 / 2 | no interval: 1 seed "
          "of Transformer++ |") in report
  assert "Both sides are means over seeds" in report


def test_where_vanilla_never_reached_no_multiplier_and_no_interval_are_claimed():
  """Vanilla's frontier ends above Transformer++'s NLL: the ratio of vanilla's largest run's
  FLOPs says which runs were made, so it is given as that, not as a bound of a multiplier,
  and the seeds give no interval of it."""
  results = [result("vanilla", s, 2.0 + 0.01 * s, curve=[(1e12, 3.0 + 0.01 * s), (1e14, 2.0 + 0.01 * s)]) for s in (0, 1)]
  results += [result("transformer++", s, 0.5 + 0.01 * s, size="large", curve=[(1e13, 0.5 + 0.01 * s)]) for s in (0, 1)]
  row, = multiplier.multipliers(results)
  assert math.isinf(row.multiplier) and math.isinf(row.low) and row.weak_max == pytest.approx(10.0)
  report = ablations.markdown(results, [], {}, "cmd", [])
  assert ("| not reached | none measured (vanilla's largest run: 10.00x these FLOPs) | 2 / 2 | none: not reached |"
          in report)
  assert "> 10.00x" not in report


def write_run(root, name, variant, seed, final, bleu, config, size="base", val=()):
  """A finished run's files as seq2seq-train and seq2seq-eval write them; `val`: the
  validation split's (BLEU, chrF, decoding) results, if the run translated it."""
  run = root / name
  (run / "eval").mkdir(parents=True)
  (run / "config.json").write_text(json.dumps(config))
  steps = config["train"]["steps"]
  records = [{"step": s, "loss": 4.0, "tokens": 1000.0, "wall_time_s": s / 10} for s in range(10, steps + 1, 10)]
  records += [{"step": s, "val_nll": final + (steps - s) / steps} for s in range(50, steps + 1, 50)]
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  decode = {k: config["eval"][k] for k in ("beam_size", "alpha")}
  for split in config["data"]["test_splits"]:
    (run / "eval" / f"{split}.step{steps}.beam.json").write_text(json.dumps({
        "bleu": bleu, "chrf": bleu + 30, "decode": decode, "seconds": 1.0, "hardware": "test CPU"}))
  for i, (val_bleu, val_chrf, settings) in enumerate(val):
    (run / "eval" / f"val.step{steps}.beam{i}.json").write_text(json.dumps({
        "bleu": val_bleu, "chrf": val_chrf, "decode": decode | settings, "seconds": 1.0}))
  return {"name": name, "variant": variant, "size": size, "seed": seed, "command": f"train {name}"}


def test_the_report_from_run_files_carries_the_tests_and_the_intervals(tmp_path):
  config = json.loads(configs.get("tiny").to_json_best_effort())
  runs = [write_run(tmp_path, f"{v}-s{seed}", v, seed, final, bleu, config)
          for v, seed, final, bleu in (("vanilla", 0, 2.50, 26.5), ("vanilla", 1, 2.52, 27.0),
                                       ("swiglu", 0, 2.38, 27.6), ("swiglu", 1, 2.39, 27.9),
                                       ("transformer++", 0, 2.20, 30.2))]
  runs.append(write_run(tmp_path, "transformer++@small-s0", "transformer++", 0, 2.56, 25.0, config, "small"))
  (tmp_path / "sweep.json").write_text(json.dumps({"runs": runs, "sweeps": ["python -m seq2seq.research.sweep x"]}))
  ablations.write(tmp_path, tmp_path / "ablations.md")
  report = (tmp_path / "ablations.md").read_text()
  assert "| `swiglu` | 2 |" in report and "| `transformer++` | 1 |" in report
  heading = "| Variant | Column | n (variant / `vanilla`) | mean ± std | difference | 95% interval | Welch df | p | p, Holm |"
  assert heading in report
  tests = [line.split("|")[1].strip() for line in report[report.index(heading):].split("\n\n")[0].splitlines()[2:]]
  assert tests == ["`swiglu`", "`swiglu`", "`transformer++`", "`transformer++`"]  # final loss, BLEU each
  swiglu = [line for line in report.splitlines() if line.startswith("| `swiglu` | Final loss |")][0]
  expected = significance.welch([2.38, 2.39], [2.50, 2.52])
  assert swiglu.startswith(f"| `swiglu` | Final loss | 2 / 2 | 2.385 ± 0.007 | −0.125 | [−{-expected.low:.3f}, "
                           f"−{-expected.high:.3f}] | {expected.df:.2f} | {expected.p:.3f} |")
  assert "| `transformer++` | Final loss | 1 / 2 | 2.200 | −0.310 | n/a | n/a | n/a | n/a |" in report
  assert "Holm's correction over all 2 tests of the table" in report
  assert "| seeds (Transformer++ / vanilla) | 95% interval |" in report and "no interval: 1 seed of Transformer++" in report


def test_a_runs_record_holds_test_and_validation_bleu_and_chrf_at_the_configs_decoding(tmp_path):
  """Test sets' BLEU and chrF, and the validation split's where the run translated it: with
  the config's own beam and alpha where a later seq2seq-eval added other decodings."""
  config = json.loads(configs.get("tiny").to_json_best_effort())
  other = {"alpha": config["eval"]["alpha"] + 0.5}
  entries = [write_run(tmp_path, "a-s0", "vanilla", 0, 2.5, 26.5, config, val=[(40.0, 61.0, other), (30.0, 55.0, {})]),
             write_run(tmp_path, "b-s0", "vanilla", 0, 2.5, 26.5, config)]
  with_val, without = (ablations.read_run(tmp_path / e["name"], e) for e in entries)
  assert (with_val.bleu, with_val.chrf, with_val.val_bleu, with_val.val_chrf) == (
      {"test_2016_flickr": 26.5}, {"test_2016_flickr": 56.5}, 30.0, 55.0)
  assert without.chrf == {"test_2016_flickr": 56.5} and math.isnan(without.val_bleu) and math.isnan(without.val_chrf)


@pytest.mark.parametrize("seed", range(40))
def test_tost_is_scipys_two_one_sided_welch_tests_and_reads_off_the_90_percent_interval(seed):
  """TOST's p is the larger p of scipy's one-sided Welch tests of the shifted samples, and it is
  below 0.05 exactly when the 90% interval of the difference lies within ±margin."""
  import numpy as np

  rng = np.random.default_rng(seed)
  a, b = list(rng.normal(0.01 * rng.normal(), 0.01, 3 + seed % 3)), list(rng.normal(0, 0.015, 3))
  margin = 0.02
  test = significance.tost(a, b, margin)
  lower = stats.ttest_ind([x + margin for x in a], b, equal_var=False, alternative="greater").pvalue
  upper = stats.ttest_ind([x - margin for x in a], b, equal_var=False, alternative="less").pvalue
  assert math.isclose(test.p, max(lower, upper), rel_tol=1e-9)
  interval = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.90)
  assert math.isclose(test.low, interval.low, rel_tol=1e-9) and math.isclose(test.high, interval.high, rel_tol=1e-9)
  assert test.equivalent == (-margin < test.low and test.high < margin)


def test_a_difference_is_read_as_none_only_from_the_equivalence_test():
  """Three readings: significant after the correction, equivalent within the margin, else
  inconclusive (a large p alone is not "level")."""
  tight, base = [2.000, 2.001, 2.002, 2.001], [2.001, 2.002, 2.000, 2.002]
  loose = [1.95, 2.05, 1.99, 2.03]
  assert significance.reading(0.5, significance.tost(tight, base, 0.02)) == "equivalent"
  assert significance.tost(loose, base, 0.02).p > 0.05 and significance.welch(loose, base).p > 0.3
  assert significance.reading(0.5, significance.tost(loose, base, 0.02)) == "inconclusive"
  assert significance.reading(0.01, significance.tost(tight, base, 0.02)) == "differs"
  assert significance.reading(0.5, None) == "inconclusive"
  assert math.isnan(significance.tost([1.0], base, 0.02).p)  # one seed: no test


def test_the_report_says_what_survives_by_reading_never_a_non_significant_difference_as_none():
  """Each test is listed under its reading: differs (Holm), equivalent (TOST within the margin),
  else inconclusive, however small the difference."""
  finals = {"vanilla": [2.000, 2.004, 2.008], "gelu": [2.001, 2.005, 2.009], "swiglu": [1.800, 1.804, 1.808],
            "rope": [1.96, 2.05, 2.01]}
  bleus = {"vanilla": [30.0, 30.1, 30.2], "gelu": [30.0, 30.1, 30.2], "swiglu": [30.0, 30.1, 30.2],
           "rope": [28.0, 31.0, 30.5]}
  runs = [result(v, seed, final, bleus[v][seed]) for v in finals for seed, final in enumerate(finals[v])]
  report = ablations.markdown(runs, [], {}, "cmd", [])
  survives = report[report.index("What survives:"):].split("\n\n")[1].splitlines()
  assert survives == [
      "- **differs** (significant after Holm's correction): `swiglu` final NLL −0.200.",
      "- **equivalent** (within the margin by TOST): `gelu` final NLL +0.001; `gelu` BLEU test +0.00; "
      "`swiglu` BLEU test +0.00.",
      "- **inconclusive** (neither: no difference is claimed either way): `rope` final NLL +0.003; "
      "`rope` BLEU test −0.27."]


def test_every_report_with_committed_run_records_is_what_they_make(tmp_path):
  """docs/NAME.md, where docs/runs/NAME.jsonl keeps its runs, is remade from those records
  alone, character for character: every table, test and quoted figure of the report (the
  length study's between its page's markers, the prose around them kept)."""
  from seq2seq.research import positions_report

  repo = pathlib.Path(__file__).resolve().parents[1]
  kept = [p for p in sorted((repo / "docs" / "runs").glob("*.jsonl")) if (repo / "docs" / f"{p.stem}.md").is_file()]
  assert {"ablations", "ablations_prenorm", "ablations_prenorm_norms", "positions"} <= {p.stem for p in kept}
  for path in kept:
    if path.stem == "positions":  # the page with its generated part emptied, to be written again
      head, _, rest = (repo / "docs" / "positions.md").read_text().partition(positions_report.START)
      (tmp_path / "positions.md").write_text(head + positions_report.START + "\n" + positions_report.END
                                             + rest.partition(positions_report.END)[2])
      positions_report.write(None, tmp_path / "positions.md", records_path=path)
    else:
      ablations.write(None, tmp_path / f"{path.stem}.md", records_path=path)
    assert (tmp_path / f"{path.stem}.md").read_text() == (repo / "docs" / f"{path.stem}.md").read_text(), path


def test_the_readmes_claims_are_one_family_generated_from_the_committed_reports():
  """docs/findings.md's family table is what seq2seq.research.family makes of the committed
  reports and run records; each recomputed test agrees with the p its report printed."""
  from seq2seq.research import family

  repo = pathlib.Path(__file__).resolve().parents[1]
  found = family.claims(repo)
  text = (repo / "docs" / "findings.md").read_text(encoding="utf-8")
  assert text.split(family.START, 1)[1].split(family.END, 1)[0] == "\n" + family.table(found)
  by_name = {c.comparison: c for c in found}
  assert len(found) == 22 and len(by_name) == 22
  # Every report with committed records gives its p from the runs' unrounded final NLLs: the grid's and
  # the norms study's as their reports printed them (3 decimals).
  from seq2seq.research import records
  for name, report in (("ablations", "ablations.md"), ("ablations_prenorm_norms", "ablations_prenorm_norms.md")):
    kept = records.read(repo / "docs" / "runs" / f"{name}.jsonl")
    final = lambda v: [r.final_nll for r in kept.results if r.variant == v]
    printed = report_tables.printed_tests(repo / "docs" / report)
    for variant in sorted({r.variant for r in kept.results} - {kept.baseline}):
      claim = by_name[f"`{variant}` − `{kept.baseline}`"]
      assert claim.inputs == "run records" and claim.p == significance.welch(final(variant), final(kept.baseline)).p
      shown = printed[(variant, "Final loss")][7]
      assert shown == "< 0.001" if claim.p < 0.001 else float(shown) == round(claim.p, 3), variant
  assert by_name["`prenorm` − `prenorm+rope`"].p < 0.001
  adjusted = dict(zip(by_name, significance.holm([c.p for c in found])))
  assert sum(significance.significant(p) for p in adjusted.values()) == 12
  # The pre-norm study from its records: RoPE's gain survives, GELU's earlier near-miss (raw p 0.007 from the
  # report made before records) does not repeat.
  gelu = by_name["`prenorm+rope+gelu` − `prenorm+rope`"]
  assert gelu.inputs == "run records" and gelu.p > 0.5 and adjusted["`prenorm` − `prenorm+rope`"] < 0.01
  # The main job as shipped, quoted by the README, results.md and findings.md at its Holm p in this family.
  shipped = next(p for name, p in adjusted.items() if name.startswith("main job as shipped"))
  quoted = lambda page: " ".join((repo / page).read_text(encoding="utf-8").split())
  assert f"{shipped:.2f} after Holm's correction over the claims below" in quoted("README.md")
  for page in ("docs/results.md", "docs/findings.md"):
    assert f"Holm p = {shipped:.3f}" in quoted(page), page
  assert "at the edge" not in family.table(found)
  # Holm over these two: 0.01 x 2 = 0.02, then 0.0496 x 1, within rounding of 0.05: flagged.
  near = [family.Claim("docs/x.md", "near", 0.1, 0.0496, "x"), family.Claim("docs/x.md", "far", 0.1, 0.01, "x")]
  assert [line.split(" | ")[5] for line in family.table(near).splitlines()[2:]] == [
      "differs", "differs (at the edge: within rounding of 0.05)"]


def test_the_prose_quoting_studies_with_records_is_what_the_records_make():
  """docs/findings.md's sentences on the pre-norm and norms studies quote figures recomputed here
  from their committed records (differences, intervals, corrected and TOST p, validation BLEU):
  a rerun that moves one fails until the prose follows."""
  from seq2seq.research import records

  repo = pathlib.Path(__file__).resolve().parents[1]
  prose = " ".join((repo / "docs" / "findings.md").read_text(encoding="utf-8").split())

  def study(name):
    kept = records.read(repo / "docs" / "runs" / f"{name}.jsonl")
    found = {(c.variant, c.column): c for c in ablations.comparisons(kept.results, baseline=kept.baseline)}
    val = {v: statistics.mean(r.val_bleu for r in kept.results if r.variant == v) for v in {r.variant for r in kept.results}}
    return (lambda v, column="Final loss": found[(v, column)]), val

  interval = lambda c: f"[{signed(c.welch.low)}, {signed(c.welch.high)}]"
  t16, t17 = "BLEU test_2016_flickr", "BLEU test_2017_flickr"

  test, val = study("ablations_prenorm")
  sin, gelu, swiglu = test("prenorm"), test("prenorm+rope+gelu"), test("prenorm+rope+swiglu")
  assert sin.adjusted < 0.001
  expected = [
      f"by {sin.welch.difference:.3f}, 95% interval {interval(sin)} (corrected p < 0.001)",
      f"({val['prenorm+rope']:.2f} with RoPE against {val['prenorm']:.2f}",
      f"cost {-test('prenorm', t16).welch.difference:.2f} / {-test('prenorm', t17).welch.difference:.2f} BLEU",
      f"corrected p = {test('prenorm', t16).adjusted:.3f} / {test('prenorm', t17).adjusted:.3f})",
      f"{signed(gelu.welch.difference)} for GELU, 95% interval {interval(gelu)}, and "
      f"{signed(swiglu.welch.difference)} for SwiGLU, {interval(swiglu)}",
      f"(corrected p {gelu.adjusted:.2f} and {swiglu.adjusted:.2f})",
      f"(TOST p {gelu.tost.p:.2f} and {swiglu.tost.p:.2f} against ±0.02)",
      f"BLEU {signed(test('prenorm+rope+gelu', t16).welch.difference, 2)} / "
      f"{signed(test('prenorm+rope+gelu', t17).welch.difference, 2)} and "
      f"{signed(test('prenorm+rope+swiglu', t16).welch.difference, 2)} / "
      f"{signed(test('prenorm+rope+swiglu', t17).welch.difference, 2)}",
      f"({signed(test('prenorm+rope+gelu', t17).welch.difference, 2)}, "
      f"TOST p {test('prenorm+rope+gelu', t17).tost.p:.3f} against ±0.5)",
      f"Validation BLEU: {val['prenorm+rope+gelu']:.2f} GELU, {val['prenorm+rope+swiglu']:.2f} SwiGLU, "
      f"{val['prenorm+rope']:.2f} ReLU",
  ]
  test, val = study("ablations_prenorm_norms")
  rms, rel, ada = test("prenorm+rmsnorm"), test("prenorm+relative"), test("adanorm-xu")
  expected += [
      f"{signed(ada.welch.difference)} final NLL, {signed(test('adanorm-xu', t16).welch.difference, 2)} and "
      f"{signed(test('adanorm-xu', t17).welch.difference, 2)} BLEU",
      f"{signed(rms.welch.difference)} final NLL, 95% interval {interval(rms)}, TOST p {rms.tost.p:.3f} against ±0.02",
      f"{signed(test('prenorm+rmsnorm', t16).welch.difference, 2)} / "
      f"{signed(test('prenorm+rmsnorm', t17).welch.difference, 2)} BLEU",
      f"{signed(rel.welch.difference)} final NLL, {signed(test('prenorm+relative', t16).welch.difference, 2)} / "
      f"{signed(test('prenorm+relative', t17).welch.difference, 2)} BLEU",
      f"{val['prenorm']:.2f} for `prenorm`, {val['prenorm+rmsnorm']:.2f} RMSNorm, {val['prenorm+relative']:.2f} "
      f"relative, {val['adanorm-xu']:.2f} AdaNorm",
  ]
  assert [s for s in expected if s not in prose] == []


def test_the_grids_reading_in_findings_md_is_what_its_records_make():
  """docs/findings.md's reading of the grid quotes figures recomputed here from its committed
  records (docs/runs/ablations.jsonl): which final-NLL differences survive the correction and
  by how much, which are equivalent or inconclusive, which BLEU gains survive, validation
  BLEU, and what the comparison with Narang et al. and the pre-norm paragraph quote. A rerun
  that moves one fails until the prose follows."""
  from seq2seq.research import records

  repo = pathlib.Path(__file__).resolve().parents[1]
  kept = records.read(repo / "docs" / "runs" / "ablations.jsonl")
  found = {(c.variant, c.column): c for c in ablations.comparisons(kept.results, baseline=kept.baseline)}
  prose = " ".join((repo / "docs" / "findings.md").read_text(encoding="utf-8").split())
  nll, t16, t17 = report_tables.TESTED
  order = [v for v, column in found if column == nll]
  assert len(order) == 12 and all(found[(v, c)].welch.n == 3 for v in order for c in report_tables.TESTED)
  d = lambda v, column=nll: found[(v, column)].welch.difference
  reading = lambda v, column=nll: found[(v, column)].reading
  interval = lambda v, column=nll, digits=3: (f"[{signed(found[(v, column)].welch.low, digits)}, "
                                              f"{signed(found[(v, column)].welch.high, digits)}]")
  listing = lambda items: " and ".join([", ".join(items[:-1]), items[-1]] if len(items) > 1 else items)
  words = "none one two three four five six seven eight nine ten eleven twelve".split()
  val = {v: statistics.fmean(r.val_bleu for r in kept.results if r.variant == v) for v in [kept.baseline, *order]}

  differs = sorted((v for v in order if reading(v) == "differs"), key=d)
  assert all(d(v) < 0 for v in differs)  # the prose says "below"
  rest = [v for v in order if v not in differs]
  level = [v for v in rest if reading(v) == "equivalent"]
  open_ = [v for v in rest if reading(v) == "inconclusive"]
  both = [v for v in order if reading(v, t16) == reading(v, t17) == "differs"]
  one = [(v, c) for v in order if v not in both for c in (t16, t17) if reading(v, c) == "differs"]
  others = [(v, c) for v in order for c in (t16, t17) if reading(v, c) != "differs"]
  glus = [d(v) for v in ("reglu", "geglu", "swiglu")]
  rms = found[("rmsnorm", nll)].welch
  expected = [
      f"**Final NLL: {words[len(differs)]} of the twelve modifications end below post-norm vanilla after the "
      f"correction**: {listing([f'`{v}` {signed(d(v))}' for v in differs])}",
      (f"Within ±0.02 NLL of vanilla by TOST: {listing([f'`{v}` {signed(d(v))}' for v in level])}" if level
       else "None is within ±0.02 NLL of vanilla by TOST"),
      f"inconclusive: {listing([f'`{v}` {signed(d(v))} {interval(v)}' for v in open_])}",
      (f"**BLEU: {listing([f'`{v}` {signed(d(v, t16), 2)} / {signed(d(v, t17), 2)}' for v in both])} on both test "
       "sets**" if both else "**BLEU: no variant's gain survives on both test sets**"),
      f"the other {len(others)} BLEU differences ({signed(min(d(*k) for k in others), 2)} to "
      f"{signed(max(d(*k) for k in others), 2)}) do not survive 36 tests (raw p "
      f"{min(found[k].welch.p for k in others):.3f} to {max(found[k].welch.p for k in others):.3f})",
      f"Validation BLEU (from the records, untested): `{kept.baseline}` {val[kept.baseline]:.2f}, "
      + listing([f"`{v}` {val[v]:.2f}" for v in sorted(order, key=val.get, reverse=True)]),
      # Against Narang et al.
      f"GELU and Swish: {signed(d('gelu'))} and {signed(d('swish'))} NLL (corrected p = "
      f"{found[('gelu', nll)].adjusted:.3f} / {found[('swish', nll)].adjusted:.3f}, {reading('gelu')} / "
      f"{reading('swish')})",
      f"the GLUs ({signed(min(glus))} to {signed(max(glus))} NLL, {listing(sorted({reading(v) for v in ('reglu', 'geglu', 'swiglu')}))})",
      f"RMSNorm: {signed(d('rmsnorm'))} NLL, 95% interval {interval('rmsnorm')}, their −0.017 "
      + ("inside it" if rms.low <= -0.017 <= rms.high else "outside it"),
      # The pre-norm paragraph: the activations on post-norm vanilla.
      f"**GELU and SwiGLU**, {-d('gelu'):.3f} and {-d('swiglu'):.3f} NLL below ReLU on post-norm vanilla "
      f"({reading('gelu')} and {reading('swiglu')} in the grid)",
  ]
  if one:
    expected.append(f"on one test set: {listing([f'`{v}` {signed(d(v, c), 2)} on {c[5:]}' for v, c in one])}")
  assert [s for s in expected if s not in prose] == []


def test_the_grids_table_in_findings_md_quotes_its_report():
  """docs/findings.md's table of the grid quotes, row for row,
  what docs/ablations.md's tests print: the final-NLL difference, interval and reading as
  printed, and each Holm p rounded to the digits shown, its * included."""
  repo = pathlib.Path(__file__).resolve().parents[1]
  report = report_tables.printed_tests(repo / "docs" / "ablations.md")
  text = (repo / "docs" / "findings.md").read_text(encoding="utf-8")
  rows = report_tables.table_rows(text[text.index("| variant | final NLL vs vanilla |"):])
  assert sorted(row[0].strip("`") for row in rows) == sorted({v for v, _ in report})

  def same_p(quoted: str, printed: str) -> bool:
    if quoted.rstrip("*") == "< 0.001" or printed.rstrip("*") == "< 0.001":
      return quoted == printed
    digits = len(quoted.rstrip("*").split(".")[1])
    return (quoted.endswith("*") == printed.endswith("*")
            and float(quoted.rstrip("*")) == round(float(printed.rstrip("*")), digits))

  for quoted, nll, interval, nll_p, said, bleus, bleu_ps in rows:
    variant = quoted.strip("`")
    final = report[(variant, "Final loss")]
    assert (nll, interval, said) == (final[4], final[5], final[10]) and same_p(nll_p, final[8]), variant
    for column, bleu, p in zip(("BLEU test_2016_flickr", "BLEU test_2017_flickr"), bleus.split(" / "),
                               bleu_ps.split(" / ")):
      assert bleu == report[(variant, column)][4] and same_p(p, report[(variant, column)][8]), (variant, column)


def scaling_mean(runs) -> str:
  return "{:.3f} ± {:.3f}".format(*significance.summary([r.final_nll for r in runs])[:2])


def scaling_reading(results, family_claims) -> list[str]:
  """What docs/findings.md says of the scaling rerun, made from its records: the rate each side
  chose at each size, and Transformer++ small against vanilla's best size with the family's
  Holm p."""
  from seq2seq.research import family

  chosen = {(architecture, size): f"{multiplier.base_rate(runs[0]):g}" for architecture in ("vanilla", "transformer++")
            for size, (_, runs) in multiplier.best_by_size(results, architecture).items()}
  small, strong, size, weak = multiplier.smallest_against_best(results)
  w = significance.welch([r.final_nll for r in strong], [r.final_nll for r in weak])
  adjusted = dict(zip(family_claims, significance.holm([c.p for c in family_claims])))
  holm = next(a for c, a in adjusted.items() if c.source == family.SCALING and "best size" in c.comparison)
  mean = scaling_mean
  ratio = next(m for m in multiplier.multipliers(results) if m.size == small).weak_max
  # At the base size, each at its best rate: the report's modifications test, one of the family's.
  (pp, pp_runs), (_, vanilla_runs) = (multiplier.best_by_size(results, a)["base"] for a in ("transformer++", "vanilla"))
  at_base = significance.welch([r.final_nll for r in pp_runs], [r.final_nll for r in vanilla_runs])
  base_holm = next(a for c, a in adjusted.items() if c.source == family.SCALING and c.comparison.startswith(f"`{pp}`"))
  return [f"for vanilla {chosen['vanilla', 'small']} at the small size and {chosen['vanilla', 'base']} at the base size; "
          f"for Transformer++ {chosen['transformer++', 'small']} at the small size and "
          f"{chosen['transformer++', 'base']} at the base size",
          f"Its seeds 1 to 3 end at {mean(strong)} final NLL, vanilla's best size ({size}, seeds 1 to 3) at "
          f"{mean(weak)}: {signed(w.difference)} [{signed(w.low)}, {signed(w.high)}] (Welch p = {w.p:.2g}; in the "
          f"README's family, Holm p = {holm:.2g}).",
          f"the widest vanilla run used {ratio:.2f}x its training FLOPs",
          f"At the base size, each at its best rate (seeds 1 to 3), Transformer++ ends at {mean(pp_runs)} against "
          f"vanilla's {mean(vanilla_runs)}: {signed(at_base.difference)} [{signed(at_base.low)}, "
          f"{signed(at_base.high)}] (Welch p = {at_base.p:.2g}; in the README's family, Holm p = {base_holm:.2g})."]


def test_the_scaling_reading_in_findings_md_is_its_records():
  """docs/findings.md's reading of the rate search and of Transformer++ small against vanilla's
  best size is what docs/runs/ablations_scaling.jsonl makes (scaling_reading), and every
  vanilla run ends above every confirmatory run of Transformer++ small, as it says."""
  from seq2seq.research import family, records

  repo = pathlib.Path(__file__).resolve().parents[1]
  results = records.read(repo / "docs" / "runs" / "ablations_scaling.jsonl").results
  text = " ".join((repo / "docs" / "findings.md").read_text(encoding="utf-8").split())
  for sentence in scaling_reading(results, family.claims(repo)):
    assert sentence in text
  _, strong, _, _ = multiplier.smallest_against_best(results)
  vanilla = [r for r in results if multiplier.architecture_of(r.variant) == "vanilla"]
  assert "Every vanilla run of the study, at every rate and seed, ends above every Transformer++ small run" in text
  assert min(r.final_nll for r in vanilla) > max(r.final_nll for r in strong)
  # The exploratory longer run: every scaling run trains 720 steps (what the README's claim says), and a vanilla
  # small run of 2880 steps passes Transformer++ small's NLL between the two FLOPs ratios quoted.
  assert {len(r.curve) for r in results} == {8}  # 720 steps, validated every 90
  (longer,) = records.read(repo / "docs" / "runs" / "ablations_longer.jsonl").results
  assert (longer.variant, longer.size, longer.seed) == ("vanilla+lr0.004", "small", 0)
  assert "--config.train.steps=2880" in longer.command and len(longer.curve) == 32
  target, spent = statistics.fmean(r.final_nll for r in strong), statistics.fmean(r.curve[-1][0] for r in strong)
  after = next(i for i, (_, nll) in enumerate(longer.curve) if nll <= target)
  assert after > 0 and longer.curve[-1][1] < target
  assert (f"It ends at {longer.final_nll:.3f} final NLL, and its validation NLL passes Transformer++ small's "
          f"{target:.3f} between {longer.curve[after - 1][0] / spent:.2f}x and {longer.curve[after][0] / spent:.2f}x "
          "Transformer++ small's training FLOPs") in text
  # The BLEU of the base-size comparison is the report's, and the time is the records' (the report's Time: line
  # sums all 24; the commits split them into the sittings that made them).
  report = {(row[0], row[1]): row for row in report_tables.rows((repo / "docs" / "ablations_scaling.md").read_text())}
  (pp, _), _ = (multiplier.best_by_size(results, a)["base"] for a in ("transformer++", "vanilla"))
  t16, t17 = (report[(f"`{pp}`", column)][4] for column in report_tables.TESTED[1:])
  assert f"In BLEU, secondary, {t16} / {t17} on test_2016_flickr / test_2017_flickr (the report's correction)" in text
  minutes = lambda runs, key: f"{sum(getattr(r, key) for r in runs) / 60:.1f}"
  by_commit = {}
  for r in results:
    by_commit.setdefault(r.commit, []).append(r)
  first, base, confirm = sorted(by_commit.values(), key=len, reverse=True)
  assert ({r.size for r in confirm}, {r.size for r in base}, len(first)) == ({"small"}, {"base"}, 15)
  assert (f"{minutes(results, 'train_seconds')} minutes of training and {minutes(results, 'eval_seconds')} of "
          f"test-set translation for the {len(results)} runs, on a 2-core Intel Xeon, from three commits: "
          f"{len(first)} runs from `{first[0].commit}` ({minutes(first, 'train_seconds')} minutes of training), "
          f"vanilla small's three confirmatory seeds from `{confirm[0].commit}` ({minutes(confirm, 'train_seconds')}) "
          f"and Transformer++ base's six, its search and seeds 1 to 3, from `{base[0].commit}` "
          f"({minutes(base, 'train_seconds')})") in text
  assert {r.hardware for r in results} == {"2-core Intel(R) Xeon(R) Processor @ 2.80GHz"}
  # A rerun of the large size by this protocol: as many runs as the base size took, at twice its width.
  from seq2seq.research import variants

  assert variants.SIZES["large"] == 2 * variants.SIZES["base"]
  assert (f"A rerun by this protocol is {sum(r.size == 'base' for r in results)} runs at the large size (twice the "
          "base width") in text
  # docs/sweeps.md's protocol: the grid's rate, 0.002, is also the rerun's seed-0 choice for vanilla at its size.
  searched = {f"{multiplier.base_rate(r):g}": f"{r.final_nll:.3f}" for r in vanilla if r.size == "base" and r.seed == 0}
  chosen, kept = multiplier.best_rate([r for r in vanilla if r.size == "base"])
  assert chosen == "vanilla" and sorted(searched) == ["0.001", "0.002", "0.004"]
  protocol = " ".join((repo / "docs" / "sweeps.md").read_text(encoding="utf-8").split())
  assert (f"with seed 0: {searched['0.002']} at 0.002 against {searched['0.001']} at 0.001 and {searched['0.004']} "
          f"at 0.004 (its seeds 1 to 3 at 0.002: {scaling_mean(kept)})") in protocol
  # ... and Transformer++'s best there is 0.004, not the grid's rate.
  pp = [r for r in results if multiplier.architecture_of(r.variant) == "transformer++" and r.size == "base"]
  searched = {f"{multiplier.base_rate(r):g}": f"{r.final_nll:.3f}" for r in pp if r.seed == 0}
  chosen, kept = multiplier.best_rate(pp)
  assert chosen == "transformer+++lr0.004" and sorted(searched) == ["0.002", "0.004", "0.008"]
  assert (f"Transformer++'s best at this size is 0.004 with seed 0 ({searched['0.004']}, against "
          f"{searched['0.002']} at 0.002 and {searched['0.008']} at 0.008; its seeds 1 to 3 at 0.004: "
          f"{scaling_mean(kept)})") in protocol


def test_a_report_states_its_question_and_the_limits_its_runs_set():
  """The report's limits come from the runs: one rate or several, one size or several, one
  tokenization (its token count) or several."""
  import dataclasses

  runs = [dataclasses.replace(result(v, s, 2.5), learning_rate=0.002, val_tokens=17861)
          for v in ("vanilla", "gelu") for s in range(3)]
  text = " ".join(ablations.scope(runs))
  assert "Does each variant change `vanilla`'s final validation NLL (the primary metric)" in text
  assert "One peak learning rate for every variant, 0.002:" in text
  assert "one model size (1.0M parameters for `vanilla`)" in text
  assert "one tokenization (17,861 validation target tokens)" in text
  mixed = [dataclasses.replace(r, learning_rate=0.004, val_tokens=17177) if r.variant == "gelu" else r for r in runs]
  mixed.append(dataclasses.replace(runs[0], size="small"))
  text = " ".join(ablations.scope(mixed))
  assert "Peak learning rates 0.002, 0.004" in text and "the modifications table at the base size only" in text
  assert "runs of several tokenizations: their NLLs do not compare" in text


def test_the_familys_reading_in_findings_md_is_what_the_family_and_the_reports_make():
  """The paragraph under findings.md's family table: GELU's and ReGLU's raw p, their Holm p in
  the grid's own tests and in the family, Swish's, pre-norm GELU's, and the main job's raw and
  family p and its own table's BLEU gain, each recomputed from the records."""
  from seq2seq.research import family, recipe_search, records

  repo = pathlib.Path(__file__).resolve().parents[1]
  found = {c.comparison: c for c in family.claims(repo)}
  holm = dict(zip(found, significance.holm([c.p for c in found.values()])))
  grid = records.read(repo / "docs" / "runs" / "ablations.jsonl")
  in_grid = {c.variant: c for c in ablations.comparisons(grid.results, baseline=grid.baseline) if c.column == "Final loss"}
  gelu, reglu, swish = (found[f"`{v}` − `vanilla`"] for v in ("gelu", "reglu", "swish"))
  tests = sum(1 for c in ablations.comparisons(grid.results, baseline=grid.baseline) if c.welch.tested)
  shipped = next(name for name in found if name.startswith("main job as shipped"))
  rows, adjusted = recipe_search.comparison(recipe_search.load(repo / "docs" / "runs" / "main_job_search.jsonl"),
                                            recipe_search.ROWS64, recipe_search.BASELINE)
  assert f"{adjusted[0]:.3f}" == f"{adjusted[1]:.3f}"  # "for both"
  prenorm_gelu = found["`prenorm+rope+gelu` − `prenorm+rope`"]
  quoted = [
      f"GELU ({signed(gelu.difference, 3)} NLL, raw p = {gelu.p:.3f}) and ReGLU ({signed(reglu.difference, 3)}, raw p = "
      f"{reglu.p:.3f}) are inconclusive in the grid's own {tests} tests (Holm {in_grid['gelu'].adjusted:.3f} and "
      f"{in_grid['reglu'].adjusted:.3f}, BLEU's tests included) and differ in this family of {len(found)} NLL tests "
      f"(Holm {holm['`gelu` − `vanilla`']:.3f} and {holm['`reglu` − `vanilla`']:.3f})",
      f"Swish (Holm p = {holm['`swish` − `vanilla`']:.3f} here) is inconclusive",
      f"({signed(prenorm_gelu.difference, 3)}, raw p = {prenorm_gelu.p:.2f})",
      f"({signed(found[shipped].difference, 3)}, raw p = {found[shipped].p:.3f}, Holm p = {holm[shipped]:.3f})",
      f"(+{rows[1][3].difference:.1f} BLEU, Holm p = {adjusted[0]:.3f} for both)",
  ]
  # "Until 2026-12-01 the family held the main job as it was then": the same family with the 3600-step
  # runs' comparison in the shipped one's place.
  then_rows, _ = recipe_search.comparison(recipe_search.load(repo / "docs" / "runs" / "main_job_search.jsonl"),
                                          recipe_search.SHIPPED, recipe_search.BASELINE)
  then = then_rows[0][3]
  then_holm = significance.holm([then.p if name == shipped else c.p for name, c in found.items()])
  quoted.append(f"(rows of 128, 3600 steps: {signed(then.difference, 3)}, raw p = {then.p:.3f}, "
                f"Holm p = {then_holm[list(found).index(shipped)]:.3f})")
  assert not significance.significant(in_grid["gelu"].adjusted) and significance.significant(holm["`gelu` − `vanilla`"])
  assert not significance.significant(holm["`swish` − `vanilla`"]) and swish.difference < 0
  prose = " ".join((repo / "docs" / "findings.md").read_text(encoding="utf-8").split())
  for sentence in quoted:
    assert sentence in prose, sentence


def test_the_rates_behind_the_grid_in_findings_md_are_the_scaling_searchs_records():
  """"One learning rate": vanilla's and Transformer++'s final validation NLLs at each rate of the
  scaling study's seed-0 search at the base size, and Transformer++'s confirmatory seeds at its
  best rate, as docs/runs/ablations_scaling.jsonl holds them."""
  from seq2seq.research import records

  repo = pathlib.Path(__file__).resolve().parents[1]
  kept = records.read(repo / "docs" / "runs" / "ablations_scaling.jsonl").results
  base = [r for r in kept if r.size == "base"]
  at = lambda arch, rate, seed=0: next(r.final_nll for r in base if r.seed == seed and math.isclose(r.learning_rate, rate)
                                       and r.variant.split("+lr")[0] == arch)
  confirm = [r.final_nll for r in base if r.variant == "transformer+++lr0.004" and r.seed > 0]
  assert len(confirm) == 3 and min(at("vanilla", x) for x in (0.001, 0.004)) > at("vanilla", 0.002)
  quoted = [f"vanilla ends at a validation NLL of {at('vanilla', 0.002):.3f} there, against {at('vanilla', 0.001):.3f} at "
            f"0.001 and {at('vanilla', 0.004):.3f} at 0.004",
            f"it ends at {at('transformer++', 0.004):.3f} at 0.004, against {at('transformer++', 0.002):.3f} at the grid's "
            f"0.002 and {at('transformer++', 0.008):.3f} at 0.008 (seed 0 each; its seeds 1 to 3 at 0.004 end at "
            f"{statistics.mean(confirm):.3f} ± {statistics.stdev(confirm):.3f}"]
  prose = " ".join((repo / "docs" / "findings.md").read_text(encoding="utf-8").split())
  for sentence in quoted:
    assert sentence in prose, sentence


def test_the_grid_and_prenorm_readings_in_findings_md_are_their_records():
  """findings.md's bullets on the grid (GELU's corrected p, the raw p 36 tests ask for, BLEU's
  largest seed spread, GELU's and Swish's BLEU gains) and its pre-norm paragraph (the 9 tests,
  what survives, the activations' intervals), recomputed from the two studies' records."""
  from seq2seq.research import records

  repo = pathlib.Path(__file__).resolve().parents[1]

  def study(name):
    kept = records.read(repo / "docs" / "runs" / f"{name}.jsonl")
    return kept, {(c.variant, c.column): c for c in ablations.comparisons(kept.results, baseline=kept.baseline)}

  grid, found = study("ablations")
  sets = ("test_2016_flickr", "test_2017_flickr")
  spread = max(statistics.stdev([r.bleu[s] for r in grid.results if r.variant == v])
               for v in {r.variant for r in grid.results} for s in sets)
  gains = [found[(v, f"BLEU {s}")].welch.difference for v in ("gelu", "swish") for s in sets]
  prenorm, pre = study("ablations_prenorm")
  fl = lambda v: pre[(v, "Final loss")].welch
  activations = [fl("prenorm+rope+gelu"), fl("prenorm+rope+swiglu")]
  quoted = [
      f"GELU's corrected p, {found[('gelu', 'Final loss')].adjusted:.3f}, is just above 0.05",
      f"{len(found)} tests ask for raw p below {0.05 / len(found):.4f} to 0.05",
      f"(std up to {spread:.2f})",
      f"BLEU gains of {signed(min(gains), 1)} to {signed(max(gains), 1)} untested after the correction",
      f"{len({v for v, _ in pre})} variants x {len({c for _, c in pre})} columns, {len(pre)} tests. Two survive",
      f"raise the final NLL by {fl('prenorm').difference:.3f} (corrected p < 0.001) and cost "
      f"{-pre[('prenorm', 'BLEU test_2016_flickr')].welch.difference:.2f} BLEU on test_2016_flickr "
      f"({pre[('prenorm', 'BLEU test_2016_flickr')].adjusted:.3f}); their "
      f"{-pre[('prenorm', 'BLEU test_2017_flickr')].welch.difference:.2f} on test_2017_flickr does not survive "
      f"({pre[('prenorm', 'BLEU test_2017_flickr')].adjusted:.3f})",
      f"GELU ({signed(activations[0].difference, 3)} NLL, [{signed(activations[0].low, 3)}, "
      f"{signed(activations[0].high, 3)}]) and SwiGLU ({signed(activations[1].difference, 3)}, "
      f"[{signed(activations[1].low, 3)}, {signed(activations[1].high, 3)}])",
      f"(95% intervals from {signed(min(w.low for w in activations), 3)} to {signed(max(w.high for w in activations), 3)} NLL)",
  ]
  assert sum(significance.significant(c.adjusted) for c in pre.values()) == 2
  assert not significance.significant(found[("gelu", "Final loss")].adjusted) and all(g > 0 for g in gains)
  prose = " ".join((repo / "docs" / "findings.md").read_text(encoding="utf-8").split())
  assert [s for s in quoted if s not in prose] == []


def test_sweeps_md_quotes_its_records_and_history():
  """docs/sweeps.md's commands say what each study cost as its records sum it (each report's Time:
  line), which runs the pre-norm study shares with the norms study, the tokenization its reports
  share, the main job's time a run as docs/results.md's table gives it, and the config's history
  as docs/history.md tells it."""
  from seq2seq.research import records, sweep, variants

  repo = pathlib.Path(__file__).resolve().parents[1]
  page, history = words("docs/sweeps.md").replace(" # ", " "), words("docs/history.md")
  study = {name: records.read(repo / "docs" / "runs" / f"{name}.jsonl").results
           for name in ("ablations", "ablations_prenorm", "ablations_prenorm_norms")}
  minutes = lambda runs, key: sum(getattr(r, key) for r in runs) / 60
  for name, runs in study.items():
    assert {r.hardware for r in runs} == {"2-core AMD EPYC"}, name
    assert (f"Time: {minutes(runs, 'train_seconds'):.1f} min of training and {minutes(runs, 'eval_seconds'):.1f} min "
            f"of test-set translation for {len(runs)} runs") in words(f"docs/{name}.md"), name
  grid, pre, norms = study.values()
  assert len(variants.DEFAULT) == 13 and sweep._SEEDS.default == 2
  assert (f"The default grid: {len(variants.DEFAULT)} variants x 3 seeds of configs/multi30k_sweep.py, 720 steps: "
          f"docs/ablations.md (2 CPU cores: {minutes(grid, 'train_seconds'):.1f} minutes of training and "
          f"{minutes(grid, 'eval_seconds'):.1f} of translation for the {len(grid)} runs on a 2-core AMD EPYC, "
          f"{(minutes(grid, 'train_seconds') + minutes(grid, 'eval_seconds')) / len(grid):.1f} minutes a run in all; "
          f"without --seeds a sweep makes 2 seeds, {2 * len(variants.DEFAULT)} runs)") in page
  shared = {(r.name, r.final_nll) for r in pre} & {(r.name, r.final_nll) for r in norms}
  assert {name for name, _ in shared} == {"prenorm-s0", "prenorm-s1", "prenorm-s2"}
  assert (f"{len(pre) - len(shared)} new runs, RoPE's first ({minutes(pre, 'train_seconds'):.1f} minutes of training "
          f"for the {len(pre)} and {minutes(pre, 'eval_seconds'):.1f} of translation on a 2-core AMD EPYC)") in page
  assert (f"docs/ablations_prenorm_norms.md and its records, {len(norms)} runs ({minutes(norms, 'train_seconds'):.1f} "
          f"minutes of training and {minutes(norms, 'eval_seconds'):.1f} of test-set translation on a 2-core AMD EPYC)"
          ) in page
  (tokens,) = {r.val_tokens for runs in study.values() for r in runs}
  assert f"the reports with records were made under it ({tokens:,} tokens)" in page
  (main,) = {row[8] for row in report_tables.results_table()["m30k_p64_readme"]}
  assert f"the main job's config ({main} a run on 2 CPU cores, as docs/results.md's main job" in page
  # The config's history, quoted.
  for quoted, source in [("3.5 after 500 steps: too slow; d_model 256: 10 minutes a run), its 720 steps by the "
                          "3-hour budget for the grid", ("alike, 3.5 after 500 (7.7 greedy BLEU): too slow.",
                                                         "(25.2), but 10 minutes a run.", "over the 3-hour budget")),
                         ("The rate between (0.003 at 720 steps) has only a test BLEU (24.95)",
                          ("720 steps at 0.003: 24.95 BLEU",))]:
    assert quoted in page and all(s in history for s in source), quoted


def test_the_asides_of_findings_md_are_the_records_and_history():
  """The figures findings.md repeats or mentions in passing: each recomputed from the records
  (docs/runs/), the configs, or quoted from docs/history.md where that is their only source."""
  from seq2seq.research import family, recipe_search, records, variants

  repo = pathlib.Path(__file__).resolve().parents[1]
  prose, history = words("docs/findings.md"), words("docs/history.md")
  kept = {name: records.read(repo / "docs" / "runs" / f"{name}.jsonl")
          for name in ("ablations", "ablations_prenorm", "ablations_prenorm_norms", "ablations_scaling")}
  tests = {name: {(c.variant, c.column): c for c in ablations.comparisons(k.results, baseline=k.baseline)}
           for name, k in kept.items()}
  nll = "Final loss"
  grid, pre, norms = (tests[n] for n in ("ablations", "ablations_prenorm", "ablations_prenorm_norms"))
  expected = []
  # The pre-norm GELU of the report made before records, as history keeps it.
  assert "([−0.041, −0.014], raw p 0.009, corrected 0.064)" in history
  expected.append("GELU on the pre-norm base, which the report made before records put at raw p = 0.009")
  # Three seeds a side, 36 tests: Welch's degrees of freedom and Holm's thresholds.
  seeds = {sum(r.variant == v for r in kept["ablations"].results) for v in {r.variant for r in kept["ablations"].results}}
  tested = [c for c in grid.values() if c.welch.tested]
  assert seeds == {3} and len(tested) == 36
  expected.append(f"with 3 seeds a side Welch has {3 - 1} to {2 * 3 - 2} degrees of freedom, and {len(tested)} tests "
                  f"ask for raw p below {0.05 / len(tested):.4f} to 0.05")
  n_family = len(family.claims(repo))
  expected += [f"In the README's family of {n_family} final-NLL tests", f"surviving the family of {n_family} NLL tests"]
  # BLEU left untested by the grid's correction.
  bleu = [c for c in tested if c.column != nll]
  open_ = [c for c in bleu if not significance.significant(c.adjusted)]
  expected.append(f"leaves {len(open_)} of the grid's {len(bleu)} BLEU differences, up to "
                  f"{max(abs(c.welch.difference) for c in open_):.2f} points, untested after a correction over "
                  f"{len(tested)} tests")
  # Where the grid's runs end, against the main job's confirmatory runs.
  ends = [r.final_nll for r in kept["ablations"].results]
  searched = recipe_search.load(repo / "docs" / "runs" / "main_job_search.jsonl")
  confirm = [r.nll for r in searched if r.run.startswith((recipe_search.CHOSEN, recipe_search.SHIPPED,
                                                          recipe_search.ROWS64))]
  expected.append(f"end at a validation NLL of {min(ends):.2f} to {max(ends):.2f}, against {min(confirm):.2f} to "
                  f"{max(confirm):.2f} for the main job's confirmatory runs")
  # Repeats of the reports' differences.
  expected += [f"to GELU {signed(pre[('prenorm+rope+gelu', nll)].welch.difference)} and SwiGLU "
               f"{signed(pre[('prenorm+rope+swiglu', nll)].welch.difference)} NLL, inconclusive",
               f"RoPE on the same base beat sinusoidal positions by {pre[('prenorm', nll)].welch.difference:.3f} NLL",
               f"the grid's Transformer++ row ({signed(grid[('transformer++', nll)].welch.difference)} NLL"]
  # AdaNorm is behind LayerNorm at the first quarter's validation too.
  early = lambda v: statistics.fmean(r.early_nll for r in kept["ablations_prenorm_norms"].results if r.variant == v)
  assert early("adanorm-xu") > early("prenorm") and norms[("adanorm-xu", nll)].welch.difference > 0
  expected.append("It is already behind at 25% of the steps")
  # The norms rerun: its runs, its tokenization and its vocabulary.
  runs = kept["ablations_prenorm_norms"].results
  (tokens,) = {r.val_tokens for r in runs}
  vocab = configs.get("multi30k_sweep").data.vocab_size
  expected.append(f"The {len(runs)} runs were made on 2026-11-28 with the command in [docs/sweeps.md](sweeps.md#commands), "
                  f"under the pinned sentencepiece 0.2.2 ({tokens:,} validation target tokens in this {vocab}-piece "
                  "vocabulary)")
  # The scaling study at the base size: parameters, and Transformer++ small's seeds.
  scaling = kept["ablations_scaling"].results
  params = lambda v: {r.params for r in scaling if r.variant == v and r.size == "base"}
  ((pp,), (vanilla,)) = params("transformer+++lr0.004"), params("vanilla")
  _, strong, _, _ = multiplier.smallest_against_best(scaling)
  expected += [f"Equal parameters ({pp / 1e6:.2f}M against {vanilla / 1e6:.2f}M)",
               f"Transformer++ small ({scaling_mean(strong)}; untested)"]
  # The sizes not rerun, as history describes them.
  assert "(d_model 384) and R / 2 at xlarge (d_model 768, vanilla only, on a GPU)" in history
  assert "vanilla at d_model 768 (xlarge), on one H100" in history
  assert variants.SIZES["large"] == 2 and variants.SIZES["xlarge"] == 4
  expected.append("of the first study (d_model 384 on the CPU, 768 on an H100")
  assert [s for s in expected if s not in prose] == []


def test_the_rest_of_sweeps_md_is_the_records_the_configs_and_the_formulas():
  """docs/sweeps.md's other figures: RoPE's pre-norm difference, where learned positions lose
  significantly (the positions study's records), the sweep config's schedule, Welch's degrees of
  freedom and interval widths for 2 and 3 seeds a side (scipy's t quantiles), and the rates per
  size (variants.size_learning_rate)."""
  from seq2seq.research import positions_report, records, variants

  repo = pathlib.Path(__file__).resolve().parents[1]
  page, history = words("docs/sweeps.md"), words("docs/history.md")
  pre = records.read(repo / "docs" / "runs" / "ablations_prenorm.jsonl")
  (sin,) = [c for c in ablations.comparisons(pre.results, baseline=pre.baseline)
            if (c.variant, c.column) == ("prenorm", "Final loss")]
  assert sin.adjusted < 0.001
  expected = [f"sinusoidal positions {signed(sin.welch.difference)} final NLL, corrected p < 0.001, the pre-norm "
              "study's records"]
  # Learned positions: the significant differences are in the buckets up to twice the training length.
  runs, head = positions_report.read_records(repo / "docs" / "runs" / "positions.jsonl")
  by_kind = positions_report.per_run(runs, tuple(head["upper"]))
  labels = [s["label"] for s in by_kind["sinusoidal"][0]]
  lost = {c.cells[1] for c in positions_report.comparisons(by_kind)
          if c.variant == "learned" and significance.significant(c.adjusted) and c.welch.difference < 0}
  assert head["upper"][1] == 2 * head["upper"][0] and lost == set(labels[:2])
  expected.append("lose significantly only on sources up to twice the training length")
  # The schedule.
  config = configs.get("multi30k_sweep")
  assert "calibrated for vanilla to pass 25 BLEU in the least time" in history
  expected.append(f"**The schedule.** {config.train.steps} steps at a peak rate of {config.train.learning_rate:g}, "
                  f"decoding to source + {config.eval.max_len_b} tokens")
  expected.append("It was calibrated for vanilla to pass 25 BLEU in the least time, on test BLEU")
  # Welch: degrees of freedom n - 1 to 2n - 2, and the 95% interval's half-width in standard errors.
  width = lambda df: stats.t.ppf(0.975, df)
  expected.append(f"With 2 seeds a side Welch's degrees of freedom are between 1 and 2: the 95% interval is "
                  f"{width(2):.1f} to {width(1):.1f} standard errors wide on each side")
  expected.append(f"With 3 a side they are 2 to 4, and the interval {width(4):.1f} to {width(2):.1f} standard errors wide")
  # The peak rate per size.
  rate = lambda size, base: variants.size_learning_rate(size, base).get("train.learning_rate", base)
  expected.append(f"on the Multi30k grid {' / '.join(f'{rate(s, 0.002):.3g}' for s in ('small', 'base', 'large'))}, "
                  f"and {' / '.join(f'{rate(s, 0.003):.3g}' for s in ('small', 'base', 'large'))} on the 800-step one")
  assert "800 steps at peak rate 0.003" in history and config.train.learning_rate == 0.002
  assert [s for s in expected if s not in page] == []
