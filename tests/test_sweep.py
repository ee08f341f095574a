"""Architecture sweeps: each variant's overrides build the intended model, the table
arithmetic on synthetic results, the runs' commands, and resuming a killed sweep."""

import dataclasses
import json
import math
import re
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import pytest
from flax import nnx

from seq2seq import configs, metrics, provenance
from seq2seq.errors import DataError
from seq2seq.research import ablations, multiplier, records, runs as sweep_runs, significance, sweep, variants
from seq2seq.model.config import ModelConfig
from seq2seq.model.transformer import abstract, count_params

REPO = pathlib.Path(__file__).resolve().parents[1]


def model_of(name: str, size: str = "base", config_name: str = "multi30k"):
  config = configs.get(config_name)
  model = config.model.to_dict()
  changes = variants.overrides(name, model, config.data.vocab_size, size)
  model |= {k.split(".", 1)[1]: v for k, v in changes.items()}
  return ModelConfig.from_config(model, config.data.vocab_size)


def param_paths(cfg: ModelConfig) -> list[str]:
  state = nnx.state(abstract(cfg), nnx.Param)
  return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state)]


def test_vanilla_is_vaswani_whatever_the_base_config():
  cfg = model_of("vanilla", config_name="multi30k")  # multi30k.py itself is pre-norm
  assert (cfg.norm_position, cfg.norm, cfg.activation, cfg.positions, cfg.use_bias, cfg.tie_output) == (
      "post", "layernorm", "relu", "sinusoidal", True, True)
  base = configs.get("multi30k").model
  assert (cfg.d_model, cfg.d_ff) == (base.d_model, base.d_ff) == (128, 256)  # sizes stay the config's


@pytest.mark.parametrize("name, settings", [
    ("gelu", dict(activation="gelu")), ("swish", dict(activation="swish")),
    ("rmsnorm", dict(norm="rmsnorm")), ("prenorm", dict(norm_position="pre")), ("adanorm", dict(norm="adanorm")),
    ("learned", dict(positions="learned")), ("rope", dict(positions="rope")), ("untied", dict(tie_output=False)),
    ("nobias", dict(use_bias=False)),
    ("glu", dict(activation="glu", d_ff=168)), ("reglu", dict(activation="reglu", d_ff=168)),
    ("geglu", dict(activation="geglu", d_ff=168)), ("swiglu", dict(activation="swiglu", d_ff=168)),
    ("transformer++", dict(norm_position="pre", norm="rmsnorm", activation="swiglu", positions="rope",
                           use_bias=False, d_ff=168)),
])
def test_each_variant_changes_what_it_names_and_nothing_else(name, settings):
  vanilla, cfg = model_of("vanilla"), model_of(name)
  changed = {k: getattr(cfg, k) for k in vars(cfg) if getattr(cfg, k) != getattr(vanilla, k)}
  assert changed == settings
  paths = param_paths(cfg)
  assert any("wg_df" in p for p in paths) == (settings.get("activation") in variants_gated())
  assert any("positions" in p for p in paths) == (settings.get("positions") == "learned")
  assert any("output_dv" in p for p in paths) == (settings.get("tie_output") is False)
  dense_biases = [p for p in paths if re.search(r"'b[qkvoi]_\w+'\]", p)]  # bq_nh, bo_d, bi_f, ...
  assert bool(dense_biases) == settings.get("use_bias", True)
  # Gated feed-forwards at 2/3 width: the layers keep their parameters within 1% (the
  # rounding of d_ff to a multiple of 8), against the same model with a plain one.
  if cfg.activation in variants_gated():
    plain = dataclasses.replace(cfg, activation="relu", d_ff=vanilla.d_ff)
    assert abs(layer_params(cfg) / layer_params(plain) - 1) < 0.01


def test_adanorm_as_xu_et_al_released_it_is_prenorm_with_scale_two():
  """`adanorm-xu`: pre-norm, AdaNorm with C = 2 and k = 0.1 (their released IWSLT14 script),
  a valid model that differs from vanilla in those settings only, and from `prenorm` in the
  norm; it has no norm parameters (AdaNorm has no gain or bias)."""
  vanilla, cfg, prenorm = model_of("vanilla"), model_of("adanorm-xu"), model_of("prenorm")
  changed = {k: getattr(cfg, k) for k in vars(cfg) if getattr(cfg, k) != getattr(vanilla, k)}
  assert changed == {"norm_position": "pre", "norm": "adanorm", "adanorm_c": 2.0}
  assert cfg.adanorm_k == 0.1 and prenorm.norm == "layernorm" and prenorm.norm_position == "pre"
  assert not [p for p in param_paths(cfg) if "norm" in p]
  assert variants.parts("prenorm+adanorm-xu") == ["prenorm", "adanorm-xu"] and variants.available("adanorm-xu")
  assert "C = 2" in variants.describe("adanorm-xu")


