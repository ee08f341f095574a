"""Where a GPU step's time goes, without a GPU: the optimized HLO's kernels, their bytes and
FLOPs (benchmarks/profile_table.py's static table), the cost model fitted to a measured
profile, and benchmarks/gpu_compile.py, which compiles the train step for an H100 or H200 on
this CPU. The compile needs XLA's GPU compiler (jax-cuda12-plugin and jax-cuda12-pjrt, no
CUDA libraries); CI installs it into a folder of its own and names it in
SEQ2SEQ_GPU_COMPILER (.ci/run)."""

import collections
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from conftest import REPO, benchmark

FUNCTIONS = ["train_step", "MultiHeadAttention.project_qkv", "dense", "Norm.__call__", "fused_flash_attention",
             "scale_by_adam.<locals>.update_fn", "_chunk_loop.<locals>.project"]
# Frame k is function k (1-based), called from train_step (frame 1); dense (3) from project_qkv (2).
# A frame's parent_frame_id is its parent's id plus one (profile_table.parse_hlo).
PARENTS = {1: 1, 2: 2, 3: 3, 4: 2, 5: 2, 6: 2, 7: 2}
STACKS = "\n".join(f"{k} {{file_location_id={k} parent_frame_id={p}}}" for k, p in PARENTS.items())
HLO = f"""HloModule jit_train_step, is_scheduled=true

FileNames
1 "seq2seq/model/multihead.py"

FunctionNames
{chr(10).join(f'{k} "{f}"' for k, f in enumerate(FUNCTIONS, 1))}

FileLocations
{chr(10).join(f"{k} {{file_name_id=1 function_name_id={k} line=1 end_line=1 column=1 end_column=2}}"
              for k in range(1, 8))}

StackFrames
{STACKS}

%fused_slice (param_0: bf16[4,8,3,16]) -> bf16[32,1,16] {{
  %param_0 = bf16[4,8,3,16]{{3,2,1,0}} parameter(0)
  %bitcast.1 = bf16[32,3,16]{{2,1,0}} bitcast(%param_0)
  ROOT %slice.1 = bf16[32,1,16]{{2,1,0}} slice(%bitcast.1), slice={{[0:32], [1:2], [0:16]}}
}}

%fused_dus (param_0.1: f32[64,16], param_1.1: f32[8,16], param_2.1: s32[]) -> f32[64,16] {{
  %param_0.1 = f32[64,16]{{1,0}} parameter(0)
  %param_1.1 = f32[8,16]{{1,0}} parameter(1)
  %param_2.1 = s32[] parameter(2)
  %constant.1 = s32[] constant(0)
  ROOT %dynamic-update-slice.1 = f32[64,16]{{1,0}} dynamic-update-slice(%param_0.1, %param_1.1, %param_2.1, %constant.1)
}}

%gemm_fusion_dot.1_computation (parameter_0: bf16[32,16], parameter_1: bf16[16,48]) -> bf16[32,48] {{
  %parameter_0 = bf16[32,16]{{1,0}} parameter(0)
  %parameter_1 = bf16[16,48]{{1,0}} parameter(1)
  ROOT %dot.1 = bf16[32,48]{{1,0}} dot(%parameter_0, %parameter_1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}

%fused_norm (param_0.3: f32[8]) -> (f32[8], f32[]) {{
  %param_0.3 = f32[8]{{0}} parameter(0)
  %constant.3 = f32[] constant(0)
  %multiply.3 = f32[8]{{0}} multiply(%param_0.3, %param_0.3)
  %reduce.3 = f32[] reduce(%multiply.3, %constant.3), dimensions={{0}}
  ROOT %tuple.3 = (f32[8]{{0}}, f32[]) tuple(%multiply.3, %reduce.3)
}}

%body (p.4: (s32[], f32[8])) -> (s32[], f32[8]) {{
  %p.4 = (s32[], f32[8]{{0}}) parameter(0)
  %gte.4 = s32[] get-tuple-element(%p.4), index=0
  %gte.5 = f32[8]{{0}} get-tuple-element(%p.4), index=1
  %loop_multiply_fusion = (f32[8]{{0}}, f32[]) fusion(%gte.5), kind=kLoop, calls=%fused_norm, metadata={{op_name="jit(train_step)/mul" stack_frame_id=4}}
  %gte.6 = f32[8]{{0}} get-tuple-element(%loop_multiply_fusion), index=0
  ROOT %tuple.4 = (s32[], f32[8]{{0}}) tuple(%gte.4, %gte.6)
}}

%cond (p.5: (s32[], f32[8])) -> pred[] {{
  %p.5 = (s32[], f32[8]{{0}}) parameter(0)
  ROOT %constant.5 = pred[] constant(true)
}}

ENTRY %main (qkv: bf16[4,8,3,16], w: bf16[16,48], x: bf16[32,16], acc: f32[64,16], up: f32[8,16], i: s32[], v: f32[8]) -> f32[8] {{
  %qkv = bf16[4,8,3,16]{{3,2,1,0}} parameter(0)
  %w = bf16[16,48]{{1,0}} parameter(1)
  %x = bf16[32,16]{{1,0}} parameter(2)
  %acc = f32[64,16]{{1,0}} parameter(3)
  %up = f32[8,16]{{1,0}} parameter(4)
  %i = s32[] parameter(5)
  %v = f32[8]{{0}} parameter(6)
  %loop_slice_fusion = bf16[32,1,16]{{2,1,0}} fusion(%qkv), kind=kLoop, calls=%fused_slice, metadata={{op_name="jit(train_step)/jvp()/slice" stack_frame_id=2}}
  %gemm_fusion_dot.1 = bf16[32,48]{{1,0}} fusion(%x, %w), kind=kCustom, calls=%gemm_fusion_dot.1_computation, metadata={{op_name="jit(train_step)/transpose(jvp())/dot_general" stack_frame_id=3}}
  %custom-call.2 = (bf16[32,48]{{1,0}}, s8[16]{{0}}) custom-call(%x, %w), custom_call_target="__cublas$lt$matmul", metadata={{op_name="jit(train_step)/jvp()/dot_general" stack_frame_id=7}}, backend_config={{"gemm_backend_config":{{"dot_dimension_numbers":{{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}}}}
  %pallas_call.3 = bf16[4,8,1,16]{{3,2,1,0}} custom-call(%qkv, %qkv), custom_call_target="__gpu$xla.gpu.triton", metadata={{op_name="jit(train_step)/pallas_call" stack_frame_id=5}}
  %fusion.4 = f32[64,16]{{1,0}} fusion(%acc, %up, %i), kind=kLoop, calls=%fused_dus, metadata={{op_name="jit(train_step)/dynamic_update_slice" stack_frame_id=6}}
  %tuple.0 = (s32[], f32[8]{{0}}) tuple(%i, %v)
  %while.1 = (s32[], f32[8]{{0}}) while(%tuple.0), condition=%cond, body=%body, backend_config={{"known_trip_count":{{"n":"4"}}}}
  ROOT %gte.9 = f32[8]{{0}} get-tuple-element(%while.1), index=1
}}
"""


