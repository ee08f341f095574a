"""docs/scaling.md quotes the committed records in benchmarks/results/: each figure here is
computed from its JSON (derived figures too: differences, ratios, sums) in the page's own
format and found in the page, and each table is rebuilt row by row. Figures the page calls
"about" are given to 2 significant figures; a record's decimals are rounded half up."""

import ast
import math
from decimal import Decimal

from conftest import REPO, benchmark
from report_tables import fixed as _fixed
from report_tables import record as _record
from report_tables import table_lines as _table_lines

GIB = 2**30
SHORT_DTYPE = {"bfloat16": "bf16", "float32": "f32"}


def _raw() -> str:
  return (REPO / "docs" / "scaling.md").read_text(encoding="utf-8")


def _page() -> str:
  return " ".join(_raw().split())


def _about(x: float) -> str:
  """An "about" figure: 2 significant figures (660.7 -> 660, 103.3 -> 100, 15.27 -> 15)."""
  return f"{float(f'{x:.2g}'):.0f}"


def test_the_dry_run_table_and_its_readings_are_dry_run_wmt14_json():
  """The dry-run table is dry_run_wmt14.json row by row; bf16's CPU temporaries, the FLOP agreement and
  the recommended settings' GiB figures are computed from its rows."""
  from seq2seq import configs

  rows = _record("dry_run_wmt14.json")
  raw, page = _raw(), _page()
  config_tokens = {name: configs.get(name).data.max_tokens for name in ("wmt14_base", "wmt14_big")}
  assert set(config_tokens.values()) == {25000} and "the config's 25,000" in page

  def tokens(r) -> str:
    n = config_tokens[r["config"]] if r["max_tokens"] == "config" else int(r["max_tokens"])
    assert n % 1000 == 0
    return f"{n // 1000}k"

  def params_adam(r) -> float:
    return (r["param_bytes"] + r["opt_state_bytes"]) / GIB

  expected = []
  for r in rows:
    mesh = ", ".join(str(r["mesh"][a]) for a in ("data", "fsdp", "tensor"))
    fits = " | ".join("yes" if r["total_gib"] <= m else "no" for m in (16, 32, 80))
    expected.append(f"| {r['config']} | {tokens(r)} | {SHORT_DTYPE[r['dtype']]} | {mesh} | {params_adam(r):.2f} | "
                    f"{r['temp_bytes'] / GIB:.2f} | {r['total_gib']:.2f} | {fits} | "
                    f"{r['flops_xla'] / 1e12:.2f} / {r['flops_model'] / 1e12:.2f} |")
  header = ("| config | tokens/batch | dtype | mesh (data, fsdp, tensor) | params + Adam GiB | temporaries GiB | total GiB "
            "| fits 16 GiB | fits 32 GiB | fits 80 GiB | TFLOP/step/device (XLA / formula) |")
  assert _table_lines(raw, header) == expected

  by = {(r["config"], tokens(r), r["dtype"], tuple(r["mesh"][a] for a in ("data", "fsdp", "tensor"))): r for r in rows}
  # bf16 costs XLA:CPU temporaries for wmt14_base on every mesh; the page quotes data parallelism
  base = [key for key in by if key[0] == "wmt14_base" and key[2] == "bfloat16"]
  assert all(by[k]["temp_bytes"] > by[(k[0], k[1], "float32", k[3])]["temp_bytes"] for k in base)
  bf16, f32 = by[("wmt14_base", "25k", "bfloat16", (8, 1, 1))], by[("wmt14_base", "25k", "float32", (8, 1, 1))]
  assert (f"bf16 *costs* the CPU temporaries here ({bf16['temp_bytes'] / GIB:.2f} GiB against "
          f"{f32['temp_bytes'] / GIB:.2f} GiB in f32 for wmt14_base)") in page

  excess = [r["flops_xla"] / r["flops_model"] - 1 for r in rows]
  assert min(excess) > 0 and f"XLA's FLOP count exceeds the formula's by {min(excess):.1%} to {max(excess):.1%}." in page

  # wmt14_base fits 16 GiB on every mesh; its parameters and Adam state under data parallelism
  assert all(r["total_gib"] <= 16 for r in rows if r["config"] == "wmt14_base")
  assert "any of 16/32/80 GiB:** plain data parallelism" in page
  assert f"Parameters and Adam take {params_adam(bf16):.1f} GiB" in page
  # wmt14_big: 25k tokens fit 16 GiB with data parallelism; 100k tokens in one step
  assert all(by[("wmt14_big", "25k", d, (8, 1, 1))]["total_gib"] <= 16 for d in ("bfloat16", "float32"))
  big = [r for r in rows if r["config"] == "wmt14_big" and tokens(r) == "100k"]
  assert min(r["temp_bytes"] for r in big) / GIB > 16
  assert f"At 100k tokens in one step, temporaries alone need {min(r['temp_bytes'] for r in big) / GIB:.0f} GiB." in page
  totals = [r["total_gib"] for r in big]
  assert max(totals) <= 32 and f"fits on any mesh ({min(totals):.1f} to {max(totals):.1f} GiB)" in page
  big100 = lambda mesh: by[("wmt14_big", "100k", "bfloat16", mesh)]
  freed = params_adam(big100((8, 1, 1))) - params_adam(big100((1, 8, 1)))
  assert f"`mesh.fsdp=8` at this size: it frees {freed:.1f} GiB of parameters and Adam state" in page

  # tensor=2 against the same devices with fsdp in its place: one figure per model and batch, any dtype
  added = {}
  for (config, tok, dtype, (data, fsdp, tensor)), r in by.items():
    if tensor == 2:
      added.setdefault((config, tok), set()).add(
          f"{(r['temp_bytes'] - by[(config, tok, dtype, (data, fsdp * 2, 1))]['temp_bytes']) / GIB:.1f}")
  assert all(len(v) == 1 for v in added.values()), added
  (base_gib,), (big_gib,) = added[("wmt14_base", "25k")], added[("wmt14_big", "25k")]
  (big100_gib,) = added[("wmt14_big", "100k")]
  assert (f"temporaries: against the mesh with fsdp in its place, {base_gib} GiB per device for wmt14_base and "
          f"{big_gib} GiB for wmt14_big at 25k tokens ({big100_gib} GiB at 100k)") in page


def test_the_h100_figures_are_the_device_check_records():
  """The H100 versions, the flash kernel's accuracy and speed, the train step's tokens/s and MFU, the
  check's time budget and its run's date and length are device_check's script and JSONs."""
  check = _record("device_check_nvidia_h100_80gb_hbm3.json")
  rerun = _record("device_check_nvidia_h100_80gb_hbm3_flash_decode.json")
  page = _page()
  versions = check["versions"]
  assert rerun["versions"] == versions and check["device_kind"].startswith("NVIDIA H100")
  assert (f"The H100 figures in [results](../benchmarks/results/) were measured with jax {versions['jax']} and flax "
          f"{versions['flax']}.") in page
  assert f"On one H100 (`benchmarks/device_check.py`, jax {versions['jax']};" in page

  # outputs within 2 ulps (of each dtype, at the output's largest magnitude) in every case
  flash = check["sections"]["flash"]
  mantissa = {"bfloat16": 7, "float16": 10}
  ulp = lambda x, dtype: 2.0**(math.frexp(x)[1] - 1 - mantissa[dtype])
  for row in flash["checks"]:
    assert row["out_within_2_bf16_ulps"] and row["out_max_abs_err"] <= 2 * ulp(row["out_max_abs"], row["dtype"]), row
  assert {r["dtype"] for r in flash["checks"]} == {"bfloat16", "float16"}
  assert {r["case"] for r in flash["checks"]} == {"self", "causal", "cross"}
  assert "its outputs are within 2 ulps of explicit attention's in bf16 and fp16 (self, causal and cross)" in page
  timing = flash["timing"]
  assert timing["flash"]["shape"] == timing["xla"]["shape"]
  b, t, heads, head_dim = timing["flash"]["shape"]
  assert (f"A causal packed forward and backward at {b}x{t}, {heads} heads of {head_dim}, takes "
          f"{timing['flash']['causal_packed_fwd_bwd_ms']:.2f} ms against XLA's "
          f"{timing['xla']['causal_packed_fwd_bwd_ms']:.2f} ms.") in page

  steps = check["sections"]["steps_bfloat16"]
  packed, unpacked = steps["packed"], steps["unpacked"]
  assert (packed["attention"], unpacked["attention"]) == ("flash", "cudnn")
  assert packed["shape"] == unpacked["shape"] == check["shape"] and check["config"] == "configs/wmt14_base.py"
  shape = "x".join(map(str, check["shape"]))
  assert (f"The wmt14_base bf16 train step at {shape} runs at {packed['target_tokens_per_s'] / 1e3:.0f}k target "
          f"tokens/s packed with flash ({packed['mfu']:.1%} MFU), against {unpacked['target_tokens_per_s'] / 1e3:.0f}k "
          f"({unpacked['mfu']:.1%}) unpacked with cuDNN.") in page
  assert packed["peak_tflops"] == unpacked["peak_tflops"]
  assert f"({packed['mfu']:.1%} and {unpacked['mfu']:.1%} MFU of {packed['peak_tflops']:.0f} TFLOP/s)" in page

  source = (REPO / "benchmarks" / "device_check.py").read_text(encoding="utf-8")
  full = next(node.value for node in ast.parse(source).body
              if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["FULL"])
  budget_s = next(ast.literal_eval(k.value) for k in full.keywords if k.arg == "budget_s")
  assert f"in at most {math.ceil(budget_s / 60)} minutes on one GPU" in page
  assert f"Run on one H100 on {check['date'][:10]} ({check['elapsed_s'] / 60:.1f} minutes)" in page


