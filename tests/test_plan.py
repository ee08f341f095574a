"""The dry-run planner (train.py --dry_run): compiles the real train step for a mesh of
fake CPU devices and reports per-device memory and FLOPs without data."""

import json
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.long  # two dry runs, each a fresh process compiling for 8 fake devices


def dry_run(*overrides, memory_gib=None):
  args = [sys.executable, "train.py", "--config=configs/tiny.py", "--workdir=/nonexistent/never/written", "--dry_run",
          "--peak_tflops=100", *overrides]
  if memory_gib is not None:
    args.append(f"--device_memory_gib={memory_gib}")
  out = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
  lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
  return out, (json.loads(lines[-1]) if lines else None)


def test_fsdp_cuts_parameter_and_optimizer_bytes_per_device_8x_and_a_run_that_does_not_fit_is_refused():
  data, data_plan = dry_run("--config.mesh.data=8", memory_gib=0.001)
  assert data.returncode != 0 and "does not fit" in data.stderr and "--config.mesh.fsdp" in data.stderr
  fsdp, fsdp_plan = dry_run("--config.mesh.data=1", "--config.mesh.fsdp=8", memory_gib=1)
  assert fsdp.returncode == 0, fsdp.stderr[-2000:]
  assert "fits in 1 GiB per device" in fsdp.stdout
  assert data_plan["devices"] == fsdp_plan["devices"] == 8
  assert data_plan["param_bytes"] == 4 * data_plan["params"]  # f32, every device holds all of them
  # fsdp splits every parameter with an embed dimension (64 here) 8 ways; the query/value and
  # feed-forward biases have none and stay whole: 1% of the tiny model's parameters.
  assert 7.5 < data_plan["param_bytes"] / fsdp_plan["param_bytes"] < 8
  assert 7.5 < data_plan["opt_state_bytes"] / fsdp_plan["opt_state_bytes"] < 8
  # The model formula counts matmuls only; XLA also counts softmax, norms and the optimizer.
  for plan in (data_plan, fsdp_plan):
    assert plan["flops_model"] <= plan["flops_xla"] < 1.15 * plan["flops_model"]
    assert plan["batch_shapes"] == [[16, 64, 64]] and plan["compiled_shape"] == [16, 64, 64]


def test_the_loss_in_chunks_plans_less_memory_and_the_same_flops():
  """train.loss_chunk: the per-device temporaries fall (by how much depends on what else is
  live at the peak: on the tiny model less than its logits, on wmt14_base's step more than
  twice theirs, docs/scaling.md), and XLA's FLOPs (from the chunk loop unrolled: XLA counts a
  loop's body once) stay within 1% of the unchunked step's."""
  (whole, whole_plan), (chunked, chunked_plan) = (dry_run("--config.mesh.data=8", f"--config.train.loss_chunk={c}")
                                                  for c in (0, 8))
  assert whole.returncode == chunked.returncode == 0, chunked.stderr[-2000:]
  assert chunked_plan["temp_bytes"] < whole_plan["temp_bytes"]
  # a little more: each chunk adds its part to the running weight gradient ([v, d] adds)
  assert whole_plan["flops_xla"] < chunked_plan["flops_xla"] < 1.01 * whole_plan["flops_xla"]