def _pt():
  return benchmark("profile_table")


def test_kernel_costs_count_what_each_kernel_moves_and_multiplies():
  """A fusion reads only the slice it takes of an operand (seen through a bitcast), writes only
  the update of an in-place dynamic-update-slice; a matmul's FLOPs are 2 M N K, from a fused dot
  or a cuBLAS call's backend config; a loop's body runs its trip count of times; a Pallas call is
  a library kernel (its operands, a fused array read in part, say little)."""
  costs = {k.name: k for k in _pt().kernel_costs(HLO)}
  assert list(costs) == ["loop_slice_fusion", "gemm_fusion_dot.1", "custom-call.2", "pallas_call.3", "fusion.4",
                         "loop_multiply_fusion"]
  row = lambda k: (k.category, k.site, k.bytes, k.flops, k.launches, k.library)
  assert row(costs["loop_slice_fusion"]) == ("attention elementwise (biases, layout)", "", 2 * 1024, 0, 1, False)
  assert row(costs["gemm_fusion_dot.1"]) == ("matmul", "QKV projection (backward)", 1024 + 1536 + 3072,
                                             2 * 32 * 16 * 48, 1, False)
  assert row(costs["custom-call.2"]) == ("matmul", "vocabulary projection", 1024 + 1536 + 3072 + 16,
                                         2 * 32 * 16 * 48, 1, False)
  assert row(costs["pallas_call.3"]) == ("attention", "", 2 * 3072 + 1024, 0, 1, True)
  assert row(costs["fusion.4"]) == ("optimizer", "", 0 + 512 + 4 + 512, 0, 1, False)
  assert row(costs["loop_multiply_fusion"]) == ("norm", "", 32 + 32 + 4, 0, 4, False)


