"""Every script in benchmarks/ at a tiny size on this machine's CPU (accelerator.py, device_check.py and
its profile parser, the others in one smoke test each); the nominal-peak table. The GPU check's
profile and variants sections, the next GPU session's command, run in CI (the slow suite);
its default run and most other scripts' runs are `pytest -m long`, and test_benchmark_calls.py
checks what every script calls of seq2seq in each fast run."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import REPO, benchmark


def _accelerator():
  return benchmark("accelerator")


def test_nominal_peak_takes_the_most_specific_device_kind_and_the_dtype():
  from seq2seq.model.flops import nominal_peak

  assert nominal_peak("NVIDIA H100 80GB HBM3") == 989.4 and nominal_peak("NVIDIA H100 80GB HBM3", "float32") == 494.7
  assert nominal_peak("NVIDIA H100 PCIe") == 756.5  # not the SXM figure
  assert nominal_peak("NVIDIA GH200 480GB") == 989.4 and nominal_peak("NVIDIA H200 NVL") == 835.5
  assert nominal_peak("NVIDIA A100-SXM4-80GB") == 312.0 and nominal_peak("NVIDIA A100-SXM4-80GB", "float32") == 156.0
  assert nominal_peak("NVIDIA L4") == 121.0 and nominal_peak("NVIDIA L40S") == 362.0
  assert nominal_peak("TPU v5 lite") == 197.0 and nominal_peak("TPU v5") == 459.0  # v5e, v5p
  assert nominal_peak("TPU v6 lite", "float32") == 918.0  # f32 matmuls take one bf16 pass on a TPU
  assert nominal_peak("Tesla V100-SXM2-16GB", "float32") == 15.7 and nominal_peak("Tesla V100-SXM2-16GB") is None
  assert nominal_peak("TPU v4 lite") is None and nominal_peak("cpu") is None
  assert not hasattr(_accelerator(), "PEAK_TFLOPS")  # one table, in seq2seq.model.flops


def test_benchmarks_take_a_config_by_path_or_by_shipped_name(capsys):
  """accelerator.load_config, which every benchmark's --config goes through: a file, a shipped
  config's name (also under another folder, as scripts prefix the repository) or NAME.py give
  the same config; anything else ends in one `error:` line naming it, with exit 2."""
  load = _accelerator().load_config
  by_path = load(str(REPO / "configs" / "tiny.py")).to_dict()
  assert load("tiny").to_dict() == load(str(REPO / "tiny")).to_dict() == load("tiny.py").to_dict() == by_path
  with pytest.raises(SystemExit) as stop:
    load(str(REPO / "nope"))
  assert stop.value.code == 2
  assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
      f"error: --config={REPO / 'nope'}: no such file, and no shipped config has that name; shipped configs: ")


@pytest.mark.long
def test_accelerator_benchmark_runs_on_the_cpu_with_a_measured_peak(tmp_path):
  out = subprocess.run([sys.executable, "benchmarks/accelerator.py", "--config=configs/tiny.py", "--dtype=float32",
                        "--steps=2", f"--out={tmp_path / 'r.json'}"], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads((tmp_path / "r.json").read_text())
  assert result["platform"] == "cpu" and result["peak_source"] == "measured f32 matmul"
  (shape,) = result["shapes"]
  assert shape["shape"] == [16, 64, 64] and shape["target_tokens_per_s"] == pytest.approx(16 * 64 / shape["step_ms"] * 1e3)
  assert 0 < result["mfu"] < 1


@pytest.mark.long  # every section of the GPU check's default run, at toy sizes on the CPU (65 s)
@pytest.mark.data  # its train and decode sections read newstest
def test_device_check_smoke_writes_every_section(real_data_dir, tmp_path):
  out = subprocess.run([sys.executable, "benchmarks/device_check.py", "--smoke", f"--out={tmp_path / 'check.json'}",
                        f"--shared={real_data_dir.parent}", f"--flax_models={tmp_path / 'missing.py'}"], cwd=REPO,
                       capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads((tmp_path / "check.json").read_text())
  assert result["smoke"] and result["device_kind"] == "cpu" and result["shape"] == [8, 32, 32]
  assert {"jax", "jaxlib", "flax", "torch"} <= set(result["versions"]) and result["versions"]["jax"]
  sections = result["sections"]
  assert list(sections) == ["flash", "steps_bfloat16", "profile", "decode", "peers", "train", "steps_float32"]
  assert all(sections["profile"][layout]["table"]["attributed_fraction"] == 1.0 for layout in ("packed", "unpacked"))
  flash_checks = [row for row in sections["flash"]["checks"] if not row["case"].startswith(("norm_", "loss_"))]
  assert all("interpret mode" in row["error"] for row in flash_checks) and flash_checks  # the kernels need a GPU
  norm_checks = [row for row in sections["flash"]["checks"] if row["case"].startswith("norm_")]
  assert [row["case"] for row in norm_checks] == ["norm_layernorm", "norm_rmsnorm", "norm_residual_add"]
  assert all("norm_impl='pallas' cannot run here" in row["error"] for row in norm_checks)
  timing = sections["flash"]["timing"]  # XLA's attention at the step's rows and target length; the kernel needs a GPU
  assert timing["xla"]["shape"] == [8, 32, 8, 64] and timing["xla"]["causal_packed_fwd_bwd_ms"] > 0, timing
  (loss_check,) = [row for row in sections["flash"]["checks"] if row["case"] == "loss_kernel"]
  assert "interpret mode" in loss_check["error"] and "error" in timing["loss_pallas"]  # the loss kernel: a GPU's
  assert timing["loss_xla"]["shape"] == [8, 32, 37000] and timing["loss_xla"]["loss_fwd_bwd_ms"] > 0, timing
  assert sections["flash"]["ptx"] == {}  # XLA:CPU writes no PTX: on a GPU, the kernels' matrix instructions
  decode = sections["decode"]
  assert decode["identical_hypotheses"] and decode["modes"]["planned"]["programs"] <= 3, decode
  for dtype in ("bfloat16", "float32"):
    assert "--section=steps" in sections[f"steps_{dtype}"]["command"]
    for layout in ("packed", "unpacked"):
      row = sections[f"steps_{dtype}"][layout]
      assert row["target_tokens_per_s"] > 0 and 0 < row["mfu"] < 1, (dtype, layout, row)
      assert row["peak_source"] == "measured f32 matmul" and row["attention"] in ("xla", "explicit")
  train = sections["train"]
  assert train["command"].startswith("seq2seq-train ") and [r["step"] for r in train["rows"]] == [5, 10]
  assert train["target_tokens_per_s"] > 0 and 0 <= train["data_wait_fraction"] < 1 and train["vocab_size"] > 0
  assert "no Flax WMT example" in sections["peers"]["flax-wmt"]["skipped"]  # a missing peer is a reason, not a failure
  if not result["versions"]["torch"]:
    assert sections["peers"]["torch"] == {"skipped": "torch is not installed"}
  assert result["summary"]["bfloat16_packed_tokens_per_s"] > 0 and result["summary"]["train_target_tokens_per_s"] > 0


def test_the_save_times_docs_quote_are_those_the_benchmark_wrote():
  """docs/training.md's save-time table is benchmarks/results/save_time_cpu2.json, row by row
  (`python benchmarks/save_time.py --out=...` writes it; the table is not typed by hand)."""
  import json
  import re

  result = json.loads((REPO / "benchmarks" / "results" / "save_time_cpu2.json").read_text())
  doc = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
  table = doc.split("<!-- save-time:start -->", 1)[1].split("<!-- save-time:end -->", 1)[0]
  quoted = re.findall(r"^\| `(\w+)` \| ([\d,]+) MB \| ([\d.]+) s \| ([\d.]+) s \| ([\d.]+) s \|$", table, re.M)
  assert quoted == [(r["config"], f"{r['state_bytes'] / 1e6:,.0f}", f"{r['blocking_s']:.2f}", f"{r['complete_s']:.2f}",
                     f"{r['stop_s']:.2f}") for r in result["rows"]]
  from seq2seq import configs

  shipped = {name for name in configs.names() if name not in ("default", "multi30k_positions", "multi30k_sweep",
                                                              "wmt14_files")}
  assert {r["config"] for r in result["rows"]} == shipped  # every shipped training config has its row


def test_the_save_time_benchmark_saves_as_the_run_does(tmp_path, monkeypatch):
  """One save of the tiny config, in process: the row's figures are positive and ordered."""
  save_time = benchmark("save_time")
  monkeypatch.chdir(tmp_path)
  row = save_time.measure("tiny", repeats=1)
  # float32 parameters and Adam's two moments, plus four scalars (step, lr scale, Adam's count; float32/int32)
  assert row["state_bytes"] == 12 * row["parameters"] + 16
  assert 0 < row["blocking_s"] <= row["complete_s"] and row["stop_s"] > 0
  assert list(tmp_path.iterdir()) == []  # its temporary workdir is gone


