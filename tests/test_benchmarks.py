"""benchmarks/accelerator.py: the nominal-peak table and a run on this machine's CPU."""

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


def test_nominal_peak_takes_the_most_specific_device_kind():
  peak = _accelerator().nominal_peak
  assert peak("NVIDIA H100 80GB HBM3") == 989.0
  assert peak("NVIDIA H100 PCIe") == 756.0  # not the SXM figure
  assert peak("NVIDIA A100-SXM4-80GB") == 312.0
  assert peak("TPU v5 lite") == 197.0 and peak("TPU v5p") == 459.0
  assert peak("cpu") is None


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
