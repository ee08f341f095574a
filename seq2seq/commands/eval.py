"""Evaluates a training run with sacreBLEU: seq2seq-eval --workdir=DIR (or python eval.py).

  seq2seq-eval --workdir=DIR                                   # the config's test sets
  seq2seq-eval --workdir=DIR [--step=N | --best | --average_last=K] [--split=NAME ...]
  seq2seq-eval --workdir=DIR --source=in.en --reference=ref.de [--beam_size=4 --alpha=0.6]
  seq2seq-eval --workdir=DIR --source=- < in.en > out.de       # translate stdin
  seq2seq-eval --workdir=DIR --ensemble=DIR2 --ensemble=DIR3    # the runs' ensemble

It prints the sacreBLEU score lines (signature last) and writes hypotheses and a JSON result
into DIR/eval/ (see seq2seq/inference/evaluate.py); the scores also go to the run's
TensorBoard as eval/NAME/bleu and eval/NAME/chrf at the checkpoint's step.

Many hosts (a model too large for one): the same command on every host, plus
--coordinator_address=auto or --coordinator_address=HOST:PORT --num_processes=N --process_id=I;
process 0 writes the files and prints the scores.
"""

import pathlib
import re
import sys

import jax
from absl import flags

from seq2seq.errors import ConfigError, DataError
from seq2seq import cli, data, metrics, sharding
from seq2seq.inference import evaluate, load
from seq2seq.inference.translate import Translator, search_settings

_WORKDIR = flags.DEFINE_string("workdir", None, "The training run's directory.", required=True)
_STEP = flags.DEFINE_integer("step", None, "Evaluate this checkpoint step (default: the latest).")
_BEST = flags.DEFINE_bool("best", False, "Evaluate the kept checkpoint with the lowest validation loss.")
_AVERAGE_LAST = flags.DEFINE_integer("average_last", 0, "Evaluate the average of the last K checkpoints.")
_SPLITS = flags.DEFINE_multi_string("split", None, "Split(s) to evaluate (default: config.data.test_splits).")
_SOURCE = flags.DEFINE_string("source", None, "Source file to translate (plain/gz/sgm); '-' reads stdin.")
_REFERENCE = flags.DEFINE_string("reference", None, "Reference file for --source (plain/gz/sgm).")
_OUTPUT = flags.DEFINE_string("output", "", "Also write the hypotheses to this file.")
_BEAM_SIZE = flags.DEFINE_integer("beam_size", None, "Beam size (default: config.eval.beam_size); 1 = greedy.")
_ALPHA = flags.DEFINE_float("alpha", None, "Length penalty exponent (default: config.eval.alpha).")
_MAX_LEN_A = flags.DEFINE_float("max_len_a", None, "Max output length = a * source length + b.")
_MAX_LEN_B = flags.DEFINE_integer("max_len_b", None, "Max output length = a * source length + b.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", None, "Sentences per batch (default: config.eval.batch_size).")
_WORKERS = flags.DEFINE_integer("workers", None, "Batches decoded at once (default: 2 on a one-process CPU run, "
                                 "where one search keeps the cores partly idle; 1 elsewhere).")
_TOKENIZE = flags.DEFINE_string("tokenize", "13a", "sacreBLEU tokenizer (13a, intl, zh, char, none, ...).")
_LOWERCASE = flags.DEFINE_bool("lowercase", False, "Case-insensitive BLEU and chrF.")
_JOIN_HOSTS = cli.define_distributed_flags()
_ENSEMBLE = flags.DEFINE_multi_string("ensemble", None, "Also load this run (repeatable) and decode the ensemble: the "
                                      "mean of the models' probabilities. Runs must share the sentencepiece model.")


def jobs(config) -> list[tuple[str, list[str], list[str]]]:
  """(name, sources, references) to score: --source/--reference, or the splits."""
  source, reference = _SOURCE.value, _REFERENCE.value
  if (reference is None) != (source is None) and source != "-":
    raise ConfigError("--source and --reference go together (or --source=- alone to translate stdin)")
  if source == "-":
    return []
  if source is not None:
    sources, references = evaluate.read_text(source), evaluate.read_text(reference)
    if len(sources) != len(references):
      raise DataError(f"--source={source} has {len(sources)} lines but --reference={reference} "
                       f"has {len(references)}; they must be parallel, one segment per line")
    return [(pathlib.Path(source).name.removesuffix(".gz"), sources, references)]
  out = []
  for split in _SPLITS.value or list(config.data.test_splits):
    pairs = data.eval_pairs(config, split)
    out.append((evaluate.result_name(split), [s for s, _ in pairs], [t for _, t in pairs]))
  return out


def main(argv) -> None:
  _JOIN_HOSTS()
  if _SOURCE.value == "-" and jax.process_count() > 1:
    raise ConfigError("--source=- (stdin) translates on one process; give --source=FILE on a multi-host run")
  if [_BEST.value, _STEP.value is not None, bool(_AVERAGE_LAST.value)].count(True) > 1:
    raise ConfigError("choose at most one of --step, --best and --average_last")
  workdir = _WORKDIR.value
  config = load.run_config(workdir)
  todo = jobs(config)
  mesh = sharding.make_mesh(config.mesh)
  choice = dict(step=_STEP.value, best=_BEST.value, average_last=_AVERAGE_LAST.value)
  extra = {"command": cli.command_line("seq2seq-eval")}
  if _ENSEMBLE.value:
    model_cfg, graphdef, params, tok, label, members = load.load_ensemble([workdir, *_ENSEMBLE.value], config, mesh,
                                                                          **choice)
    extra["ensemble"] = members
  else:
    model_cfg, graphdef, params, tok, label = load.load_params(workdir, config, mesh, **choice)
  translator = Translator(model_cfg, graphdef, tok, mesh, **search_settings(
      config.eval, beam_size=_BEAM_SIZE.value, alpha=_ALPHA.value, max_len_a=_MAX_LEN_A.value,
      max_len_b=_MAX_LEN_B.value, batch_size=_BATCH_SIZE.value, workers=_WORKERS.value))
  if _SOURCE.value == "-":
    evaluate.translate_stream(translator, params, sys.stdin, sys.stdout)
    return
  outdir = pathlib.Path(workdir) / "eval"
  results = [evaluate.evaluate(translator, params, src, ref, name=name, label=label, outdir=outdir,
                               output=_OUTPUT.value, tokenize=_TOKENIZE.value, lowercase=_LOWERCASE.value, extra=extra)
             for name, src, ref in todo]
  if jax.process_index() != 0:
    return
  step = re.search(r"(\d+)$", label.split("+")[0])  # step20000, best20000, average5-20000
  if step and results and not _ENSEMBLE.value:
    metrics.write_scalars(workdir, int(step.group(1)), {
        f"eval/{r['name']}/{key}": r[key] for r in results for key in ("bleu", "chrf")})
  for r in results:
    print(f"{r['name']} ({r['checkpoint']}): {r['sentences']} sentences in {r['seconds']:.1f} s "
          f"({r['sentences_per_s']:.1f} sentences/s); hypotheses in {r['hypotheses']}")
  for r in results:  # the score lines come last, each ending with its signature
    print(f"{r['name']}: {r['chrf_line']}")
    print(f"{r['name']}: {r['bleu_line']}")


def run() -> None:
  cli.run(main, __name__)


if __name__ == "__main__":
  run()
