"""The project's Pallas kernels as machine code for a GPU, without a GPU: per kernel and tiling,
the registers a thread takes, what spills to local memory, shared memory, how many programs an
SM holds, and which matrix instructions it runs (Hopper's warpgroup `HGMMA` or Ampere's
`HMMA`, which an H100 runs at a fraction of its tensor-core rate).

  pip install --no-deps --target=build/gpu_compiler "jax-cuda12-plugin==$JAX" "jax-cuda12-pjrt==$JAX"
  pip install --no-deps --target=build/triton "triton==3.9.0"     # Triton's compiler and ptxas
  PYTHONPATH=build/gpu_compiler python benchmarks/triton_kernels.py --triton=build/triton \\
      --blocks=default --blocks=dkdv=64x64,dq=64x64,backward_warps=8 --out=FILE

For each `--blocks` (seq2seq.model.flash.Blocks.parse form; `default` is the kernels' own tiles),
the flash kernels' gradient (self-attention, the encoder's and the decoder's, causal, q, k and v
read in place from the fused projection; cross-attention) is lowered for the target (a
compile-only device of benchmarks/gpu_compile.py, at `--shape`'s rows and lengths and the
config's heads), and so, once, is the norm kernels' (the config's norm, handed on as its blocks
do). Each kernel's Triton IR, what XLA would compile, is taken from its custom call. A child
process, with Triton on its path, compiles each kernel for sm_90a (Triton's own passes, then
ptxas) and reads the binary with cuobjdump: registers, stack and local memory, shared memory,
and the SASS instructions by kind. Occupancy follows from Hopper's per-SM limits
(OCCUPANCY_LIMITS).

What this cannot see: the kernels' speed (only a GPU times it), and XLA's Triton: it compiles
the same IR with the Triton it was built with, not the pip `triton` used here, so registers and
instruction choices may differ by version (the record names jax's and Triton's).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import functools
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import device_check  # noqa: E402  (run_child, _configured)
import gpu_compile  # noqa: E402  (TARGETS, compile_only_devices)

TRITON_CALL = "__gpu$xla.gpu.triton"
# Load hints that jaxlib's Triton dialect prints in a form the pip Triton's parser does not read
# (the loss kernel's L2 policy). They are left out of the text compiled here: the loads' cache
# policy, not the tiles the registers and spills counted below come from.
LOAD_HINTS = re.compile(r" (?:evictionPolicy|cacheModifier) = \w+")
# Per SM of compute capability 9.0 (NVIDIA's CUDA C programming guide, its table of technical
# specifications per compute capability; the occupancy calculator's allocation units).
OCCUPANCY_LIMITS = {"registers": 65536, "register_unit": 256, "warps": 64, "programs": 32,
                    "shared_reserved_per_program": 1024}
# SASS instructions by kind: Hopper's warpgroup matrix multiply, the warp-level one of earlier
# GPUs, local-memory traffic (spills), asynchronous copies to shared memory.
KINDS = {"HGMMA": "hgmma", "HMMA": "hmma", "LDL": "local_loads", "STL": "local_stores", "LDGSTS": "async_copies",
         "UTMALDG": "tma_loads"}


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One Triton kernel as the step would launch it."""

  name: str  # the kernel's function name (seq2seq_flash_forward, ...)
  problem: str  # what was lowered: "self causal", "cross", "layernorm"
  grid: tuple[int, int, int]
  warps: int
  stages: int
  ir: str  # Triton IR (tt dialect), as text

  @property
  def build(self) -> tuple:
    """What Triton compiles: two kernels alike in these are compiled once."""
    return self.name, self.ir, self.warps, self.stages


def triton_calls(module) -> list[dict]:
  """The backend configs of the Triton custom calls in a lowered StableHLO module, in order:
  {name, ir (bytes), num_warps, num_stages, grid_x, grid_y, grid_z}."""
  from jax._src.lib.mlir import ir

  found = []

  def visit(op):
    if op.operation.name == "stablehlo.custom_call" and ir.StringAttr(
        op.operation.attributes["call_target_name"]).value == TRITON_CALL:
      attributes = op.operation.attributes  # API version 4 keeps the config in mhlo.backend_config
      config = ir.DictAttr(attributes["mhlo.backend_config"] if "mhlo.backend_config" in attributes
                           else attributes["backend_config"])
      entry = {"ir": ir.StringAttr(config["ir"]).value_bytes, "name": ir.StringAttr(config["name"]).value}
      for key in ("num_warps", "num_stages", "grid_x", "grid_y", "grid_z"):
        entry[key] = ir.IntegerAttr(config[key]).value
      found.append(entry)
    for region in op.operation.regions:
      for block in region.blocks:
        for inner in block.operations:
          visit(inner)

  visit(module.operation)
  return found


