"""seq2seq-translate against CTranslate2 (float32 and int8) on one test set, in one run:
sentences/s and BLEU of each, and the parity of the export.

    pip install ".[ctranslate2]"
    SEQ2SEQ_DATA_DIR=../shared/data python benchmarks/ctranslate2_speed.py --workdir=workdirs/m30k \
        --out=benchmarks/results/ctranslate2_cpu2.json

The run's latest checkpoint is exported twice (`python -m seq2seq.export --format=ctranslate2`,
float32 and --quantization=int8, each verified at export) into a temporary folder. Then:

- **Speed and BLEU.** Each engine translates the split with beam 4, batches of 64 sentences,
  on the same cores: ours with the run's settings (`seq2seq-eval`'s: GNMT alpha, output
  limit a * source length + b), CTranslate2 with its default length normalisation
  (length_penalty 1: score / length) and the largest of our limits. Each engine translates
  once to warm up (our compilation, CTranslate2's first allocations), then --rounds times,
  alternating engines so that a busy machine slows all alike; the median is reported.
- **Parity.** Both search the same way (alpha 0 and length_penalty 0, our limit per
  sentence, `seq2seq.ct2.search_options`): the share of identical hypotheses, float32 and
  int8, and the BLEU of each.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="a trained run")
  parser.add_argument("--split", default="test_2016_flickr")
  parser.add_argument("--sentences", type=int, default=0, help="the first N sentences only (0: all)")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CTranslate2's intra_threads")
  parser.add_argument("--out", default="", help="write the results as JSON here")
  args = parser.parse_args()

  import ctranslate2
  import jax

  from seq2seq import Translator, ct2, data, export
  from seq2seq.inference import evaluate, score

  ours = Translator.from_workdir(args.workdir, batch_size=64, compilation_cache="")  # its first call compiles
  pairs = data.eval_pairs(ours.config, args.split)
  pairs = pairs[:args.sentences] if args.sentences else pairs
  sources, references = [s for s, _ in pairs], [r for _, r in pairs]
  sp, src_ids = ours.tok.sp, ours.tok.encode(sources)
  pieces = [[sp.id_to_piece(i) for i in ids[:-1]] for ids in src_ids]
  limits = [ours.max_output(len(ids)) for ids in src_ids]
  folder = pathlib.Path(tempfile.mkdtemp(prefix="ct2_speed_"))
  models, checks = {}, {}
  for quantization in (None, "int8"):
    name = quantization or "float32"
    path = export.export(args.workdir, folder / name, format="ctranslate2", quantization=quantization)
    checks[name] = json.loads((path / "export.json").read_text())["ctranslate2"]
    compute_type = "float32" if quantization is None else "auto"  # auto would run a float32 model in int8 too
    models[name] = ctranslate2.Translator(str(path), device="cpu", compute_type=compute_type, intra_threads=args.threads)
    checks[name]["compute_type"] = models[name].compute_type

  def ct2_translate(model):
    results = model.translate_batch(pieces, max_batch_size=64, beam_size=4, max_decoding_length=max(limits) - 1,
                                    max_input_length=0)
    return [sp.decode(r.hypotheses[0]) for r in results]

  engines = {"seq2seq": lambda: ours.translate(sources)}
  engines |= {f"ctranslate2 {name}": (lambda m=m: ct2_translate(m)) for name, m in models.items()}
  outputs, first = {}, {}
  for name, run in engines.items():  # warm-up: our compilation (no persistent cache), CTranslate2's first call
    start = time.perf_counter()
    outputs[name] = run()
    first[name] = time.perf_counter() - start
  seconds = {name: [] for name in engines}
  for _ in range(args.rounds):
    for name, run in engines.items():
      start = time.perf_counter()
      outputs[name] = run()
      seconds[name].append(time.perf_counter() - start)
  speed = {}
  for name in engines:
    s = statistics.median(seconds[name])
    bleu = score.score(outputs[name], references)
    speed[name] = {"seconds": s, "sentences_per_s": len(sources) / s, "bleu": bleu["bleu"], "chrf": bleu["chrf"],
                   "rounds": seconds[name], "first_seconds": first[name]}
    print(f"{name:22s} {len(sources) / s:7.1f} sentences/s  BLEU {bleu['bleu']:.2f}  chrF {bleu['chrf']:.2f}  "
          f"(first call {first[name]:.1f} s)", flush=True)

  exact = Translator.from_workdir(args.workdir, beam_size=4, alpha=0.0, batch_size=64)
  our_ids = exact.translate_ids(exact.params, src_ids)
  parity = {"seq2seq": {"bleu": score.score([sp.decode(o) for o in our_ids], references)["bleu"]}}
  for name, model in models.items():
    theirs = [ids for ids, _ in ct2.search(model, sp, src_ids, limits, 4)]
    same = sum(a == b for a, b in zip(our_ids, theirs))
    below = [a == b for a, b, n in zip(our_ids, theirs, limits) if len(a) + 1 < n and len(b) + 1 < n]
    limited = len(sources) - len(below)
    parity[name] = {"identical": same, "identical_share": same / len(sources), "reached_limit": limited,
                    "identical_below_limit": sum(below),
                    "bleu": score.score([sp.decode(t) for t in theirs], references)["bleu"]}
    print(f"parity (beam 4, alpha 0): ctranslate2 {name}: {same}/{len(sources)} hypotheses identical to ours "
          f"({parity[name]['identical_below_limit']}/{len(below)} of those below the length limit), "
          f"BLEU {parity[name]['bleu']:.2f} (ours {parity['seq2seq']['bleu']:.2f})", flush=True)

  results = {"workdir": str(args.workdir), "checkpoint": ours.checkpoint, "split": args.split,
             "sentences": len(sources), "hardware": evaluate.hardware(), "device_kind": jax.devices()[0].device_kind,
             "ctranslate2": ctranslate2.__version__, "jax": jax.__version__, "threads": args.threads,
             "decode": {"seq2seq": {"beam_size": ours.settings.beam_size, "alpha": ours.settings.alpha,
                                    "max_len_a": ours.settings.max_len_a, "max_len_b": ours.settings.max_len_b},
                        "ctranslate2": {"beam_size": 4, "length_penalty": 1.0,
                                        "max_decoding_length": max(limits) - 1}},
             "speed": speed, "parity": parity, "export_checks": checks}
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
  main()
