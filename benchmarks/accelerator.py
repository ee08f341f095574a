"""Train-step throughput on whatever accelerator is present: wmt14_base in bf16 at the
config's batch (~25k tokens), on all devices of this host (the config's mesh), reported as
target tokens/s and MFU against the device's nominal peak.

  python benchmarks/accelerator.py                                   # wmt14_base, bf16
  python benchmarks/accelerator.py --config=configs/wmt14_big.py --peak_tflops=989 --out=result.json

Batches are random tokens in the shapes the config's batching compiles (every row one
sentence of the full row length, so every slot is a real token); the data pipeline has its
own benchmark (benchmarks/data_pipeline.py). Each shape is compiled and warmed up, then
timed over `--steps` steps, synchronised once at the end. The nominal peak comes from
PEAK_TFLOPS by device kind (dense bf16 per device, vendor figures), or `--peak_tflops`;
on a CPU it is an f32 matmul measured in the same run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

# Dense bf16 TFLOP/s of one device (no sparsity), by a substring of `device_kind`.
PEAK_TFLOPS = {
    "H200": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "GH200": 989.0, "B200": 2250.0,
    "A100": 312.0, "A10G": 125.0, "L40S": 362.0, "L4": 121.0, "V100": 125.0, "RTX 4090": 165.0,
    "TPU v6": 918.0, "TPU v5p": 459.0, "TPU v5": 197.0, "TPU v4": 275.0, "TPU v3": 123.0,
}


def nominal_peak(device_kind: str) -> float | None:
  """TFLOP/s of `device_kind` from PEAK_TFLOPS (the longest matching key), or None."""
  matches = [k for k in PEAK_TFLOPS if k.lower() in device_kind.lower()]
  return PEAK_TFLOPS[max(matches, key=len)] if matches else None


def load_config(path: str):
  spec = importlib.util.spec_from_file_location("benchmark_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def random_batch(rows: int, s: int, t: int, vocab: int, rng) -> dict:
  import numpy as np

  src = rng.integers(3, vocab, (rows, s)).astype(np.int32)
  tgt = rng.integers(3, vocab, (rows, t)).astype(np.int32)
  positions = lambda n: np.broadcast_to(np.arange(n, dtype=np.int32), (rows, n)).copy()
  return {"src_bs": src, "src_segments_bs": np.ones_like(src), "src_positions_bs": positions(s),
          "tgt_in_bt": np.concatenate([np.full((rows, 1), 2, np.int32), tgt[:, :-1]], 1), "tgt_out_bt": tgt,
          "tgt_segments_bt": np.ones_like(tgt), "tgt_positions_bt": positions(t)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default=str(pathlib.Path(__file__).resolve().parents[1] / "configs/wmt14_base.py"))
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--steps", type=int, default=20, help="timed steps per batch shape")
  parser.add_argument("--shapes", default="all", help="all, or how many of the longest shapes to time")
  parser.add_argument("--peak_tflops", type=float, default=0.0, help="per device; 0 = PEAK_TFLOPS by device kind")
  parser.add_argument("--out", default="")
  args = parser.parse_args()

  import jax
  import numpy as np

  from seq2seq import sharding
  from seq2seq.model import flops
  from seq2seq.model.config import ModelConfig
  from seq2seq.training import optimizer, plan, train

  config = load_config(args.config)
  config.model.dtype = args.dtype
  mesh = sharding.make_mesh(config.mesh)
  model_cfg = ModelConfig.from_config(config.model, vocab_size=config.data.vocab_size)
  tx, schedule = optimizer.make(config.train, d_model=model_cfg.d_model)
  graphdef, state, shardings = train.init_state(model_cfg, tx, mesh, config.seed)
  steps = train.Steps(config, graphdef, shardings, mesh, tx, schedule)
  device = jax.devices()[0]
  peak_tflops = args.peak_tflops or nominal_peak(device.device_kind)
  peak_source = "flag" if args.peak_tflops else "table"
  if peak_tflops is None:  # a CPU or an unknown device: a matmul measured now
    peak_tflops, peak_source = flops.measure_matmul_peak(repeats=5) / 1e12, "measured f32 matmul"

  shapes = plan.batch_shapes(config)
  if args.shapes != "all":
    shapes = sorted(shapes, key=lambda x: -max(x[1], x[2]))[:int(args.shapes)]
  rng = np.random.default_rng(0)
  results = []
  for rows, s, t in shapes:
    batch = sharding.put_batch(random_batch(rows, s, t, model_cfg.vocab_size, rng), mesh)
    compile_start = time.perf_counter()
    state, _ = steps.update(state, [batch])
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - compile_start
    state, _ = steps.update(state, [batch])  # warm
    jax.block_until_ready(state)
    start = time.perf_counter()
    for _ in range(args.steps):
      state, metrics = steps.update(state, [batch])
    jax.block_until_ready((state, metrics))
    seconds = (time.perf_counter() - start) / args.steps
    step_flops = flops.train_step_flops(model_cfg, rows, s, t)
    results.append({"shape": [rows, s, t], "step_ms": seconds * 1e3, "target_tokens_per_s": rows * t / seconds,
                    "mfu": step_flops / seconds / (peak_tflops * 1e12 * mesh.size), "compile_s": compile_s})
    print(json.dumps(results[-1]), flush=True)
  total_tokens = sum(r["shape"][0] * r["shape"][2] for r in results)
  total_seconds = sum(r["step_ms"] / 1e3 for r in results)
  summary = {"config": pathlib.Path(args.config).name, "dtype": args.dtype, "device_kind": device.device_kind,
             "platform": device.platform, "devices": mesh.size, "mesh": dict(mesh.shape),
             "params": sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state["params"])),
             "peak_tflops_per_device": peak_tflops, "peak_source": peak_source,
             "target_tokens_per_s": total_tokens / total_seconds,  # one step of each shape
             "mfu": sum(r["mfu"] * r["step_ms"] for r in results) / sum(r["step_ms"] for r in results),
             "jax": jax.__version__, "shapes": results}
  print(json.dumps({k: v for k, v in summary.items() if k != "shapes"}))
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
  main()
