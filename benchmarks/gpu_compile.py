"""The train step compiled for a GPU on a machine without one, and where its time would go.

  pip install --no-deps --target=build/gpu_compiler "jax-cuda12-plugin==$JAX" "jax-cuda12-pjrt==$JAX"
  PYTHONPATH=build/gpu_compiler python benchmarks/gpu_compile.py --target=h200 \\
      --measured=benchmarks/results/profile_h200.json --out=benchmarks/results/gpu_compile_h200.json

($JAX: this machine's jax version. The two wheels, ~180 MB, hold XLA's GPU compiler; no CUDA
library and no GPU is needed.) For each of `--variants` (benchmarks/device_check.py's VARIANTS,
the changes issue 62 weighs), in a process of its own so that its XLA flags apply to it alone:

- compile-only devices of the target (`jax.experimental.topologies`, from the device facts in
  TARGETS), the config's mesh over them, and the train step at `--shape` compiled for it ahead of
  time (seq2seq.training.plan.compile_step, as the dry run does): XLA's GPU pipeline, fusion and
  the Pallas (Triton) kernels included;
- its optimized HLO read by benchmarks/profile_table.py: each kernel's category (as the measured
  profile names them), the bytes it reads and writes, its matmul FLOPs, the launches per step.

With `--measured` (a profile of the same step on that GPU: device_check's profile section), a
CostModel is fitted to the baseline's measured categories (profile_table.fit: memory-bound
kernels at one bandwidth plus a launch cost each, matmuls at their measured rate, attention
kernels at their measured time per attention FLOP of the model formula; other Pallas kernels,
the norms', as memory-bound ones) and every variant's step time and MFU are predicted. With
`--model` (an earlier record), its fitted model predicts another config's step: wmt14_big's

  PYTHONPATH=build/gpu_compiler python benchmarks/gpu_compile.py --target=h200 \\
      --config=configs/wmt14_big.py --model=benchmarks/results/gpu_compile_h200.json \\
      --variants=baseline,logits_bfloat16,no_bias --out=benchmarks/results/gpu_compile_h200_big.json

What a compile here cannot see: autotuning (XLA takes its default GEMM tilings, and Triton GEMMs
where a GPU might pick cuBLAS), so variants that change XLA flags or kernel tiles are compiled but
marked `predicted: false`; cuDNN attention (unpacked rows), which needs the GPU's cuDNN to
trace, so the step takes XLA attention and the record says so (`compiled_attention`); and how
fast the kernels run, which only the fitted model says.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import shlex
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import device_check  # noqa: E402  (VARIANTS, _configured, run_child)
import profile_table  # noqa: E402

PLUGIN = "jax-cuda12-plugin and jax-cuda12-pjrt"


@dataclasses.dataclass(frozen=True)
class Target:
  """A GPU's facts as XLA reads them to compile for it (its GpuTargetConfigProto): public
  figures of the part; what XLA's fusion and tiling decisions depend on."""

  device_kind: str  # as the device reports it; Pallas reads the compute capability from it
  memory_bytes: int
  bandwidth: float  # nominal memory bandwidth, bytes/s
  sm_count: int = 132
  compute_capability: tuple = (9, 0)
  clock_ghz: float = 1.98
  l2_bytes: int = 50 * 2**20
  shared_memory_per_sm: int = 228 * 1024
  shared_memory_per_block_optin: int = 227 * 1024

  def config_text(self) -> str:
    """The text proto `jax.experimental.topologies.get_topology_desc(target_config=...)` takes."""
    major, minor = self.compute_capability
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {self.shared_memory_per_sm}
  shared_memory_per_block_optin: {self.shared_memory_per_block_optin}
  threads_per_core_limit: 2048
  core_count: {self.sm_count}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(self.bandwidth)}
  l2_cache_size: {self.l2_bytes}
  clock_rate_ghz: {self.clock_ghz}
  device_memory_size: {self.memory_bytes}
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 }}
device_description_str: "{self.device_kind}"
"""


TARGETS = {  # NVIDIA's data sheets: both are the GH100 chip with 132 SMs enabled (SXM)
    "h100": Target("NVIDIA H100 80GB HBM3", memory_bytes=80 * 10**9, bandwidth=3.35e12),
    "h200": Target("NVIDIA H200", memory_bytes=141 * 10**9, bandwidth=4.8e12),
}


def compile_only_devices(target: Target, count: int = 1) -> list:
  """`count` devices of `target` on one host, to compile for; SystemExit (one `error:` line)
  without XLA's GPU compiler."""
  import jax
  from jax.experimental import topologies

  try:
    topology = topologies.get_topology_desc("", "cuda", target_config=target.config_text(),
                                            topology=f"1x1x{count}")
  except Exception as err:  # noqa: BLE001 - no plugin: RuntimeError, ValueError or JaxRuntimeError by version
    print(f"error: compiling for a GPU needs {PLUGIN} {jax.__version__} (pip install --no-deps --target=DIR "
          f"\"jax-cuda12-plugin=={jax.__version__}\" \"jax-cuda12-pjrt=={jax.__version__}\", then PYTHONPATH=DIR): "
          f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}", file=sys.stderr)
    sys.exit(2)
  return list(topology.devices)