def test_the_host_overhead_table_is_host_overhead_cpu2_json():
  """The host-overhead table is host_overhead_cpu2.json's interleaved runs, two per version, and its
  setting (2-core CPU, about 1 ms of device work) is the record's."""
  record = _record("host_overhead_cpu2.json")
  raw, page = _raw(), _page()
  runs = record["runs_interleaved"]
  version = [r["version"].split(" ", 1)[0] for r in runs]
  assert version == ["before", "after"] * 2  # two runs per version, interleaved
  for r in runs:  # each figure rounded to 3 decimals on its own: the difference is the overhead's to 0.001
    assert abs(r["loop_ms_per_step"] - r["dispatch_ms_per_step"] - r["overhead_ms_per_step"]) <= 0.001 + 1e-12, r
  labels = {"before": "before: the guard read the loss every step", "after": "after: checks at log/eval/checkpoint steps"}
  expected = []
  for name, label in labels.items():
    mine = [r for r, v in zip(runs, version) if v == name]
    cells = [", ".join(_fixed(r[key], 2) for r in mine) for key in ("loop_ms_per_step", "dispatch_ms_per_step",
                                                                     "overhead_ms_per_step")]
    expected.append(f"| {label} | " + " | ".join(cells) + " |")
  assert _table_lines(raw, "| loop | loop ms/step | bare step ms/step | host overhead ms/step |") == expected
  assert "~1 ms of work per step" in record["model"] and record["machine"].startswith("2-core")
  assert ("on a model so small that the device's work is about 1 ms (`benchmarks/host_overhead.py`; 2-core CPU; two "
          "runs per version, interleaved; results in `benchmarks/results/host_overhead_cpu2.json`)") in page


def test_the_h200_profile_table_and_bullets_are_profile_h200_json():
  """The H200 profile's table, matmul sites and bullets are profile_h200.json; the step's FLOPs are XLA's
  (loss_bytes_cpu.json, the GPU's one-pass loss) and the model formula's (dry_run_wmt14.json)."""
  from seq2seq import configs
  from seq2seq.model import flops
  from seq2seq.model.config import ModelConfig

  profile = _record("profile_h200.json")
  raw, page = _raw(), _page()
  packed, unpacked = profile["layouts"]["packed"], profile["layouts"]["unpacked"]
  assert (packed["attention"], unpacked["attention"]) == ("flash", "cudnn")
  b, s, t = profile["shape"]
  assert (f"{profile['config'].removeprefix('configs/').removesuffix('.py')}, {SHORT_DTYPE[profile['dtype']]}, "
          f"{b}x{s}x{t}, one {profile['device_kind'].removeprefix('NVIDIA ')}, jax {profile['versions']['jax']}, "
          f"{profile['date']} ([benchmarks/results/profile_h200.json]") in page

  lines = {  # the page's line: the record's categories it sums
      "matmuls": ["matmul"], "attention kernels": ["attention"],
      "attention elementwise (biases, RoPE/layout, gradient sums)": ["attention elementwise (biases, layout)"],
      "loss and logits (softmax over 37000, bf16 casts of the logits' gradient)": ["loss and logits (softmax, casts)"],
      "norms": ["norm"], "FFN elementwise (bias, ReLU)": ["FFN elementwise (bias, activation)"],
      "optimizer (Adam, gradient norm)": ["optimizer"], "dropout (masks and their use)": ["dropout"],
      "residual adds": ["residual adds"], "embedding, memsets, other": ["embedding", "memsets/copies", "other elementwise"],
      "idle gaps on the device": ["idle gaps (device)"]}
  for layout in (packed, unpacked):  # every category is a line, but host-to-device copies (a bullet quotes them)
    assert set(layout["table"]["ms_per_step"]) == {c for cs in lines.values() for c in cs} | {"host-to-device copies"}
  ms = lambda layout, line: sum(Decimal(repr(layout["table"]["ms_per_step"][c])) for c in lines[line])
  expected = [f"| {line} | {_fixed(ms(packed, line), 2)} | {_fixed(ms(unpacked, line), 2)} |" for line in lines]
  expected.append(f"| **step (device span)** | **{_fixed(packed['table']['step_ms'], 1)}** | "
                  f"**{_fixed(unpacked['table']['step_ms'], 1)}** |")
  expected.append(f"| kernel launches per step | {packed['table']['kernel_launches_per_step']:.0f} | "
                  f"{unpacked['table']['kernel_launches_per_step']:.0f} |")
  assert _table_lines(raw, "| category | packed rows (flash kernel) | unpacked rows (cuDNN) |") == expected

  sites = packed["table"]["matmul_sites_ms_per_step"]
  named = {"FFN": "FFN", "vocabulary projection": "vocabulary projection", "QKV": "QKV projection",
           "attention output": "attention output", "cross-attention K/V": "KV projection", "Q": "Q projection"}
  assert set(sites) == {f"{site}{end}" for site in named.values() for end in ("", " (backward)")}
  pair = lambda site: f"{_fixed(sites[site], 2)} / {_fixed(sites[site + ' (backward)'], 2)}"
  listed = [f"{name} {pair(site)}" for name, site in named.items()]
  assert (f"Matmuls by site, packed rows (forward / backward): {', '.join(listed[:-1])} and {listed[-1]}. "
          "What it says:") in page

  table, other = packed["table"], packed["table"]["ms_per_step"]
  matmul = other["matmul"]
  assert (f"{_fixed(other['idle gaps (device)'], 2)} ms of {_fixed(table['step_ms'], 1)} is idle, host-to-device "
          f"copies take {other['host-to-device copies'] * 1e3:.0f} µs.") in page
  assert f"The {table['busy_ms'] - matmul:.0f} ms that are not matmuls are kernels" in page

  # the step's FLOPs: XLA's count (the loss a GPU compiles, one_pass) and the model formula's
  step = _record("loss_bytes_cpu.json")["losses"]["one_pass"]["step"]
  assert step["shape"] == profile["shape"] and step["dtype"] == profile["dtype"]
  xla = step["flops"]
  formula_row = next(r for r in _record("dry_run_wmt14.json") if r["config"] == "wmt14_base" and r["dtype"] == "bfloat16"
                     and r["max_tokens"] == "config" and r["compiled_shape"] == profile["shape"])
  formula = formula_row["flops_model"] * formula_row["devices"]  # per device, the batch split over them
  cfg = ModelConfig.from_config(configs.get("wmt14_base").model, vocab_size=step["vocab"])
  assert math.isclose(formula, flops.train_step_flops(cfg, b, s, t), rel_tol=1e-12)
  scores = lambda q, k: 2 * 2 * b * q * k * cfg.num_heads * cfg.head_size  # q k^T and weights v, forward
  attention = 3 * (cfg.num_encoder_layers * scores(s, s) + cfg.num_decoder_layers * (scores(t, t) + scores(t, s)))
  rate = (xla - attention) / (matmul * 1e-3)
  assert (f"The matmuls run at about {_about(rate / 1e12)} TFLOP/s (XLA's {xla / 1e12:.1f} TFLOP for the step less "
          f"the {attention / 1e12:.1f} of attention scores, in {_fixed(matmul, 1)} ms)") in page
  peak = flops.nominal_peak(profile["device_kind"], profile["dtype"]) * 1e12
  mfu, target = formula / (table["step_ms"] * 1e-3 * peak), formula_row["mfu"]
  assert (f"At that rate the step's matmuls and attention together need about {_about(xla / rate * 1e3)} ms; the rest "
          f"of the {_fixed(table['step_ms'], 1)} ms is what stands between {mfu:.0%} and {target:.0%} MFU "
          f"({formula / (target * peak) * 1e3:.1f} ms a step; MFU counts the model formula's {formula / 1e12:.1f} "
          "TFLOP).") in page

  att_p, att_u = other["attention"], unpacked["table"]["ms_per_step"]["attention"]
  rest = max(abs(ms(packed, line) - ms(unpacked, line)) for line in lines
             if line not in ("attention kernels", "idle gaps on the device"))
  assert (f"({_fixed(att_p, 2)} against {_fixed(att_u, 2)} ms; every other category agrees within {_fixed(rest, 2)} ms): "
          f"the project's flash kernel takes {att_p / att_u:.2f}x cuDNN's time (about "
          f"{_about(attention / (att_p * 1e-3) / 1e12)} against {_about(attention / (att_u * 1e-3) / 1e12)} TFLOP/s on "
          f"the scores' {attention / 1e12:.1f} TFLOP).") in page

  logits = _record("loss_bytes_cpu.json")["losses"]["one_pass"]["loss"]["shape"]
  assert logits == [b * t, step["vocab"]]
  vocabulary = sites["vocabulary projection"] + sites["vocabulary projection (backward)"]
  assert (f"(a [{logits[0]}, {logits[1]}] tensor) cost {_fixed(other['loss and logits (softmax, casts)'], 1)} ms, and "
          f"the vocabulary projection's matmuls {vocabulary:.1f} ms.") in page
  elementwise = sum(ms(packed, line) for line in ("attention elementwise (biases, RoPE/layout, gradient sums)", "norms",
                                                  "FFN elementwise (bias, ReLU)", "dropout (masks and their use)",
                                                  "residual adds"))
  assert (f"norms, FFN bias and ReLU, dropout and residuals add up to {_fixed(elementwise, 1)} ms, in many small "
          f"kernels (the step launches {table['kernel_launches_per_step']:.0f} in all).") in page