@pytest.mark.skipif(not variants.available("relative"), reason="model.positions=relative is not in this version")
def test_relative_positions_variant_changes_the_positions_only():
  vanilla = model_of("vanilla")
  for name, base in (("relative", vanilla), ("prenorm+relative", model_of("prenorm"))):
    cfg = model_of(name)
    assert {k for k in vars(cfg) if getattr(cfg, k) != getattr(base, k)} == {"positions"} and cfg.positions == "relative"
  assert "relative" in variants.DEFAULT and variants.DEFAULT.index("relative") == variants.DEFAULT.index("rope") + 1


def test_a_variant_the_model_does_not_offer_is_refused_when_planned(monkeypatch):
  """Until the model has a choice a variant sets (as `relative` had to wait for
  model.positions=relative), planning its runs fails, naming the setting."""
  monkeypatch.setitem(variants.VARIANTS, "hyperbolic", ("", lambda m, v: {"model.positions": "hyperbolic"}))
  assert not variants.available("prenorm+hyperbolic") and variants.available("prenorm+rope")
  with pytest.raises(ValueError, match="model.positions='hyperbolic', which this version's model does not offer"):
    sweep.plan(configs.get("tiny"), "tiny", [], ["prenorm+hyperbolic"], ["base"], seeds=1)


def layer_params(cfg: ModelConfig) -> int:
  return variants.layer_params({k: v for k, v in vars(cfg).items() if k != "vocab_size"}, cfg.vocab_size)


def variants_gated():
  return ("glu", "reglu", "geglu", "swiglu")


def test_layer_params_are_the_models_without_embeddings():
  for name in ("transformer++", "untied"):  # pre-norm final norms, no biases; an output matrix
    cfg = model_of(name)
    embeddings = sum(int(v.size) for path, v in jax.tree_util.tree_leaves_with_path(nnx.state(abstract(cfg), nnx.Param))
                     if re.search("embed|positions|output_dv", jax.tree_util.keystr(path)))
    assert layer_params(cfg) == count_params(cfg) - embeddings, name


@pytest.mark.parametrize("name, layers", [("deep", 8), ("wide", 2)])
def test_depth_against_width_at_equal_layer_parameters(name, layers):
  vanilla, cfg = model_of("vanilla"), model_of(name)
  assert cfg.num_encoder_layers == cfg.num_decoder_layers == layers
  ratio = layer_params(cfg) / layer_params(vanilla)
  assert abs(ratio - 1) < 0.01, ratio
  assert (cfg.d_model < vanilla.d_model) == (name == "deep") and cfg.head_size % 2 == 0


def test_sizes_scale_width_and_keep_the_variant():
  small, base, large = (model_of("transformer++", size) for size in ("small", "base", "large"))
  assert (small.d_model, base.d_model, large.d_model) == (64, 128, 256)
  assert (small.d_ff, base.d_ff, large.d_ff) == (88, 168, 344)  # 2/3 of 128 / 256 / 512
  assert count_params(small) < count_params(base) < count_params(large)
  assert {c.activation for c in (small, large)} == {"swiglu"}


def test_combined_variants_apply_in_order_on_vanilla():
  assert variants.parts("prenorm+rope") == ["prenorm", "rope"]
  assert variants.parts("transformer++") == ["transformer++"]
  assert variants.parts("transformer+++swish") == ["transformer++", "swish"]
  cfg, prenorm = model_of("prenorm+rope", config_name="multi30k"), model_of("prenorm", config_name="multi30k")
  changed = {k: getattr(cfg, k) for k in vars(cfg) if getattr(cfg, k) != getattr(prenorm, k)}
  assert changed == {"positions": "rope"} and prenorm.norm_position == "pre"
  # A later part sees the earlier ones' settings: transformer++ then swish keeps the 2/3
  # width, prenorm+swiglu takes 2/3 of the base width once.
  assert model_of("transformer+++swish").activation == "swish" and model_of("transformer+++swish").d_ff == 168
  assert model_of("prenorm+swiglu").d_ff == 168
  for bad in ("prenorm+", "prenorm+nope", "rope+rope", "+rope", ""):
    with pytest.raises(ValueError, match="variant"):
      variants.parts(bad)


def synthetic(variant, seed, final, bleu=30.0, size="base", curve=None):
  return ablations.Result(f"{variant}-s{seed}", variant, size, seed, params=1e6, flops=2e6, steps_per_s=2.0,
                          early_nll=final + 1, final_nll=final, bleu={"test": bleu},
                          curve=curve or [(1e12, final + 1), (2e12, final)])


def test_mean_std_and_the_welch_test_that_replaced_the_two_standard_error_rule():
  mean, std, n = ablations.summary([1.0, 2.0, 3.0])
  assert (mean, std, n) == (2.0, 1.0, 3)
  # se = sqrt(1/3 + 1/3) and 4 degrees of freedom. The old rule marked this difference of 2.0
  # (more than 2 se, 1.633); Welch's t-test gives t = 2.449, p = 0.070: not significant at 0.05.
  test = significance.welch([3.0, 4.0, 5.0], [1.0, 2.0, 3.0])
  assert test.difference == 2.0 and math.isclose(test.se, math.sqrt(2 / 3)) and math.isclose(test.df, 4.0)
  assert math.isclose(test.p, 0.0705, abs_tol=5e-4) and not significance.significant(test.p)
  assert significance.significant(significance.welch([3.5, 4.0, 4.5], [1.0, 1.5, 2.0]).p)  # t = 6.12, p = 0.004
  assert not significance.welch([5.0], [1.0]).tested  # one seed: no test, nothing marked
  assert math.isnan(ablations.summary([5.0])[1])


