"""Evaluates a training run with sacreBLEU: seq2seq-eval --workdir=DIR (or python eval.py).

  seq2seq-eval --workdir=DIR                                   # the config's test sets
  seq2seq-eval --workdir=DIR [--checkpoint=latest|best|STEP] [--average_last=K] [--split=NAME ...]
  seq2seq-eval --workdir=DIR --source=in.en --reference=ref.de [--beam_size=4 --alpha=0.6]
  seq2seq-eval --workdir=DIR --source=- < in.en > out.de       # translate stdin
  seq2seq-eval --workdir=DIR --ensemble=DIR2 --ensemble=DIR3    # the runs' ensemble
  seq2seq-eval --workdir=DIR --split=test_2016_flickr --compare=other.hyp [--paired=bs|ar]

--compare=HYPS (one or more files, one test set): BLEU, chrF++ and TER of this run and of each
file, and sacreBLEU's paired test of each against this run (seq2seq/inference/compare.py),
printed before the score lines and kept in the JSON result under "compare".

It prints the sacreBLEU score lines (signature last) and writes hypotheses and a JSON result
into DIR/eval/ (see seq2seq/inference/evaluate.py); the scores also go to the run's
TensorBoard as eval/NAME/bleu and eval/NAME/chrf at the checkpoint's step.

Many hosts (a model too large for one): the same command on every host, plus
--coordinator_address=auto or --coordinator_address=HOST:PORT --num_processes=N --process_id=I;
process 0 writes the files and prints the scores.
"""

import os
import pathlib
import sys

from absl import flags

from seq2seq import cli, metrics
from seq2seq.commands import decoding
from seq2seq.errors import ConfigError, DataError
from seq2seq.inference import compare  # JAX and the model come in main(): --help answers at once

_WORKDIR = flags.DEFINE_string("workdir", None, "The training run's directory.", required=True)
_STEP = flags.DEFINE_integer("step", None, "The old name of --checkpoint=STEP.")
_BEST = flags.DEFINE_bool("best", False, "The old name of --checkpoint=best.")
_SPLITS = flags.DEFINE_multi_string("split", None, "Split(s) to evaluate (default: config.data.test_splits).")
_SOURCE = flags.DEFINE_string("source", None, "Source file to translate (plain/gz/sgm); '-' reads stdin.")
_REFERENCE = flags.DEFINE_string("reference", None, "Reference file for --source (plain/gz/sgm).")
_OUTPUT = flags.DEFINE_string("output", "", "Also write the hypotheses to this file.")
_TOKENIZE = flags.DEFINE_string("tokenize", "13a", "sacreBLEU tokenizer (13a, intl, zh, char, none, ...).")
_LOWERCASE = flags.DEFINE_bool("lowercase", False, "Case-insensitive BLEU and chrF.")
_COMPARE = flags.DEFINE_multi_string("compare", None, "Hypothesis file(s) of other systems on the same test set: "
                                     "each is compared with this run by a paired test (one --split or --source).")
_PAIRED = flags.DEFINE_enum("paired", "bs", ["bs", "ar"], "--compare's test: paired bootstrap (bs) or approximate "
                            "randomization (ar), as sacreBLEU runs them.")
_PAIRED_SAMPLES = flags.DEFINE_integer("paired_samples", 0, "Bootstrap resamples or randomization trials "
                                       "(0: sacreBLEU's 1000 / 10000).", lower_bound=0)
_JOIN_HOSTS = cli.define_distributed_flags()


def jobs(config) -> list[tuple[str, list[str], list[str]]]:
  """(name, sources, references) to score: --source/--reference, or the splits."""
  from seq2seq import data
  from seq2seq.inference import evaluate

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


def checkpoint() -> None | str | int:
  """--checkpoint's choice, or that of its old names --step=N and --best (with a deprecation line)."""
  old = ([f"--step={_STEP.value}"] if _STEP.value is not None else []) + (["--best"] if _BEST.value else [])
  if not old:
    return cli.checkpoint_choice(decoding.CHECKPOINT.value)
  if len(old) > 1 or decoding.CHECKPOINT.value is not None:
    given = old + ([f"--checkpoint={decoding.CHECKPOINT.value}"] if decoding.CHECKPOINT.value is not None else [])
    raise ConfigError(f"{' and '.join(given)} each choose the checkpoint: give one --checkpoint=latest|best|STEP")
  new = "--checkpoint=best" if _BEST.value else f"--checkpoint={_STEP.value}"
  cli.deprecated(old[0], new)
  return cli.checkpoint_choice(new.split("=", 1)[1], old[0].split("=")[0])