def _synthetic(bandwidth: float, launch_us: float, matmul_flops: float):
  """Kernels of known categories and the ms a device of these rates would take on them."""
  pt = _pt()
  kernels = [("norm", 4e9, 100), ("dropout", 1e9, 50), ("optimizer", 0.5e9, 300), ("residual adds", 2e9, 30),
             ("attention", 1e9, 10)]
  costs = [pt.KernelCost(f"k{n}", c, "", b / launches, 0.0, launches) for n, (c, b, launches) in enumerate(kernels)]
  costs += [pt.KernelCost("mm", "matmul", "FFN", 1e6, 1e12, 1), pt.KernelCost("flash", "attention", "", 5e8, 0.0, 3,
                                                                               library=True)]
  measured = {c: b / bandwidth * 1e3 + launches * launch_us / 1e3 for c, b, launches in kernels}
  measured["matmul"] = 1e12 / matmul_flops * 1e3
  measured["attention"] += 4.0  # the flash kernels' own time
  return costs, measured


def test_the_fit_recovers_the_rates_of_a_device_and_predicts_the_step():
  """Measured times made by known rates: the fit gives those rates back, every category's
  prediction (left out of the fit too) is its measured time, the library kernels take what the
  measured attention leaves, and twice the attention FLOPs twice their time."""
  pt = _pt()
  costs, measured = _synthetic(bandwidth=2e12, launch_us=3.0, matmul_flops=5e14)
  model, check = pt.fit(costs, measured, library_tflop=0.7)
  assert model.bandwidth == pytest.approx(2e12, rel=1e-9) and model.launch_us == pytest.approx(3.0, rel=1e-9)
  assert model.matmul_flops == pytest.approx(5e14, rel=1e-12) and model.library_tflop == 0.7
  assert model.library_ms == {"attention": pytest.approx(4.0, rel=1e-9)}
  assert set(check) == {"norm", "dropout", "optimizer", "residual adds"}
  for row in check.values():
    assert row["predicted_ms"] == pytest.approx(row["measured_ms"], abs=1e-4)
    assert row["predicted_ms_left_out"] == pytest.approx(row["measured_ms"], abs=1e-4)
  table = pt.static_table(costs, model)
  assert table["ms_per_step"] == pytest.approx(sum(measured.values()), abs=1e-3)
  assert {c: r["ms"] for c, r in table["by_category"].items()} == pytest.approx(measured, abs=1e-4)
  assert table["kernel_launches_per_step"] == 100 + 50 + 300 + 30 + 10 + 1 + 3
  doubled = pt.static_table(costs, model, library_tflop=1.4)  # the same kernels: only the library's time scales
  assert doubled["by_category"]["attention"]["ms"] == pytest.approx(measured["attention"] + 4.0, abs=1e-4)
  assert pt.CostModel.from_json(json.loads(json.dumps(model.to_json()))).to_json() == model.to_json()


def test_a_fit_with_too_few_categories_says_so():
  pt = _pt()
  costs, measured = _synthetic(bandwidth=2e12, launch_us=3.0, matmul_flops=5e14)
  with pytest.raises(ValueError, match="at least 3 memory-bound categories"):
    pt.fit(costs, {"norm": measured["norm"], "dropout": measured["dropout"]}, library_tflop=0.7)


def _compiler() -> str:
  """The folder holding XLA's GPU compiler (SEQ2SEQ_GPU_COMPILER), or "" if it is not installed."""
  folder = os.environ.get("SEQ2SEQ_GPU_COMPILER", "")
  return folder if folder and (pathlib.Path(folder) / "jax_plugins").is_dir() else ""


def _gpu_compile(*args, compiler: str = "", timeout: float = 600):
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
  if compiler:
    env["PYTHONPATH"] = compiler
  return subprocess.run([sys.executable, "benchmarks/gpu_compile.py", *args], cwd=REPO, capture_output=True,
                        text=True, env=env, timeout=timeout)


