"""benchmarks/triton_kernels.py: the Pallas kernels as machine code for an H100, without a GPU.
Its parsers and occupancy rule here; the whole path (the kernels lowered for an H100 by XLA's GPU
compiler, compiled by Triton for sm_90a) in the slow suite, where .ci/run installs both
(SEQ2SEQ_GPU_COMPILER, SEQ2SEQ_TRITON)."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import REPO, benchmark


def _tk():
  return benchmark("triton_kernels")


# cuobjdump 12.9's output for the dQ kernel at the default tiles (wmt14_base, cross-attention)
RESOURCE_USAGE = """
Resource usage:
 Common:
  GLOBAL:11 CONSTANT[4]:8
 Function seq2seq_flash_dq:
  REG:96 STACK:8 SHARED:1024 LOCAL:0 CONSTANT[0]:632 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
SASS = """
\t.headerflags\t@"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0300*/                   STL [R1], R8 ;                                  /* 0x0000000801007387 */
        /*06f0*/               @P4 SEL R17, RZ, 0x1, P0 ;                          /* 0x00000001ff114807 */
        /*1ea0*/                   WARPGROUP.ARRIVE ;                              /* 0x00000000000079c5 */
        /*1eb0*/                   HGMMA.64x64x16.F32.BF16 R56, R108, gdesc[UR4], RZ, !UPT ;  /* 0x00e000046c387df0 */
        /*1f00*/                   HGMMA.64x64x16.F32.BF16 R56, R116, gdesc[UR4], R56 ;       /* 0x00e0000474387df0 */
        /*2000*/              @!P0 LDL R3, [R1] ;                                  /* 0x0000000001038983 */
        /*2010*/             @!UPT HMMA.16816.F32.BF16 R4, R8, R12, R4 ;           /* 0x000000080c04723c */
        /*2020*/                   LDGSTS.E.BYPASS.128 [R5], desc[UR6][R2.64] ;    /* 0x0000000002057fae */
"""


def test_resource_usage_and_instruction_kinds_are_read_from_cuobjdump():
  tk = _tk()
  assert tk.parse_resource_usage(RESOURCE_USAGE) == {
      "registers": 96, "stack_bytes": 8, "static_shared_bytes": 1024, "local_bytes": 0}
  assert tk.count_instructions(SASS) == {"instructions": 8, "hgmma": 2, "hmma": 1, "local_loads": 1,
                                         "local_stores": 1, "async_copies": 1, "tma_loads": 0}
  with pytest.raises(ValueError, match="no resource usage"):
    tk.parse_resource_usage("Resource usage:\n")


@pytest.mark.parametrize("registers, shared, warps, programs, limit", [
    (163, 41216 + 1024, 4, 3, "registers"),  # 168 a thread allocated: 21504 a program of 4 warps
    (255, 4096 + 1024, 8, 1, "registers"),  # 256 x 256 threads: the whole register file
    (32, 100 * 1024, 4, 2, "shared_memory"),  # 228 KiB an SM, a reserved KiB a program
    (16, 0, 32, 2, "warps"),  # 64 warps an SM
    (16, 0, 1, 32, "programs"),  # 32 programs an SM
])
def test_occupancy_is_the_tightest_of_hopper_s_per_sm_limits(registers, shared, warps, programs, limit):
  fit = _tk().occupancy(registers, shared, warps)
  assert fit == {"programs_per_sm": programs, "warps_per_sm": programs * warps, "limited_by": limit}


@pytest.mark.parametrize("args, match", [
    (["--blocks=dkdv=3x3"], "Blocks.dkdv must be two powers of two >= 16"),
    (["--shape=96x256"], "rows x source x target"), (["--target=a100"], "invalid choice: 'a100'"),
    (["--config=nope"], "no such file, and no shipped config has that name"),
    (["--set=model.no_such_key=1"], "error: --set=model.no_such_key=1: KeyError"),
    (["--set=model.norm_position"], "error: --set=model.norm_position: ValueError")])
def test_triton_kernels_refuses_bad_flags_in_one_line(args, match):
  out = _triton_kernels(*args, compiler="")
  assert out.returncode == 2 and match in out.stderr.strip().splitlines()[-1], out.stderr[-2000:]


def _installed(variable: str, marker: str) -> str:
  folder = os.environ.get(variable, "")
  return folder if folder and (pathlib.Path(folder) / marker).exists() else ""


def _triton_kernels(*args, compiler: str):
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")} | {"PYTHONPATH": compiler}
  return subprocess.run([sys.executable, "benchmarks/triton_kernels.py", *args], cwd=REPO, capture_output=True,
                        text=True, env=env, timeout=600)