def compile_child(args) -> None:
  """One variant: compiles the step for the target and writes its optimized HLO to `--hlo`;
  prints one JSON line (compile time, XLA's memory figures, the attention the model chose, the
  step's TFLOP by the model formula and those of its attention kernels)."""
  import jax

  variant = device_check.VARIANTS[args.child]
  variant.apply()
  rows, s, t = (int(x) for x in args.shape.split("x"))
  config, applied = device_check._configured(str(REPO / args.config), args.dtype, args.layout == "packed",
                                              (*args.set, *variant.overrides))
  config.mesh.update(data=-1, fsdp=1, tensor=1)
  devices = compile_only_devices(TARGETS[args.target], args.devices)
  start = time.perf_counter()
  with jax.default_device(devices[0]):  # Pallas reads the GPU it lowers for from the default device
    from seq2seq.model import flops
    from seq2seq.training import plan

    step = plan.compile_step(config, devices, (rows * variant.rows, s, t))
  compile_s = time.perf_counter() - start
  formula = {"model_tflop": flops.train_step_flops(step.model_cfg, *step.shape) / 1e12,
             "attention_tflop": 3 * flops.attention_flops(step.model_cfg, *step.shape) / 1e12}  # forward and back
  hlo = step.compiled.as_text()
  pathlib.Path(args.hlo).write_text(hlo)
  memory = step.compiled.memory_analysis()
  chosen = compiled_attention(
      device_check._attention(step.model_cfg, t, args.layout == "packed", len(devices), devices[0].platform), hlo)
  print(json.dumps({"variant": args.child, "shape": list(step.shape), "compile_s": round(compile_s, 1),
                    "device_kind": devices[0].device_kind, "attention": chosen, "config": applied,
                    "temp_gib": round(memory.temp_size_in_bytes / 2**30, 3),
                    "argument_gib": round(memory.argument_size_in_bytes / 2**30, 3),
                    **{k: round(v, 6) for k, v in formula.items()}}), flush=True)


def compiled_attention(chosen: str, hlo: str) -> str:
  """The attention the step compiled with: the model's choice, but cuDNN's only if the HLO
  calls it. Tracing cuDNN attention asks the GPU's cuDNN for its version, which a compile-only
  target lacks, so the model falls back to XLA attention (with a warning): unpacked rows here
  are not the step a GPU runs."""
  if chosen == "cudnn" and "__cudnn$fmha" not in hlo:
    return "xla (cuDNN attention needs a GPU to trace)"
  return chosen


def measured_table(path: pathlib.Path, layout: str) -> dict:
  """ms per step by category of a profile record (device_check's profile section)."""
  record = json.loads(path.read_text())
  return record["layouts"][layout]["table"]["ms_per_step"] if "layouts" in record else record["ms_per_step"]