def ir_text(bytecode: bytes) -> str:
  """Triton IR bytecode (a custom call's `ir`) as text."""
  from jax._src.interpreters import mlir
  from jax._src.lib.mlir import ir
  from jax._src.lib.triton import dialect as tt_dialect

  context = mlir.make_ir_context()
  tt_dialect.register_dialect(context)
  with context:
    return str(ir.Module.parse(bytecode))


def lowered_kernels(fn, args, problem: str) -> list[Kernel]:
  """The distinct Triton kernels `jax.jit(fn)` lowers to for `args` (abstract, placed on a
  compile-only device)."""
  import jax

  kernels = {}
  for call in triton_calls(jax.jit(fn).lower(*args).compiler_ir("stablehlo")):
    kernel = Kernel(call["name"], problem, (call["grid_x"], call["grid_y"], call["grid_z"]), call["num_warps"],
                    call["num_stages"], LOAD_HINTS.sub("", ir_text(call["ir"])))
    kernels.setdefault((kernel.name, kernel.ir), kernel)
  return list(kernels.values())


def step_kernels(config, tilings: list, shape: tuple[int, int, int], device) -> list[tuple[str, Kernel]]:
  """(tiling's spec, kernel) of the flash kernels at each of `tilings` (seq2seq.model.flash.Blocks):
  forward and both gradients of self-attention (the encoder's, and the decoder's, causal: read
  in place from the fused projection) and of cross-attention; then ("", kernel) of the norm kernels, forward and
  gradient, as the config's blocks run them (with the residual add; post-norm: the output twice; pre-norm: the
  sum handed on), and of the loss
  kernel on the config's logits. At the
  step's shape, for `device`."""
  import jax
  import jax.numpy as jnp

  from seq2seq.model import flash, norm_kernels
  from seq2seq.model.config import ModelConfig
  from seq2seq.training import loss_kernel

  rows, s, t = shape
  model = ModelConfig.from_config(config.model, vocab_size=config.data.vocab_size)
  heads, head_dim, d = model.num_heads, model.head_size, model.d_model
  placed = {"sharding": jax.sharding.make_single_device_sharding(device)}
  array = lambda *dims, kind=model.compute_dtype: jax.ShapeDtypeStruct(dims, kind, **placed)
  segments = lambda length: array(rows, length, kind=jnp.int32)
  biases = (array(heads, head_dim), array(heads, head_dim)) if model.use_bias else ()  # q's and v's

  def attention_grad(layout, causal, blocks):
    def loss(arrays, q_seg, k_seg, *biases):
      q_bias, v_bias = biases or (None, None)
      out = flash.fused_flash_attention(arrays, layout, q_seg, k_seg, q_bias_nh=q_bias, v_bias_nh=v_bias,
                                        causal=causal, blocks=blocks)
      return jnp.sum(out.astype(jnp.float32))
    return jax.grad(loss)

  # a block's norm makes the residual add (Norm.add: the branch, its bias, dropout): a post-norm's
  # output feeds two uses (transformer.Fork); a pre-norm's makes the block before's add and hands the
  # sum on beside its output (transformer.Pending)
  post = model.norm_position == "post"
  copies, with_input = (2, False) if post else (1, True)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, **placed)

  def norm_loss(x, scale, bias, branch, branch_bias, key):
    added = {"branch_btd": branch, "branch_bias_d": branch_bias if model.use_bias else None,
             "rate": model.dropout_rate, "rng": key}
    outs = norm_kernels.fused_norm(x, scale, None if model.norm == "rmsnorm" else bias, eps=model.norm_eps,
                                   copies=copies, with_input=with_input, **added)
    return sum(jnp.sum(o.astype(jnp.float32) * (i + 1)) for i, o in enumerate(outs))

  found = []
  with jax.default_device(device):  # Pallas reads the GPU it lowers for from the default device
    for blocks in tilings:
      self_args = ((array(rows, t, heads, 3, head_dim),), segments(t), segments(t), *biases)
      cross_args = ((array(rows, t, heads, 1, head_dim), array(rows, s, heads, 2, head_dim)), segments(t),
                    segments(s), *biases)
      for causal, problem in ((False, "self"), (True, "self causal")):  # the encoder's, the decoder's
        found += [(blocks.spec(), k) for k in lowered_kernels(attention_grad(flash.SELF, causal, blocks), self_args,
                                                              problem)]
      found += [(blocks.spec(), k) for k in lowered_kernels(attention_grad(flash.CROSS, False, blocks), cross_args,
                                                            "cross")]
    norm_args = (array(rows, t, d), array(d, kind=jnp.float32), array(d, kind=jnp.float32), array(rows, t, d),
                 array(d, kind=jnp.float32), key)
    found += [("", k) for k in lowered_kernels(jax.grad(norm_loss, argnums=(0, 1)), norm_args,
                                               model.norm + " + residual")]
    loss_args = (array(rows, t, model.vocab_size, kind=jnp.dtype(model.logits_dtype)), segments(t),
                 array(rows, t, kind=jnp.float32))  # logits, labels, weights
    found += [("", k) for k in lowered_kernels(functools.partial(loss_kernel.stats_and_grad, eps=0.1,
                                                                 out_dtype=model.compute_dtype), loss_args, "loss")]
  return found