def test_modifications_table_rows_and_marks():
  results = [synthetic("vanilla", 0, 2.00, 30.0), synthetic("vanilla", 1, 2.02, 31.0),
             synthetic("swiglu", 0, 1.90, 30.4), synthetic("swiglu", 1, 1.91, 30.6),
             synthetic("gelu", 0, 2.00, 30.0), synthetic("gelu", 1, 2.03, 31.2)]
  table = ablations.modifications_table(results).splitlines()
  assert table[0].startswith("| Variant | Seeds | Params | FLOPs / token | Steps/s | Early loss | Final loss")
  rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in table[2:]}
  assert list(rows) == ["`vanilla`", "`gelu`", "`swiglu`"]  # vanilla first, then the variants' order
  final = {k: v[5] for k, v in rows.items()}
  assert final["`vanilla`"] == "2.010 ± 0.014"
  # swiglu: -0.105, se = sqrt(0.0002/2 + 0.00005/2) = 0.0112, which the old two-standard-error
  # rule marked. Welch's t-test (1.47 degrees of freedom) gives p = 0.027, 0.110 after Holm's
  # correction over the table's 4 tests (2 variants x final loss and BLEU): not marked now.
  # gelu: +0.005, not marked either way.
  assert final["`swiglu`"] == "1.905 ± 0.007 (−0.105)"
  assert final["`gelu`"] == "2.015 ± 0.021 (+0.005)"
  assert rows["`swiglu`"][-1] == "30.50 ± 0.14"  # the same mean BLEU as vanilla: no difference shown
  assert rows["`swiglu`"][1] == "1.00M" and rows["`vanilla`"][3] == "2.00"  # params, steps/s


def test_the_table_compares_with_the_baseline_it_is_given():
  results = [synthetic("vanilla", 0, 2.40), synthetic("vanilla", 1, 2.42),
             synthetic("prenorm", 0, 2.10), synthetic("prenorm", 1, 2.12),
             synthetic("prenorm+rope", 0, 1.90), synthetic("prenorm+rope", 1, 1.91)]
  table = ablations.modifications_table(results, baseline="prenorm").splitlines()
  rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in table[2:]}
  assert list(rows) == ["`prenorm`", "`vanilla`", "`prenorm+rope`"]  # the baseline first, a combination after its parts
  final = {k: v[5] for k, v in rows.items()}
  assert final == {"`prenorm`": "2.110 ± 0.014", "`vanilla`": "2.410 ± 0.014 (+0.300*)",
                   "`prenorm+rope`": "1.905 ± 0.007 (−0.205*)"}
  report = ablations.markdown(results, [], {}, "cmd", [], baseline="prenorm")
  assert "difference to `prenorm`" in report and "- `prenorm+rope`: pre-norm residual blocks + rotary" in report
  assert "No finished" not in report and "No finished `swiglu` run" in ablations.markdown(results, [], {}, "", [],
                                                                                          baseline="swiglu")


def test_compute_multiplier_interpolates_on_vanillas_frontier():
  # Vanilla reaches NLL 3, 2, 1 at 1e12, 1e13, 1e14 FLOPs (two sizes; the frontier keeps the best).
  results = [synthetic("vanilla", 0, 2.0, size="small", curve=[(1e12, 3.0), (1e13, 2.0), (1e14, 2.5)]),
             synthetic("vanilla", 0, 1.0, size="base", curve=[(1e13, 2.2), (1e14, 1.0)]),
             synthetic("transformer++", 0, 1.5, size="base", curve=[(1e12, 2.0), (1e13, 1.5)]),
             synthetic("transformer++", 0, 0.5, size="large", curve=[(1e13, 0.5)]),
             # a larger vanilla that trained badly: not on the frontier, but it bounds the multiplier
             synthetic("vanilla", 0, 2.5, size="large", curve=[(1e15, 2.5)])]
  assert multiplier.frontier([r.curve for r in results[:2]]) == [(1e12, 3.0), (1e13, 2.0), (1e14, 1.0)]
  rows = {m.size: m for m in multiplier.multipliers(results)}
  # NLL 1.5 lies halfway between 2.0 (1e13) and 1.0 (1e14) in log FLOPs: 10^13.5.
  assert math.isclose(rows["base"].weak_flops, 10**13.5) and math.isclose(rows["base"].multiplier, 10**0.5)
  assert multiplier.frontier([r.curve for r in results if r.variant == "vanilla"]) == multiplier.frontier(
      [r.curve for r in results[:2]])
  # Vanilla never reached 0.5, not even with 1e15 FLOPs: more than 100x transformer++ large's 1e13.
  assert math.isinf(rows["large"].multiplier) and math.isclose(rows["large"].weak_max, 100.0)
  # The report's scaling table: a row per Transformer++ size with its peak learning rate.
  results = [dataclasses.replace(r, learning_rate=0.003 / {"small": 0.5, "base": 1.0, "large": 2.0}[r.size] ** 0.5)
             for r in results]
  report = ablations.markdown(results, [], {}, "cmd", [])
  assert "| base | 1.00M | 0.003 | 1.500 | 0.003 | 1.000 | 1e+13 | 3.16e+13 | **3.16x** |" in report
  assert ("| large | 1.00M | 0.002121 | 0.500 | 0.002121 | 2.500 | 1e+13 | not reached | none measured (vanilla's "
          "largest run: 100.00x these FLOPs) | 1 / 1 |") in report