def test_the_bf16_logits_paragraph_is_loss_bytes_cpu_json():
  """Precision's `model.logits_dtype` paragraph: the logits' shape, the loss's and the CPU
  step's bytes with bf16 logits against f32 ones (loss_bytes_cpu.json), the bound's u."""
  record = _record("loss_bytes_cpu.json")
  page = _page()
  entry, ratio = record["one_pass_bf16_logits"], record["bf16_logits_ratio_to_one_pass"]
  tokens, vocab = entry["loss"]["shape"]
  assert entry["loss"]["dtype"] == entry["step"]["logits_dtype"] == "bfloat16"
  assert record["losses"]["one_pass"]["loss"]["shape"] == [tokens, vocab]
  assert f"on wmt14_base's {tokens} x {vocab} logits, forward and backward" in page
  assert f"`one_pass_bf16_logits`): {_fixed(ratio['loss']['bytes_accessed'], 2)}x the bytes of f32 logits" in page
  assert f"The CPU's whole step does not show it ({_fixed(ratio['step']['bytes_accessed'], 3)}x)" in page
  import jax.numpy as jnp

  assert "(u = 2^-8: bf16's unit roundoff" in page and 2.0**-8 == float(jnp.finfo(jnp.bfloat16).eps) / 2


def test_the_loss_in_chunks_section_is_its_records():
  """'The loss in chunks': the logits it does not hold, XLA's temporaries, FLOPs and bytes of
  wmt14_base's step with chunks against without (loss_bytes_cpu.json), and the CPU A/B's
  shape, rounds and speed (train_throughput_loss_chunk_cpu2.json)."""
  record, page = _record("loss_bytes_cpu.json"), _page()
  unchunked, chunked = record["losses"]["one_pass"]["step"], record["one_pass_chunked"]["step"]
  ratio = record["chunked_ratio_to_one_pass"]["step"]
  rows, s, t = chunked["shape"]
  assert chunked["shape"] == unchunked["shape"] and chunked["dtype"] == unchunked["dtype"] == "bfloat16"
  logits = record["losses"]["one_pass"]["loss"]
  assert logits["shape"] == [rows * t, chunked["vocab"]] and logits["dtype"] == "float32"
  assert (f"wmt14_base's step ({rows}x{s}x{t}) keeps {rows * t} x {chunked['vocab']} f32 logits "
          f"({_fixed(logits['logits_bytes'] / 1e9, 2)} GB)") in page
  assert (f"`one_pass_chunked`, chunks of {chunked['loss_chunk']}): temporaries "
          f"{_fixed(chunked['temp_bytes'] / GIB, 1)} GiB against {_fixed(unchunked['temp_bytes'] / GIB, 1)} GiB "
          f"({_fixed(ratio['temp_bytes'], 2)}x), FLOPs {_fixed(ratio['flops'], 3)}x, "
          f"bytes {_fixed(ratio['bytes_accessed'], 3)}x") in page
  assert ratio["temp_bytes"] == chunked["temp_bytes"] / unchunked["temp_bytes"]
  ab = _record("train_throughput_loss_chunk_cpu2.json")
  assert ab["setting"] == "train.loss_chunk"
  (base_value, chunk) = ab["values"]
  base = ab["values"][base_value]
  b, s, t = base["shape"]
  assert base_value == "0" and base["config"] == "configs/multi30k.py"
  from seq2seq import configs

  main = configs.get("multi30k").data  # the main job's batches: packed rows of pack_length tokens
  assert (main.max_tokens // main.pack_length, main.pack_length, main.pack_length, main.vocab_size) == (
      b, s, t, base["vocab_size"])
  assert (f"The main job's shape ({b} x {s} x {t}, {SHORT_DTYPE[base['dtype']]}, vocabulary "
          f"{base['vocab_size']}), chunks of {chunk}, both timed in each of {base['rounds']} rounds "
          f"(`benchmarks/train_throughput.py --setting=train.loss_chunk=0,{chunk}`") in page
  ranges = [ab["values"][v]["step_ms_range"] for v in (chunk, base_value)]
  assert (f"{_fixed(ab['speed_vs_first'][chunk], 2)}x the unchunked step's speed (median of the rounds' ratios; the "
          f"step times' ranges overlap, {'-'.join(f'{x:.0f}' for x in ranges[0])} ms against "
          f"{'-'.join(f'{x:.0f}' for x in ranges[1])})") in page
  assert ranges[0][0] < ranges[1][1] and ranges[1][0] < ranges[0][1]  # they do overlap
  assert "`loss_chunk_32` variant, unmeasured" in page
  rows = _record("dry_run_loss_chunk.json")
  gib = {}
  for r in rows:
    assert r["dtype"] == "bfloat16" and r["devices"] == 8 and r["compiled_shape"] == [96, 256, 256], r
    gib.setdefault((r["config"], r["loss_chunk"]), set()).add(_fixed(r["temp_bytes"] / GIB, 2))
  assert {c for _, c in gib} == {0, 32} and all(len(v) == 1 for v in gib.values())  # data or fsdp: the same
  (base_0,), (base_32,), (big_0,), (big_32,) = (gib[k] for k in (("wmt14_base", 0), ("wmt14_base", 32),
                                                                ("wmt14_big", 0), ("wmt14_big", 32)))
  assert (f"The dry run on 8 fake devices, bf16, chunks of 32 ([dry_run_loss_chunk.json](../benchmarks/results/"
          f"dry_run_loss_chunk.json)): temporaries per device {base_32} GiB against {base_0} for wmt14_base, "
          f"{big_32} against {big_0} for wmt14_big, with data or fsdp parallelism alike; XLA's FLOPs within 0.1%.") in page
  pairs = {(r["config"], tuple(r["mesh"].values())): {} for r in rows}
  for r in rows:
    pairs[(r["config"], tuple(r["mesh"].values()))][r["loss_chunk"]] = r["flops_xla"]
  assert {tuple(p) for p in pairs.values()} == {(0, 32)}
  assert all(abs(p[32] / p[0] - 1) < 1e-3 for p in pairs.values())


def test_the_bf16_options_cpu_speeds_are_their_ab_records():
  """Precision's bf16 moments and bf16 logits paragraphs: each option's CPU train-step speed
  against float32, at the main job's shape, from its A/B record."""
  page = _page()
  for name, setting, values, words in (
      ("train_throughput_adam_mu_cpu2.json", "train.adam_mu_dtype", ["", "bfloat16"], "the speed with f32 moments"),
      ("train_throughput_logits_dtype_cpu2.json", "model.logits_dtype", ["float32", "bfloat16"],
       "the f32 logits' speed")):
    ab = _record(name)
    assert ab["setting"] == setting and list(ab["values"]) == values, name
    base = ab["values"][values[0]]
    assert base["config"] == "configs/multi30k.py" and base["shape"] == [32, 64, 64] and base["dtype"] == "float32"
    assert f"{_fixed(ab['speed_vs_first']['bfloat16'], 2)}x {words}, both timed in each of {base['rounds']} rounds" in page
  assert "`benchmarks/train_throughput.py --setting=train.adam_mu_dtype=,bfloat16`" in page


def test_the_variants_table_is_device_checks_variants():
  """'The changes it points to': one row per variant of benchmarks/device_check.py (but the
  baseline), in its order, naming its settings; MIN_GAIN and the call's budget as the script
  has them."""
  device_check = benchmark("device_check")
  raw, page = _raw(), _page()
  rows = _table_lines(raw, "| variant | what it changes | what the profile says it may save |")
  assert [r.split("|")[1].strip().strip("`") for r in rows] == [n for n in device_check.VARIANTS if n != "baseline"]
  for row in rows:
    name, what = (c.strip() for c in row.split("|")[1:3])
    variant = device_check.VARIANTS[name.strip("`")]
    settings = [*variant.overrides, *filter(None, [variant.xla_flags, variant.flash_blocks])]
    settings = [o for o in settings if o not in device_check.FLASH]  # the flash variants' implementation: a sentence
    assert all(s in what for s in settings) or (variant.rows == 2 and what == "twice the rows a step"), row
  (flash_override,) = device_check.FLASH
  assert f"The flash variants also set `{flash_override}`" in page
  assert f"at least `MIN_GAIN` ({device_check.MIN_GAIN}x) faster" in page
  assert device_check.CAPS_S["variants"] + device_check.CAPS_S["variants_big"] >= 570
  assert f"about 40 s each in the variants section's {device_check.CAPS_S['variants']} s" in page
  assert "--sections=flash,variants,variants_big,profile_after --budget_s=570" in page
  compile_s = _record("device_check_nvidia_h100_80gb_hbm3.json")["sections"]["steps_bfloat16"]["packed"]["compile_s"]
  assert f"(the H100's device check compiled the packed step in {compile_s:.0f} s)" in page
  call = page.split("--budget_s=570", 1)[1].split("--variants=", 1)[1].split(" ", 1)[0]  # the device check's call
  assert len(call.split(",")) == 8 and "one call holds about eleven: the eight above, the baseline with packed" in page


def test_the_flash_checks_gradients_are_the_two_h100_records():
  """Attention kernels: the rerun's flash check has gradients within 2 bf16 ulps at the
  largest gradient's magnitude (fp16's too); the first record's bf16 cross dq error is the
  figure quoted; the test named exists."""
  first = _record("device_check_nvidia_h100_80gb_hbm3.json")["sections"]["flash"]["checks"]
  rerun = _record("device_check_nvidia_h100_80gb_hbm3_flash_decode.json")["sections"]["flash"]["checks"]
  (cross,) = [c for c in first if (c["dtype"], c["case"]) == ("bfloat16", "cross")]
  assert f"(bf16 dq by {cross['dq_max_abs_err']:.1f})" in _page()
  for row in rerun:
    for name in ("dq", "dk", "dv"):
      assert row[f"{name}_max_abs_err"] <= 2 * 2.0 ** (math.floor(math.log2(row[f"{name}_max_abs"])) - 7), row
  assert "def test_flash_queries_without_keys_attend_to_nothing" in (REPO / "tests" / "test_attention.py").read_text()


