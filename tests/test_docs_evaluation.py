"""docs/evaluation.md quotes the configs and the committed records in benchmarks/results/: each
figure here is computed from its source (derived figures too: ratios, shares, differences) in the
page's own format and found in the page's sentence, and each table is rebuilt row by row. A
record's decimals are rounded half up. Figures timed by hand, with no record, are kept in
docs/history.md, not here."""

import ast
import re
import statistics
from decimal import Decimal

from conftest import REPO
from report_tables import fixed as _fixed
from report_tables import record as _record
from report_tables import table_lines as _table_lines

from seq2seq import configs
from seq2seq.configs import get as _config

CONFIG_NAMES = sorted(configs.names())
WORDS = {3: "three", 4: "four", 6: "six", 7: "seven"}


def _raw() -> str:
  return (REPO / "docs" / "evaluation.md").read_text(encoding="utf-8")


def _page() -> str:
  return " ".join(_raw().split())


def _sci(x, places: int) -> str:
  """x as the page writes a small number: 1.4e-6, 1e-4."""
  x = Decimal(repr(x))
  return f"{_fixed(x.scaleb(-x.adjusted()), places)}e{x.adjusted()}"


def test_the_search_settings_quoted_are_the_configs():
  """The default search settings, the Multi30k configs' alpha, output limit and validation, and the fixed widths."""
  from seq2seq.inference import programs

  page = _page()
  default = _config("default").eval
  alphas = {name: _config(name).eval.alpha for name in CONFIG_NAMES}
  others = {name: a for name, a in alphas.items() if a != default.alpha}
  assert others == {"multi30k": 1.5, "multi30k_positions": 1.2, "multi30k_sweep": 1.2}
  assert (f"`eval.alpha` ({default.alpha:g}; `configs/multi30k.py` uses {others['multi30k']:g}, `multi30k_sweep` and "
          f"`multi30k_positions` {others['multi30k_sweep']:g}), at most") in page
  assert f"`eval.beam_size` ({default.beam_size}) and GNMT" in page
  assert f"padded to at most `eval.max_programs` ({default.max_programs}) widths" in page
  assert f"(`eval.max_programs`, {default.max_programs}; `--max_programs`" in page
  widths = ", ".join(map(str, programs.SOURCE_BUCKETS))
  assert f"among the fixed widths {widths} (so that" in page
  m30k = _config("multi30k").eval
  assert f"`configs/multi30k.py` stops outputs at source + {m30k.max_len_b:g} tokens" in page
  assert f"instead of the generic + {default.max_len_b:g}." in page
  assert f"(`eval.val_beam_size={m30k.val_beam_size}`, the same limits)" in page
  assert f"its {m30k.val_bleu_sentences} validation sentences need" in page