def test_gpu_compile_without_the_compiler_says_what_to_install():
  import importlib.util

  if importlib.util.find_spec("jax_plugins") is not None:
    pytest.skip("a GPU plugin is installed in this environment")
  out = _gpu_compile("--config=configs/tiny.py", "--shape=8x32x32")
  assert out.returncode == 2, out.stderr[-2000:]
  assert out.stderr.strip().splitlines()[-1].startswith(
      "error: compiling for a GPU needs jax-cuda12-plugin and jax-cuda12-pjrt"), out.stderr[-2000:]


@pytest.mark.parametrize("args, match", [
    (["--variants=nope"], "unknown nope"), (["--variants=logits_bfloat16", "--measured=README.md"], "must start with"),
    (["--measured=no/such.json"], "no file no/such.json"), (["--before_hlo=no/such.txt"], "no file no/such.txt"),
    (["--target=a100"], "invalid choice: 'a100'"),
    (["--config=nope"], "no such file, and no shipped config has that name")])
def test_gpu_compile_refuses_bad_flags_in_one_line(args, match):
  out = _gpu_compile(*args)
  assert out.returncode == 2 and match in out.stderr.strip().splitlines()[-1], out.stderr[-2000:]


@pytest.mark.slow
def test_the_train_step_compiles_for_an_h100_on_this_cpu(tmp_path):
  """tiny in bf16 with packed rows, compiled for an H100 by XLA's GPU pipeline on this CPU: the
  flash kernel is chosen and lowered through Triton (three Pallas calls per attention layer),
  reading the fused projections in place, and so are the norm kernels (one call each way per
  norm); the step's matmul FLOPs are the model formula's but for the attention scores (inside
  the kernels); the table names every kernel's category; the FFN's bias is added in its matmul."""
  compiler = _compiler()
  if not compiler:
    pytest.skip("XLA's GPU compiler is not installed (SEQ2SEQ_GPU_COMPILER; .ci/run installs it)")
  from seq2seq.configs import tiny
  from seq2seq.model import flops
  from seq2seq.model.config import ModelConfig

  out = _gpu_compile("--target=h100", "--config=configs/tiny.py", "--shape=8x32x32", f"--hlo_dir={tmp_path}",
                     "--set=data.vocab_size=1024",
                     "--variants=baseline,flash_sliced,xla_norms,ffn_bias_apart,flash_sums_apart,norm_per_leaf,loss_in_xla,"
                     "residual_apart,pre_add_apart",
                     f"--out={tmp_path / 'r.json'}",
                     compiler=compiler)
  assert out.returncode == 0, out.stderr[-3000:]
  record = json.loads((tmp_path / "r.json").read_text())
  row = record["variants"]["baseline"]
  assert row["device_kind"] == "NVIDIA H100 80GB HBM3" and row["attention"] == "flash" and row["shape"] == [8, 32, 32]
  hlo = (tmp_path / "baseline.hlo.txt").read_text()
  cfg = tiny.get_config()
  layers = cfg.model.num_encoder_layers + 2 * cfg.model.num_decoder_layers  # self, and cross in the decoder
  calls = [line for line in hlo.splitlines() if 'custom_call_target="__gpu$xla.gpu.triton"' in line]
  for kernel in ("seq2seq_flash_forward", "seq2seq_flash_dkdv", "seq2seq_flash_dq"):
    assert sum(f"({kernel})" in line for line in calls) == layers, kernel  # jvp(NAME) or transpose(jvp(NAME))
  norms = 2 * cfg.model.num_encoder_layers + 3 * cfg.model.num_decoder_layers + 2  # pre-norm: a final norm each
  for kernel in ("seq2seq_norm_fwd", "seq2seq_norm_bwd"):
    assert sum(f"({kernel})" in line for line in calls) == norms, kernel
  assert sum("/seq2seq_loss_fwd_bwd/" in line for line in calls) == 1  # the loss's statistics and gradient
  assert len(calls) == 3 * layers + 2 * norms + 1
  # pre-norm: each block's norm backward also takes the residual path's gradient of x (with_input):
  # x, dy, that, scale, mean, rstd, where x is the embeddings (a stack's first norm) or the sum the
  # forward kernel wrote (the block before's add, made by this norm); the two final norms make the
  # last block's add as a post-norm's do: residual, branch, its bias, dy, scale, mean, rstd
  operands = lambda text, kernel: sorted(len(re.search(r"custom-call\(([^)]*)\)", line).group(1).split(","))
                                         for line in text.splitlines()
                                         if 'custom_call_target="__gpu$xla.gpu.triton"' in line and f"({kernel})" in line)
  assert operands(hlo, "seq2seq_norm_bwd") == [6] * (norms - 2) + [7] * 2
  # forward: x (or residual, branch and its bias), scale, bias; a block norm that makes the add also
  # writes the sum (y, the sum, mean, rstd)
  assert operands(hlo, "seq2seq_norm_fwd") == [3] * 2 + [5] * (norms - 2)
  assert sum(re.search(r"= \((\S+, ){3}\S+\) custom-call", line) is not None
             for line in calls if "(seq2seq_norm_fwd)" in line) == norms - 4
  costs = _pt().kernel_costs(hlo)
  model_cfg = ModelConfig.from_config(cfg.model, vocab_size=1024)  # 1000 would be padded to 1024 in a GEMM
  n_h, (b, s, t) = model_cfg.num_heads * model_cfg.head_size, (8, 32, 32)
  scores = 3 * 2 * 2 * b * n_h * (cfg.model.num_encoder_layers * s * s + cfg.model.num_decoder_layers * (t * t + t * s))
  assert sum(k.flops * k.launches for k in costs) == flops.train_step_flops(model_cfg, b, s, t) - scores
  assert 3 * flops.attention_flops(model_cfg, b, s, t) == scores  # what the attention kernels' time scales with
  assert row["attention_tflop"] == round(scores / 1e12, 6)
  assert row["model_tflop"] == round(flops.train_step_flops(model_cfg, b, s, t) / 1e12, 6)
  assert sum(k.library for k in costs) == 3 * layers and all(k.category == "attention" for k in costs if k.library)
  assert "unattributed" not in row["table"]["by_category"] and row["table"]["kernel_launches_per_step"] == len(costs)
  assert record["settings"] == ["data.vocab_size=1024"] and row["config"] == {"data.vocab_size": 1024}
  # The kernels read the fused projections in place: no slices of q, k, v before them, no bias
  # passes, no concatenation of their gradients after; with them sliced (as before), all three.
  sliced = record["variants"]["flash_sliced"]
  assert sliced["attention"] == "flash" and sliced["flash_sliced"] and "flash_sliced" not in row
  layout = "attention elementwise (biases, layout)"
  ours, theirs = row["table"]["by_category"][layout], sliced["table"]["by_category"][layout]
  assert ours["launches"] < theirs["launches"] and ours["gb"] < theirs["gb"], (ours, theirs)
  assert row["table"]["gb_per_step"] < sliced["table"]["gb_per_step"]
  assert row["table"]["matmul_tflop_per_step"] == sliced["table"]["matmul_tflop_per_step"]
  # The norms in XLA's fusions (as before the kernels): more kernels and bytes, the same matmuls.
  xla = record["variants"]["xla_norms"]
  assert xla["config"] == {"data.vocab_size": 1024, "model.norm_impl": "xla"}
  ours, theirs = row["table"]["by_category"]["norm"], xla["table"]["by_category"]["norm"]
  assert ours["launches"] < theirs["launches"] and ours["gb"] < theirs["gb"], (ours, theirs)
  assert not any("seq2seq_norm" in line for line in (tmp_path / "xla_norms.hlo.txt").read_text().splitlines()
                 if "custom_call_target" in line)
  assert row["table"]["matmul_tflop_per_step"] == xla["table"]["matmul_tflop_per_step"]
  # The FFN's first bias is added in its matmul (layers.dense_bias): apart, as before, each
  # feed-forward layer adds it in a kernel of its own, a pass over [tokens, d_ff] (against the step
  # after it, flash_sums_apart, which has the later changes undone too).
  apart = record["variants"]["ffn_bias_apart"]
  assert apart["bias_apart"] and "bias_apart" not in row and xla["bias_apart"]
  ffn, ffns = "FFN elementwise (bias, activation)", cfg.model.num_encoder_layers + cfg.model.num_decoder_layers
  ours = record["variants"]["flash_sums_apart"]["table"]["by_category"][ffn]
  theirs = apart["table"]["by_category"][ffn]
  assert theirs["launches"] - ours["launches"] == ffns and ours["gb"] < theirs["gb"], (ours, theirs)
  assert row["table"]["matmul_tflop_per_step"] == apart["table"]["matmul_tflop_per_step"]
  # ... and its backward takes the gradient in bf16: every matmul of the step multiplies bf16
  # operands (JAX's own backward of the f32 sum would multiply f32 ones).
  kinds = collections.Counter()
  for computation in re.split(r"\n(?=%|ENTRY)", hlo):
    dtypes = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", computation))
    for _, lhs, rhs in re.findall(r"= (\w+)\[[^\]]*\]\S* dot\(%([\w.\-]+), %([\w.\-]+)\)", computation):
      kinds[(dtypes[lhs], dtypes[rhs])] += 1
  assert set(kinds) == {("bf16", "bf16")}, kinds
  # The flash backward's delta = rowsum(dO * O) and its biases' gradient sums are the kernels' own
  # (flash.SUMS_IN_KERNELS): the attention line is the three kernels a layer; in XLA (as before),
  # three passes more a layer, over dO and O, dq and dv.
  sums = record["variants"]["flash_sums_apart"]
  assert sums["sums_apart"] and "sums_apart" not in row and xla["sums_apart"] and apart["sums_apart"]
  assert row["table"]["by_category"]["attention"]["launches"] == 3 * layers
  assert sums["table"]["by_category"]["attention"]["launches"] == 6 * layers
  per_leaf = record["variants"]["norm_per_leaf"]["table"]
  assert per_leaf["kernel_launches_per_step"] == sums["table"]["kernel_launches_per_step"] - 3 * layers
  # ffn_bias_apart is the step before both (the FFN's bias and the sums apart), and before the next two
  assert per_leaf["kernel_launches_per_step"] == apart["table"]["kernel_launches_per_step"] - ffns - 3 * layers
  assert row["table"]["matmul_tflop_per_step"] == sums["table"]["matmul_tflop_per_step"]
  # The gradient's norm summed by groups (optimizer.global_norm) changes the optimizer's kernels
  # alone: fewer (tiny has no dropout, so the dropout keys, also apart there, change nothing).
  loss_xla, resid = record["variants"]["loss_in_xla"], record["variants"]["residual_apart"]
  assert _launches_apart_from(per_leaf, loss_xla["table"]) == "optimizer"
  # The loss's statistics and gradient in one kernel (seq2seq/training/loss_kernel.py), against the
  # step after it (residual_apart): the step reads the f32 logits once less, in fewer kernels, with
  # the same matmul FLOPs; only the loss's line and the matmuls' change (at this size XLA splits the
  # projection's backward matmuls over their long dimension, and the sums of the parts join the
  # loss's cotangent scale or stay apart).
  assert loss_xla["loss_in_xla"] and "loss_in_xla" not in row and "loss_in_xla" not in resid
  assert not any("seq2seq_loss" in line for line in (tmp_path / "loss_in_xla.hlo.txt").read_text().splitlines()
                 if "custom_call_target" in line)
  moved = {n: sum(k.bytes * k.launches for k in _pt().kernel_costs((tmp_path / f"{n}.hlo.txt").read_text()))
           for n in ("baseline", "loss_in_xla", "residual_apart", "pre_add_apart")}
  assert moved["loss_in_xla"] - moved["residual_apart"] >= b * t * model_cfg.vocab_size * 4  # a read of the f32 logits
  launches = lambda table: {c: v["launches"] for c, v in table["by_category"].items()}
  ours, theirs = launches(resid["table"]), launches(loss_xla["table"])
  assert sum(ours.values()) < sum(theirs.values()) and set(ours) == set(theirs)
  assert {c for c in ours if ours[c] != theirs[c]} <= {"loss and logits (softmax, casts)", "matmul", "optimizer"}, (
      ours, theirs)
  assert resid["table"]["matmul_tflop_per_step"] == loss_xla["table"]["matmul_tflop_per_step"]
  # residual_apart undoes norm_kernels.ADD_IN_KERNEL (and the change after it): each norm backward's
  # partial sums (the scale's and the bias's) come in one array, whose slices XLA's optimizer kernels
  # take in fewer kernels
  pre_apart = record["variants"]["pre_add_apart"]
  assert resid["residual_apart"] and resid["pre_add_apart"] and "residual_apart" not in pre_apart
  assert launches(pre_apart["table"])["optimizer"] < launches(resid["table"])["optimizer"]
  # A pre-norm's residual adds in the next norm's kernels (norm_kernels.PRE_ADD_IN_KERNEL): a kernel a
  # block fewer in the residual adds' line (none left) and fewer in the attention and FFN lines
  # (the bias's gradient and the dropout), less moved, the same matmul FLOPs; apart, every norm
  # takes x alone, as before
  blocks = 2 * cfg.model.num_encoder_layers + 3 * cfg.model.num_decoder_layers
  ours, theirs = launches(row["table"]), launches(pre_apart["table"])
  assert "residual adds" not in ours and theirs["residual adds"] == blocks and pre_apart["pre_add_apart"]
  assert ours[layout] < theirs[layout] and ours[ffn] < theirs[ffn] and moved["baseline"] < moved["pre_add_apart"]
  assert row["table"]["matmul_tflop_per_step"] == pre_apart["table"]["matmul_tflop_per_step"]
  apart_hlo = (tmp_path / "pre_add_apart.hlo.txt").read_text()
  assert operands(apart_hlo, "seq2seq_norm_fwd") == [3] * norms
  assert operands(apart_hlo, "seq2seq_norm_bwd") == [5] * 2 + [6] * (norms - 2)