def profiled_ffn_matmuls(profile: dict) -> dict:
  """The H200 profile's two forward FFN matmuls, µs a layer: the first (x·W₁, cuBLAS's nvjet
  kernel) and the second (Triton's GEMM fusion, the ReLU in its prologue); and what the step
  gets back if Triton takes the second's time for the first, ms."""
  slowest = profile["layouts"]["packed"]["table"]["slowest_kernels"]
  (cublas,) = [k for k in slowest if k["category"] == "matmul: FFN" and k["kernel"].startswith("nvjet")]
  (triton,) = [k for k in slowest if k["category"] == "matmul: FFN" and k["kernel"].startswith("gemm_fusion")]
  assert cublas["launches_per_step"] == triton["launches_per_step"] == 12  # one each per feed-forward layer
  per_layer = lambda k: k["ms_per_step"] / k["launches_per_step"] * 1e3
  return {"bias_cublas_us": _fixed(per_layer(cublas), 1), "bias_triton_us": _fixed(per_layer(triton), 1),
          "bias_back": _fixed(triton["ms_per_step"] - cublas["ms_per_step"], 2)}


def gpu_compile_figures() -> dict:
  """'Without a GPU: the step compiled for one': every figure the section quotes, from
  gpu_compile_h200.json (and the H200 profile and the model formula it is read against), in
  the page's format; the two tables' rows."""
  from seq2seq import configs
  from seq2seq.model import flops
  from seq2seq.model.config import ModelConfig

  record, profile = _record("gpu_compile_h200.json"), _record("profile_h200.json")
  measured = profile["layouts"]["packed"]["table"]
  model, variants, fitted, before = record["model"], record["variants"], record["fitted_table"], record["before_table"]
  base, xla_norms = variants["baseline"]["table"], variants["xla_norms"]["table"]
  apart = variants["ffn_bias_apart"]["table"]  # the step before the FFN's bias went into its matmul
  sums = variants["flash_sums_apart"]["table"]  # the step after it, before the flash backward's sums went in
  per_leaf = variants["norm_per_leaf"]["table"]  # the step after that, before the gradient norm was summed by groups
  keys_apart = variants["dropout_keys_apart"]["table"]  # the step after that, before the dropout keys came at once
  loss_xla = variants["loss_in_xla"]["table"]  # the step after that, before the loss kernel
  resid = variants["residual_apart"]["table"]  # the step after that, before the residual adds went into the norms
  loss_line = "loss and logits (softmax, casts)"
  assert _fixed(per_leaf["gb_per_step"], 1) == _fixed(keys_apart["gb_per_step"], 1)  # "the same GB"
  ms = lambda table, category: table["by_category"].get(category, {"ms": 0.0})["ms"]
  norms = lambda table: sum(ms(table, c) for c in ("norm", "dropout", "residual adds"))
  config = configs.get("wmt14_base")
  formula = flops.train_step_flops(ModelConfig.from_config(config.model, vocab_size=config.data.vocab_size),
                                   *record["shape"]) / 1e12
  fit_rows = "\n".join(f"| {c} | {_fixed(r['measured_ms'], 2)} | {_fixed(r['predicted_ms'], 2)} | "
                       f"{_fixed(r['predicted_ms_left_out'], 2)} |" for c, r in record["fit_check"].items())
  variant_rows = []
  for name, row in variants.items():
    table = row["table"]
    timed = (f"{_fixed(table['ms_per_step'], 2)} | {_fixed(row['predicted_speed_vs_baseline'], 3)}x | "
             f"{_fixed(row['predicted_mfu'] * 100, 1)}%" if row["predicted"] else "- | - | -")
    assert ("predicted_mfu" in row) == row["predicted"]
    if row["predicted"]:  # the model formula's FLOPs in the predicted time, against the H200's bf16 peak
      assert row["predicted_mfu"] == round(formula * row["rows"] / (table["ms_per_step"] / 1e3) / 989.4, 4)
    variant_rows.append(f"| `{name}` | {'yes' if row['predicted'] else 'no: ' + _flagged(row)} | "
                        f"{table['kernel_launches_per_step']} | {_fixed(table['gb_per_step'], 1)} | {timed} |")
  return {
      "bandwidth": _fixed(model["bandwidth_tb_s"], 2), "bandwidth_share": f"{model['bandwidth_tb_s'] / 4.8:.0%}",
      "launch": _fixed(model["launch_us"], 1), "matmul": _fixed(model["matmul_tflop_s"], 0),
      "library": _fixed(model["library_ms"]["attention"], 2), "fit_rows": fit_rows,
      "fitted_ms": _fixed(fitted["ms_per_step"], 2), "measured_ms": _fixed(measured["step_ms"], 2),
      "variant_rows": "\n".join(variant_rows),
      "attn_measured": _fixed(measured["ms_per_step"]["attention elementwise (biases, layout)"], 2),
      "attn_before": _fixed(ms(fitted, "attention elementwise (biases, layout)"), 2),
      "attn_after": _fixed(ms(xla_norms, "attention elementwise (biases, layout)"), 2),
      "before_ms": _fixed(fitted["ms_per_step"], 2), "inplace_ms": _fixed(xla_norms["ms_per_step"], 2),
      "inplace_speed": _fixed(fitted["ms_per_step"] / xla_norms["ms_per_step"], 3),
      "norms_before": _fixed(norms(xla_norms), 2), "norms_after": _fixed(norms(before), 2),
      "norms_step": _fixed(before["ms_per_step"], 2), "after_ms": _fixed(base["ms_per_step"], 2),
      "norms_speed": _fixed(xla_norms["ms_per_step"] / before["ms_per_step"], 3),
      "fork_before": _fixed(before["ms_per_step"], 2), "fork_after": _fixed(apart["ms_per_step"], 2),
      "fork_speed": _fixed(before["ms_per_step"] / apart["ms_per_step"], 3),
      "fork_kernels_before": str(before["kernel_launches_per_step"]), "fork_kernels_after": str(apart["kernel_launches_per_step"]),
      "fork_gb_before": _fixed(before["gb_per_step"], 1), "fork_gb_after": _fixed(apart["gb_per_step"], 1),
      "fork_attn_before": _fixed(ms(before, "attention elementwise (biases, layout)"), 2),
      "fork_attn_after": _fixed(ms(apart, "attention elementwise (biases, layout)"), 2),
      "fork_ffn_before": _fixed(ms(before, "FFN elementwise (bias, activation)"), 2),
      "fork_ffn_after": _fixed(ms(apart, "FFN elementwise (bias, activation)"), 2),
      "fork_norm_before": _fixed(ms(before, "norm"), 2), "fork_norm_after": _fixed(ms(apart, "norm"), 2),
      "bias_before": _fixed(apart["ms_per_step"], 2), "bias_after": _fixed(sums["ms_per_step"], 2),
      "bias_speed": _fixed(apart["ms_per_step"] / sums["ms_per_step"], 3),
      "bias_kernels_before": str(apart["kernel_launches_per_step"]),
      "bias_kernels_after": str(sums["kernel_launches_per_step"]),
      "bias_gb_before": _fixed(apart["gb_per_step"], 1), "bias_gb_after": _fixed(sums["gb_per_step"], 1),
      "bias_ffn_before": _fixed(ms(apart, "FFN elementwise (bias, activation)"), 2),
      "bias_ffn_after": _fixed(ms(sums, "FFN elementwise (bias, activation)"), 2),
      "bias_saves": _fixed(apart["ms_per_step"] - sums["ms_per_step"], 2),
      "sums_before": _fixed(sums["ms_per_step"], 2), "sums_after": _fixed(per_leaf["ms_per_step"], 2),
      "sums_speed": _fixed(sums["ms_per_step"] / per_leaf["ms_per_step"], 3),
      "sums_kernels_before": str(sums["kernel_launches_per_step"]),
      "sums_kernels_after": str(per_leaf["kernel_launches_per_step"]),
      "sums_gb_before": _fixed(sums["gb_per_step"], 1), "sums_gb_after": _fixed(per_leaf["gb_per_step"], 1),
      "sums_attn_before": _fixed(ms(sums, "attention"), 2), "sums_attn_after": _fixed(ms(per_leaf, "attention"), 2),
      "gnorm_before": _fixed(per_leaf["ms_per_step"], 2), "gnorm_after": _fixed(keys_apart["ms_per_step"], 2),
      "gnorm_speed": _fixed(per_leaf["ms_per_step"] / keys_apart["ms_per_step"], 3),
      "gnorm_kernels_before": str(per_leaf["kernel_launches_per_step"]),
      "gnorm_kernels_after": str(keys_apart["kernel_launches_per_step"]),
      "gnorm_gb": _fixed(keys_apart["gb_per_step"], 1),  # as before, to 0.1 GB (asserted below)
      "gnorm_launches_before": str(per_leaf["by_category"]["optimizer"]["launches"]),
      "gnorm_ms_before": _fixed(ms(per_leaf, "optimizer"), 2),
      "gnorm_launches_after": str(keys_apart["by_category"]["optimizer"]["launches"]),
      "gnorm_ms_after": _fixed(ms(keys_apart, "optimizer"), 2),
      "keys_before": _fixed(keys_apart["ms_per_step"], 2), "keys_after": _fixed(loss_xla["ms_per_step"], 2),
      "keys_speed": _fixed(keys_apart["ms_per_step"] / loss_xla["ms_per_step"], 3),
      "keys_kernels_before": str(keys_apart["kernel_launches_per_step"]),
      "keys_kernels_after": str(loss_xla["kernel_launches_per_step"]),
      "keys_dropout_launches_before": str(keys_apart["by_category"]["dropout"]["launches"]),
      "keys_dropout_launches_after": str(loss_xla["by_category"]["dropout"]["launches"]),
      "keys_dropout_before": _fixed(ms(keys_apart, "dropout"), 2),
      "keys_dropout_after": _fixed(ms(loss_xla, "dropout"), 2),
      "lossk_before": _fixed(loss_xla["ms_per_step"], 2), "lossk_after": _fixed(resid["ms_per_step"], 2),
      "lossk_speed": _fixed(loss_xla["ms_per_step"] / resid["ms_per_step"], 3),
      "lossk_kernels_before": str(loss_xla["kernel_launches_per_step"]),
      "lossk_kernels_after": str(resid["kernel_launches_per_step"]),
      "lossk_gb_before": _fixed(loss_xla["gb_per_step"], 1), "lossk_gb_after": _fixed(resid["gb_per_step"], 1),
      "lossk_line_before": _fixed(ms(loss_xla, loss_line), 2), "lossk_line_after": _fixed(ms(resid, loss_line), 2),
      "lossk_line_gb_before": _fixed(loss_xla["by_category"][loss_line]["gb"], 1),
      "lossk_line_gb_after": _fixed(resid["by_category"][loss_line]["gb"], 1),
      "resid_before": _fixed(resid["ms_per_step"], 2), "resid_after": _fixed(base["ms_per_step"], 2),
      "resid_speed": _fixed(resid["ms_per_step"] / base["ms_per_step"], 3),
      "resid_kernels_before": str(resid["kernel_launches_per_step"]),
      "resid_kernels_after": str(base["kernel_launches_per_step"]),
      "resid_gb_before": _fixed(resid["gb_per_step"], 1), "resid_gb_after": _fixed(base["gb_per_step"], 1),
      "resid_adds": _fixed(ms(resid, "residual adds"), 2),
      "resid_norm_before": _fixed(ms(resid, "norm"), 2), "resid_norm_after": _fixed(ms(base, "norm"), 2),
      "resid_attn_before": _fixed(ms(resid, "attention elementwise (biases, layout)"), 2),
      "resid_attn_after": _fixed(ms(base, "attention elementwise (biases, layout)"), 2),
      "resid_ffn_before": _fixed(ms(resid, "FFN elementwise (bias, activation)"), 2),
      "resid_ffn_after": _fixed(ms(base, "FFN elementwise (bias, activation)"), 2),
      "resid_opt_before": str(resid["by_category"]["optimizer"]["launches"]),
      "resid_opt_after": str(base["by_category"]["optimizer"]["launches"]),
      **profiled_ffn_matmuls(profile),
      "norms_temp": _fixed(variants["baseline"]["temp_gib"], 2), "xla_norms_temp": _fixed(variants["xla_norms"]["temp_gib"], 2),
      "sliced_speed": _fixed(variants["flash_sliced"]["table"]["ms_per_step"] / base["ms_per_step"], 3),
      "target_ms": _fixed(formula / (0.4 * 989.4) * 1e3, 1), "formula_tflop": _fixed(formula, 2),
      "predicted_mfu": f"{formula / (base['ms_per_step'] / 1e3) / 989.4:.0%}",
      "profiled_mfu": f"{formula / (measured['step_ms'] / 1e3) / 989.4:.0%}",
      "attn_kernels": _fixed(ms(base, "attention"), 2), "norm_ms": _fixed(ms(base, "norm"), 2),
      "ffn_ms": _fixed(ms(base, "FFN elementwise (bias, activation)"), 2),
      "loss_ms": _fixed(ms(base, "loss and logits (softmax, casts)"), 2),
      "logits_saves": _fixed(base["ms_per_step"] - variants["logits_bfloat16"]["table"]["ms_per_step"], 2),
      "no_bias_saves": _fixed(base["ms_per_step"] - variants["no_bias"]["table"]["ms_per_step"], 2),
      "no_bias_ffn": _fixed(ms(variants["no_bias"]["table"], "FFN elementwise (bias, activation)"), 2),
      "no_bias_attention": _fixed(ms(variants["no_bias"]["table"], "attention"), 2),
      "attn_launches": str(base["by_category"]["attention"]["launches"]),
      "no_bias_attn_gone": str(base["by_category"]["attention"]["launches"]
                               - variants["no_bias"]["table"]["by_category"]["attention"]["launches"]),
      "optimizer_launches": str(base["by_category"]["optimizer"]["launches"]),
      "optimizer_ms": _fixed(ms(base, "optimizer"), 2),
      "no_norm_saves": _fixed(base["ms_per_step"] - variants["no_grad_norm"]["table"]["ms_per_step"], 2),
      "no_norm_kernels": str(base["kernel_launches_per_step"] - variants["no_grad_norm"]["table"]["kernel_launches_per_step"]),
      "no_norm_optimizer": _fixed(ms(variants["no_grad_norm"]["table"], "optimizer"), 2),
      "no_norm_optimizer_launches": str(variants["no_grad_norm"]["table"]["by_category"]["optimizer"]["launches"]),
      "dropout_ms": _fixed(ms(base, "dropout") + ms(base, "residual adds"), 2),  # residual adds: none left
      "cudnn_ms": _fixed(profile["layouts"]["unpacked"]["table"]["ms_per_step"]["attention"], 2),
      "pad_gb": _fixed(sum(k["gb_per_step"] for k in variants["loss_chunk_32"]["table"]["largest_kernels"]
                           if k["kernel"] == "loop_pad_fusion"), 1)}