@pytest.mark.slow
def test_the_kernels_compile_for_sm_90_and_only_tiles_of_64_use_hopper_s_matrix_instructions(tmp_path):
  """wmt14_base's kernels (heads of 64, lengths of 256, biases), lowered for an H100 and compiled
  by Triton: at the default tiles the backward kernels (32-row tiles) issue only HMMA; with
  64x64 tiles and 8 warps every flash kernel issues HGMMA and none spills. The grid, warps and
  stages are those the Blocks give. The loss kernel (a program a token, over wmt14_base's 37000
  logits) spills nothing."""
  compiler = _installed("SEQ2SEQ_GPU_COMPILER", "jax_plugins")
  triton = _installed("SEQ2SEQ_TRITON", "triton")
  if not (compiler and triton):
    pytest.skip("XLA's GPU compiler (SEQ2SEQ_GPU_COMPILER) or Triton (SEQ2SEQ_TRITON) is not installed "
                "(.ci/run installs both)")
  wide = "dkdv=64x64,dq=64x64,backward_warps=8"
  out = _triton_kernels("--shape=2x256x256", "--blocks=default", f"--blocks={wide}", f"--triton={triton}",
                        f"--out={tmp_path / 'r.json'}", compiler=compiler)
  assert out.returncode == 0, out.stderr[-3000:]
  record = json.loads((tmp_path / "r.json").read_text())
  assert record["device_kind"] == "NVIDIA H100 80GB HBM3" and record["versions"]["triton"] != "unknown"
  rows = {(r["blocks"].split(",")[1] if r["blocks"] else "", r["kernel"], r["problem"]): r for r in record["kernels"]}
  flash = ("seq2seq_flash_forward", "seq2seq_flash_dkdv", "seq2seq_flash_dq")
  assert len(record["kernels"]) == 2 * 9 + 3  # per tiling three flash kernels for each attention; the norm's two, the loss's
  norm = "layernorm + residual"  # wmt14_base is post-norm: its norm kernels make the residual add
  assert {k[1:] for k in rows if k[0] == ""} == {("seq2seq_norm_fwd", norm), ("seq2seq_norm_bwd", norm),
                                                 ("seq2seq_loss_fwd_bwd", "loss")}
  loss = rows["", "seq2seq_loss_fwd_bwd", "loss"]
  assert loss["grid"] == [2 * 256, 1, 1] and loss["warps"] == 8 and loss["stack_bytes"] == loss["local_loads"] == 0, loss
  for problem in ("self", "self causal", "cross"):
    default = {name: rows["dkdv=32x32", name, problem] for name in flash}
    assert default["seq2seq_flash_forward"]["grid"] == [256 // 64, 2, 8]  # query blocks, rows, heads
    assert default["seq2seq_flash_dkdv"]["grid"] == default["seq2seq_flash_dq"]["grid"] == [256 // 32, 2, 8]
    assert all((r["warps"], r["stages"]) == (4, 2) for r in default.values())
    assert default["seq2seq_flash_forward"]["hgmma"] > 0
    for name in ("seq2seq_flash_dkdv", "seq2seq_flash_dq"):
      assert default[name]["hgmma"] == 0 < default[name]["hmma"], default[name]
    for name in flash:
      row = rows["dkdv=64x64", name, problem]
      assert row["hgmma"] > 0 and row["hmma"] == 0 and row["stack_bytes"] == row["local_loads"] == 0, row
      assert row["warps"] == (4 if name == "seq2seq_flash_forward" else 8)
  for row in record["kernels"]:
    assert 0 < row["registers"] <= 255 and row["programs_per_sm"] >= 1 and row["dynamic_shared_bytes"] > 0, row
    # the GPU check's reading of PTX (device_check.pallas_instruction_kinds) agrees with the SASS
    assert (row["ptx_wgmma"] > 0) == (row["hgmma"] > 0) and (row["ptx_mma_sync"] > 0) == (row["hmma"] > 0), row


@pytest.mark.slow
def test_triton_kernels_without_triton_says_so_in_one_line(tmp_path):
  compiler = _installed("SEQ2SEQ_GPU_COMPILER", "jax_plugins")
  if not compiler:
    pytest.skip("XLA's GPU compiler is not installed (SEQ2SEQ_GPU_COMPILER; .ci/run installs it)")
  if importlib.util.find_spec("triton") is not None:
    pytest.skip("Triton is installed in this environment")
  out = _triton_kernels("--shape=2x256x256", f"--triton={tmp_path}", compiler=compiler)
  assert out.returncode == 2, out.stderr[-2000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("error: compiling the kernels with Triton failed") and "No module named 'triton'" in last


PTX = """
.version 8.7
.target sm_90a
.visible .entry seq2seq_flash_dq(
  .param .u64 seq2seq_flash_dq_param_0
)
{
\twgmma.fence.sync.aligned;
\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1, %f2}, %rd1, %rd2, p, 1, 1, 0, 1;
\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1, %f2}, %rd3, %rd4, p, 1, 1, 0, 1;
}
.visible .entry seq2seq_flash_dq_1(
)
{
\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1}, {%r1}, {%r2}, {%f1};
}
.entry loop_add_fusion(
)
{
\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1}, {%r1}, {%r2}, {%f1};
}
"""


def test_the_gpu_check_counts_each_pallas_kernel_s_matrix_instructions_in_xla_s_ptx():
  """device_check's flash section reads the PTX XLA dumps on the GPU: per project kernel (a
  copy's _N suffix folded in), Hopper's wgmma and the warp-level mma.sync; XLA's own kernels
  are left out, and a fence is not a multiply."""
  kinds = benchmark("device_check").pallas_instruction_kinds([PTX, ""])
  assert kinds == {"seq2seq_flash_dq": {"wgmma": 2, "mma_sync": 1, "entries": 2}}