def test_the_decode_programs_table_and_readings_are_decode_programs_json():
  """The programs table is decode_programs_{h100,cpu2}.json row by row; the compile ratio, padding share,
  compilation saved and differing hypotheses are computed from them."""
  gpu, cpu = _record("decode_programs_h100.json"), _record("decode_programs_cpu2.json")
  raw, page = _raw(), _page()
  for r in (gpu, cpu):
    d_model, enc, dec, vocab = re.fullmatch(r"random wmt14_base \((\d+)d, (\d+)\+(\d+) layers, vocab (\d+), float32\)",
                                            r["model"]).groups()
    assert r["limits"] == "max_len_a=1, max_len_b=0"  # "every sentence decoded to its source's length"
    assert (f"{r['test_set']} ({r['sentences']} sentences), beam {r['beam_size']}, a wmt14_base-size model "
            f"(d{d_model}, {enc}+{dec}, {vocab} pieces,") in page
  assert gpu["hardware"].endswith("H100 80GB HBM3") and cpu["hardware"].startswith("2-core")

  def row(device, r, per_s, planned):
    compile_s = f"{_fixed(r['compile_s'], 1)} s"
    if r["compile_s_summed"] != r["compile_s"] and not planned:
      compile_s += f" ({_fixed(r['compile_s_summed'], 0)} s summed over threads)"
    total = f"{_fixed(r['total_s'], 1)} s"
    what = f"`max_programs={r['programs']}`" if planned else "one per width (before)"
    return (f"| {device}, {what} | {r['programs']} | {compile_s} | {_fixed(r['decode_s'], 1)} s | "
            f"{_fixed(r['sentences_per_s'], per_s)} | {f'**{total}**' if device == 'H100' and planned else total} |")

  g, c = gpu["modes"], cpu["modes"]
  assert _table_lines(raw, "| device | programs | compile (wall) | decode | sentences/s | total |") == [
      row("H100", g["buckets"], 0, False), row("H100", g["planned"], 0, True),
      row("2-core CPU", c["buckets"], 1, False), row("2-core CPU", c["planned"], 1, True)]

  assert g["planned"]["decode_s"] <= g["buckets"]["decode_s"]  # "decode no slower"
  assert f"three programs compile {_fixed(g['buckets']['compile_s'] / g['planned']['compile_s'], 1)}x faster" in page
  padding = (c["planned"]["decode_s"] - c["buckets"]["decode_s"]) / c["buckets"]["decode_s"]
  saved = c["buckets"]["compile_s"] - c["planned"]["compile_s"]
  assert f"the padding costs {_fixed(100 * padding, 0)}% of the decode time against {_fixed(saved, 0)} s of" in page
  assert cpu["identical_hypotheses"] and "The CPU's hypotheses are identical either way." in page
  half = g["buckets_half"]
  half_batch = max(int(shape.split("x")[0]) for shape in half["shapes"])
  assert half["programs"] == len({shape.split("x")[1] for shape in half["shapes"]})  # one program per width
  assert (f"give {g['planned']['differing_from_buckets']} of {gpu['sentences']} sentences another hypothesis with "
          f"{WORDS[g['planned']['programs']]} programs, and {half['differing_from_buckets']} with batches of "
          f"{half_batch} instead of {gpu['batch_size']} (one program per width both)") in page


