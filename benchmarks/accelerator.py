"""Train-step throughput on whatever accelerator is present: wmt14_base in bf16 at the
config's batch (~25k tokens), on all devices of this host (the config's mesh), reported as
target tokens/s and MFU against the device's nominal peak.

  python benchmarks/accelerator.py                                   # wmt14_base, bf16
  python benchmarks/accelerator.py --config=configs/wmt14_big.py --peak_tflops=989 --out=result.json

Batches are random tokens in the shapes the config's batching compiles (every row one
sentence of the full row length, so every slot is a real token); the data pipeline has its
own benchmark (benchmarks/data_pipeline.py). Each shape is compiled and warmed up, then
timed over `--steps` steps, synchronised once at the end. The peak per device is
`--peak_tflops` ("config"), else the nominal dense peak of the device kind for `--dtype`
(`seq2seq.model.flops.PEAK_TFLOPS`, vendor figures), else (a CPU, an unknown device) an f32
matmul measured in the same run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

def load_config(path: str):
  """The ConfigDict of a config file, or of a shipped config named by the path's last part
  (`tiny`, `wmt14_base.py`); SystemExit with one `error:` line if it is neither."""
  from seq2seq import configs

  if not pathlib.Path(path).is_file():
    shipped = configs.resolve(pathlib.Path(path).name.removesuffix(".py"))
    if not pathlib.Path(shipped).is_file():
      print(f"error: --config={path}: no such file, and no shipped config has that name; shipped configs: "
            f"{', '.join(configs.names())}", file=sys.stderr)
      sys.exit(2)
    path = shipped
  spec = importlib.util.spec_from_file_location("benchmark_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def random_batch(rows: int, s: int, t: int, vocab: int, rng) -> dict:
  """A [rows, s] / [rows, t] batch of random tokens, one sentence per row filling it."""
  import numpy as np

  src = rng.integers(3, vocab, (rows, s)).astype(np.int32)
  tgt = rng.integers(3, vocab, (rows, t)).astype(np.int32)
  positions = lambda n: np.broadcast_to(np.arange(n, dtype=np.int32), (rows, n)).copy()
  return {"src_bs": src, "src_segments_bs": np.ones_like(src), "src_positions_bs": positions(s),
          "tgt_in_bt": np.concatenate([np.full((rows, 1), 2, np.int32), tgt[:, :-1]], 1), "tgt_out_bt": tgt,
          "tgt_segments_bt": np.ones_like(tgt), "tgt_positions_bt": positions(t)}


def build(config):
  """(model config, mesh, train state, jitted Steps) of `config` on all local devices."""
  from seq2seq import sharding
  from seq2seq.model.config import ModelConfig
  from seq2seq.training import optimizer, train

  mesh = sharding.make_mesh(config.mesh)
  model_cfg = ModelConfig.from_config(config.model, vocab_size=config.data.vocab_size)
  tx, schedule = optimizer.make(config.train, d_model=model_cfg.d_model)
  graphdef, state, shardings = train.init_state(model_cfg, tx, mesh, config.seed)
  return model_cfg, mesh, state, train.Steps(config, graphdef, shardings, mesh, tx, schedule)


def time_steps(steps, state, batch, count: int):
  """(state, seconds per step, compile seconds): a step that compiles, one to warm up, then
  `count` steps synchronised once at the end."""
  import jax

  compile_start = time.perf_counter()
  state, _ = steps.update(state, [batch])
  jax.block_until_ready(state)
  compile_s = time.perf_counter() - compile_start
  state, _ = steps.update(state, [batch])  # warm
  jax.block_until_ready(state)
  start = time.perf_counter()
  for _ in range(count):
    state, metrics = steps.update(state, [batch])
  jax.block_until_ready((state, metrics))
  return state, (time.perf_counter() - start) / count, compile_s


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default=str(pathlib.Path(__file__).resolve().parents[1] / "configs/wmt14_base.py"))
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--steps", type=int, default=20, help="timed steps per batch shape")
  parser.add_argument("--shapes", default="all", help="all, or how many of the longest shapes to time")
  parser.add_argument("--peak_tflops", type=float, default=0.0,
                      help="per device; 0 = seq2seq.model.flops.PEAK_TFLOPS by device kind and dtype")
  parser.add_argument("--out", default="")
  args = parser.parse_args()

  import jax
  import numpy as np

  from seq2seq import sharding
  from seq2seq.model import flops
  from seq2seq.training import plan

  config = load_config(args.config)
  config.model.dtype = args.dtype
  model_cfg, mesh, state, steps = build(config)
  device = jax.devices()[0]
  peak, peak_source = flops.peak_flops(device.device_kind, device.platform, args.dtype, 1, args.peak_tflops * 1e12,
                                       repeats=5)
  peak_tflops = peak / 1e12

  shapes = plan.batch_shapes(config)
  if args.shapes != "all":
    shapes = sorted(shapes, key=lambda x: -max(x[1], x[2]))[:int(args.shapes)]
  rng = np.random.default_rng(0)
  results = []
  for rows, s, t in shapes:
    batch = sharding.put_batch(random_batch(rows, s, t, model_cfg.vocab_size, rng), mesh)
    state, seconds, compile_s = time_steps(steps, state, batch, args.steps)
    step_flops = flops.train_step_flops(model_cfg, rows, s, t)
    results.append({"shape": [rows, s, t], "step_ms": seconds * 1e3, "target_tokens_per_s": rows * t / seconds,
                    "mfu": step_flops / seconds / (peak_tflops * 1e12 * mesh.size), "compile_s": compile_s})
    print(json.dumps(results[-1]), flush=True)
  total_tokens = sum(r["shape"][0] * r["shape"][2] for r in results)
  total_seconds = sum(r["step_ms"] / 1e3 for r in results)
  summary = {"config": pathlib.Path(args.config).name, "dtype": args.dtype, "device_kind": device.device_kind,
             "platform": device.platform, "devices": mesh.size, "mesh": dict(mesh.shape),
             "params": sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params)),
             "peak_tflops_per_device": peak_tflops, "peak_source": peak_source,
             "target_tokens_per_s": total_tokens / total_seconds,  # one step of each shape
             "mfu": sum(r["mfu"] * r["step_ms"] for r in results) / sum(r["step_ms"] for r in results),
             "jax": jax.__version__, "shapes": results}
  print(json.dumps({k: v for k, v in summary.items() if k != "shapes"}))
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
  main()