# -- every script in benchmarks/ runs: tiny shapes, a few steps (a refactor cannot break one unseen)
def _run_benchmark(script: str, args: list, data_dir, tmp_path) -> str:
  env = {**os.environ, "SEQ2SEQ_DATA_DIR": str(data_dir), "SEQ2SEQ_CACHE": str(tmp_path / "cache")}
  out = subprocess.run([sys.executable, f"benchmarks/{script}.py", *args], cwd=REPO, capture_output=True, text=True,
                       timeout=600, env=env)
  assert out.returncode == 0, (script, out.stdout[-2000:], out.stderr[-3000:])
  return out.stdout


@pytest.mark.parametrize("script", [
    # CI (the slow suite) runs the three quickest; the rest take 7 to 35 s each (`pytest -m long`)
    *(pytest.param(s, marks=pytest.mark.slow) for s in ("train_throughput", "wmt_like", "dry_run_table")),
    *(pytest.param(s, marks=pytest.mark.long) for s in ("loss_bytes", "host_overhead", "decode_programs",
                                                        "ctranslate2_speed")),
    # an 8000-piece vocabulary (decode's model) and WMT-like text for 1000 pieces need the real corpora
    pytest.param("decode", marks=[pytest.mark.data, pytest.mark.long]),
    pytest.param("data_pipeline", marks=[pytest.mark.data, pytest.mark.long])])