def test_the_cpu_speed_table_is_eval_speed_and_decode_json():
  """The speed table is eval_speed_cpu2.json, decode_cpu2.json and decode_h100.json row by row."""
  speed, forced, h100 = _record("eval_speed_cpu2.json"), _record("decode_cpu2.json"), _record("decode_h100.json")

  def s(x):
    return f"{_fixed(x, 1)} s"

  def ratio(a, b):
    return f"{_fixed(a / b, 2)}x"

  before, after = speed["before"]["modes"], speed["after"]["modes"]
  fm = forced["modes"]
  steps = re.fullmatch(r"random multi30k model, (\d+) steps per sentence", forced["model"]).group(1)
  assert fm["beam4"]["sentences"] == fm["greedy"]["sentences"] == fm["flax-beam4"]["sentences"]
  n = fm["beam4"]["sentences"]
  batches = h100["by_batch_size"]
  one, two = (speed["concurrent_batches"][k]["modes"] for k in ("one_at_a_time", "two_at_once"))
  lim = speed["output_limit_17"]
  l50, l17 = lim["limit_50"], lim["limit_17"]
  per_set = lim["eval_py_seconds_per_test_set_filled_cache"]
  cache = speed["validation_fills_cache"]
  rerun = cache["in_process"]
  first = cache["eval_py_translation_seconds"]["test_2016_flickr"]
  expected = [
      "| `eval.py`, test_2016_flickr, beam 4, trained multi30k model (warm, compiled) | "
      f"{s(before['warm']['seconds'])} "
      f"| {s(after['warm']['seconds'])} ({ratio(before['warm']['seconds'], after['warm']['seconds'])}) |",
      f"| the same, first translation in the process (compilation included) | {s(before['cold']['seconds'])} "
      f"| {s(after['cold']['seconds'])} ({ratio(before['cold']['seconds'], after['cold']['seconds'])}) |",
      f"| forced {steps} steps, {n} sentences, beam 4 (Flax WMT example in the same run: "
      f"{s(fm['flax-beam4']['seconds'])}) | | {s(fm['beam4']['seconds'])}, "
      f"{_fixed(forced['beam4_vs_flax_wmt']['median'], 2)}x the Flax example's sentences/s |",
      f"| forced {steps} steps, {n} sentences, greedy | | {s(fm['greedy']['seconds'])} |",
      f"| the forced beam 4 on one H100, batches of {' / '.join(batches)} sentences, vs the Flax example | | "
      + " / ".join(f"{_fixed(b['beam4_vs_flax_wmt']['median'], 2)}x" for b in batches.values()) + " |",
      "| `python eval.py --workdir=workdirs/m30k`, test_2016_flickr, empty / filled compilation cache | | "
      + " / ".join(s(x) for x in speed["eval_py"]["test_2016_flickr_seconds"].values()) + " |",
      f"| two batches at once (a later, quieter sitting; one at a time / two, warm and cold) | "
      f"{s(one['warm']['seconds'])} / {s(one['cold']['seconds'])} | {s(two['warm']['seconds'])} / "
      f"{s(two['cold']['seconds'])} ({ratio(one['warm']['seconds'], two['warm']['seconds'])} / "
      f"{ratio(one['cold']['seconds'], two['cold']['seconds'])}) |",
      f"| output limit source + {l50['decode']['max_len_b']} / + {l17['decode']['max_len_b']} (same sitting), "
      f"test_2016_flickr, warm / cold in-process | {s(l50['modes']['warm']['seconds'])} / "
      f"{s(l50['modes']['cold']['seconds'])} | {s(l17['modes']['warm']['seconds'])} / "
      f"{s(l17['modes']['cold']['seconds'])} |",
      "| the same, `eval.py` with a filled compilation cache, test_2016_flickr / test_2017_flickr | "
      f"{s(per_set['test_2016_flickr']['limit_50'])} / {s(per_set['test_2017_flickr']['limit_50'])} | "
      f"**{s(per_set['test_2016_flickr']['limit_17'])} / {s(per_set['test_2017_flickr']['limit_17'])}** |",
      f"| a faster sitting (the hour run rerun: {cache['training']['steps']} steps in "
      f"{_fixed(cache['training']['wall_seconds'] / 60, 0)} min), `{rerun['model'].split()[0].split('/')[-1]}`, "
      f"{rerun['split']}, warm / cold in-process | | {s(rerun['modes']['warm']['seconds'])} / "
      f"{s(rerun['modes']['cold']['seconds'])} |",
      "| the same sitting, first `eval.py` after training, test_2016_flickr: empty cache / cache filled by the beam-4 "
      f"validation / filled by a previous `eval.py` | | {s(first['empty_cache'])} / "
      f"**{s(first['filled_by_training'])}** / {s(first['filled_by_eval'])} |",
  ]
  rows = _table_lines(_raw(), "| what | before | now |")
  assert rows == expected


