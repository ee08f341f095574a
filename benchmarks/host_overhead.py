"""Host overhead per training step: the whole loop of `seq2seq.training.train` (data feed, step
dispatch, divergence guard, bookkeeping) on a model so small that device time is negligible.

  SEQ2SEQ_DATA_DIR=../shared/data python benchmarks/host_overhead.py
  SEQ2SEQ_DATA_DIR=../shared/data python benchmarks/host_overhead.py --repo=/tmp/old_checkout  # another version

Reports, from one run:
- loop_ms_per_step: wall time per step of `train_and_evaluate` between logging steps
  (from metrics.jsonl's wall_time_s; the first window, which compiles, is left out);
- dispatch_ms_per_step: the same jitted step called back to back on one batch with nothing
  else, synchronised once at the end: what the device plus the bare dispatch cost;
- overhead_ms_per_step: the difference, what the loop adds on the host.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--repo", default=str(pathlib.Path(__file__).resolve().parents[1]),
                      help="the checkout whose seq2seq is measured")
  parser.add_argument("--steps", type=int, default=1200)
  parser.add_argument("--log_every", type=int, default=200)
  parser.add_argument("--out", default="", help="also write the result as JSON here")
  args = parser.parse_args()
  sys.path.insert(0, args.repo)

  import jax
  import numpy as np

  from seq2seq import metrics
  from seq2seq.configs import tiny
  from seq2seq.training import train

  if not pathlib.Path(train.__file__).is_relative_to(pathlib.Path(args.repo).resolve()):
    raise SystemExit(f"seq2seq was imported from {train.__file__}, not from --repo={args.repo}")

  config = tiny.get_config()
  config.model.update(d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32, max_len=16)
  config.data.update(max_len=16, pack_length=16, max_tokens=128)
  config.train.update(steps=args.steps, log_every=args.log_every, checkpoint_every=10 * args.steps, eval_every=0,
                      peak_flops=1e12)
  with tempfile.TemporaryDirectory() as workdir:
    train.train_and_evaluate(config, workdir)
    walls = [r["wall_time_s"] for r in metrics.read(workdir) if "wall_time_s" in r]
  loop_ms = statistics.median(np.diff(walls[:-1]) / args.log_every * 1e3)  # the last window holds the final save

  # The bare step: same model and batch shape, called back to back.
  from seq2seq import data, sharding
  from seq2seq.model import transformer
  from seq2seq.model.config import ModelConfig
  from seq2seq.training import optimizer

  tok = data.load_tokenizer(config, tempfile.mkdtemp())
  model_cfg = ModelConfig.from_config(config.model, vocab_size=tok.vocab_size)
  mesh = sharding.make_mesh(config.mesh)
  tx, schedule = optimizer.make(config.train, d_model=model_cfg.d_model)
  graphdef, state, shardings = train.init_state(model_cfg, tx, mesh, config.seed)
  steps = train.Steps(config, graphdef, shardings, mesh, tx, schedule)
  batch = sharding.put_batch(next(iter(data.train_iterator(config, tok))), mesh)
  del transformer
  state, _ = steps.update(state, [batch])
  jax.block_until_ready(state)
  n = 500
  start = time.perf_counter()
  for _ in range(n):
    state, _ = steps.update(state, [batch])
  jax.block_until_ready(state)
  dispatch_ms = (time.perf_counter() - start) / n * 1e3
  result = {"repo": args.repo, "steps": args.steps, "log_every": args.log_every,
            "loop_ms_per_step": round(loop_ms, 3), "dispatch_ms_per_step": round(dispatch_ms, 3),
            "overhead_ms_per_step": round(loop_ms - dispatch_ms, 3), "devices": str(jax.devices()[0].device_kind)}
  print(json.dumps(result))
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
  main()