def test_a_rate_searchs_seed_0_chooses_and_only_the_other_seeds_report_the_chosen_rate():
  """At a size where an architecture ran at several rates, seed 0 of each rate chooses (lowest
  final NLL) and seeds 1-3 of the chosen rate report it: in the modifications table, its tests
  and the multiplier; the search table shows every seed-0 figure and the chosen rate's mean."""
  rate = lambda r, x: dataclasses.replace(r, learning_rate=x)
  results = [rate(synthetic("vanilla", 0, 2.50), 0.002), rate(synthetic("vanilla+lr0.004", 0, 2.60), 0.004)]
  results += [rate(synthetic("vanilla", s, 2.60 + 0.01 * s), 0.002) for s in (1, 2, 3)]
  results += [rate(synthetic("transformer+++lr0.004", 0, 1.90), 0.004),
              rate(synthetic("transformer++", 0, 2.00), 0.002)]
  results += [rate(synthetic("transformer+++lr0.004", s, 2.00 + 0.01 * s), 0.004) for s in (1, 2, 3)]
  kept = multiplier.confirmatory(results)
  assert [(r.variant, r.seed) for r in results if r not in kept] == [("vanilla", 0), ("transformer+++lr0.004", 0)]
  table = ablations.modifications_table(results)
  # vanilla's row is seeds 1-3 (2.62 ± 0.01), not seed 0's 2.50 too; the other rates keep their one run.
  assert "| `vanilla` | 3 |" in table and "2.620 ± 0.010 |" in table
  assert "| `vanilla+lr0.004` | 1 |" in table and "| `transformer+++lr0.004` | 3 |" in table
  (test,) = [c for c in ablations.comparisons(results) if c.welch.tested]
  assert test.variant == "transformer+++lr0.004" and math.isclose(test.welch.difference, -0.6)
  assert multiplier.multipliers(results)[0].nll == pytest.approx(2.02) and "search run that chose it" in (
      ablations.markdown(results, [], {}, "cmd", []))
  search = multiplier.search_table(results)
  assert search[0] == "| base-size rate | vanilla base | transformer++ base |"
  assert search[2] == "| 0.002 | **2.500** (seeds 1, 2, 3: 2.620 ± 0.010) | 2.000 |"
  assert search[3] == "| 0.004 | 2.600 | **1.900** (seeds 1, 2, 3: 2.020 ± 0.010) |"
  # Transformer++'s smallest size against vanilla's best size, both by their confirmatory seeds:
  # the report's reading and the README family's test.
  small, strong, size, weak = multiplier.smallest_against_best(results)
  assert (small, size, [r.seed for r in strong], [r.seed for r in weak]) == ("base", "base", [1, 2, 3], [1, 2, 3])
  assert multiplier.smallest_reading(results) == []  # at one size the modifications table tests it
  (reading, _) = multiplier.smallest_reading(results + [rate(synthetic("vanilla", 0, 2.9, size="small"), 0.0028)])
  assert "Final NLL 2.020 ± 0.010 against 2.620 ± 0.010, a difference of −0.600, 95% interval [" in reading
  from seq2seq.research import family

  claim = family.scaling_claim(results)
  assert math.isclose(claim.difference, -0.6) and claim.p == significance.welch([2.01, 2.02, 2.03], [2.61, 2.62, 2.63]).p
  # The main grid (one rate per architecture) keeps every run.
  grid = [synthetic(v, s, 2.0) for v in ("vanilla", "gelu") for s in (0, 1)]
  assert multiplier.confirmatory(grid) == grid and multiplier.search_table(grid) == []