def test_every_benchmark_script_runs_at_a_tiny_size(script, data_dir, tmp_path, request):
  result = tmp_path / "result.json"
  if script == "ctranslate2_speed":  # on the trained tiny run, whose config names data_dir
    tiny_run = request.getfixturevalue("tiny_run")
  if request.node.get_closest_marker("data"):
    data_dir = request.getfixturevalue("real_data_dir")
  if script == "train_throughput":
    stdout = _run_benchmark(script, ["--config=configs/tiny.py", "--vocab_size=300", "--batch=4", "--src_len=8",
                                     "--tgt_len=8", "--steps=1", "--rounds=1", "--setting=train.loss_chunk=0,3"],
                            data_dir, tmp_path)
    out = json.loads(stdout[stdout.index("{"):])
    assert out["setting"] == "train.loss_chunk" and list(out["values"]) == list(out["speed_vs_first"]) == ["0", "3"]
    assert out["speed_vs_first"]["0"] == 1.0
    for row in out["values"].values():
      assert row["shape"] == [4, 8, 8] and row["target_tokens_per_s"] > 0 and 0 < row["mfu"] < 1, row
  elif script == "wmt_like":
    _run_benchmark(script, ["--pairs=200", f"--out={tmp_path}"], data_dir, tmp_path)
    for lang in ("en", "de"):
      lines = (tmp_path / f"wmt_like.{lang}").read_text().splitlines()
      assert len(lines) == 200 and all(line.strip() for line in lines)
  elif script == "decode":
    _run_benchmark(script, ["--sentences=8", "--steps=4", "--modes=greedy", "--batch_size=8", f"--out={result}"],
                   data_dir, tmp_path)
    modes = json.loads(result.read_text())["modes"]
    assert modes["greedy"]["sentences_per_s"] > 0, modes
  elif script == "loss_bytes":
    _run_benchmark(script, ["--config=configs/tiny.py", "--shape=4,8,8", "--dtype=float32", "--loss=auto",
                            f"--out={result}"], data_dir, tmp_path)  # the step and the loss this machine runs
    (row,) = json.loads(result.read_text())["losses"].values()
    assert row["loss"]["bytes_accessed"] > 0 and row["step"]["flops"] > row["loss"]["flops"] > 0, row
    _run_benchmark(script, ["--config=configs/tiny.py", "--shape=4,8,8", "--dtype=float32", "--loss_chunk=3",
                            f"--out={result}"], data_dir, tmp_path)  # every loss, bf16 logits, the loss in chunks
    out = json.loads(result.read_text())
    assert out["one_pass_chunked"]["step"]["loss_chunk"] == 3 and out["one_pass_chunked"]["step"]["temp_bytes"] > 0
    assert set(out["chunked_ratio_to_one_pass"]["step"]) == {"bytes_accessed", "flops", "temp_bytes"}
  elif script == "host_overhead":
    _run_benchmark(script, ["--steps=30", "--log_every=10", f"--out={result}"], data_dir, tmp_path)
    row = json.loads(result.read_text())
    assert row["loop_ms_per_step"] > 0 and row["dispatch_ms_per_step"] > 0, row
  elif script == "data_pipeline":
    _run_benchmark(script, ["--pairs=3000", "--vocab_size=1000", "--skip_train_step", "--batches=5",
                            f"--data_dir={data_dir}", f"--out={result}"], data_dir, tmp_path)
    row = json.loads(result.read_text())
    assert row["text"]["pairs"] == 3000 and row["text"]["write_s"] > 0, row["text"]  # the corpus made here
    assert 2900 < row["pairs_kept"] <= 3000 and row["text_to_token_cache"]["seconds"] > 0, row["text_to_token_cache"]
    assert len(row["packed"]["batch_shapes"]) == 1 <= len(row["bucketed"]["batch_shapes"]), row["packed"]
  elif script == "decode_programs":
    _run_benchmark(script, ["--config=configs/tiny.py", "--sentences=64", f"--out={result}"], data_dir, tmp_path)
    row = json.loads(result.read_text())
    assert row["identical_hypotheses"] and row["modes"]["planned"]["programs"] <= 3, row["modes"]
  elif script == "ctranslate2_speed":
    _run_benchmark(script, [f"--workdir={tiny_run}", "--sentences=20", "--rounds=1", f"--out={result}"], data_dir,
                   tmp_path)
    row = json.loads(result.read_text())
    assert set(row["speed"]) == {"seq2seq", "ctranslate2 float32", "ctranslate2 int8"}, row["speed"]
    assert all(r["sentences_per_s"] > 0 and 0 <= r["bleu"] <= 100 for r in row["speed"].values()), row["speed"]
    assert row["parity"]["float32"]["identical_below_limit"] == 20 - row["parity"]["float32"]["reached_limit"]
    assert row["export_checks"]["int8"]["compute_type"].startswith("int8"), row["export_checks"]
  elif script == "dry_run_table":
    _run_benchmark(script, ["--configs=tiny", "--dtypes=float32", "--meshes=2,2,2", f"--out={result}"], data_dir,
                   tmp_path)
    [row] = json.loads(result.read_text())
    assert row["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2} and row["total_gib"] > 0 and row["flops_xla"] > 0, row


@pytest.mark.slow  # the next GPU session's command (docs/scaling.md) at toy sizes: 38 to 69 s in CI
def test_the_profile_and_variants_sections_table_a_cpu_trace_and_time_each_change_against_the_baseline(tmp_path):
  """device_check's profile section (profile_capture, then profile_table) on XLA:CPU: every
  thunk names its instruction, so all are attributed, and the sites of a model are there; the
  step traced is the one with the variants named (`--profile_variants`). Its variants: a config
  override reaches its child (each variant is one); each row is the packed step at the config's
  shape with its speed relative to the baseline, beside the baseline's unpacked rows; the
  combination runs only when two variants won; variants_big times the baseline and the named
  winners together on its own config."""
  from seq2seq.model import flash

  out = subprocess.run([sys.executable, "benchmarks/device_check.py", "--smoke",
                        "--sections=profile,variants,variants_big,profile_after",
                        "--profile_variants=logits_bfloat16,rows_x2", f"--profile_dir={tmp_path / 'profile'}",
                        "--variants=logits_bfloat16,flash_tiles_128",
                        "--big_variants=logits_bfloat16,adam_mu_bfloat16,norm_per_leaf",
                        f"--out={tmp_path / 'check.json'}"], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  check = json.loads((tmp_path / "check.json").read_text())
  assert (check["device_kind"], check["platform"], check["devices"]) == ("cpu", "cpu", 1)  # from the variants' rows
  profile = check["sections"]["profile"]
  assert profile["variants"] == ["logits_bfloat16", "rows_x2"] and "--shape=16x32x32" in profile["command"]
  for layout in ("packed", "unpacked"):
    assert profile[layout]["config"] == {"model.logits_dtype": "bfloat16"}
    table = profile[layout]["table"]
    assert table["attributed_fraction"] == 1.0 and table["kernel_launches_per_step"] > 0, table
    assert {"matmul", "optimizer", "loss and logits (softmax, casts)", "norm"} <= set(table["ms_per_step"]), table
    assert {"FFN", "FFN (backward)", "QKV projection", "vocabulary projection"} <= set(
        table["matmul_sites_ms_per_step"]), table
    assert (tmp_path / "profile" / layout / "train_step.hlo.txt").is_file()
  variants, big = check["sections"]["variants"], check["sections"]["variants_big"]
  assert variants.pop("seconds") > 0 and list(variants) == ["baseline", "unpacked", "logits_bfloat16",
                                                           "flash_tiles_128", "combined"]
  # A flash variant asks for the kernel, which cannot run on a CPU: its row is that error, with
  # the tiles as the child's kernel setting parsed them (--flash_blocks reached it).
  tiles = variants["flash_tiles_128"]
  assert "attention_impl='flash' cannot run here" in tiles["error"] and "speed_vs_baseline" not in tiles, tiles
  assert tiles["config"] == {"model.attention_impl": "flash"}
  spec = _device_check().VARIANTS["flash_tiles_128"].flash_blocks  # the child's canonical form, not this string
  assert tiles["flash_blocks"] == flash.Blocks.parse(spec).spec() not in (spec, flash.Blocks().spec()), tiles
  assert variants["logits_bfloat16"]["overrides"] == ["model.logits_dtype=bfloat16"]
  assert variants["logits_bfloat16"]["config"] == {"model.logits_dtype": "bfloat16"}  # as the child built it
  assert variants["combined"]["skipped"] == "fewer than two variants won"
  for row in (variants["baseline"], variants["unpacked"], variants["logits_bfloat16"], big["baseline"], big["combined"]):
    assert "error" not in row and row["shape"] == [8, 32, 32] and row["speed_vs_baseline"] > 0, row
  assert (variants["baseline"]["attention"], variants["unpacked"]["attention"]) == ("xla", "xla")  # a CPU
  assert check["summary"]["variants_packed_over_unpacked"]["baseline"] == pytest.approx(
      variants["baseline"]["target_tokens_per_s"] / variants["unpacked"]["target_tokens_per_s"])
  assert variants["baseline"]["speed_vs_baseline"] == 1.0
  assert big["combined"]["members"] == ["logits_bfloat16", "adam_mu_bfloat16", "norm_per_leaf"]
  # An undo variant's switch reached the child (--undo), as the child's module held it.
  assert big["combined"]["switches"] == {"optimizer.GROUPED_NORM": False, "transformer.DROPOUT_KEYS_AT_ONCE": False,
                                        "loss_kernel.AUTO": False, "norm_kernels.ADD_IN_KERNEL": False,
                                        "norm_kernels.PRE_ADD_IN_KERNEL": False}, big["combined"]
  assert big["combined"]["config"] == {"model.logits_dtype": "bfloat16", "train.adam_mu_dtype": "bfloat16"}
  assert set(check["summary"]["big_mfu"]) == {"baseline", "combined"}
  # the "after" profile traces the winners of this call's variants (on a CPU, likely none)
  winners = _device_check().combine(variants)[0]
  after = check["sections"]["profile_after"]
  if winners:
    assert after["variants"] == winners and after["packed"]["table"]["attributed_fraction"] == 1.0, after
  else:
    assert after["skipped"] == "no variant won" and after["variants"] == [], after


def test_profile_after_traces_the_winners_of_the_variants_that_ran_before_it(monkeypatch):
  device_check = _device_check()
  traced = []
  monkeypatch.setattr(device_check, "profile_section", lambda args, timeout, members=None: traced.append(members) or {})
  args = device_check.parse(["--smoke"])
  assert device_check.profile_after_section(args, 60)["skipped"].startswith("the variants section has not run")
  args.variants_ran = True
  assert device_check.profile_after_section(args, 60) == {"variants": [], "skipped": "no variant won"}
  args.variant_winners = ["logits_bfloat16", "rows_x2"]
  assert device_check.profile_after_section(args, 60) == {} and traced == [["logits_bfloat16", "rows_x2"]]


def test_the_undo_variants_reach_the_switches_of_their_child(monkeypatch):
  """A variant that undoes a change hands its child --undo=NAME, which turns that change's
  module switch off there and leaves every other one on; a union keeps every undo. The "apart"
  variants undo what came after them too (the step as it was then)."""
  import importlib

  device_check = _device_check()
  modules = {name: importlib.import_module(module) for name, (module, _) in device_check.UNDO.items()}
  for name, (_, switch) in device_check.UNDO.items():
    monkeypatch.setattr(modules[name], switch, True)
  for name in device_check.UNDO:
    flags = device_check.Variant(undo=(name,)).child_flags()
    assert flags == [f"--undo={name}"]
    device_check.child_variant(device_check.parse(["--section=steps", *flags])).apply()
    assert {other: getattr(modules[other], switch) for other, (_, switch) in device_check.UNDO.items()} == {
        other: other != name for other in device_check.UNDO}
  variants = device_check.VARIANTS
  later = ("norm_per_leaf", "dropout_keys_apart", "loss_in_xla", "residual_apart", "pre_add_apart")  # after the sums
  assert variants["ffn_bias_apart"].undo == variants["xla_norms"].undo == ("bias_apart", "sums_apart", *later)
  assert variants["flash_sums_apart"].undo == ("sums_apart", *later) and variants["norm_per_leaf"].undo == later
  assert variants["dropout_keys_apart"].undo == later[1:] and variants["loss_in_xla"].undo == later[2:]
  assert variants["residual_apart"].undo == later[3:] and variants["pre_add_apart"].undo == ("pre_add_apart",)
  assert variants["pre_add_apart"].overrides == variants["pre_norm"].overrides == ("model.norm_position=pre",)
  assert not variants["pre_norm"].undo and not (variants["pre_norm"].combine or variants["pre_add_apart"].combine)
  assert variants["flash_sliced"].undo == ("flash_sliced",)
  assert device_check.union(["logits_bfloat16", "dropout_keys_apart", "flash_sums_apart"]).undo == (
      *later[1:], "sums_apart", "norm_per_leaf")
  assert device_check.union(["logits_bfloat16", "no_bias"]).undo == ()
  assert variants["norm_per_leaf"].switches() == {name: True for name in later}


def test_every_variants_xla_flags_are_flags_this_xla_knows():
  """XLA parses every backend's flags on any platform and aborts at an unknown one, so a
  misspelt GPU flag in VARIANTS fails here, not in a GPU session's variant child; the
  variants' flags together, as `combined` would pass them, in the child's environment."""
  device_check = _device_check()
  flagged = [name for name, v in device_check.VARIANTS.items() if v.xla_flags]
  assert len(flagged) >= 3, flagged
  env = device_check.union(flagged).child_env()
  out = subprocess.run([sys.executable, "-c", "import jax.numpy as jnp; print(int(jnp.ones(3).sum()))"],
                       env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and out.stdout.strip() == "3", (env, out.stderr[-2000:])
  bad = subprocess.run([sys.executable, "-c", "import jax.numpy as jnp; jnp.ones(3).sum()"], capture_output=True,
                       text=True, env={**os.environ, "XLA_FLAGS": "--xla_gpu_no_such_flag=1"}, timeout=120)
  assert bad.returncode != 0 and "Unknown flag in XLA_FLAGS: --xla_gpu_no_such_flag" in bad.stderr, bad.stderr[-2000:]


def test_a_calls_children_share_one_compilation_cache_its_own_unless_one_is_set(monkeypatch, tmp_path):
  """Standalone (no JAX_COMPILATION_CACHE_DIR), the call makes a folder its children inherit
  and removes it after; one already set is used and left as it is. (The variants sections'
  smoke call: 100 s standalone before, 57 to 65 s with the shared folder, on 2 cores.)"""
  device_check = _device_check()
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  with device_check.shared_compilation_cache() as recorded:
    folder = pathlib.Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    assert folder.is_dir() and recorded == "a fresh folder for this call's children"
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['JAX_COMPILATION_CACHE_DIR'])"],
                           capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == str(folder)
  assert not folder.exists() and "JAX_COMPILATION_CACHE_DIR" not in os.environ
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
  with device_check.shared_compilation_cache() as recorded:
    assert recorded == os.environ["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path)
  assert tmp_path.is_dir() and os.environ["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path)


def test_variants_that_won_combine_the_fastest_of_each_group():
  """`combine`: variants at least MIN_GAIN faster than the baseline join, the fastest of a
  group of alternatives (two flash tilings) only, and none that changes the model however fast;
  overrides are merged in the table's order, XLA flags joined, row factors multiplied."""
  device_check = _device_check()
  V = device_check.Variant
  table = {"baseline": V(), "a": V(("model.x=1",), rows=2), "tiles_1": V(("model.impl=f",), flash_blocks="dq=64x16",
                                                                          group="tiles"),
           "tiles_2": V(("model.impl=f",), flash_blocks="dq=128x16", group="tiles"), "flag": V(xla_flags="--f=1"),
           "slow": V(xla_flags="--g=0"), "other_model": V(("model.use_bias=False",), combine=False)}
  gain = device_check.MIN_GAIN
  speeds = {"baseline": 1.0, "a": gain, "tiles_1": gain + 0.1, "tiles_2": gain + 0.05, "flag": 1.3, "slow": gain - 1e-9,
            "other_model": 1.5}
  members, together = device_check.combine({k: {"speed_vs_baseline": v} for k, v in speeds.items()}, table)
  assert members == ["a", "tiles_1", "flag"]
  assert together == V(("model.x=1", "model.impl=f"), "--f=1", 2, "dq=64x16")
  assert device_check.combine({"baseline": {"speed_vs_baseline": 1.0}, "a": {"error": "x"}}, table) == ([], V())


def _device_check():
  return benchmark("device_check")


def _profile_table():
  return benchmark("profile_table")


HLO = """HloModule jit_train_step, is_scheduled=true

FileNames
1 "seq2seq/model/layers.py"

FunctionNames
1 "train_step"
2 "FeedForward.__call__"
3 "dense"
4 "Norm.__call__"
5 "flash_attention"
6 "scale_by_adam.<locals>.update_fn"

FileLocations
1 {file_name_id=1 function_name_id=1 line=1 end_line=1 column=1 end_column=2}
2 {file_name_id=1 function_name_id=2 line=2 end_line=2 column=1 end_column=2}
3 {file_name_id=1 function_name_id=3 line=3 end_line=3 column=1 end_column=2}
4 {file_name_id=1 function_name_id=4 line=4 end_line=4 column=1 end_column=2}
5 {file_name_id=1 function_name_id=5 line=5 end_line=5 column=1 end_column=2}
6 {file_name_id=1 function_name_id=6 line=6 end_line=6 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}
3 {file_location_id=3 parent_frame_id=3}
4 {file_location_id=4 parent_frame_id=2}
5 {file_location_id=5 parent_frame_id=2}
6 {file_location_id=6 parent_frame_id=2}

%fused_norm (param_0.1: f32[8]) -> f32[8] {
  %param_0.1 = f32[8]{0} parameter(0), metadata={scheduling_name="param_0.1"}
  ROOT %multiply.1 = f32[8]{0} multiply(%param_0.1, %param_0.1), metadata={op_name="jit(train_step)/mul" stack_frame_id=4}
}

%fused_norm.1 (param_0.2: f32[8]) -> f32[8] {
  %param_0.2 = f32[8]{0} parameter(0), metadata={scheduling_name="param_0.2"}
  ROOT %multiply.2 = f32[8]{0} multiply(%param_0.2, %param_0.2), metadata={op_name="jit(train_step)/mul" stack_frame_id=4}
}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %loop_multiply_fusion = f32[8]{0} fusion(%p), kind=kLoop, calls=%fused_norm, metadata={op_name="jit(train_step)/mul" stack_frame_id=4}
  %custom-call.1 = (f32[8]{0}, s8[4]{0}) custom-call(%p, %p), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(train_step)/jvp()/dot_general" stack_frame_id=3}
  %pallas_call.2 = f32[8]{0} custom-call(%p), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(train_step)/pallas_call" stack_frame_id=5}
  %custom-call.3 = (f32[8]{0}, s8[4]{0}) custom-call(%p, %p), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(train_step)/transpose(jvp())/dot_general" stack_frame_id=3}
  %loop_multiply_fusion.1 = f32[8]{0} fusion(%p), kind=kLoop, calls=%fused_norm.1, metadata={op_name="jit(train_step)/mul" stack_frame_id=4}
  %loop_add_fusion = f32[8]{0} fusion(%p), kind=kLoop, calls=%fused_norm, metadata={op_name="jit(train_step)/add" stack_frame_id=6}
  ROOT %copy.1 = f32[8]{0} copy(%p)
}
"""


def test_profile_table_matches_command_buffer_kernels_to_their_instructions():
  """Inside a CUDA graph every kernel says `command_buffer_1`: named kernels match their fusion
  (a deduplicated kernel, named after the first fusion like it, the next such fusion), library
  kernels the next call of their library, memsets nothing; then categories and sites."""
  pt = _profile_table()
  hlo = pt.parse_hlo(HLO)
  assert [i.name for i in hlo.schedule] == ["loop_multiply_fusion", "custom-call.1", "pallas_call.2", "custom-call.3",
                                            "loop_multiply_fusion.1", "loop_add_fusion", "copy.1"]
  assert hlo.by_name["custom-call.1"].functions == ["dense", "FeedForward.__call__", "train_step"]
  kernels = ["loop_multiply_fusion", "Memset 0", "nvjet_sm90_tst_128x128", "my_flash_kernel", "nvjet_sm90_tss_64x64",
             "loop_multiply_fusion", "loop_add_fusion", "copy_1"]
  events = [{"name": k, "ts": 10.0 * n, "dur": float(n + 1), "stream": "Stream #14(Compute)",
             "args": {"hlo_module": "jit_train_step", "hlo_op": "command_buffer_1"}} for n, k in enumerate(kernels)]
  events.append({"name": "MemcpyH2D", "ts": 5.0, "dur": 3.0, "stream": "Stream #15(MemcpyH2D)", "args": {}})
  kernels_out, h2d = pt.attribute(events, hlo)
  assert [(inst.name if inst else None, category, site) for _, inst, category, site in kernels_out] == [
      ("loop_multiply_fusion", "norm", ""), (None, "memsets/copies", ""),
      ("custom-call.1", "matmul", "FFN"), ("pallas_call.2", "attention", ""),
      ("custom-call.3", "matmul", "FFN (backward)"), ("loop_multiply_fusion.1", "norm", ""),
      ("loop_add_fusion", "optimizer", ""), ("copy.1", "copy/layout", "")]
  assert h2d == 3.0
  table = pt.table(events, hlo, steps=1)
  assert table["ms_per_step"]["norm"] == (1 + 6) / 1e3 and table["matmul_sites_ms_per_step"] == {
      "FFN (backward)": 5 / 1e3, "FFN": 3 / 1e3}
  assert table["kernel_launches_per_step"] == 8 and table["attributed_fraction"] == 7 / 8
  assert table["busy_ms"] == 36 / 1e3 and table["step_ms"] == (70 + 8) / 1e3  # span: first start to last end
  assert table["ms_per_step"]["idle gaps (device)"] == (78 - 36) / 1e3


def test_flash_blocks_counts_what_the_kernels_visit(tmp_path):
  """benchmarks/flash_blocks.py at a toy size: the spans it finds are the kernels' (a block of
  two pairs meets the other side's blocks of those pairs; padding none), skipping leaves a
  fraction of the work on packed rows, and shapes whose lengths are not multiples of 16 (XLA
  attention) are named, not counted."""
  import numpy as np

  blocks = benchmark("flash_blocks")
  own = np.array([[1] * 8 + [2] * 4 + [3] * 4 + [0] * 16])  # blocks of 8: {1}, {2, 3}, {0}, {0}
  other = np.array([[1] * 12 + [2] * 10 + [3] * 6 + [0] * 4])  # blocks of 4: 1, 1, 1, 2, 2, (2, 3), 3, 0
  start, stop = blocks.spans(own, other, 8, 4)
  assert start.tolist() == [[0, 3, 8, 8]] and stop.tolist() == [[3, 7, 8, 8]]
  out = subprocess.run([sys.executable, "benchmarks/flash_blocks.py", "--pairs=3000", f"--out={tmp_path / 'b.json'}"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  record = json.loads((tmp_path / "b.json").read_text())
  assert 0.2 < record["packed"]["left"] < 0.8 and list(record["packed"]["by_shape"]) == ["[96, 256, 256]"]
  assert record["bucketed"]["by_shape"]["[624, 40, 40]"]["left"] == "no flash: lengths not multiples of 16"