def _launches_apart_from(before: dict, after: dict) -> str:
  """The one category whose kernels a change made fewer, every other category's as before."""
  launches = lambda table: {c: v["launches"] for c, v in table["by_category"].items()}
  before, after = launches(before), launches(after)
  (changed,) = [c for c in before if before[c] != after.get(c)]
  assert after[changed] < before[changed] and set(before) == set(after), (before, after)
  return changed


@pytest.mark.slow  # two compiles of wmt14_base's 12 layers, ~85 s
def test_the_dropout_keys_derived_at_once_take_a_kernel_a_depth_not_one_a_fold(tmp_path):
  """wmt14_base (dropout 0.1) at a small shape, compiled for an H100: each fold_in of the dropout
  keys, apart, is a kernel of its own; derived at once (dropout.DropoutKeys) they are a few
  batched kernels, and no line of the step has more kernels. (At tiny's widths XLA fuses most
  folds into their consumers instead, so tiny shows neither.)"""
  compiler = _compiler()
  if not compiler:
    pytest.skip("XLA's GPU compiler is not installed (SEQ2SEQ_GPU_COMPILER; .ci/run installs it)")
  out = _gpu_compile("--target=h100", "--config=configs/wmt14_base.py", "--shape=4x64x64", f"--hlo_dir={tmp_path}",
                     "--set=data.vocab_size=1024", "--variants=loss_in_xla,dropout_keys_apart",
                     f"--out={tmp_path / 'r.json'}", compiler=compiler)
  assert out.returncode == 0, out.stderr[-3000:]
  variants = json.loads((tmp_path / "r.json").read_text())["variants"]
  # loss_in_xla: the step right after the keys came at once (the changes since undone by both)
  assert variants["dropout_keys_apart"]["dropout_keys_apart"] and "dropout_keys_apart" not in variants["loss_in_xla"]

  def folds(name):  # the step's kernels that compute fold_in
    entry = (tmp_path / f"{name}.hlo.txt").read_text().split("\nENTRY", 1)[1]
    return sum(" fusion(" in line and "threefry_fold_in" in line for line in entry.splitlines())

  assert folds("loss_in_xla") <= 5 and folds("dropout_keys_apart") >= 60
  launches = {n: {c: v["launches"] for c, v in row["table"]["by_category"].items()} for n, row in variants.items()}
  apart, at_once = launches["dropout_keys_apart"], launches["loss_in_xla"]
  assert set(apart) == set(at_once) and all(at_once[c] <= apart[c] for c in apart), (apart, at_once)
  assert apart["dropout"] - at_once["dropout"] >= 55