def _flagged(row: dict) -> str:
  """Why a variant is not predicted: the XLA flags or flash tiles autotuning or kernels decide."""
  return f"`{row['xla_flags']}`" if row["xla_flags"] else f"tiles `{row['flash_blocks']}`"


# Where the section quotes each figure: (the text before it, the text after it), whitespace normalised.
SECTION_TEMPLATE_FIGURES = {
    "bandwidth": [("it gives ", " TB/s (")], "bandwidth_share": [("TB/s (", " of the H200's nominal 4.8 TB/s)")],
    "launch": [("4.8 TB/s), ", " µs a launch")], "matmul": [("µs a launch, ", " TFLOP/s for the matmuls")],
    "library": [("matmuls and ", " ms for the flash kernels")],
    "fitted_ms": [("The fitted program comes to ", " ms a step against")],
    "measured_ms": [("against the profile's ", " ms.")],
    "attn_measured": [('"attention elementwise" line (', " ms measured)")],
    "attn_before": [("that line goes from ", " to ")], "attn_after": [(" to ", " ms and the step from")],
    "before_ms": [("the step from ", " to ")], "inplace_ms": [(" to ", " ms, 1."), ("and the step from ", " to ")],
    "norms_before": [("residual adds together go from ", " to ")], "norms_after": [(" to ", " ms, and the step")],
    "norms_step": [(" to ", " ms: 1.")], "after_ms": [("between the predicted ", " ms and 40% MFU")],
    "fork_before": [("On the model the step goes from ", " to ")], "fork_after": [(" to ", " ms (1.0")],
    "fork_speed": [(" ms (", "x; ")], "fork_kernels_before": [("x; ", " to ")],
    "fork_kernels_after": [(" to ", " kernels, ")], "fork_gb_before": [(" kernels, ", " to ")],
    "fork_gb_after": [(" to ", " GB): the attention elementwise")],
    "fork_attn_before": [("the attention elementwise line from ", " to ")],
    "fork_attn_after": [(" to ", " ms, the FFN's from")], "fork_ffn_before": [("the FFN's from ", " to ")],
    "fork_ffn_after": [(" to ", ", and the norm line from")], "fork_norm_before": [("and the norm line from ", " to ")],
    "fork_norm_after": [(" to ", " (its backward reads the second array)")],
    "bias_before": [("On the model the step goes from ", " to ")], "bias_after": [(" to ", " ms (1.0")],
    "bias_speed": [(" ms (", "x; ")], "bias_kernels_before": [("x; ", " to ")],
    "bias_kernels_after": [(" to ", " kernels, ")], "bias_gb_before": [(" kernels, ", " to ")],
    "bias_gb_after": [(" to ", " GB): the FFN's line")], "bias_ffn_before": [("the FFN's line from ", " to ")],
    "bias_ffn_after": [(" to ", " ms, one kernel fewer a layer and its bias's cast")],
    "sums_before": [("With its sums in its kernels the step goes from ", " to ")],
    "sums_after": [(" to ", " ms (1.0")], "sums_speed": [(" ms (", "x; ")], "sums_kernels_before": [("x; ", " to ")],
    "sums_kernels_after": [(" to ", " kernels, ")], "sums_gb_before": [(" kernels, ", " to ")],
    "sums_gb_after": [(" to ", " GB): the attention line")],
    "sums_attn_before": [("the attention line from ", " to ")],
    "sums_attn_after": [(" to ", " ms, three XLA kernels fewer an attention layer")],
    "gnorm_before": [("On the model, summed by groups, the step goes from ", " to ")],
    "gnorm_after": [(" to ", " ms (1.0")], "gnorm_speed": [(" ms (", "x; ")], "gnorm_kernels_before": [("x; ", " to ")],
    "gnorm_kernels_after": [(" to ", " kernels, ")], "gnorm_gb": [(" kernels, the same ", " GB): the optimizer's line from")],
    "gnorm_launches_before": [("the optimizer's line from ", " kernels and ")],
    "gnorm_ms_before": [(" kernels and ", " ms to ")],
    "gnorm_launches_after": [(" ms to ", " and ")], "gnorm_ms_after": [(" and ", " ms. The groups")],
    "keys_before": [("On the model, with the keys at once, the step goes from ", " to ")],
    "keys_after": [(" to ", " ms (1.0")], "keys_speed": [(" ms (", "x; ")], "keys_kernels_before": [("x; ", " to ")],
    "keys_kernels_after": [(" to ", " kernels): the dropout line from")],
    "keys_dropout_launches_before": [("the dropout line from ", " kernels and ")],
    "keys_dropout_before": [(" kernels and ", " ms to ")],
    "keys_dropout_launches_after": [(" ms to ", " and ")],
    "keys_dropout_after": [(" and ", " ms. The keys are")],
    "lossk_before": [("On the model, with the kernel, the step goes from ", " to ")],
    "lossk_after": [(" to ", " ms (1.0")], "lossk_speed": [(" ms (", "x; ")], "lossk_kernels_before": [("x; ", " to ")],
    "lossk_kernels_after": [(" to ", " kernels, ")], "lossk_gb_before": [(" kernels, ", " to ")],
    "lossk_gb_after": [(" to ", " GB): the loss and logits line from")],
    "lossk_line_before": [("the loss and logits line from ", " ms and ")],
    "lossk_line_gb_before": [(" ms and ", " GB to ")], "lossk_line_after": [(" GB to ", " ms and ")],
    "lossk_line_gb_after": [(" ms and ", " GB, one kernel where there were")],
    "resid_before": [("On the model, with the add in the kernels, the step goes from ", " to ")],
    "resid_after": [(" to ", " ms (1.0")], "resid_speed": [(" ms (", "x; ")], "resid_kernels_before": [("x; ", " to ")],
    "resid_kernels_after": [(" to ", " kernels, ")], "resid_gb_before": [(" kernels, ", " to ")],
    "resid_gb_after": [(" to ", " GB): the residual adds' line (")],
    "resid_adds": [("the residual adds' line (", " ms) goes")],
    "resid_norm_before": [("the norm line goes from ", " to ")],
    "resid_norm_after": [(" to ", " ms (the kernels read the residual")],
    "resid_attn_before": [("the attention and FFN elementwise lines from ", " to ")],
    "resid_attn_after": [(" to ", " and from ")], "resid_ffn_before": [(" and from ", " to ")],
    "resid_ffn_after": [(" to ", " ms (the bias and dropout passes")],
    "resid_opt_before": [("and the optimizer's from ", " kernels to ")],
    "resid_opt_after": [(" kernels to ", " (XLA's optimizer kernels")],
    "bias_cublas_us": [("this matmul ran in cuBLAS, ", " µs a layer")],
    "bias_triton_us": [("in its prologue, took ", " µs.")], "bias_back": [("here as there, ", " ms of the")],
    "bias_saves": [(" ms of the ", " go back.")],
    "norms_speed": [(" ms: ", "x, and ")], "norms_temp": [("x, and ", " GiB of temporary memory")],
    "xla_norms_temp": [("temporary memory against ", ". Inside a mesh")],
    "inplace_speed": [(" ms, ", "x (against `flash_sliced`")],
    "sliced_speed": [("(against `flash_sliced`, ", "x: that variant")],
    "target_ms": [("40% MFU (", " ms a step for the model formula's")],
    "predicted_mfu": [("the step would be ", " MFU")], "profiled_mfu": [("(the profiled one ", ").")],
    "formula_tflop": [("the model formula's ", " TFLOP at 989 TFLOP/s)")],
    "attn_kernels": [("the flash kernels (", " ms; the profile"), ("the attention line from ", " to ")],
    "norm_ms": [("norms (", " ms)")], "ffn_ms": [("bias and ReLU (", " ms)"), ("(its line from ", " to ")],
    "loss_ms": [("the loss and logits (", " ms; `logits_bfloat16`")],
    "logits_saves": [("is predicted to take ", " ms off)")],
    "no_bias_saves": [("the step is predicted to take ", " ms less")],
    "no_bias_ffn": [(" to ", " ms), and the attention line loses")],
    "no_bias_attention": [(" to ", " ms). That changes the model")],
    "attn_launches": [(" of its ", " kernels, the sums of the kernels' partial sums")],
    "no_bias_attn_gone": [("the attention line loses ", " of its")],
    "optimizer_launches": [("the optimizer's ", " kernels ("), ("the optimizer line from ", " kernels and ")],
    "optimizer_ms": [(" kernels (", " ms), dropout"), (" kernels and ", " ms to ")],
    "no_norm_saves": [("the step is predicted to take ", " ms less, in ")],
    "no_norm_kernels": [(" ms less, in ", " fewer kernels")],
    "no_norm_optimizer_launches": [(" ms to ", " kernels and ")],
    "no_norm_optimizer": [(" kernels and ", " ms). It changes")],
    "dropout_ms": [("dropout (", " ms; the residual adds are in the norm kernels now).")],
    "pad_gb": [("(37000 is not a multiple of 16), ", " GB of copies a step")],
    "cudnn_ms": [("the profile's unpacked step spent ", " ms in cuDNN's)")],
}