def test_vanilla_at_a_size_transformer_pp_skipped_extends_the_frontier_and_is_listed():
  """Vanilla at xlarge (4x base's width, run on another machine): its best rate there raises
  every `> N` bound, gets its own table, and the time line splits by hardware."""
  cpu, gpu = "2-core CPU", "1 x GPU"
  timed = lambda r, h, s: dataclasses.replace(r, hardware=h, train_seconds=s, eval_seconds=s / 10)
  results = [timed(synthetic("vanilla", s, 2.5, size="base", curve=[(1e13, 2.5)]), cpu, 600) for s in (0, 1)]
  results += [timed(synthetic("transformer++", s, 2.0, size="base", curve=[(1e13, 2.0)]), cpu, 600) for s in (0, 1)]
  results += [timed(synthetic("vanilla+lr0.001", s, nll, size="xlarge", curve=[(1e14, nll)]), gpu, 60)
              for s, nll in ((0, 2.25), (1, 2.2), (2, 2.4))]  # seed 0 chose the rate; seeds 1 and 2 report it
  results += [timed(synthetic("vanilla", 0, 2.9, size="xlarge", curve=[(1e14, 2.9)]), gpu, 60)]
  results = [dataclasses.replace(r, learning_rate=(0.001 if "lr" in r.variant else 0.002)
                                 / variants.SIZES[r.size] ** 0.5) for r in results]
  row, = multiplier.multipliers(results)
  assert math.isinf(row.multiplier) and math.isclose(row.weak_max, 10.0)  # 1e14 / 1e13, not 1.0
  beyond, = multiplier.beyond_sizes(results)
  assert (beyond.size, beyond.learning_rate, beyond.rates, beyond.seeds) == ("xlarge", 0.0005, 2, 2)
  assert math.isclose(beyond.nll, 2.3) and math.isclose(beyond.std, 0.1 * 2 ** 0.5) and beyond.hardware == gpu
  report = ablations.markdown(results, [], {}, "cmd", [])
  assert "| xlarge | 1.00M | 0.0005 (best of 2) | 2.300 ± 0.141 | 2 | 1e+14 | 1 x GPU |" in report
  assert "; 4.0 and 0.4 for the 4 runs on 1 x GPU; 40.0 and 4.0 for the 4 runs on 2-core CPU." in report
  assert variants.size_overrides("xlarge", {"d_model": 192, "d_ff": 768, "num_heads": 4}) == {
      "model.d_model": 768, "model.d_ff": 3072}
  assert variants.size_learning_rate("xlarge", 0.002) == {"train.learning_rate": 0.001}


def test_a_learning_rate_part_sets_the_rate_and_nothing_else():
  """`vanilla+lr0.004`: vanilla's model at peak learning rate 0.004 at the base size, scaled
  with the size like the config's rate, and winning over a --config.train.learning_rate."""
  assert variants.parts("transformer+++lr0.008") == ["transformer++", "lr0.008"]
  assert variants.architecture("transformer+++lr0.008") == "transformer++"
  assert variants.split("transformer+++swish+lr0.008") == (["transformer++", "swish"], 0.008)
  assert variants.split("prenorm+rope") == (["prenorm", "rope"], None)
  assert variants.architecture("prenorm+rope+lr4e-3") == "prenorm+rope" and variants.rate_of("lr4e-3") == 0.004
  assert model_of("transformer+++lr0.008") == model_of("transformer++")
  assert variants.describe("vanilla+lr0.004").endswith("(Vaswani et al.) + peak learning rate 0.004 at the base size")
  for bad, why in (("lr0.004", "unknown variant"), ("vanilla+lr0.004+rope", "comes last"),
                   ("vanilla+lr0.004+lr0.002", "comes last"), ("vanilla+lr0", "not a positive"),
                   ("vanilla+lr", "unknown variant"), ("vanilla+lrx2", "unknown variant")):
    with pytest.raises(ValueError, match=why):
      variants.parts(bad)
  config = configs.get("tiny")
  config.train.learning_rate = 0.001  # as the flag below sets it when the sweep parses its command line
  runs = sweep.plan(config, "tiny", ["--config.train.learning_rate=0.001"], ["vanilla+lr0.004", "vanilla"],
                    ["small", "base"], seeds=1)
  rates = {r.name: [a for a in r.shell(pathlib.Path("D")).split() if "learning_rate" in a] for r in runs}
  assert rates == {"vanilla+lr0.004@small-s0": ["--config.train.learning_rate=0.005657"],  # 0.004 x sqrt(2)
                   "vanilla@small-s0": ["--config.train.learning_rate=0.001414"],  # the user's 0.001 x sqrt(2)
                   "vanilla+lr0.004-s0": ["--config.train.learning_rate=0.004"],
                   "vanilla-s0": ["--config.train.learning_rate=0.001"]}


