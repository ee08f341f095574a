"""Compiled search programs, compile seconds and sentences/s of a WMT-size test set.

newstest2014 (3003 sentences, $SEQ2SEQ_DATA_DIR/wmt14) is translated with beam 4 by a
wmt14_base-size model (d512, 6+6 layers) at its random initialisation, with a joint
8000-piece sentencepiece model trained on newstest2013. A random model never chooses eos,
so every sentence is decoded to its output limit; the limits are the source lengths
(max_len_a=1, max_len_b=0, about the references' lengths in pieces).

Two ways to choose the batch shapes, in one run on the same model and sentences:
- `buckets`: one compiled search per source bucket the set's lengths fall in (the behaviour
  before issue 46; `Translator(max_programs=0)`);
- `planned`: at most 3, fitted to the set's lengths (`max_programs=3`, the default).

Each first compiles the programs its batches need (several at once, as a translation does,
without the persistent compilation cache), then translates: `compile_s` is the wall time
until every program is compiled, `decode_s` the translation after that. The hypotheses of
the two must be identical. On a GPU, where a
program's rounding depends on its shapes, `buckets_half` (batches of half as many sentences,
one program per bucket) shows how many hypotheses of the (tie-prone) random model change
with the batch shape alone.

  SEQ2SEQ_DATA_DIR=../shared/data python benchmarks/decode_programs.py \\
      --out=benchmarks/results/decode_programs_cpu2.json
  python benchmarks/decode_programs.py --sentences=300 --modes=planned   # a quicker look
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
MODES = {"buckets": 0, "planned": 3}  # max_programs; a mode NAME_half uses batches of half the sentences
sys.path.insert(0, str(REPO))


def build(config_path: str, vocab: int, dtype: str):
  from flax import nnx

  import device_check  # beside this file: seq2seq.configs from a checkout that is not installed

  device_check.use_this_checkout()
  from seq2seq import sharding
  from seq2seq import configs
  from seq2seq.data import tokenizer
  from seq2seq.data.sources import Source
  from seq2seq.model.config import ModelConfig
  from seq2seq.model.transformer import Transformer

  config = configs.get(config_path)
  config.model.dtype = dtype
  data_dir = os.environ.get("SEQ2SEQ_DATA_DIR", str(REPO.parent / "shared" / "data"))
  train = list(Source("files:wmt14/newstest2013.{lang}", "en", "de", data_dir=data_dir))
  test = [s for s, _ in Source("files:wmt14/newstest2014.{lang}", "en", "de", data_dir=data_dir)]
  tok = tokenizer.Tokenizer(tokenizer.train([s for pair in train for s in pair], vocab_size=vocab))
  model_cfg = ModelConfig.from_config(config.model, vocab_size=tok.vocab_size)
  mesh = sharding.make_mesh(config.mesh)
  graphdef, params = nnx.split(Transformer(model_cfg, rngs=nnx.Rngs(0)))
  return model_cfg, graphdef, params, tok, mesh, test


def run_mode(name: str, translator, params, sentences: list[str]) -> tuple[dict, list[str]]:
  """Compiles the programs the sentences need, then translates them."""
  from seq2seq.inference.translate import Want

  ids = translator.tok.encode(sentences)
  lengths = sorted((len(s) for s in ids), reverse=True)
  batches = translator._batches(lengths)
  start = time.perf_counter()
  keys = list(dict.fromkeys(translator._program_key(params, size, width, Want()) for _, size, width in batches))
  for key in keys:
    translator.programs.get(key)
  compile_s = time.perf_counter() - start
  start = time.perf_counter()
  hypotheses = translator(params, sentences)
  decode_s = time.perf_counter() - start
  shapes = sorted({(size, width) for _, size, width in batches})
  row = {"programs": len(keys), "shapes": [f"{b}x{w}" for b, w in shapes], "compile_s": round(compile_s, 2),
         "compile_s_summed": round(sum(translator.programs.seconds[k] for k in keys), 2),
         "decode_s": round(decode_s, 2), "sentences_per_s": round(len(sentences) / decode_s, 2),
         "total_s": round(compile_s + decode_s, 2), "padded_source_tokens": sum(
             size * width for _, size, width in batches), "source_tokens": sum(lengths)}
  print(f"{name:8s} {row['programs']} programs {row['shapes']}: compile {compile_s:.1f} s, "
        f"decode {decode_s:.1f} s ({row['sentences_per_s']:.2f} sentences/s)", flush=True)
  return row, hypotheses


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/wmt14_base.py")
  parser.add_argument("--vocab", type=int, default=8000)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--sentences", type=int, default=0, help="the first N of newstest2014 (0: all 3003)")
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--modes", default="buckets,planned")
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # compile every program (no persistent cache)

  import jax

  from seq2seq.inference import evaluate
  from seq2seq.inference.translate import Translator

  model_cfg, graphdef, params, tok, mesh, test = build(args.config, args.vocab, args.dtype)
  sentences = test[:args.sentences or len(test)]
  result = {"model": f"random {pathlib.Path(args.config).stem} ({model_cfg.d_model}d, {model_cfg.num_encoder_layers}"
                     f"+{model_cfg.num_decoder_layers} layers, vocab {tok.vocab_size}, {args.dtype})",
            "test_set": "newstest2014", "sentences": len(sentences), "beam_size": args.beam_size,
            "batch_size": args.batch_size, "limits": "max_len_a=1, max_len_b=0", "hardware": evaluate.hardware(),
            "jax": jax.__version__, "modes": {}}
  outputs = {}
  for mode in args.modes.split(","):
    translator = Translator(model_cfg, graphdef, tok, mesh, beam_size=args.beam_size, alpha=0.6, max_len_a=1.0,
                            max_len_b=0, batch_size=args.batch_size // (2 if mode.endswith("_half") else 1),
                            max_programs=MODES[mode.removesuffix("_half")])
    result["modes"][mode], outputs[mode] = run_mode(mode, translator, params, sentences)
  if len(outputs) > 1:
    first_mode, first = next(iter(outputs.items()))
    result["identical_hypotheses"] = all(o == first for o in outputs.values())
    for mode, hyps in outputs.items():  # sentences translated otherwise than by the first mode
      result["modes"][mode][f"differing_from_{first_mode}"] = sum(a != b for a, b in zip(hyps, first))
    print(f"identical hypotheses: {result['identical_hypotheses']}; differing sentences: "
          f"{ {m: r[f'differing_from_{first_mode}'] for m, r in result['modes'].items()} }")
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
  main()
