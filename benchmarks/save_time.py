"""How long a checkpoint save takes for each shipped config: what a stop signal (SIGTERM at
preemption) waits for besides the steps in flight (docs/training.md#preemption-and-stop-signals).

  python benchmarks/save_time.py [--configs=tiny,multi30k,...] [--out=benchmarks/results/save_time_cpu2.json]

For each config, the training state (parameters and Adam's two moments, as the run keeps
them) is initialised on this machine's devices and saved with the run's own checkpoint code
(`seq2seq.training.checkpoint.Checkpoints`) into a temporary folder, three times. Reports per
config: the state's bytes, the seconds `save` blocks the loop (the copy off the devices
before the asynchronous write), the seconds until the checkpoint is complete and sealed
(`wait`: written, renamed into place, checksums recorded), MB/s, and the seconds a stopped
run spends from its save to its exit (save, wait, and closing the manager, which deletes
the checkpoints beyond `keep`). The medians of the three saves are reported; the first save of a process also sets up orbax's writers, so it is
reported apart. The vocabulary is the config's data.vocab_size (no data is read).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import sys
import tempfile
import time

SHIPPED = ["tiny", "multi30k", "wmt14_base", "wmt14_big"]


def measure(name: str, repeats: int) -> dict:
  import jax

  from seq2seq import configs, sharding
  from seq2seq.model import transformer
  from seq2seq.model.config import ModelConfig
  from seq2seq.training import checkpoint, optimizer
  from seq2seq.training.config import TrainConfig
  from seq2seq.training.state import init_state

  config = configs.get(name)
  model_cfg = ModelConfig.from_config(config.model, vocab_size=config.data.vocab_size)
  t = TrainConfig.from_config(config.train)
  tx, _ = optimizer.make(t, d_model=model_cfg.d_model)
  mesh = sharding.make_mesh(config.mesh)
  _, state, _ = init_state(model_cfg, tx, mesh, config.seed)
  saved = state.saved()
  nbytes = sum(x.nbytes for x in jax.tree.leaves(saved))
  blocking, complete = [], []
  with tempfile.TemporaryDirectory(dir=pathlib.Path.cwd()) as workdir:
    ckpts = checkpoint.Checkpoints(workdir, keep=2, writer=True)
    try:
      for step in range(1, repeats + 2):
        start = time.perf_counter()
        ckpts.save(step, saved, {"position": step}, {"config": name})
        returned = time.perf_counter()
        ckpts.wait()
        done = time.perf_counter()
        blocking.append(returned - start)
        complete.append(done - start)
      # A stopped run: save, wait, and close the manager (older checkpoints deleted) before it exits.
      start = time.perf_counter()
      ckpts.save(repeats + 2, saved, {"position": 0}, {"config": name})
      ckpts.wait()
    finally:
      ckpts.close()
    stop = time.perf_counter() - start
  seconds = statistics.median(complete[1:])
  return {"config": name, "parameters": transformer.count_params(model_cfg), "state_bytes": nbytes, "first_save_s": round(complete[0], 3),
          "blocking_s": round(statistics.median(blocking[1:]), 3), "complete_s": round(seconds, 3),
          "stop_s": round(stop, 3),
          "mb_per_s": round(nbytes / 1e6 / seconds, 1)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--configs", default=",".join(SHIPPED))
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default="", help="also write the result as JSON here")
  args = parser.parse_args()
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

  import jax

  rows = []
  for name in args.configs.split(","):
    rows.append(measure(name, args.repeats))
    r = rows[-1]
    print(f"{name:14s} {r['state_bytes'] / 1e6:8.1f} MB  blocks {r['blocking_s']:6.2f} s  complete "
          f"{r['complete_s']:6.2f} s  save+close {r['stop_s']:6.2f} s  ({r['mb_per_s']:.0f} MB/s; first save "
          f"{r['first_save_s']:.2f} s)", flush=True)
  result = {"device": f"{jax.device_count()} x {jax.devices()[0].device_kind}", "machine": platform.processor() or
            platform.machine(), "jax": jax.__version__, "folder": str(pathlib.Path.cwd()), "rows": rows}
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
  main()