def test_the_speed_readings_are_eval_speed_cpu2_json():
  """The output limit's changed hypotheses and BLEU, beam-4 validation's cost and the first eval.py after
  training, and the fresh process's compilation, all from eval_speed_cpu2.json."""
  speed = _record("eval_speed_cpu2.json")
  page = _page()
  lim = speed["output_limit_17"]
  old, new = (lim[k]["decode"]["max_len_b"] for k in ("limit_50", "limit_17"))
  changed = re.search(r"the (\d+) \(test_2016\) and (\d+) \(test_2017\) whose limit-50 hypotheses are longer than "
                      rf"source \+ {new} tokens", lim["hypotheses"]).groups()
  assert f"{new} under sentencepiece 0.2.3, when the figures below were measured" in page
  bleu = lim["bleu"]
  assert (f"exactly the {changed[0]} + {changed[1]} hypotheses longer than source + {new} change (all degenerate "
          f"repetitions that ran to + {old}), and BLEU goes from {_fixed(bleu['test_2016_flickr']['limit_50'], 2)} to "
          f"{_fixed(bleu['test_2016_flickr']['limit_17'], 2)} (test_2016_flickr) and "
          f"{_fixed(bleu['test_2017_flickr']['limit_50'], 2)} to {_fixed(bleu['test_2017_flickr']['limit_17'], 2)} "
          "(test_2017_flickr)") in page

  cache = speed["validation_fills_cache"]
  val = cache["validation_500_sentences_in_process_seconds"]
  mean = {(search, call): statistics.mean(val[search][call])
          for search in ("greedy", "beam4") for call in ("first", "second")}
  assert all(len(val[search][call]) == 2 for search in ("greedy", "beam4") for call in ("first", "second"))
  assert (f"on the 500 sentences, measured twice each in one sitting (the means), "
          f"{_fixed(mean['beam4', 'second'], 1)} s instead of {_fixed(mean['greedy', 'second'], 1)} s, and "
          f"{_fixed(mean['beam4', 'first'], 1)} s instead of {_fixed(mean['greedy', 'first'], 1)} s the first time "
          "(compilation)") in page
  validations = len(cache["training"]["val_bleu_seconds_beam4"])
  more = (mean["beam4", "first"] - mean["greedy", "first"]
          + (validations - 1) * (mean["beam4", "second"] - mean["greedy", "second"]))
  wall = cache["training"]["wall_seconds"]
  first = cache["eval_py_translation_seconds"]["test_2016_flickr"]
  assert (f"Over the hour run's {WORDS[validations]} validations that is about {_fixed(more, 0)} s more "
          f"({_fixed(100 * more / wall, 1)}% of its {_fixed(wall / 60, 0)} minutes); the first evaluation after "
          f"training then takes {_fixed(first['empty_cache'] - first['filled_by_training'], 0)} s less "
          f"({_fixed(first['empty_cache'], 1)} s to {_fixed(first['filled_by_training'], 1)} s on test_2016_flickr)"
          ) in page
  warm_cold = cache["in_process"]["modes"]
  assert (f"compiles them in {_fixed(warm_cold['cold']['seconds'], 1)} s in a faster sitting "
          f"({_fixed(warm_cold['warm']['seconds'], 1)} s warm; `eval_speed_cpu2.json`)") in page
  batches = -(-speed["after"]["modes"]["warm"]["sentences"] // speed["after"]["batch_size"])  # 1000 sentences in 64s
  assert f"test_2016_flickr's {batches} batches need three source widths" in page


def test_the_matmul_peak_quoted_is_train_throughput_cpu2_json():
  """The CPU's matmul peak range, quoted beside the decode profile (now in docs/history.md, with
  the timings by hand it explains), is train_throughput_cpu2.json's."""
  lo, hi = _record("train_throughput_cpu2.json")["matmul_peak_gflops_range"]
  history = " ".join((REPO / "docs" / "history.md").read_text(encoding="utf-8").split())
  assert (f"at this CPU's matmul peak ({_fixed(lo, 0)}-{_fixed(hi, 0)} GFLOP/s in "
          "`benchmarks/results/train_throughput_cpu2.json`)") in history


def test_the_ctranslate2_section_is_ctranslate2_cpu2_json():
  """The CTranslate2 speed table is ctranslate2_cpu2.json row by row; the run, parity, export gap and
  speed-ups are computed from it; the parity tests' counts are tests/test_ctranslate2.py's."""
  from seq2seq import ct2

  r = _record("ctranslate2_cpu2.json")
  raw, page = _raw(), _page()
  sp = r["speed"]
  ours, f32, i8 = sp["seq2seq"], sp["ctranslate2 float32"], sp["ctranslate2 int8"]
  for engine in sp.values():
    assert engine["seconds"] == statistics.median(engine["rounds"]) and len(engine["rounds"]) == 3
    assert engine["sentences_per_s"] == r["sentences"] / engine["seconds"]
  steps = int(r["checkpoint"].removeprefix("step"))
  former = _record("eval_speed_cpu2.json")["validation_fills_cache"]["bleu"]
  readme = (REPO / "README.md").read_text(encoding="utf-8")
  assert f"({_fixed(former['test_2016_flickr'], 2)} / {_fixed(former['test_2017_flickr'], 2)})" in readme
  assert (f"3+3 layers, {steps} steps; the retired recipe in CHANGELOG.md), retrained with its own command "
          f"({_fixed(ours['bleu'], 2)} against the {_fixed(former[r['split']], 2)} it had in the README on "
          f"{r['split']}), its latest checkpoint exported twice, then {r['split']} ({r['sentences']} sentences) with "
          f"beam {r['decode']['seq2seq']['beam_size']} in batches of 64 on a 2-core Intel Xeon, each engine on both "
          f"cores, the median of {len(ours['rounds'])} rounds") in page
  assert r["hardware"].startswith("2-core Intel") and r["threads"] == 2

  def row(name, e):
    return (f"| {name} | {_fixed(e['sentences_per_s'], 1)} | "
            f"{_fixed(e['sentences_per_s'] / ours['sentences_per_s'], 2)}x | {_fixed(e['bleu'], 2)} | "
            f"{_fixed(e['chrf'], 2)} | {_fixed(e['first_seconds'], 1)} s")

  assert r["decode"]["seq2seq"]["beam_size"] == r["decode"]["ctranslate2"]["beam_size"]
  assert _table_lines(raw, "| engine | sentences/s | vs ours | BLEU | chrF | first call |") == [
      row(f"`seq2seq-translate` (float32, alpha {r['decode']['seq2seq']['alpha']:g})", ours)
      + " (compiles its search programs) |",
      row(f"CTranslate2 float32 (length_penalty {r['decode']['ctranslate2']['length_penalty']:g})", f32) + " |",
      row("CTranslate2 int8", i8) + " |"]

  par = r["parity"]
  assert par["float32"]["bleu"] == par["seq2seq"]["bleu"]  # "both"
  drop = _fixed(par["int8"]["bleu"] - par["seq2seq"]["bleu"], 2).replace("-", "\u2212")
  assert (f"float32 gives the same hypothesis as ours for {par['float32']['identical']} of {r['sentences']} sentences "
          f"(BLEU {_fixed(par['float32']['bleu'], 2)} both); int8 for {par['int8']['identical']}, at BLEU "
          f"{_fixed(par['int8']['bleu'], 2)} ({drop}).") in page
  assert (f"CTranslate2 translates {_fixed(f32['sentences_per_s'] / ours['sentences_per_s'], 1)}x faster than our "
          f"decoder in float32 and {_fixed(i8['sentences_per_s'] / ours['sentences_per_s'], 1)}x faster in int8"
          ) in page

  checks = r["export_checks"].values()
  assert {c["verified_on"] for c in checks} == {len(ct2.SENTENCES)}
  gap = max(c["float32"]["largest_gap"] for c in checks)
  assert f"translates {len(ct2.SENTENCES)} fixed sentences greedily" in page
  assert (f"must be within {_sci(ct2.SCORE_TOLERANCE, 0)} per token of ours (at most {_sci(gap, 1)} for the model "
          "of the speed comparison below)") in page

  tests = (REPO / "tests" / "test_ctranslate2.py").read_text(encoding="utf-8")
  variants = next(node.value for node in ast.parse(tests).body
                  if isinstance(node, ast.Assign) and node.targets[0].id == "VARIANTS")
  assert "sentences = [next(f).strip() for _ in range(100)]" in tests
  assert (f"{WORDS[len(variants.keys)]} small models with random weights that together use every setting above give "
          f"the same greedy outputs (one of them running to the length limit) and scores within "
          f"{_sci(ct2.SCORE_TOLERANCE, 0)} of ours; a trained tiny model gives the same beam-4 and greedy outputs and "
          "search scores on 100 validation sentences") in page


def test_the_ctranslate2_models_recipe_is_the_former_defaults_record():
  """The CTranslate2 comparison's model is the README's main job until 2026-11-28: the former
  default, whose settings its records keep (docs/runs/main_job_search.jsonl), at its 2400 steps."""
  from seq2seq.research import recipe_search

  former = next(r for r in recipe_search.load(REPO / "docs" / "runs" / "main_job_search.jsonl")
                if r.run == "default_s1")
  m = former.settings["model"]
  assert _record("ctranslate2_cpu2.json")["checkpoint"] == f"step{former.steps}"
  assert (f"README's main job as it was until 2026-11-28 (d_model {m['d_model']}, {m['num_encoder_layers']}+"
          f"{m['num_decoder_layers']} layers, {former.steps} steps;") in _page()