@pytest.mark.slow
def test_a_post_norm_step_compiled_for_an_h100_adds_each_norms_two_gradients_in_its_kernel(tmp_path):
  """tiny made post-norm, compiled for an H100: every norm's backward kernel takes the gradients
  of both copies of its output (transformer.Fork) as operands of its own, so that no XLA kernel
  adds them first, and makes the block's residual add itself (Norm.add): residual, the sublayer's
  output and its bias, the dropout's key words, dy twice, scale, mean and rstd; no XLA kernel of
  the residual adds' line is left."""
  compiler = _compiler()
  if not compiler:
    pytest.skip("XLA's GPU compiler is not installed (SEQ2SEQ_GPU_COMPILER; .ci/run installs it)")
  from seq2seq.configs import tiny

  out = _gpu_compile("--target=h100", "--config=configs/tiny.py", "--shape=8x32x32", f"--hlo_dir={tmp_path}",
                     "--set=data.vocab_size=1024", "--set=model.norm_position=post", "--variants=baseline",
                     f"--out={tmp_path / 'r.json'}", compiler=compiler)
  assert out.returncode == 0, out.stderr[-3000:]
  hlo = (tmp_path / "baseline.hlo.txt").read_text()
  calls = [line for line in hlo.splitlines()
           if 'custom_call_target="__gpu$xla.gpu.triton"' in line and "(seq2seq_norm_bwd)" in line]
  cfg = tiny.get_config().model
  assert len(calls) == 2 * cfg.num_encoder_layers + 3 * cfg.num_decoder_layers  # post-norm: no final norms
  operands = 2 + cfg.use_bias + (cfg.dropout_rate > 0) + 2 + 3
  assert all(len(re.search(r"custom-call\(([^)]*)\)", line).group(1).split(",")) == operands for line in calls)
  assert "residual adds" not in json.loads((tmp_path / "r.json").read_text())["variants"]["baseline"]["table"][
      "by_category"]


