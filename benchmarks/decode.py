"""Decoding speed on Multi30k test_2016_flickr (1000 sentences), in sentences/s.

Two workloads:

- **Forced** (default): the former multi30k model (d_model 256, 3+3 layers, d_ff 1024, vocab
  8000: the sizes ../shared/bench/flax_wmt_decode.py pins, and those of the committed results) at
  its random initialisation decodes every sentence for exactly --steps tokens (eos is
  forbidden before that). Modes: greedy and beam 4, each with the key/value cache and
  without it (the whole prefix rerun at every step), and with --flax the Flax WMT example's
  cached beam-4 search on the same-shaped model, timed in the same run:

    git clone --depth=1 https://github.com/google/flax /tmp/flax   # outside this repo
    SEQ2SEQ_DATA_DIR=../shared/data python benchmarks/decode.py --flax=/tmp/flax --modes=beam4,greedy \
        --rounds=2 --out=benchmarks/results/decode_cpu2.json

  Its code is imported from that checkout at run time, never copied here. Its search is
  forced by an eos id the model cannot emit, so it runs max_decode_len - 1 = --steps steps.
- **Test set** (--workdir=DIR): a trained run's latest checkpoint translates the split as
  `eval.py` does (beam and length settings from its config, real stopping). "cold" is the
  first translation in the process, compilation included (no persistent compilation cache);
  "warm" the second, compiled already.

    python benchmarks/decode.py --workdir=workdirs/m30k --out=benchmarks/results/eval_speed_cpu2.json
    python benchmarks/decode.py --workdir=workdirs/m30k --max_len_b=17   # other output limits
    python benchmarks/decode.py --workdir=workdirs/m30k --profile=/tmp/decode_trace   # where the time goes

  --profile traces one more warm translation, one batch at a time, with XLA:CPU timing every
  operation, and prints the operations that took longest (the trace opens in Perfetto).

Rounds alternate the modes (ours, Flax, ours, Flax, ...), so a busy machine slows both alike;
the ratio is taken within each round. Forced runs exclude compilation (one warm-up call per
batch shape).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def flax_wmt_search(flax_dir: str, model_cfg, *, beam_size: int, steps: int):
  """A function (sources [b, s] int32) -> tokens [b, steps + 1] running the Flax WMT example's
  beam search (examples/wmt/decode.py) on its Transformer (examples/wmt/models.py), shaped like
  `model_cfg` and randomly initialised, with the calls its train.py predict_step makes."""
  import jax
  import jax.numpy as jnp

  wmt = pathlib.Path(flax_dir) / "examples" / "wmt"
  if not (wmt / "decode.py").is_file():
    raise SystemExit(f"--flax={flax_dir}: no examples/wmt/decode.py there (see this file's docstring)")
  flax_decode, flax_models = (_import_file(f"flax_wmt_{name}", wmt / f"{name}.py") for name in ("decode", "models"))

  base = flax_models.TransformerConfig(
      vocab_size=model_cfg.vocab_size, output_vocab_size=model_cfg.vocab_size, share_embeddings=True,
      logits_via_embedding=True, emb_dim=model_cfg.d_model, num_heads=model_cfg.num_heads,
      num_layers=model_cfg.num_encoder_layers, qkv_dim=model_cfg.d_model, mlp_dim=model_cfg.d_ff,
      max_len=model_cfg.max_len, dropout_rate=0.0, attention_dropout_rate=0.0, deterministic=True)
  cfg = base.replace(decode=True)
  params = jax.jit(flax_models.Transformer(base).init)(jax.random.key(0), jnp.ones((1, 8), jnp.int32),
                                                       jnp.ones((1, 8), jnp.int32))["params"]
  max_decode_len = steps + 1  # its loop runs while cur_index < max_decode_len - 1

  @jax.jit
  def predict(params, inputs):
    init = lambda: flax_models.Transformer(cfg).init(jax.random.key(0), jnp.ones(inputs.shape, jnp.int32),
                                                      jnp.ones((inputs.shape[0], max_decode_len), jnp.int32))
    cache = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(init)["cache"])  # its initial cache
    model = flax_models.Transformer(cfg)
    encoded = flax_decode.flat_batch_beam_expand(
        model.apply({"params": params}, inputs, method=flax_models.Transformer.encode), beam_size)
    raw_inputs = flax_decode.flat_batch_beam_expand(inputs, beam_size)

    def tokens_ids_to_logits(flat_ids, flat_cache):
      logits, new_vars = model.apply({"params": params, "cache": flat_cache}, encoded, raw_inputs, flat_ids,
                                     mutable=["cache"], method=flax_models.Transformer.decode)
      return logits.squeeze(axis=1), new_vars["cache"]

    seqs, _ = flax_decode.beam_search(inputs, cache, tokens_ids_to_logits, beam_size=beam_size, alpha=0.6,
                                      eos_id=-1, max_decode_len=max_decode_len)  # no eos: forced
    return seqs[:, -1]

  return lambda sources: predict(params, sources)


def _import_file(name: str, path: pathlib.Path):
  """The module at `path` (the Flax example's files, under names of their own)."""
  import importlib.util

  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def profile(run, folder: str, top: int = 25) -> list[dict]:
  """Runs `run` under `jax.profiler` into `folder` and prints the `top` operations by total
  time (each with how many times it ran); returns them."""
  import collections
  import gzip

  import jax

  jax.profiler.start_trace(folder, create_perfetto_trace=True)
  start = time.perf_counter()
  run()
  seconds = time.perf_counter() - start
  jax.profiler.stop_trace()
  trace = max(pathlib.Path(folder).rglob("*.trace.json.gz"), key=lambda f: f.stat().st_mtime)
  events = json.load(gzip.open(trace))
  total, count = collections.Counter(), collections.Counter()
  for e in events["traceEvents"] if isinstance(events, dict) else events:
    name = e.get("name", "")
    # XLA operations only: not Python frames ($...), calls (np.asarray(...)) or the runtime's spans (A::B).
    if e.get("ph") == "X" and not name.startswith("$") and "(" not in name and "::" not in name:
      total[name] += e.get("dur", 0) / 1e6
      count[name] += 1
  print(f"profiled translation {seconds:.1f} s, operations {sum(total.values()):.1f} s; longest ({trace}):")
  rows = [{"op": name, "seconds": t, "count": count[name]} for name, t in total.most_common(top)]
  for r in rows:
    print(f"  {r['seconds']:7.3f} s {r['count']:7d}x  {r['op']}")
  return rows


def batches(ids: list[list[int]], batch_size: int):
  """Padded [batch_size, bucket] arrays of the sentences, longest first, as Translator batches them."""
  import numpy as np

  from seq2seq.inference.translate import source_bucket

  order = sorted(ids, key=len, reverse=True)
  for start in range(0, len(order), batch_size):
    rows = order[start:start + batch_size]
    src = np.zeros((batch_size, source_bucket(max(map(len, rows)))), np.int32)
    src[:, 0] = 1
    for r, s in enumerate(rows):
      src[r, :len(s)] = s
    yield src


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", default="", help="a training run: time its test-set translation (real stopping)")
  parser.add_argument("--max_len_b", type=int, default=None,
                      help="with --workdir: output limit source + this (default: the run's eval.max_len_b)")
  parser.add_argument("--split", default="test_2016_flickr")
  parser.add_argument("--sentences", type=int, default=1000)
  parser.add_argument("--uncached_sentences", type=int, default=0,
                      help="sentences for the uncached runs (slow); 0 = the same as --sentences")
  parser.add_argument("--steps", type=int, default=40, help="tokens per sentence without --workdir")
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--modes", default="greedy,beam4,greedy-uncached,beam4-uncached")
  parser.add_argument("--flax", default="", help="a checkout of google/flax: also time its WMT example's beam 4")
  parser.add_argument("--rounds", type=int, default=1, help="times each mode runs, alternating")
  parser.add_argument("--out", default="", help="write the results as JSON here")
  parser.add_argument("--profile", default="", help="with --workdir: trace a warm translation into this folder")
  args = parser.parse_args()
  if args.profile:  # XLA:CPU records each operation in the trace only when asked, before jax starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true").strip()

  import jax
  from flax import nnx

  from seq2seq import data, sharding
  from seq2seq.inference import evaluate
  from seq2seq.inference.translate import Translator, source_bucket
  from seq2seq.model.config import ModelConfig
  from seq2seq.model.transformer import Transformer

  results = {"split": args.split, "batch_size": args.batch_size, "devices": jax.device_count(),
             "device_kind": jax.devices()[0].device_kind, "hardware": evaluate.hardware(), "modes": {}}
  if args.workdir:
    translator = Translator.from_workdir(args.workdir, batch_size=args.batch_size, max_len_b=args.max_len_b)
    sources = [s for s, _ in data.eval_pairs(translator.config, args.split)][:args.sentences]
    results |= {"model": f"{args.workdir} ({translator.checkpoint})", "decode": dataclasses.asdict(translator.settings),
                "compact": list(getattr(translator, "compact", ()))}
    for mode in ("cold", "warm"):
      start = time.perf_counter()
      hypotheses = translator.translate(sources)
      seconds = time.perf_counter() - start
      results["modes"][mode] = {"sentences": len(sources), "seconds": seconds,
                                "sentences_per_s": len(sources) / seconds}
      print(f"{mode:6s} {len(sources):5d} sentences {seconds:7.1f} s  {len(sources) / seconds:7.1f} sentences/s",
            flush=True)
    results["output_tokens"] = sum(len(ids) + 1 for ids in translator.tok.encode(hypotheses))
    if args.profile:
      translator.workers = 1  # one loop at a time: operation times add up to the wall time
      results["profile"] = profile(lambda: translator.translate(sources), args.profile)
  else:
    from seq2seq.configs import multi30k

    config = multi30k.get_config()
    # As the Flax WMT example's model, which it is compared with: sinusoidal, and the sizes the
    # main job had until 2026-11-28 (the committed results' model).
    config.model.update(positions="sinusoidal", d_model=256, num_heads=4, d_ff=1024, num_encoder_layers=3,
                        num_decoder_layers=3)
    mesh = sharding.make_mesh(config.mesh)
    tok = data.load_tokenizer(config)
    model_cfg = ModelConfig.from_config(config.model, vocab_size=tok.vocab_size)
    graphdef, params = nnx.split(Transformer(model_cfg, rngs=nnx.Rngs(0)))
    results["model"] = f"random multi30k model, {args.steps} steps per sentence"
    ids = tok.encode([s for s, _ in data.eval_pairs(config, args.split)][:args.sentences])
    runners = {}
    for mode in args.modes.split(","):
      beam = 4 if mode.startswith("beam4") else 1
      uncached = mode.endswith("uncached")
      subset = ids[:args.uncached_sentences or len(ids)] if uncached else ids
      translator = Translator(model_cfg, graphdef, tok, mesh, beam_size=beam, alpha=0.6, batch_size=args.batch_size,
                              use_cache=not uncached, max_len_a=0.0, max_len_b=args.steps, min_len=args.steps)
      for sentence in {source_bucket(len(s)): s for s in subset}.values():
        translator.translate_ids(params, [sentence])  # compile each batch shape (one call each)
      runners[mode] = (len(subset), lambda t=translator, s=subset: sum(len(o) + 1 for o in t.translate_ids(params, s)))
    if args.flax:
      search = flax_wmt_search(args.flax, model_cfg, beam_size=4, steps=args.steps)
      flax_batches = list(batches(ids, args.batch_size))
      for src in {b.shape[1]: b for b in flax_batches}.values():
        jax.block_until_ready(search(src))  # compile each shape

      def run_flax():
        for src in flax_batches:
          jax.device_get(search(src))  # as Translator fetches each batch's output
        return len(ids) * args.steps

      runners["flax-beam4"] = (len(ids), run_flax)
    for round_ in range(args.rounds):
      for mode, (count, run) in runners.items():
        start = time.perf_counter()
        tokens = run()
        seconds = time.perf_counter() - start
        results["modes"].setdefault(mode, {"sentences": count, "rounds": []})["rounds"].append(seconds)
        print(f"round {round_ + 1} {mode:16s} {count:5d} sentences {seconds:7.1f} s  {count / seconds:7.1f} "
              f"sentences/s  {tokens / seconds:8.0f} tokens/s", flush=True)
    for mode, entry in results["modes"].items():
      entry["seconds"] = statistics.median(entry["rounds"])
      entry["sentences_per_s"] = entry["sentences"] / entry["seconds"]
    modes = results["modes"]
    for search_name in ("greedy", "beam4"):
      if search_name in modes and f"{search_name}-uncached" in modes:
        speedup = modes[search_name]["sentences_per_s"] / modes[f"{search_name}-uncached"]["sentences_per_s"]
        results[f"{search_name}_cache_speedup"] = speedup
        print(f"{search_name}: the cache is {speedup:.1f}x faster than rerunning the prefix")
    if "flax-beam4" in modes and "beam4" in modes:
      ratios = [f / o for o, f in zip(modes["beam4"]["rounds"], modes["flax-beam4"]["rounds"])]
      results["beam4_vs_flax_wmt"] = {"per_round": ratios, "median": statistics.median(ratios)}
      print(f"beam4: {statistics.median(ratios):.2f}x the Flax WMT example's sentences/s "
            f"(per round: {', '.join(f'{r:.2f}' for r in ratios)})")
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
  main()