def test_the_flash_blocks_paragraph_is_flash_blocks_wmt_json():
  """'The flash kernels visit only the blocks of their pairs': the fractions of the kernels' work
  left, packed and bucketed, and the bucketed rows of 64, as the record has them; the flash
  kernels' time they are applied to is the gpu_compile record's."""
  record, page = _record("flash_blocks_wmt.json"), _page()
  packed, bucketed = record["packed"], record["bucketed"]
  assert list(packed["by_shape"]) == ["[96, 256, 256]"] and record["pairs"] == 200000
  assert record["lengths_from"] == "benchmarks/results/data_pipeline_wmt_cpu2.json"
  attention = _record("gpu_compile_h200.json")["variants"]["baseline"]["table"]["by_category"]["attention"]["ms"]
  assert (f"the kernels do {packed['left']:.0%} of the work they did (so, if their time follows their FLOPs, about "
          f"{_fixed(packed['left'] * attention, 1)} of the {_fixed(attention, 2)} ms); bucketed, the config's default, "
          f"{bucketed['left']:.0%}, since most of its batches have rows of 64 "
          f"({bucketed['by_shape']['[384, 64, 64]']['left']:.0%} left there") in page
  assert max(bucketed["by_shape"].items(), key=lambda kv: kv[1]["batches"])[0] == "[384, 64, 64]"
  assert "([flash_blocks_wmt.json](../benchmarks/results/flash_blocks_wmt.json), 200000 pairs)" in _raw()


def test_the_gpu_compile_section_is_gpu_compile_h200_json():
  """The section's figures and both tables are the record's; the record was fitted to the profile's
  measured categories, at the profile's shape, in bf16 packed rows on an H200; the in-place flash
  path is the baseline and `flash_sliced` the step as before."""
  record, profile = _record("gpu_compile_h200.json"), _record("profile_h200.json")
  assert record["measured"] == "benchmarks/results/profile_h200.json" and record["target"] == "h200"
  assert (record["shape"], record["dtype"], record["layout"]) == (profile["shape"], profile["dtype"], "packed")
  assert record["versions"]["jax"] == profile["versions"]["jax"]
  measured = profile["layouts"]["packed"]["table"]["ms_per_step"]
  assert all(row["measured_ms"] == measured[c] for c, row in record["fit_check"].items())
  assert record["variants"]["flash_sliced"]["flash_sliced"] and "flash_sliced" not in record["variants"]["baseline"]
  assert record["variants"]["xla_norms"]["config"] == {"model.norm_impl": "xla"}
  assert "model.norm_impl" not in record["variants"]["baseline"]["config"]
  raw, page = _raw(), _page()
  # the norms' backward adds their output's two gradients: JAX's adds before every post-norm but
  # the last of each stack are gone from the baseline, one kernel of zeros (those last ones' unused copy) came
  from seq2seq import configs

  cfg = configs.get("wmt14_base").model
  adds = 2 * cfg.num_encoder_layers + 3 * cfg.num_decoder_layers - 2
  before, apart = record["before_table"], record["variants"]["ffn_bias_apart"]["table"]
  assert before["kernel_launches_per_step"] - apart["kernel_launches_per_step"] == adds - 1
  assert record["variants"]["ffn_bias_apart"]["bias_apart"] and record["variants"]["xla_norms"]["bias_apart"]
  assert "bias_apart" not in record["variants"]["baseline"]
  # two kernels fewer a feed-forward layer: the bias's add and its cast to bf16; then three an
  # attention layer: XLA's delta and its two bias sums
  ffns, attentions = cfg.num_encoder_layers + cfg.num_decoder_layers, cfg.num_encoder_layers + 2 * cfg.num_decoder_layers
  sums = record["variants"]["flash_sums_apart"]
  assert apart["kernel_launches_per_step"] - sums["table"]["kernel_launches_per_step"] == 2 * ffns
  assert sums["sums_apart"] and record["variants"]["ffn_bias_apart"]["sums_apart"]
  per_leaf = record["variants"]["norm_per_leaf"]
  assert sums["table"]["kernel_launches_per_step"] - per_leaf["table"]["kernel_launches_per_step"] == 3 * attentions
  assert per_leaf["norm_per_leaf"] and sums["norm_per_leaf"] and record["variants"]["ffn_bias_apart"]["norm_per_leaf"]
  keys_apart = record["variants"]["dropout_keys_apart"]
  assert all(record["variants"][n]["dropout_keys_apart"] for n in ("ffn_bias_apart", "flash_sums_apart", "norm_per_leaf"))
  assert keys_apart["dropout_keys_apart"] and "norm_per_leaf" not in keys_apart
  assert "norm_per_leaf" not in record["variants"]["baseline"] and "dropout_keys_apart" not in record["variants"]["baseline"]
  assert f"before every norm but the last of each stack, {adds} a step, counted in the attention and FFN" in page
  figures = gpu_compile_figures()
  fit_header = "| category | measured ms | fitted ms | predicted without it, ms |"
  assert _table_lines(raw, fit_header) == figures.pop("fit_rows").splitlines()
  variant_header = ("| variant | predicted | kernels a step | GB a step (XLA's kernels) | ms a step | speed against the "
                    "baseline | MFU |")
  assert _table_lines(raw, variant_header) == figures.pop("variant_rows").splitlines()
  text = SECTION_TEMPLATE_FIGURES
  for name, value in figures.items():
    for before, after in text[name]:
      assert f"{before}{value}{after}" in page, (name, before, value, after)