def test_a_step_without_cudnns_call_says_its_attention_is_xla():
  """Tracing cuDNN attention needs a GPU's cuDNN: where the model chose it but the compiled
  step holds no cuDNN call (a compile-only target), the record says XLA attention ran."""
  gpu_compile = benchmark("gpu_compile")
  call = '%custom-call.7 = bf16[8,32,4,16] custom-call(%q), custom_call_target="__cudnn$fmhaSoftmax"'
  assert gpu_compile.compiled_attention("cudnn", call) == "cudnn"
  assert gpu_compile.compiled_attention("cudnn", HLO) == "xla (cuDNN attention needs a GPU to trace)"
  assert gpu_compile.compiled_attention("flash", HLO) == "flash"


KERNELS_AT_ODD_LENGTHS = """
import sys
sys.path.insert(0, "benchmarks")
import jax, jax.numpy as jnp
import gpu_compile
from seq2seq.model import flash, norm_kernels
device = gpu_compile.compile_only_devices(gpu_compile.TARGETS["h100"])[0]
placed = jax.sharding.make_single_device_sharding(device)
spec = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype, sharding=placed)
with jax.default_device(device):
  for t, s, causal in ((48, 80, False), (80, 48, True), (112, 112, True)):
    loss = lambda q, k, v, qs, ks: jnp.sum(flash.flash_attention(q, k, v, qs, ks, causal=causal).astype(jnp.float32))
    hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(
        spec(2, t, 8, 64), spec(2, s, 8, 64), spec(2, s, 8, 64), spec(2, t, dtype=jnp.int32),
        spec(2, s, dtype=jnp.int32)).compile().as_text()
    print(t, s, causal, hlo.count("__gpu$xla.gpu.triton"))
  for kind in norm_kernels.KINDS:
    for width in (64, 1024):
      print(kind, width, norm_kernels._compiles(kind, width, "bfloat16", device))
"""


@pytest.mark.slow
def test_the_kernels_compile_for_an_h100_at_lengths_that_are_not_powers_of_two():
  """Triton takes only power-of-two arrays: the flash kernels (whose segment spans read the other
  side's row a block at a time) compile for sm_90 at lengths of 48, 80 and 112, causal or not,
  three Triton calls each; the norm kernels at the narrowest and a wide width, both kinds."""
  compiler = _compiler()
  if not compiler:
    pytest.skip("XLA's GPU compiler is not installed (SEQ2SEQ_GPU_COMPILER; .ci/run installs it)")
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")} | {
      "PYTHONPATH": os.pathsep.join([compiler, str(REPO)]), "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-c", KERNELS_AT_ODD_LENGTHS], cwd=REPO, capture_output=True, text=True,
                       env=env, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split("\n")[:7] == ["48 80 False 3", "80 48 True 3", "112 112 True 3", "layernorm 64 None",
                                        "layernorm 1024 None", "rmsnorm 64 None", "rmsnorm 1024 None"], out.stdout
