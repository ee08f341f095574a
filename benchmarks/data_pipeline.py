"""The data pipeline at WMT14 size on this machine, with configs/wmt14_base.py's settings.

  SEQ2SEQ_DATA_DIR=../shared/data python benchmarks/data_pipeline.py \
      [--pairs=4500000] [--out=benchmarks/results/data_pipeline_wmt_cpu2.json]

The corpus is made here (benchmarks/wmt_like.py): 4.5M pairs with the word counts of
newstest2013/2014 pairs and words drawn from their vocabulary. Each stage then runs in a
fresh process, as `train.py` would run it, timed, with its peak memory sampled (resident
set of the process and any children):
  tokenizer   data.tokenizer: a seeded sample of 1M sentences, sentencepiece training (37000)
  corpus      data.corpus: read, encode, clean, write the flat token arrays (the token cache)
  plan        python -m seq2seq.data --json: epoch 0's batches, bucketed and packed
Then, in this process: host time per 25k-token batch (make_batch, and the copy to the
device), against a train step of the wmt14_base model on this CPU for the commonest shape.
Goals (issue 25): text to token cache (tokenizer + corpus) <= 10 min at <= 4 GiB; an epoch
in <= 8 batch shapes at <= 5% padding bucketed, <= 3% packed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import psutil

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import wmt_like  # noqa: E402


def overrides(corpus_dir: pathlib.Path, cache: pathlib.Path, data_dir: str, vocab_size: int = 0) -> list[str]:
  return [f"--config.data.train_split=files:{corpus_dir}/wmt_like.{{lang}}", f"--config.data.cache_dir={cache}",
          f"--config.data.dir={data_dir}", *([f"--config.data.vocab_size={vocab_size}"] if vocab_size else [])]


def run_stage(code: str, args: list[str]) -> dict:
  """Runs `code` (python -c, with the config flags `args`) and samples the resident memory of
  it and its children every 50 ms; returns seconds, peak GiB, and its stdout."""
  start = time.perf_counter()
  proc = subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, stdout=subprocess.PIPE, text=True)
  peak, done = [0], threading.Event()

  def sample():
    root = psutil.Process(proc.pid)
    while not done.is_set():
      try:
        procs = [root] + root.children(recursive=True)
        peak[0] = max(peak[0], sum(p.memory_info().rss for p in procs))
      except psutil.Error:
        pass
      done.wait(0.05)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  out, _ = proc.communicate()
  done.set()
  sampler.join()
  if proc.returncode:
    raise RuntimeError(f"stage failed ({proc.returncode}): {code}")
  return {"seconds": time.perf_counter() - start, "peak_gib": peak[0] / 2**30, "stdout": out}


CONFIG = """
import sys
from absl import flags
from ml_collections import config_flags
from seq2seq import data
flag = config_flags.DEFINE_config_file("config", "configs/wmt14_base.py")
flags.FLAGS(sys.argv)
config = flag.value
"""
TOKENIZER = CONFIG + "data.load_tokenizer(config)\n"
CORPUS = CONFIG + "print(len(data.load_corpus(config, config.data.train_split, data.load_tokenizer(config))))\n"
PLAN = "import sys; from seq2seq.data import pipeline; pipeline.main(sys.argv[:1] + ['--config=configs/wmt14_base.py', " \
       "'--json'] + sys.argv[1:])\n"


def batch_times(config, n: int = 200) -> dict:
  """Host milliseconds per batch: built (make_batch) and put on the device (put_batch)."""
  import jax

  from seq2seq import data, sharding

  tok = data.load_tokenizer(config)
  iterator = data.train_iterator(config, tok)
  mesh = sharding.make_mesh(config.mesh)
  iterator.plan(0)
  build, put, shapes = [], [], collections.Counter()
  for _ in range(n):
    start = time.perf_counter()
    batch = next(iterator)
    build.append(time.perf_counter() - start)
    start = time.perf_counter()
    jax.block_until_ready(sharding.put_batch(batch, mesh))
    put.append(time.perf_counter() - start)
    shapes[(batch["src_bs"].shape[0], batch["src_bs"].shape[1], batch["tgt_out_bt"].shape[1])] += 1
  return {"build_ms": 1e3 * float(np.median(build)), "put_ms": 1e3 * float(np.median(put)),
          "commonest_shape": list(shapes.most_common(1)[0][0]), "batches_timed": n}


def train_step_seconds(config, shape) -> float:
  """One train step of the config's model on this CPU (after compiling), on a random batch."""
  import jax
  import optax

  from seq2seq import sharding
  from seq2seq.model.config import ModelConfig
  from seq2seq.training.train import Steps, init_state

  rows, s, t = shape
  model_cfg = ModelConfig.from_config(config.model, vocab_size=config.data.vocab_size)
  mesh = sharding.make_mesh(config.mesh)
  tx = optax.adam(1e-4)
  graphdef, state, shardings = init_state(model_cfg, tx, mesh, 0)
  steps = Steps(config, graphdef, shardings, mesh, tx, lambda step: 1e-4)
  rng = np.random.default_rng(0)
  batch = {k: rng.integers(3, config.data.vocab_size, (rows, n)).astype(np.int32)
           for k, n in (("src_bs", s), ("tgt_in_bt", t), ("tgt_out_bt", t))}
  batch |= {"src_segments_bs": np.ones((rows, s), np.int32), "tgt_segments_bt": np.ones((rows, t), np.int32),
            "src_positions_bs": np.tile(np.arange(s, dtype=np.int32), (rows, 1)),
            "tgt_positions_bt": np.tile(np.arange(t, dtype=np.int32), (rows, 1))}
  batch = sharding.put_batch(batch, mesh)
  state, m = steps.update(state, [batch])
  jax.block_until_ready(m)
  start = time.perf_counter()
  state, m = steps.update(state, [batch])
  jax.block_until_ready(m)
  return time.perf_counter() - start