def check_tokenize(name: str) -> None:
  """sacreBLEU's tokenizer `name` exists, else a ConfigError listing those that do (before any decoding)."""
  from sacrebleu.metrics import BLEU

  if name not in BLEU.TOKENIZERS:
    raise ConfigError(f"--tokenize={name}: sacreBLEU has no such tokenizer; choose one of {', '.join(BLEU.TOKENIZERS)}")


def compared_systems(todo) -> list[tuple[str, list[str]]]:
  """(file, lines) of each --compare file, read and checked against the one test set before decoding."""
  if not _COMPARE.value:
    return []
  if len(todo) != 1:
    raise ConfigError(f"--compare needs one test set to compare on, got {len(todo)}: give one --split=NAME or "
                      "--source/--reference")
  from seq2seq.inference import evaluate

  name, _, references = todo[0]
  out = []
  for path in _COMPARE.value:
    hypotheses = evaluate.read_text(path)
    if len(hypotheses) != len(references):
      raise DataError(f"--compare={path} has {len(hypotheses)} lines but {name} has {len(references)} sentences: "
                      "a system's hypotheses for the same test set, one line each, are needed")
    out.append((path, hypotheses))
  return out


def comparison(name: str, label: str, references: list[str], others):
  """The paired comparison of this run's hypotheses (the baseline) with the others, as a
  function of the hypotheses (evaluate.evaluate's `compare`)."""
  return lambda hypotheses: compare.compare((f"{name}.{label} (this run)", hypotheses), others, references,
                                            test=_PAIRED.value, samples=_PAIRED_SAMPLES.value,
                                            tokenize=_TOKENIZE.value, lowercase=_LOWERCASE.value)


def main(argv) -> None:
  import jax

  from seq2seq.inference import evaluate, load

  _JOIN_HOSTS()
  if _SOURCE.value == "-" and jax.process_count() > 1:
    raise ConfigError("--source=- (stdin) translates on one process; give --source=FILE on a multi-host run")
  decoding.check_flags()  # every setting, and where the hypotheses go, before any work
  chosen = checkpoint()
  check_tokenize(_TOKENIZE.value)
  if _OUTPUT.value and _SOURCE.value == "-":
    raise ConfigError("--output goes with --source=FILE or the test sets; with --source=- the translations go to "
                      "stdout (redirect it: > FILE)")
  if _OUTPUT.value:
    decoding.check_output(_OUTPUT.value, "--output", reads={"--source": _SOURCE.value, "--reference": _REFERENCE.value},
                          keep={_WORKDIR.value: "eval"})
  workdir = _WORKDIR.value
  if os.path.lexists(pathlib.Path(workdir) / "eval") and not (pathlib.Path(workdir) / "eval").is_dir():
    raise ConfigError(f"{pathlib.Path(workdir) / 'eval'} is a file; results go in that folder: move the file away")
  config = load.run_config(workdir)
  todo = jobs(config)
  others = compared_systems(todo)
  translator, loaded = decoding.translator_for_run(workdir, config, chosen)
  params, label, members = translator.params, translator.checkpoint, loaded.members
  extra = {"command": cli.command_line("seq2seq-eval")} | ({"ensemble": members} if members else {})
  if _SOURCE.value == "-":
    evaluate.translate_stream(translator, params, sys.stdin, sys.stdout)
    return
  outdir = pathlib.Path(workdir) / "eval"
  results = [evaluate.evaluate(translator, params, src, ref, name=name, label=label, outdir=outdir,
                               output=_OUTPUT.value, tokenize=_TOKENIZE.value, lowercase=_LOWERCASE.value, extra=extra,
                               progress=not decoding.QUIET.value,
                               compare=comparison(name, label, ref, others) if others else None)
             for name, src, ref in todo]
  if jax.process_index() != 0:
    return
  if results and not members:
    metrics.write_scalars(workdir, loaded.checkpoint.step, {
        f"eval/{r['name']}/{key}": r[key] for r in results for key in ("bleu", "chrf")})
  for r in results:
    print(f"{r['name']} ({r['checkpoint']}): {r['sentences']} sentences in {r['seconds']:.1f} s "
          f"({r['sentences_per_s']:.1f} sentences/s); hypotheses in {r['hypotheses']}")
  for r in results:
    if "compare" in r:
      print("\n".join(compare.lines(r["compare"])))
  for r in results:  # the score lines come last, each ending with its signature
    print(f"{r['name']}: {r['chrf_line']}")
    print(f"{r['name']}: {r['bleu_line']}")


def run() -> None:
  cli.run(main, __name__, also=(decoding.__name__,))


if __name__ == "__main__":
  run()