def test_the_multiplier_takes_each_architecture_at_its_best_rate():
  """Runs of one architecture at several rates (`vanilla+lr0.004` beside `vanilla`): each side
  takes the rate whose seed-0 run ends lowest at each size, reported by that rate's other seeds,
  Transformer++ for its row and vanilla for its curve on the frontier; each row names both rates."""
  curve = lambda *nll: [(10.0 ** (12 + i), x) for i, x in enumerate(nll)]
  # vanilla at 0.002 is the faster start (1.9 at 1e13) but ends worse: not on the frontier.
  runs = [("vanilla+lr0.004", "base", 0.004, (3.0, 2.0, 1.0)), ("vanilla", "base", 0.002, (2.5, 1.9, 1.8)),
          ("vanilla+lr0.004", "small", 0.005657, (3.5, 2.8)),
          ("transformer+++lr0.008", "base", 0.008, (2.0, 1.5)), ("transformer++", "base", 0.002, (2.1, 1.7))]
  results = [dataclasses.replace(synthetic(name, seed, nll[-1], size=size, curve=curve(*nll)), learning_rate=rate)
             for name, size, rate, nll in runs for seed in (0, 1, 2)]
  (row,) = multiplier.multipliers(results)
  assert (row.size, row.variant, row.rates, row.weak_variant, row.weak_rates) == (
      "base", "transformer+++lr0.008", 2, "vanilla+lr0.004", 2)
  # 1.5 lies halfway between vanilla+lr0.004's 2.0 (1e13) and 1.0 (1e14) in log FLOPs: 10^13.5, over
  # 1e13 (with vanilla's 1.9 at 1e13 on the frontier it would be 10^(13 + 0.4/0.9)). At the
  # config's rate alone vanilla never gets there.
  assert math.isclose(row.multiplier, 10**0.5)
  alone = [r for r in results if r.variant in ("vanilla", "transformer+++lr0.008")]
  assert math.isinf(multiplier.multipliers(alone)[0].multiplier)
  report = ablations.markdown(results, [], {}, "cmd", [])
  assert ("| base | 1.00M | 0.008 (best of 2) | 1.500 | 0.004 (best of 2) | 1.000 | 1e+13 | 3.16e+13 | **3.16x** "
          "| 2 / 2 |") in report
  assert ablations._ordered({r.variant for r in results}, "vanilla")[-2:] == ["transformer++", "transformer+++lr0.008"]
  # Seed 0 chooses, the others report: here seed 0 prefers 0.008 though the rates' means over all seeds
  # prefer 0.002, and 0.008's row is its seeds 1 and 2 only. At one rate nothing was chosen: every seed counts.
  chose = [synthetic("transformer+++lr0.008", 0, 1.5), synthetic("transformer++", 0, 1.7)]
  confirm = [synthetic(name, seed, nll) for seed in (1, 2) for name, nll in (("transformer+++lr0.008", 1.6),
                                                                              ("transformer++", 1.4))]
  name, reported = multiplier.best_rate(chose + confirm)
  assert name == "transformer+++lr0.008" and sorted((r.seed, r.final_nll) for r in reported) == [(1, 1.6), (2, 1.6)]
  assert multiplier.best_rate(confirm + chose[:1])[0] == "transformer+++lr0.008"  # 0.002 has no search run
  assert len(multiplier.best_rate([r for r in chose + confirm if r.variant == "transformer++"])[1]) == 3


def test_the_report_sums_the_time_the_runs_took():
  timed = lambda r, train, evaluation: dataclasses.replace(r, train_seconds=train, eval_seconds=evaluation)
  results = [timed(synthetic("vanilla", 0, 2.0), 600.0, 33.0), timed(synthetic("vanilla", 1, 2.0), 300.0, 15.0),
             timed(synthetic("vanilla", 0, 2.5, size="small"), 120.0, 6.0)]
  report = ablations.markdown(results, [], {}, "cmd", [])
  assert ("Time: 17.0 min of training and 0.9 min of test-set translation for 3 runs, of which 15.0 and 0.8 for the 2 "
          "base-size runs. Wall time, summed:") in report
  assert "Time: 15.0 min of training and 0.8 min of test-set translation for 2 runs. Wall time" in ablations.markdown(
      results[:2], [], {}, "cmd", [])
  assert "Time:" not in ablations.markdown([synthetic("vanilla", 0, 2.0)], [], {}, "cmd", [])  # not recorded