def step_against_host(config, host: dict) -> dict:
  """The wmt14_base step on the commonest batch shape: measured on this CPU on an eighth of
  the rows (the whole batch's f32 logits and their gradient do not fit in 24 GiB) and scaled
  up, and what it would take on an accelerator at 400 TFLOP/s (about 40% of an H100's bf16
  peak), both against the host's time per batch."""
  from seq2seq.model import flops
  from seq2seq.model.config import ModelConfig

  rows, s, t = host["commonest_shape"]
  step_flops = flops.train_step_flops(ModelConfig.from_config(config.model, vocab_size=config.data.vocab_size),
                                      rows, s, t)
  cpu_s = 8 * train_step_seconds(config, (rows // 8, s, t))
  host_s = (host["build_ms"] + host["put_ms"]) / 1e3
  return {"model": "wmt14_base (65M parameters), f32", "shape": [rows, s, t], "flops": step_flops,
          "cpu_seconds_8x_an_eighth": cpu_s, "host_over_cpu_step": host_s / cpu_s,
          "accelerator_seconds_at_400_tflops": step_flops / 400e12,
          "host_over_accelerator_step": host_s / (step_flops / 400e12)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--pairs", type=int, default=4_500_000)
  parser.add_argument("--data_dir", default=os.environ.get("SEQ2SEQ_DATA_DIR", str(REPO.parent / "shared/data")))
  parser.add_argument("--out", default="")
  parser.add_argument("--skip_train_step", action="store_true")
  parser.add_argument("--vocab_size", type=int, default=0, help="sentencepiece pieces (0: the config's 37000)")
  parser.add_argument("--batches", type=int, default=200, help="batches timed on the host")
  args = parser.parse_args()
  from seq2seq.inference.evaluate import hardware

  results = {"machine": hardware(),
             "memory_gib": psutil.virtual_memory().total / 2**30, "config": "configs/wmt14_base.py"}

  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    start = time.perf_counter()
    results["text"] = wmt_like.write(args.data_dir, args.pairs, tmp / "text")
    results["text"]["write_s"] = time.perf_counter() - start
    flags = overrides(tmp / "text", tmp / "cache", args.data_dir, args.vocab_size)
    for name, code in (("tokenizer", TOKENIZER), ("corpus", CORPUS)):
      stage = run_stage(code, flags)
      results[name] = {"seconds": stage["seconds"], "peak_gib": stage["peak_gib"]}
      print(name, results[name], flush=True)
    results["text_to_token_cache"] = {
        "seconds": results["tokenizer"]["seconds"] + results["corpus"]["seconds"],
        "peak_gib": max(results["tokenizer"]["peak_gib"], results["corpus"]["peak_gib"]),
        "pairs_per_s": args.pairs / (results["tokenizer"]["seconds"] + results["corpus"]["seconds"])}
    for mode, extra in (("bucketed", []), ("packed", ["--config.data.packing=true"])):
      stage = run_stage(PLAN, flags + extra)
      stats = json.loads(stage["stdout"].strip().splitlines()[-1])
      results[mode] = {k: stats[k] for k in ("batching", "batches", "batch_shapes", "padding_fraction")} | {
          "seconds_from_cache": stage["seconds"], "peak_gib": stage["peak_gib"]}
      print(mode, results[mode], flush=True)
    results["pairs_kept"], results["tokens"] = stats["pairs"], stats["tokens"]
    results["length_percentiles"] = stats["length_percentiles"]

    from seq2seq.configs import wmt14_base
    for mode, packing in (("bucketed", False), ("packed", True)):
      config = wmt14_base.get_config()
      config.data.update(train_split=f"files:{tmp}/text/wmt_like.{{lang}}", cache_dir=str(tmp / "cache"),
                         dir=args.data_dir, packing=packing, vocab_size=args.vocab_size or config.data.vocab_size)
      results[mode]["host_per_batch"] = batch_times(config, args.batches)
      print(mode, results[mode]["host_per_batch"], flush=True)
    if not args.skip_train_step:
      results["train_step"] = step_against_host(wmt14_base.get_config(), results["bucketed"]["host_per_batch"])
      print(results["train_step"], flush=True)

  text = json.dumps(results, indent=1)
  print(text)
  if args.out:
    pathlib.Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
  main()
