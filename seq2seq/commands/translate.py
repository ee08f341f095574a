"""Translates stdin to stdout, one output line per input line:

  seq2seq-translate --workdir=DIR [--checkpoint=best|STEP] < in.en > out.de
  seq2seq-translate --model=MODEL_DIR < in.en > out.de      # a `python -m seq2seq.export` folder
  echo "A man rides a bike." | seq2seq-translate --workdir=DIR --beam_size=1
  seq2seq-translate --workdir=DIR --beam_size=5 --nbest=5 < in.en         # LINE<TAB>SCORE<TAB>TRANSLATION

At a terminal each line is translated as it is typed; piped input is translated in batches.
"""

import sys

from absl import flags

from seq2seq.errors import ConfigError
from seq2seq import cli
from seq2seq.inference import evaluate
from seq2seq.inference.translate import Translator

_WORKDIR = flags.DEFINE_string("workdir", None, "A training run's directory.")
_MODEL = flags.DEFINE_string("model", None, "A model directory written by `python -m seq2seq.export`.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "With --workdir: 'best' or a step (default: the newest).")
_BEAM_SIZE = flags.DEFINE_integer("beam_size", None, "Beam size (default: the config's eval.beam_size); 1 = greedy.")
_ALPHA = flags.DEFINE_float("alpha", None, "Length penalty exponent (default: the config's eval.alpha).")
_SCORES = flags.DEFINE_bool("scores", False, "Write SCORE<TAB>TRANSLATION lines (the search's score).")
_NBEST = flags.DEFINE_integer("nbest", 1, "Write the N best translations of each line (N at most the beam size), "
                              "best first, as N lines LINE<TAB>SCORE<TAB>TRANSLATION; LINE counts input lines from 1.")


def main(argv) -> None:
  if (_WORKDIR.value is None) == (_MODEL.value is None):
    raise ConfigError("give one of --workdir=DIR (a training run) and --model=MODEL_DIR (an exported model)")
  settings = dict(beam_size=_BEAM_SIZE.value, alpha=_ALPHA.value,
                  compilation_cache=flags.FLAGS.compilation_cache)  # "" (off) stays off
  if _MODEL.value:
    if _CHECKPOINT.value is not None:
      raise ConfigError("--checkpoint chooses within a --workdir; an exported --model has one")
    translator = Translator.from_pretrained(_MODEL.value, **settings)
  else:
    translator = Translator.from_workdir(_WORKDIR.value, cli.checkpoint_choice(_CHECKPOINT.value), **settings)
  lines = sys.stdin
  if _NBEST.value > 1:
    sentences = list(evaluate.decoded_lines(lines))
    hypotheses, scores = translator.translate(sentences, return_scores=True, nbest=_NBEST.value)
    for number, (hyps, best_scores) in enumerate(zip(hypotheses, scores), 1):
      for hyp, score in zip(hyps, best_scores):
        sys.stdout.write(f"{number}\t{score:.4f}\t{hyp}\n")
    sys.stdout.flush()
    return
  if not _SCORES.value:
    evaluate.translate_stream(translator, translator.params, lines, sys.stdout)
    return
  sentences = list(evaluate.decoded_lines(lines))
  hypotheses, scores = translator.translate(sentences, return_scores=True)
  for hyp, score in zip(hypotheses, scores):
    sys.stdout.write(f"{score:.4f}\t{hyp}\n")
  sys.stdout.flush()


def run() -> None:
  cli.run(main, __name__)


if __name__ == "__main__":
  run()