def test_the_big_paragraph_is_gpu_compile_h200_big_json():
  """'wmt14_big, predicted the same way': the record applies the wmt14_base record's fitted model,
  unchanged, to wmt14_big's step at the same shape, dtype, layout and target; its attention kernels
  do twice wmt14_base's FLOPs (16 heads of 64 against 8); every figure of the paragraph is the
  record's, and the 45% target is the model formula's FLOPs at the H200's bf16 peak."""
  from seq2seq import configs
  from seq2seq.model import flops
  from seq2seq.model.config import ModelConfig

  big, base = _record("gpu_compile_h200_big.json"), _record("gpu_compile_h200.json")
  assert big["model"] == base["model"] and big["fitted_to"] == "benchmarks/results/gpu_compile_h200.json"
  assert big["config"] == "configs/wmt14_big.py" and big["target"] == base["target"] == "h200"
  assert (big["shape"], big["dtype"], big["layout"]) == (base["shape"], base["dtype"], base["layout"])
  config = configs.get("wmt14_big")
  cfg = ModelConfig.from_config(config.model, vocab_size=config.data.vocab_size)
  v, shape = big["variants"], big["shape"]
  row, t = v["baseline"], v["baseline"]["table"]
  formula = flops.train_step_flops(cfg, *shape) / 1e12
  assert row["model_tflop"] == round(formula, 6)
  assert row["attention_tflop"] == round(3 * flops.attention_flops(cfg, *shape) / 1e12, 6)
  base_config = configs.get("wmt14_base")
  base_cfg = ModelConfig.from_config(base_config.model, vocab_size=base_config.data.vocab_size)
  assert flops.attention_flops(cfg, *shape) == 2 * flops.attention_flops(base_cfg, *shape)
  assert base["variants"]["baseline"]["attention_tflop"] == round(3 * flops.attention_flops(base_cfg, *shape) / 1e12, 6)
  assert all(r["predicted"] and r["attention"] == "flash" for n, r in v.items() if n != "no_triton_gemm")
  step, cat = t["ms_per_step"], lambda c: t["by_category"][c]["ms"]
  target = formula / (0.45 * 989.4) * 1e3
  mfu = lambda name: f"{v[name]['predicted_mfu'] * 100:.1f}%"
  ms = lambda name: f"{v[name]['table']['ms_per_step']:.2f}"
  expected = (
      f"The step comes to {step:.2f} ms, {mfu('baseline')} MFU of the model formula's {formula:.2f} TFLOP, "
      f"against {target:.1f} ms for issue 62's 45%. Its matmuls take {cat('matmul'):.2f} ms "
      f"({t['matmul_tflop_per_step']:.1f} TFLOP at wmt14_base's {base['model']['matmul_tflop_s']:.0f} TFLOP/s), "
      f"the flash kernels {cat('attention'):.2f} ms, and the elementwise lines "
      f"{step - cat('matmul') - cat('attention'):.2f} ms: the FFN's bias and ReLU "
      f"{cat('FFN elementwise (bias, activation)'):.2f}, the optimizer {cat('optimizer'):.2f}, the loss and logits "
      f"{cat('loss and logits (softmax, casts)'):.2f} (the same [24576, 37000] logits as wmt14_base's), norms "
      f"{cat('norm'):.2f}. With the FFN's first bias apart from its matmul, the flash backward's sums in XLA, "
      f"the gradient's norm summed a parameter at a time, a kernel a dropout key, the loss in XLA and the "
      f"residual adds in XLA (`ffn_bias_apart`, the step before all six) it was {ms('ffn_bias_apart')} ms "
      f"({mfu('ffn_bias_apart')}), with the last five (`flash_sums_apart`) {ms('flash_sums_apart')} ms "
      f"({mfu('flash_sums_apart')}), the last four (`norm_per_leaf`) {ms('norm_per_leaf')} ms "
      f"({mfu('norm_per_leaf')}), the last three (`dropout_keys_apart`) {ms('dropout_keys_apart')} ms "
      f"({mfu('dropout_keys_apart')}), the last two (`loss_in_xla`) {ms('loss_in_xla')} ms ({mfu('loss_in_xla')}), "
      f"the residual adds in XLA alone (`residual_apart`) {ms('residual_apart')} ms ({mfu('residual_apart')}). "
      f"Predicted the same way, `no_bias` takes it to {ms('no_bias')} ms ({mfu('no_bias')}), "
      f"`logits_bfloat16` to {ms('logits_bfloat16')} ms ({mfu('logits_bfloat16')}), `adam_mu_bfloat16` to "
      f"{ms('adam_mu_bfloat16')} ms ({mfu('adam_mu_bfloat16')}) and `no_grad_norm` to {ms('no_grad_norm')} ms "
      f"({mfu('no_grad_norm')}). The predicted step is {target - step:.1f} ms under the {target:.1f} ms of 45%, "
      f"less than a fifth of the flash kernels' time")
  assert expected in _page()
  assert 0 < target - step < cat("attention") / 5 and [shape[0] * shape[2], cfg.vocab_size] == [24576, 37000]
  assert "([gpu_compile_h200_big.json](../benchmarks/results/gpu_compile_h200_big.json): the model above," in _raw()


def test_the_pre_norm_sentence_is_gpu_compile_h200_pre_norm_json():
  """The pre-norm counterpart of the post-norm's Fork: wmt14_base made pre-norm, compiled as the
  commit before the Fork compiled it (`before`) and at HEAD with the FFN's bias apart (the step
  the Fork made), on the wmt14_base record's model; and at HEAD, the FFN's bias in its matmul.
  The sentences' figures are the record's."""
  record, base = _record("gpu_compile_h200_pre_norm.json"), _record("gpu_compile_h200.json")
  assert record["model"] == base["model"] and record["settings"] == ["model.norm_position=pre"]
  assert record["variants"]["baseline"]["config"] == {"model.norm_position": "pre"} and record["before"]
  assert record["variants"]["ffn_bias_apart"]["bias_apart"]
  before, after = record["before_table"], record["variants"]["ffn_bias_apart"]["table"]
  assert (f"goes from {_fixed(before['ms_per_step'], 2)} to {_fixed(after['ms_per_step'], 2)} ms and from "
          f"{_fixed(before['gb_per_step'], 1)} to {_fixed(after['gb_per_step'], 1)} GB, in the same "
          f"{after['kernel_launches_per_step']} kernels (XLA had fused those adds into other kernels)") in _page()
  assert before["kernel_launches_per_step"] == after["kernel_launches_per_step"]
  steps = [record["variants"][n]["table"] for n in ("flash_sums_apart", "norm_per_leaf", "dropout_keys_apart",
                                                     "loss_in_xla", "residual_apart", "pre_add_apart", "baseline")]
  ms, kernels = [_fixed(t["ms_per_step"], 2) for t in steps], [str(t["kernel_launches_per_step"]) for t in steps]
  assert (f"Made pre-norm, wmt14_base goes from {_fixed(after['ms_per_step'], 2)} to {ms[0]} ms with it, to {ms[1]} "
          f"ms with the flash backward's sums in its kernels too, to {ms[2]} ms with the gradient's norm summed by "
          f"groups, to {ms[3]} ms with the dropout keys derived at once, to {ms[4]} ms with the loss's kernel, "
          f"to {ms[5]} ms with the norm kernels' partial sums in one array and to {ms[6]} ms with its residual adds "
          f"in the norm kernels (below; {after['kernel_launches_per_step']} to {kernels[0]}, {kernels[1]}, "
          f"{kernels[2]}, {kernels[3]}, {kernels[4]}, {kernels[5]} and {kernels[6]} kernels;") in _page()
  assert "([gpu_compile_h200_pre_norm.json](../benchmarks/results/gpu_compile_h200_pre_norm.json))" in _raw()
  assert _pre_add_paragraph() in _page()
  # the kernels' machine code: the pre-norm record's norm rows against the post-norm record's
  rows = lambda name: {k["kernel"]: k for k in _record(name)["kernels"] if k["kernel"].startswith("seq2seq_norm")}
  pre, post = rows("triton_kernels_h100_pre_norm.json"), rows("triton_kernels_h100.json")
  assert _record("triton_kernels_h100_pre_norm.json")["settings"] == ["model.norm_position=pre"]
  assert all(k["problem"] == "layernorm + residual" and k["stack_bytes"] == k["local_loads"] == 0
             for k in [*pre.values(), *post.values()])
  fwd, bwd = pre["seq2seq_norm_fwd"], pre["seq2seq_norm_bwd"]
  assert (f"the forward kernel takes {fwd['registers']} registers a thread ({fwd['programs_per_sm']} programs an SM) "
          f"and the backward kernel {bwd['registers']} ({bwd['programs_per_sm']}), nothing spilled, where a "
          f"post-norm's take {post['seq2seq_norm_fwd']['registers']} and {post['seq2seq_norm_bwd']['registers']}") in _page()


