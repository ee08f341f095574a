"""Data pipeline at WMT scale: Multi30k repeated to 4.5M pairs, then sentencepiece
training, tokenizing + cleaning + caching, epoch planning (bucketing and packing), and
batch production, against the time a training step of the multi30k model takes.

  SEQ2SEQ_DATA_DIR=../shared/data python benchmarks/data_pipeline.py [--pairs=4500000]

Goal on the 2-core CPU: tokenize + bucket <= 10 min and <= 4 GB peak memory; batches
produced at least 10x faster than a training step consumes them.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from seq2seq import corpus as corpus_lib  # noqa: E402
from seq2seq import tokenizer as tk  # noqa: E402
from seq2seq.batching import Batching, BatchIterator, epoch_plan, plan_stats  # noqa: E402
from seq2seq.sources import Source  # noqa: E402


def peak_rss_gib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def build_corpus_files(data_dir: str, pairs: int, out: pathlib.Path) -> Source:
  base = list(Source("multi30k:train", "en", "de", data_dir=data_dir))
  with open(out / "big.en", "w", encoding="utf-8") as en, open(out / "big.de", "w", encoding="utf-8") as de:
    written = 0
    while written < pairs:
      chunk = base[:pairs - written]
      en.write("".join(s + "\n" for s, _ in chunk))
      de.write("".join(t + "\n" for _, t in chunk))
      written += len(chunk)
  return Source(f"files:{out}/big.{{lang}}", "en", "de")


def train_step_seconds(shape: tuple[int, int, int], vocab_size: int) -> float:
  """Median time of a forward+backward+update step of the multi30k model on `shape`."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from configs import multi30k
  from seq2seq.config import ModelConfig
  from seq2seq.transformer import Transformer

  cfg = ModelConfig.from_config(multi30k.get_config().model, vocab_size=vocab_size)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  rows, s, t = shape
  rng = np.random.default_rng(0)
  src, tgt = (jnp.asarray(rng.integers(3, vocab_size, (rows, n)), jnp.int32) for n in (s, t))

  @jax.jit
  def step(params, key):
    def loss(params):
      logits = nnx.merge(graphdef, params)(src, tgt, dropout_rng=key)
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tgt[..., None], -1))
    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

  params = step(params, jax.random.key(0))
  jax.block_until_ready(params)
  times = []
  for i in range(5):
    start = time.perf_counter()
    params = step(params, jax.random.key(i))
    jax.block_until_ready(params)
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--pairs", type=int, default=4_500_000)
  parser.add_argument("--vocab_size", type=int, default=8000)
  parser.add_argument("--spm_sample_size", type=int, default=2_000_000)
  parser.add_argument("--max_tokens", type=int, default=2048)
  parser.add_argument("--data_dir", default=os.environ.get("SEQ2SEQ_DATA_DIR", "../shared/data"))
  parser.add_argument("--skip_train_step", action="store_true")
  args = parser.parse_args()
  results = {"pairs": args.pairs}

  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    start = time.perf_counter()
    src = build_corpus_files(args.data_dir, args.pairs, tmp)
    results["write_corpus_s"] = time.perf_counter() - start

    start = time.perf_counter()
    sample = tk.sample_sentences(src, args.spm_sample_size, seed=0)
    results["spm_sample_s"] = time.perf_counter() - start
    start = time.perf_counter()
    tok = tk.Tokenizer(tk.train(sample, vocab_size=args.vocab_size, seed=0))
    results["spm_train_s"] = time.perf_counter() - start
    del sample

    start = time.perf_counter()
    corpus = corpus_lib.build(src, src.fingerprint(), tok, corpus_lib.Cleaning(), tmp / "cache", src.spec)
    results["tokenize_s"] = time.perf_counter() - start
    results["tokens"] = corpus.stats["tokens"]
    results["kept"] = corpus.stats["pairs"]["kept"]

    start = time.perf_counter()
    corpus = corpus_lib.build(src, src.fingerprint(), tok, corpus_lib.Cleaning(), tmp / "cache", src.spec)
    results["cached_load_s"] = time.perf_counter() - start

    for packing in (False, True):
      mode = "packing" if packing else "bucketing"
      cfg = Batching(max_tokens=args.max_tokens, packing=packing)
      start = time.perf_counter()
      plan = epoch_plan(corpus.src_lengths, corpus.tgt_lengths, cfg, 0, 0)
      results[f"{mode}_plan_s"] = time.perf_counter() - start
      stats = plan_stats(plan, corpus.src_lengths, corpus.tgt_lengths)
      results[f"{mode}_batches"] = stats["batches"]
      results[f"{mode}_padding_fraction"] = stats["padding_fraction"]
      results[f"{mode}_shapes"] = len(stats["shapes"])
      iterator = BatchIterator(corpus, cfg, seed=0)
      iterator.plan(0)
      n = 500
      start = time.perf_counter()
      for _ in range(n):
        next(iterator)
      results[f"{mode}_batch_ms"] = (time.perf_counter() - start) / n * 1e3
    results["tokenize_plus_bucketing_s"] = results["tokenize_s"] + results["bucketing_plan_s"]
    results["peak_rss_gib"] = peak_rss_gib()

    if not args.skip_train_step:
      shapes = [p.shape for p in plan_and_shapes(corpus, args.max_tokens)]
      typical = max(set(shapes), key=shapes.count)
      results["train_step_shape"] = typical
      results["train_step_ms"] = train_step_seconds(typical, tok.vocab_size) * 1e3
      results["batch_vs_step_speedup"] = results["train_step_ms"] / results["bucketing_batch_ms"]
  print(json.dumps(results, indent=1))


def plan_and_shapes(corpus, max_tokens):
  return epoch_plan(corpus.src_lengths, corpus.tgt_lengths, Batching(max_tokens=max_tokens), 0, 0)


if __name__ == "__main__":
  main()
