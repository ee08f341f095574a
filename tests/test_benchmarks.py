"""benchmarks/accelerator.py and device_check.py on this machine's CPU; the nominal-peak table."""

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import REPO


def _accelerator():
  spec = importlib.util.spec_from_file_location("accelerator", REPO / "benchmarks" / "accelerator.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


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


@pytest.mark.slow
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


@pytest.mark.long  # every section of the GPU check, at toy sizes on the CPU (2 minutes)
def test_device_check_smoke_writes_every_section(tmp_path):
  out = subprocess.run([sys.executable, "benchmarks/device_check.py", "--smoke", f"--out={tmp_path / 'check.json'}",
                        f"--flax_models={tmp_path / 'missing.py'}"], cwd=REPO, capture_output=True, text=True,
                       timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads((tmp_path / "check.json").read_text())
  assert result["smoke"] and result["device_kind"] == "cpu" and result["shape"] == [8, 32, 32]
  assert {"jax", "jaxlib", "flax", "torch"} <= set(result["versions"]) and result["versions"]["jax"]
  sections = result["sections"]
  assert list(sections) == ["flash", "steps_bfloat16", "decode", "peers", "train", "steps_float32"]
  assert all("interpret mode" in row["error"] for row in sections["flash"]["checks"])  # the kernel needs a GPU
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
  import importlib.util

  spec = importlib.util.spec_from_file_location("save_time", REPO / "benchmarks" / "save_time.py")
  save_time = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(save_time)
  monkeypatch.chdir(tmp_path)
  row = save_time.measure("tiny", repeats=1)
  # float32 parameters and Adam's two moments, plus four scalars (step, lr scale, Adam's count; float32/int32)
  assert row["state_bytes"] == 12 * row["parameters"] + 16
  assert 0 < row["blocking_s"] <= row["complete_s"] and row["stop_s"] > 0
  assert list(tmp_path.iterdir()) == []  # its temporary workdir is gone