def parse_resource_usage(text: str) -> dict:
  """cuobjdump --dump-resource-usage of a one-kernel binary: registers per thread, stack and
  local memory per thread, static shared memory per program (bytes)."""
  found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
  if found is None:
    raise ValueError(f"no resource usage in cuobjdump's output: {text[:300]!r}")
  registers, stack, shared, local = (int(x) for x in found.groups())
  return {"registers": registers, "stack_bytes": stack, "static_shared_bytes": shared, "local_bytes": local}


def count_instructions(sass: str) -> dict:
  """SASS instructions by opcode (predicates and modifiers stripped) of cuobjdump -sass."""
  opcodes = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)", sass)
  counts = collections.Counter(opcodes)
  return {"instructions": sum(counts.values()), **{label: counts[op] for op, label in KINDS.items()}}


def occupancy(registers: int, shared_bytes: int, warps: int, limits: dict = OCCUPANCY_LIMITS,
              shared_per_sm: int = 228 * 1024) -> dict:
  """Programs (thread blocks) an SM holds at once, and which limit binds: registers are
  allocated per warp in units of `register_unit`; each program also takes a reserved KiB of
  shared memory."""
  per_warp = math.ceil(registers * 32 / limits["register_unit"]) * limits["register_unit"]
  by = {"registers": limits["registers"] // (per_warp * warps),
        "shared_memory": shared_per_sm // (shared_bytes + limits["shared_reserved_per_program"]),
        "warps": limits["warps"] // warps, "programs": limits["programs"]}
  programs = min(by.values())
  return {"programs_per_sm": programs, "warps_per_sm": programs * warps,
          "limited_by": min(by, key=lambda k: (by[k], k))}


def compile_child(folder: pathlib.Path) -> None:
  """In a process with Triton on its path: each `folder/N.ttir` (with N.json: warps, stages)
  compiled for sm_90a; prints a JSON line per kernel (resource usage, instruction counts)."""
  os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default before 3.10 (3.9 warns when unset)
  import triton
  from triton.backends.compiler import GPUTarget

  print(json.dumps({"triton": triton.__version__}), flush=True)
  tools = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
  for source in sorted(folder.glob("*.ttir"), key=lambda p: int(p.stem)):
    meta = json.loads(source.with_suffix(".json").read_text())
    compiled = triton.compile(str(source), target=GPUTarget("cuda", meta["capability"], 32),
                              options={"num_warps": meta["warps"], "num_stages": meta["stages"]})
    cubin = source.with_suffix(".cubin")
    cubin.write_bytes(compiled.asm["cubin"])
    dump = lambda *flags: subprocess.run([str(tools / "cuobjdump"), *flags, str(cubin)], capture_output=True,
                                         text=True, check=True).stdout
    (ptx,) = device_check.pallas_instruction_kinds([compiled.asm["ptx"]]).values()  # as the GPU check reads XLA's
    print(json.dumps({"index": int(source.stem), "dynamic_shared_bytes": compiled.metadata.shared,
                      **parse_resource_usage(dump("--dump-resource-usage")),
                      **count_instructions(dump("-sass")), "ptx_wgmma": ptx["wgmma"],
                      "ptx_mma_sync": ptx["mma_sync"]}), flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--target", default="h100", choices=sorted(gpu_compile.TARGETS))
  parser.add_argument("--config", default="configs/wmt14_base.py")
  parser.add_argument("--shape", default="96x256x256", help="rows x source x target")
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                      help="a config override, as on the training command line (repeatable)")
  parser.add_argument("--blocks", action="append", default=[], help="flash tiles (Blocks.parse form); `default`")
  parser.add_argument("--triton", default="", help="a folder holding the `triton` package (pip --target)")
  parser.add_argument("--timeout_s", type=float, default=600.0)
  parser.add_argument("--out", default="")
  parser.add_argument("--child", default="", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    if args.triton:
      sys.path.insert(0, args.triton)
    return compile_child(pathlib.Path(args.child))

  os.environ["JAX_PLATFORMS"] = "cpu"  # the host's platform; the GPU is a compile-only target
  import jax

  from seq2seq.model import flash

  try:
    tilings = [flash.Blocks() if spec == "default" else flash.Blocks.parse(spec) for spec in args.blocks or ["default"]]
    shape = tuple(int(x) for x in args.shape.split("x")) if re.fullmatch(r"\d+x\d+x\d+", args.shape) else ()
    if not shape:
      raise ValueError(f"--shape={args.shape!r}: rows x source x target, such as 96x256x256")
  except ValueError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)
  try:
    config, _ = device_check._configured(str(REPO / args.config), args.dtype, True, tuple(args.set))
  except (KeyError, ValueError) as err:  # no such setting, or not SECTION.KEY=VALUE of its type
    print(f"error: --set={' --set='.join(args.set)}: {type(err).__name__}: {err}", file=sys.stderr)
    sys.exit(2)
  target = gpu_compile.TARGETS[args.target]
  device = gpu_compile.compile_only_devices(target)[0]
  kernels = step_kernels(config, tilings, shape, device)

  with tempfile.TemporaryDirectory() as scratch:
    folder = pathlib.Path(scratch)
    unique = {}  # the same kernel (the norms, tiles two specs share) is compiled once
    for _, kernel in kernels:
      if kernel.build not in unique:
        index = unique[kernel.build] = len(unique)
        (folder / f"{index}.ttir").write_text(kernel.ir)
        (folder / f"{index}.json").write_text(json.dumps(
            {"warps": kernel.warps, "stages": kernel.stages,
             "capability": 10 * target.compute_capability[0] + target.compute_capability[1]}))
    child = device_check.run_child([sys.executable, str(pathlib.Path(__file__).resolve()), f"--child={folder}",
                                    f"--triton={args.triton}"], args.timeout_s)
  compiled = {row["index"]: row for row in child["objects"] if "index" in row}
  if child["returncode"] != 0 or len(compiled) != len(unique):
    print(f"error: compiling the kernels with Triton failed ({args.triton or 'triton on the path'}): "
          f"{child['stderr_tail'].strip().splitlines()[-1] if child['stderr_tail'].strip() else child['returncode']}",
          file=sys.stderr)
    sys.exit(2)

  rows = []
  for spec, kernel in kernels:
    usage = dict(compiled[unique[kernel.build]])
    del usage["index"]
    shared = usage["static_shared_bytes"] + usage["dynamic_shared_bytes"]
    fit = occupancy(usage["registers"], shared, kernel.warps, shared_per_sm=target.shared_memory_per_sm)
    programs = math.prod(kernel.grid)
    rows.append({"blocks": spec, "kernel": kernel.name,
                 "problem": kernel.problem, "grid": list(kernel.grid), "warps": kernel.warps, "stages": kernel.stages,
                 **usage, **fit,
                 "waves": round(programs / (target.sm_count * fit["programs_per_sm"]), 2) if fit["programs_per_sm"]
                 else None})
  record = {"check": "benchmarks/triton_kernels.py", "date": datetime.date.today().isoformat(),
            "command": "python " + " ".join(sys.argv), "target": args.target, "device_kind": target.device_kind,
            "config": args.config, "settings": args.set, "shape": list(shape), "dtype": args.dtype,
            "versions": {"jax": jax.__version__, "triton": child["objects"][0]["triton"]},
            "occupancy_limits": OCCUPANCY_LIMITS, "kernels": rows}
  text = json.dumps(record, indent=1)
  print(text)
  if args.out:
    pathlib.Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
  main()