def variant_rows(args, folder: pathlib.Path) -> dict:
  """{variant: its child's JSON line and static table} (an error string where a child failed)."""
  rows = {}
  for name in args.variants.split(","):
    variant, hlo = device_check.VARIANTS[name], folder / f"{name}.hlo.txt"
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), f"--child={name}", f"--hlo={hlo}",
               f"--target={args.target}", f"--config={args.config}", f"--shape={args.shape}", f"--dtype={args.dtype}",
               f"--layout={args.layout}", f"--devices={args.devices}", *[f"--set={o}" for o in args.set]]
    child = device_check.run_child(command, args.timeout_s, env=variant.child_env())
    row = {"overrides": list(variant.overrides), "xla_flags": variant.xla_flags, "rows": variant.rows,
           **variant.switches(),
           # what autotuning or a kernel's speed decides, a compile here cannot
           "predicted": not (variant.xla_flags or variant.flash_blocks)}
    if not child["objects"] or not hlo.exists():
      rows[name] = row | {"error": device_check._failure(child, args.timeout_s)}
      continue
    rows[name] = row | child["objects"][0] | {"costs": profile_table.kernel_costs(hlo.read_text())}
  return rows


def _version(distribution: str) -> str:
  import importlib.metadata

  try:
    return importlib.metadata.version(distribution)
  except importlib.metadata.PackageNotFoundError:
    return ""


def _shown(path: pathlib.Path | None) -> str:
  """A path as the record shows it: relative to the checkout when inside it."""
  if path is None:
    return ""
  path = path.resolve()
  return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def report(args, rows: dict) -> dict:
  """The JSON record: the fitted model and its check, each variant's static table and, with a
  model, its predicted step time, speed against the baseline (target tokens per second) and MFU
  (the model formula's FLOPs against the target's nominal bf16 or f32 peak)."""
  import jax

  from seq2seq.model import flops

  model, check, fitted = None, {}, None
  if args.model:
    model = profile_table.CostModel.from_json(json.loads(args.model.read_text())["model"])
  elif args.measured:
    fitted = (profile_table.kernel_costs(args.fit_hlo.read_text()) if args.fit_hlo
              else rows.get("baseline", {}).get("costs"))
    attention = rows.get("baseline", {}).get("attention_tflop")  # the fitted step is the baseline's (or --fit_hlo:
    if fitted and attention:                                       # the baseline's as the profile measured it)
      model, check = profile_table.fit(fitted, measured_table(args.measured, args.layout), library_tflop=attention)
  variants = {}
  for name, row in rows.items():
    costs = row.pop("costs", None)
    variants[name] = row if costs is None else row | {
        "table": profile_table.static_table(costs, model, library_tflop=row["attention_tflop"])}
  base = variants.get("baseline", {}).get("table", {}).get("ms_per_step")
  peak = flops.nominal_peak(TARGETS[args.target].device_kind, args.dtype)
  for row in variants.values():
    ms = row.get("table", {}).get("ms_per_step") if row.get("predicted") else None  # flags, tiles: the GPU's to say
    if base and ms:
      row["predicted_speed_vs_baseline"] = round(base / (ms / row["rows"]), 4)
    if ms and peak:
      row["predicted_mfu"] = round(row["model_tflop"] / (ms * 1e-3) / peak, 4)
  return {"check": "benchmarks/gpu_compile.py", "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
          "command": shlex.join([pathlib.Path(sys.executable).name, *sys.argv]), "target": args.target,
          "device_kind": TARGETS[args.target].device_kind, "devices": args.devices, "config": args.config,
          "shape": [int(x) for x in args.shape.split("x")], "dtype": args.dtype, "layout": args.layout,
          "settings": args.set,
          "versions": {"jax": jax.__version__, "jax-cuda12-plugin": _version("jax-cuda12-plugin")},
          "measured": _shown(args.measured),
          "fitted_to": _shown(args.model) if args.model else (_shown(args.fit_hlo) if args.fit_hlo else
                                                               "baseline" if model else ""),
          "model": None if model is None else model.to_json(), "fit_check": check,
          # the program the model was fitted to (the one the profile measured), as the model predicts it
          "fitted_table": profile_table.static_table(fitted, model) if fitted and args.fit_hlo else None,
          # the baseline as an earlier commit compiled it (its attention the baseline's), the change's "before"
          **({"before": _shown(args.before_hlo), "before_table": profile_table.static_table(
              profile_table.kernel_costs(args.before_hlo.read_text()), model,
              library_tflop=variants.get("baseline", {}).get("attention_tflop"))} if args.before_hlo else {}),
          "variants": variants}


