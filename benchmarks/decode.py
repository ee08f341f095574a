"""Decoding speed on Multi30k test_2016_flickr (1000 sentences): sentences/s of greedy and
beam-4 search, each with the key/value cache and without it (the whole prefix rerun at
every step), so the cache's speed-up is measured in the same run.

  SEQ2SEQ_DATA_DIR=../shared/data python benchmarks/decode.py               # 40 steps each
  python benchmarks/decode.py --workdir=DIR                                  # a trained run

Without --workdir the model is the multi30k config's (d_model 256, 3+3 layers, vocab 8000)
at its random initialisation, and every sentence is decoded for exactly --steps tokens
(eos is forbidden before that), which is how the baselines are quoted: the Flax WMT
example's cached beam 4 takes 38 s for 1000 sentences at 40 steps; an uncached PyTorch
greedy decoder 53 s. With --workdir, the run's latest checkpoint decodes with its own
stopping, as eval.py does. Compilation is excluded (one warm-up per batch shape).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", default="", help="a training run (default: a random multi30k-config model)")
  parser.add_argument("--split", default="test_2016_flickr")
  parser.add_argument("--sentences", type=int, default=1000)
  parser.add_argument("--uncached_sentences", type=int, default=0,
                      help="sentences for the uncached runs (slow); 0 = the same as --sentences")
  parser.add_argument("--steps", type=int, default=40, help="tokens per sentence without --workdir")
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--modes", default="greedy,beam4,greedy-uncached,beam4-uncached")
  parser.add_argument("--out", default="", help="write the results as JSON here")
  args = parser.parse_args()

  import jax
  from flax import nnx

  from seq2seq import data, sharding
  from seq2seq.inference import evaluate, load
  from seq2seq.inference.translate import Translator, source_bucket
  from seq2seq.model.config import ModelConfig
  from seq2seq.model.transformer import Transformer

  if args.workdir:
    config = load.run_config(args.workdir)
    mesh = sharding.make_mesh(config.mesh)
    model_cfg, graphdef, params, tok, label = load.load_params(args.workdir, config, mesh)
    lengths = dict(max_len_a=config.eval.max_len_a, max_len_b=config.eval.max_len_b, min_len=0)
  else:
    from seq2seq.configs import multi30k

    config = multi30k.get_config()
    mesh = sharding.make_mesh(config.mesh)
    tok = data.load_tokenizer(config)
    model_cfg = ModelConfig.from_config(config.model, vocab_size=tok.vocab_size)
    graphdef, params = nnx.split(Transformer(model_cfg, rngs=nnx.Rngs(0)))
    label = f"random multi30k model, {args.steps} steps per sentence"
    lengths = dict(max_len_a=0.0, max_len_b=args.steps, min_len=args.steps)
  sources = [s for s, _ in data.eval_pairs(config, args.split)][:args.sentences]
  ids = tok.encode(sources)

  results = {"model": label, "split": args.split, "batch_size": args.batch_size, "devices": jax.device_count(),
             "device_kind": jax.devices()[0].device_kind, "hardware": evaluate.hardware(), "modes": {}}
  for mode in args.modes.split(","):
    beam = 4 if mode.startswith("beam4") else 1
    uncached = mode.endswith("uncached")
    translator = Translator(model_cfg, graphdef, tok, mesh, beam_size=beam, alpha=0.6, batch_size=args.batch_size,
                            use_cache=not uncached, **lengths)
    subset = ids[:args.uncached_sentences or len(ids)] if uncached else ids
    warm = {source_bucket(len(s)): s for s in subset}  # one sentence per batch shape
    translator.translate_ids(params, list(warm.values()))
    start = time.perf_counter()
    outputs = translator.translate_ids(params, subset)
    seconds = time.perf_counter() - start
    tokens = sum(len(o) + 1 for o in outputs)
    results["modes"][mode] = {"sentences": len(subset), "seconds": seconds, "sentences_per_s": len(subset) / seconds,
                              "output_tokens_per_s": tokens / seconds}
    print(f"{mode:16s} {len(subset):5d} sentences {seconds:7.1f} s  {len(subset) / seconds:7.1f} sentences/s  "
          f"{tokens / seconds:8.0f} tokens/s", flush=True)
  modes = results["modes"]
  for search in ("greedy", "beam4"):
    if search in modes and f"{search}-uncached" in modes:
      speedup = modes[search]["sentences_per_s"] / modes[f"{search}-uncached"]["sentences_per_s"]
      results[f"{search}_cache_speedup"] = speedup
      print(f"{search}: the cache is {speedup:.1f}x faster than rerunning the prefix")
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
  main()