def _pre_add_paragraph() -> str:
  """'A pre-norm's residual add is made in the next norm's kernels': its figures, from the pre-norm
  record (`pre_add_apart`, the step before, against the baseline) and the post-norm record's
  optimizer kernels; the MFU of the model formula's FLOPs at the H200's bf16 peak, as the record has it."""
  record, base = _record("gpu_compile_h200_pre_norm.json"), _record("gpu_compile_h200.json")
  rows = record["variants"]
  before, after = rows["pre_add_apart"]["table"], rows["baseline"]["table"]
  assert rows["pre_add_apart"]["pre_add_apart"] and "pre_add_apart" not in rows["baseline"]
  assert "residual adds" not in after["by_category"]
  assert before["by_category"]["optimizer"]["launches"] == after["by_category"]["optimizer"]["launches"]  # "stay"
  ms = lambda table, category: _fixed(table["by_category"][category]["ms"], 2)
  launches = lambda table, category: str(table["by_category"][category]["launches"])
  mfu = lambda row: f"{row['predicted_mfu']:.1%}"
  attn, ffn = "attention elementwise (biases, layout)", "FFN elementwise (bias, activation)"
  return (f"goes from {_fixed(before['ms_per_step'], 2)} to {_fixed(after['ms_per_step'], 2)} ms "
          f"({_fixed(before['ms_per_step'] / after['ms_per_step'], 3)}x, {mfu(rows['pre_add_apart'])} to "
          f"{mfu(rows['baseline'])} MFU; {before['kernel_launches_per_step']} to {after['kernel_launches_per_step']} "
          f"kernels, {_fixed(before['gb_per_step'], 1)} to {_fixed(after['gb_per_step'], 1)} GB): the residual adds' "
          f"line ({ms(before, 'residual adds')} ms) goes, the norm line goes from {ms(before, 'norm')} to "
          f"{ms(after, 'norm')} ms, and the attention and FFN elementwise lines from {ms(before, attn)} to "
          f"{ms(after, attn)} and from {ms(before, ffn)} to {ms(after, ffn)} ms, as in a post-norm above. The "
          f"optimizer's kernels stay {launches(after, 'optimizer')} (a post-norm's "
          f"{launches(base['variants']['baseline']['table'], 'optimizer')})")


TRITON_KERNELS = {"seq2seq_flash_forward": "forward", "seq2seq_flash_dkdv": "dK/dV", "seq2seq_flash_dq": "dQ"}


def triton_kernels_table() -> str:
  """The machine-code table: per tiling of triton_kernels_h100.json, in its order, the decoder
  self-attention's three kernels (registers; bytes spilled; HGMMA:HMMA; programs x warps an SM),
  named by the device check's variant of those tiles."""
  from seq2seq.model.flash import Blocks

  record, device_check = _record("triton_kernels_h100.json"), benchmark("device_check")
  names = {Blocks.parse(v.flash_blocks).spec(): f"`{n}`" for n, v in device_check.VARIANTS.items() if v.flash_blocks}
  names[Blocks().spec()] = "the default"
  tilings = {}
  for row in record["kernels"]:
    if row["problem"] == "self causal":
      tilings.setdefault(row["blocks"], {})[row["kernel"]] = row
  cell = lambda r: f"{r['registers']}; {r['stack_bytes']}; {r['hgmma']}:{r['hmma']}; {r['programs_per_sm']}x{r['warps']}"
  lines = ["| variant | tiles | forward | dK/dV | dQ |", "|---|---|---|---|---|"]
  for spec, kernels in tilings.items():
    lines.append(f"| {names.get(spec, '-')} | `{spec}` | " + " | ".join(cell(kernels[k]) for k in TRITON_KERNELS) + " |")
  return "\n".join(lines)


def triton_kernels_figures() -> dict:
  """The figures the section's bullets quote, from the record."""
  from seq2seq.model.flash import Blocks

  record, device_check = _record("triton_kernels_h100.json"), benchmark("device_check")
  spec = lambda name: Blocks.parse(device_check.VARIANTS[name].flash_blocks).spec()
  row = lambda blocks, kernel, problem="self causal": next(
      r for r in record["kernels"] if (r["blocks"], r["kernel"], r["problem"]) == (blocks, kernel, problem))
  return {"DKDV_SPILL": row(spec("flash_tiles_128"), "seq2seq_flash_dkdv")["stack_bytes"],
          "NORM_BWD_REGISTERS": row("", "seq2seq_norm_bwd", "layernorm + residual")["registers"],
          "NORM_FWD_PROGRAMS": {1: "one", 2: "two", 3: "three"}[
              row("", "seq2seq_norm_fwd", "layernorm + residual")["programs_per_sm"]],
          "LOSS_REGISTERS": row("", "seq2seq_loss_fwd_bwd", "loss")["registers"],
          "LOSS_PROGRAMS": {1: "one", 2: "two", 3: "three"}[row("", "seq2seq_loss_fwd_bwd", "loss")["programs_per_sm"]]}


def test_the_machine_code_section_is_triton_kernels_h100_json():
  """'The kernels' machine code': the table and the bullets' figures are the record's; what the
  bullets say of each tiling holds there (the default's backward kernels issue HMMA only,
  flash_tiles_128's dK/dV spills, flash_backward_64's three kernels issue HGMMA only and spill
  nothing, for every attention of the step)."""
  from seq2seq.model.flash import Blocks

  record, device_check, raw = _record("triton_kernels_h100.json"), benchmark("device_check"), _raw()
  assert triton_kernels_table() in raw
  figures = triton_kernels_figures()
  page = _page()
  assert (f"holds 255 registers and spills {figures['DKDV_SPILL']} bytes a thread" in page
          and f"the backward takes {figures['NORM_BWD_REGISTERS']} registers a thread, so an SM holds one program of "
          f"8 warps (the forward {figures['NORM_FWD_PROGRAMS']})" in page)
  norm = {r["kernel"]: r for r in record["kernels"] if r["problem"] == "layernorm + residual"}
  assert (f"{norm['seq2seq_norm_fwd']['instructions']}\ninstructions forward and "
          f"{norm['seq2seq_norm_bwd']['instructions']} backward, where the norm alone took") in raw
  assert (f"a program takes {figures['LOSS_REGISTERS']} registers a thread and an SM holds "
          f"{figures['LOSS_PROGRAMS']}, whose rows") in page
  assert record["versions"] == {"jax": "0.11.2", "triton": "3.9.0"} and record["target"] == "h100"
  assert "Triton 3.9.0 and jax 0.11.2 ([triton_kernels_h100.json](../benchmarks/results/triton_kernels_h100.json);" in page
  by = {(r["blocks"], r["kernel"], r["problem"]): r for r in record["kernels"]}
  loss = by["", "seq2seq_loss_fwd_bwd", "loss"]  # the loss kernel: a program a token, nothing spilled
  assert loss["stack_bytes"] == loss["local_bytes"] == 0 and loss["warps"] == 8 and loss["grid"] == [96 * 256, 1, 1]
  default, wide = Blocks().spec(), Blocks.parse(device_check.VARIANTS["flash_backward_64"].flash_blocks).spec()
  for problem in ("self", "self causal", "cross"):
    assert by[default, "seq2seq_flash_forward", problem]["hgmma"] > 0
    for kernel in ("seq2seq_flash_dkdv", "seq2seq_flash_dq"):
      assert by[default, kernel, problem]["hgmma"] == 0 < by[default, kernel, problem]["hmma"]
    for kernel in TRITON_KERNELS:
      row = by[wide, kernel, problem]
      assert row["hmma"] == 0 < row["hgmma"] and row["stack_bytes"] == 0, row
  assert [by[default, k, "self causal"]["programs_per_sm"] for k in ("seq2seq_flash_dkdv", "seq2seq_flash_dq")] == [3, 4]
  assert by[wide, "seq2seq_flash_dkdv", "self causal"]["registers"] == 240
  assert by[wide, "seq2seq_flash_dq", "self causal"]["registers"] == 173
  assert "(240 and 173 registers), against three and four of 4 warps now" in page
  # the flash backward's sums in its kernels (the dQ kernel's delta and bias sums): at the default
  # tiles causal self-attention's dQ kernel holds 100 registers (94 before), 4 programs an SM (5);
  # the other dQ kernels 5 still
  causal_dq = by[default, "seq2seq_flash_dq", "self causal"]
  assert (causal_dq["registers"], causal_dq["programs_per_sm"]) == (100, 4)
  assert [by[default, "seq2seq_flash_dq", p]["programs_per_sm"] for p in ("self", "cross")] == [5, 5]
  assert ("the dQ kernel of causal self-attention takes 100 registers a thread where it took 94, so an SM holds 4 of "
          "its programs instead of 5") in page
  assert by[Blocks.parse("dkdv=64x64,dq=64x64").spec(), "seq2seq_flash_dkdv", "self causal"]["stack_bytes"] == 128