def parse(argv: list[str]):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--target", default="h200", choices=sorted(TARGETS))
  parser.add_argument("--devices", type=int, default=1, help="GPUs on the host (the mesh's data axis)")
  parser.add_argument("--config", default="configs/wmt14_base.py")
  parser.add_argument("--shape", default="96x256x256", help="rows x source x target (a variant may scale rows)")
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                      help="a config setting for every variant (repeatable), before the variant's own")
  parser.add_argument("--layout", default="packed", choices=("packed", "unpacked"))
  parser.add_argument("--variants", default="baseline", help="device_check.VARIANTS names, baseline first")
  parser.add_argument("--measured", type=pathlib.Path, default=None,
                      help="a profile record of this step on the target (benchmarks/results/profile_h200.json)")
  parser.add_argument("--fit_hlo", type=pathlib.Path, default=None,
                      help="fit to this optimized HLO (the program --measured profiled) instead of the baseline's")
  parser.add_argument("--before_hlo", type=pathlib.Path, default=None,
                      help="the baseline's step as an earlier commit compiled it: its table beside the variants'")
  parser.add_argument("--model", type=pathlib.Path, default=None,
                      help="take the fitted model of this earlier record (its \"model\") instead of fitting")
  parser.add_argument("--hlo_dir", default="", help="keep each variant's optimized HLO here")
  parser.add_argument("--timeout_s", type=float, default=600.0, help="per variant")
  parser.add_argument("--out", default="")
  parser.add_argument("--child", default="", help=argparse.SUPPRESS)
  parser.add_argument("--hlo", default="", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  names = args.variants.split(",")
  unknown = [n for n in names if n not in device_check.VARIANTS]
  if unknown:
    parser.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(device_check.VARIANTS)}")
  if args.measured and not args.measured.is_file():
    parser.error(f"--measured: no file {args.measured}")
  if args.measured and names[0] != "baseline":  # with --fit_hlo too: the baseline's FLOPs are the fitted step's
    parser.error("--measured fits the model to the baseline: --variants must start with baseline")
  for flag in ("fit_hlo", "before_hlo", "model"):
    if getattr(args, flag) and not getattr(args, flag).is_file():
      parser.error(f"--{flag}: no file {getattr(args, flag)}")
  return args


def main() -> None:
  args = parse(sys.argv[1:])
  # JAX runs nothing here: the CPU is its backend, and the GPU plugin only compiles (with a GPU
  # backend to start, a machine without a driver fails before it gives a topology).
  os.environ["JAX_PLATFORMS"] = "cpu"
  if args.child:
    return compile_child(args)
  device_check.accelerator.load_config(str(REPO / args.config))  # the config is there (else one `error:` line)
  compile_only_devices(TARGETS[args.target], args.devices)  # and the compiler, before any child starts
  with tempfile.TemporaryDirectory(prefix="gpu_compile_") as scratch:
    folder = pathlib.Path(args.hlo_dir or scratch)
    folder.mkdir(parents=True, exist_ok=True)
    result = report(args, variant_rows(args, folder))
  text = json.dumps(result, indent=1)
  if args.out:
    pathlib.Path(args.out).write_text(text + "\n")
  print(text)


if __name__ == "__main__":
  main()