def test_the_records_of_a_sweep_remake_its_report_without_the_runs(tmp_path, monkeypatch):
  timed = lambda r: dataclasses.replace(r, train_seconds=60.0, eval_seconds=3.0, hardware="cpu", command="train",
                                       commit="89c0969", val_tokens=17177)
  results = [timed(synthetic(v, s, final, bleu, size)) for v, s, final, bleu, size in (
      ("vanilla", 0, 2.00, 30.0, "base"), ("vanilla", 1, 2.02, 31.0, "base"), ("swiglu", 0, 1.90, 30.4, "base"),
      ("swiglu", 1, 1.91, 30.6, "base"), ("vanilla", 0, 2.3, 25.0, "small"))]
  results[2].bleu["test"] = math.nan  # NaN survives the JSON round trip
  monkeypatch.setattr(ablations, "collect", lambda root: (results, ["gelu-s0"], ["sweep one", "sweep two"]))
  docs = tmp_path / "docs"
  told = ablations.write(tmp_path / "sweep", docs / "study.md")
  assert told.endswith(f"(records: {docs / 'runs' / 'study.jsonl'})")
  head, *lines = [json.loads(line) for line in (docs / "runs" / "study.jsonl").read_text().splitlines()]
  assert head == {"sweeps": ["sweep one", "sweep two"], "missing": ["gelu-s0"], "baseline": "vanilla",
                  "command": f"python -m seq2seq.research.sweep --workdir={tmp_path / 'sweep'} --table "
                             f"--output={docs / 'study.md'}"}
  assert [(r["variant"], r["size"], r["seed"], r["final_nll"]) for r in lines] == [
      (r.variant, r.size, r.seed, r.final_nll) for r in results]
  report = (docs / "study.md").read_text()
  assert "Every run's figures are kept in [runs/study.jsonl](runs/study.jsonl), from which" in report
  monkeypatch.undo()  # no runs from here on: the records alone
  again = tmp_path / "again" / "study.md"
  ablations.write(None, again, records_path=docs / "runs" / "study.jsonl")
  assert again.read_text() == report and "gelu-s0" in report and "swiglu" in report
  as_json = lambda rs: [json.dumps(dataclasses.asdict(r)) for r in rs]  # NaN != NaN, its JSON is equal
  assert as_json(records.read(docs / "runs" / "study.jsonl").results) == as_json(results)
  # Runs that cut the validation set into other token counts (other tokenizers) do not compare.
  results[1] = dataclasses.replace(results[1], val_tokens=16345)
  for write in (lambda: ablations.write(tmp_path / "sweep", docs / "mixed.md"),
                lambda: records.write(tmp_path / "mixed.jsonl", records.Sweep(results, [], [], "c", "vanilla"))):
    monkeypatch.setattr(ablations, "collect", lambda root: (results, [], []))
    with pytest.raises(DataError, match=r"other validation token counts, so their NLLs do not compare: "
                                        r"16345 in vanilla-s1; 17177 in vanilla-s0, swiglu-s0, swiglu-s1, \.\.\.$"):
      write()
  assert not (docs / "mixed.md").exists() and not (tmp_path / "mixed.jsonl").exists()
  (tmp_path / "bad.jsonl").write_text('{"sweeps": []}\n{"name": "x"}\n')
  for path, message in ((tmp_path / "bad.jsonl", "not a sweep's records file"), (tmp_path / "none.jsonl", "does not exist")):
    with pytest.raises(DataError, match=message):
      records.read(path)


def test_runs_commands_carry_user_then_variant_overrides(tmp_path):
  config = configs.get("tiny")
  runs = sweep.plan(config, "configs/tiny.py", ["--config.train.steps=30", "--config.model.activation=gelu"],
                    ["vanilla", "swiglu"], ["base", "small"], seeds=2)
  assert [r.name for r in runs] == ["vanilla-s0", "swiglu-s0", "vanilla@small-s0", "swiglu@small-s0",
                                    "vanilla-s1", "swiglu-s1", "vanilla@small-s1", "swiglu@small-s1"]
  swiglu = runs[1].shell(tmp_path)
  assert swiglu.startswith("seq2seq-train --config=configs/tiny.py --config.train.steps=30 ")
  assert "--config.model.activation=gelu" not in swiglu  # the variant's own setting wins
  assert {"--config.model.activation=swiglu", "--config.model.d_ff=88", "--config.seed=0"} <= set(swiglu.split())
  # Evaluated on the validation split first (its BLEU and chrF go into the records), then the test sets.
  splits = " ".join(f"--split={s}" for s in ("val", *config.data.test_splits))
  assert swiglu.endswith(f"--workdir={tmp_path / 'swiglu-s0'} && seq2seq-eval --workdir={tmp_path / 'swiglu-s0'} {splits}")
  # Sizes scale the peak learning rate with d_model^-0.5: x sqrt(2) at half the width.
  rate = config.train.learning_rate
  assert f"--config.train.learning_rate={float(f'{rate * 2 ** 0.5:.4g}')}" in runs[2].shell(tmp_path).split()
  assert "--config.train.learning_rate" not in runs[0].shell(tmp_path)
  assert variants.size_learning_rate("large", 0.003) == {"train.learning_rate": 0.002121}
  with pytest.raises(ValueError, match="unknown variant 'nope'"):
    sweep.plan(config, "tiny", [], ["nope"], ["base"], seeds=1)


def test_a_manifest_written_before_the_move_shows_and_keeps_the_new_command(tmp_path):
  """A sweep run as `python -m seq2seq.sweep` (before seq2seq/research/) listed itself so in
  DIR/sweep.json: its tables show the command in the new form, which the next sweep replaces
  rather than repeats; the old form still runs (tests/test_layout.py)."""
  old = ["python -m seq2seq.sweep --config=tiny --workdir=DIR --variants=vanilla --seeds=1",
         "python -m seq2seq.sweep --config=tiny --workdir=DIR --variants=gelu --seeds=1"]
  (tmp_path / "sweep.json").write_text(json.dumps({"runs": [{"name": "vanilla-s0"}], "sweeps": old}))
  new = [c.replace("seq2seq.sweep", "seq2seq.research.sweep") for c in old]
  assert ablations.collect(tmp_path) == ([], ["vanilla-s0"], new)
  sweep.write_manifest(tmp_path, sweep.plan(configs.get("tiny"), "tiny", [], ["vanilla"], ["base"], seeds=1), new[0])
  assert json.loads((tmp_path / "sweep.json").read_text())["sweeps"] == [new[1], new[0]]
  ablations.write(tmp_path, tmp_path / "ablations.md")
  report = (tmp_path / "ablations.md").read_text()
  assert "seq2seq.sweep" not in report and f"{new[1]}\n{new[0]}\n" in report


def test_a_rerun_skips_finished_runs_and_trains_only_the_rest(tmp_path, monkeypatch):
  """With the runs faked: finished ones (a last checkpoint and every test set's result)
  are skipped, a trained one is only evaluated, the others train then evaluate."""
  config = configs.get("tiny")
  runs = sweep.plan(config, "tiny", [], ["vanilla", "gelu", "rope"], ["base"], seeds=1)
  last = config.train.steps
  for run, evaluated in ((runs[0], True), (runs[1], False)):
    (run.workdir(tmp_path) / "checkpoints" / str(last)).mkdir(parents=True)
    if evaluated:
      (run.workdir(tmp_path) / "eval").mkdir()
      (run.workdir(tmp_path) / "eval" / f"test_2016_flickr.step{last}.beam2-alpha0.6.json").write_text("{}")
  calls = []
  monkeypatch.setattr(sweep_runs.subprocess, "run", lambda argv, **kw: calls.append(argv[2:4]) or
                      subprocess.CompletedProcess(argv, 0))
  for run in runs:
    if not run.finished(tmp_path):
      assert sweep.execute(run, tmp_path) == 0
  assert calls == [["seq2seq.commands.eval", f"--workdir={tmp_path / 'gelu-s0'}"],
                   ["seq2seq.commands.train", "--config=tiny"],
                   ["seq2seq.commands.eval", f"--workdir={tmp_path / 'rope-s0'}"]]


def sweep_command(workdir, *extra):
  return [sys.executable, "-m", "seq2seq.research.sweep", "--config=tiny", f"--workdir={workdir}",
          "--variants=vanilla,rmsnorm", "--seeds=1", "--config.train.steps=20", "--config.train.checkpoint_every=10",
          "--config.train.eval_every=5", "--config.train.log_every=5", "--config.data.test_splits=('val',)",
          "--config.eval.batch_size=64", "--compilation_cache=", *extra]


@pytest.mark.long  # a sweep of real trainings, killed and rerun
def test_a_killed_sweep_reruns_only_what_is_missing(tmp_path, data_dir, session_cache):
  """Kill -9 the sweep once the second run has its first checkpoint: the rerun leaves the
  first run alone, resumes the second from its checkpoint, and writes the tables."""
  env = os.environ | {"SEQ2SEQ_DATA_DIR": str(data_dir), "SEQ2SEQ_CACHE": str(session_cache)}
  first = subprocess.Popen(sweep_command(tmp_path), env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  checkpoint = tmp_path / "rmsnorm-s0" / "checkpoints" / "10"
  deadline = time.monotonic() + 600
  while not checkpoint.is_dir() and first.poll() is None and time.monotonic() < deadline:
    time.sleep(0.2)  # polling for the event, not waiting a fixed time
  assert checkpoint.is_dir(), first.communicate()[0].decode()[-3000:]
  first.send_signal(signal.SIGKILL)
  first.wait()
  vanilla_metrics = (tmp_path / "vanilla-s0" / "metrics.jsonl").read_bytes()
  rerun = subprocess.run(sweep_command(tmp_path), env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
  assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
  assert "[1/2] vanilla-s0: finished already" in rerun.stdout
  assert (tmp_path / "vanilla-s0" / "metrics.jsonl").read_bytes() == vanilla_metrics
  commands = (tmp_path / "rmsnorm-s0" / "commands.txt").read_text().splitlines()
  assert len(commands) == 2 and commands[0] == commands[1]  # trained twice with the same command: resumed
  report = (tmp_path / "ablations.md").read_text()
  assert "| `vanilla` | 1 |" in report and "| `rmsnorm` | 1 |" in report and "Not finished" not in report
  assert "min of test-set translation for 2 runs. Wall time, summed:" in report
  results, _, _ = ablations.collect(tmp_path)
  last_wall = [r["wall_time_s"] for r in metrics.read(tmp_path / "rmsnorm-s0") if "wall_time_s" in r][-1]
  assert {r.name: r.train_seconds for r in results}["rmsnorm-s0"] == last_wall > 0  # summed over its restart
  assert all(r.eval_seconds > 0 for r in results)
  # Here the test set is the validation split, so its records name the same translation twice.
  assert all(r.val_bleu == r.bleu["val"] > 0 and r.val_chrf == r.chrf["val"] > 0 for r in results)
  assert {r.val_tokens for r in results} == {next(r["val_tokens"] for r in metrics.read(tmp_path / "vanilla-s0")
                                                  if "val_tokens" in r)}
  commit = provenance.source_commit()[0]
  assert all(r.commit.split("+")[0] == (commit or "")[:7] for r in results)
  listed = subprocess.run(sweep_command(tmp_path, "--list"), env=env, cwd=REPO, capture_output=True, text=True)
  assert listed.stdout.splitlines() == json_commands(tmp_path)


def json_commands(root):
  return [r["command"] for r in json.loads((root / "sweep.json").read_text())["runs"]]
