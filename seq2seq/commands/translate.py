"""Translates text, one output line per input line (stdin to stdout by default):

  seq2seq-translate --workdir=DIR [--checkpoint=latest|best|STEP] [--average_last=K] < in.en > out.de
  seq2seq-translate --workdir=DIR --input=in.en --output=out.de [--ensemble=DIR2 ...]
  seq2seq-translate --model=MODEL_DIR < in.en > out.de            # a `python -m seq2seq.export` folder
  seq2seq-translate --workdir=DIR                                 # at a terminal: a prompt, line by line
  seq2seq-translate --workdir=DIR --beam_size=5 --nbest=5 < in.en  # LINE<TAB>SCORE<TAB>TRANSLATION
  seq2seq-translate --workdir=DIR --sampling --top_p=0.9 --temperature=0.8 --seed=1 --nbest=3 < in.en
  seq2seq-translate --workdir=DIR --score_reference=ref.de < in.en  # SCORE<TAB>REFERENCE

Output formats:
- default: the translation;
- --scores: SCORE<TAB>TRANSLATION, the search's score (log-probability, divided by the GNMT
  length penalty for beam > 1; plain for greedy search and sampling);
- --nbest=N: N lines LINE<TAB>SCORE<TAB>TRANSLATION per input line, best first (LINE counts
  input lines from 1; with --sampling, N drawn translations, most likely first); always N:
  entries the search left empty (a blank line has one translation, the empty one, score 0;
  a tight length limit can finish fewer) are empty translations scored -inf;
- --score_reference=FILE: SCORE<TAB>REFERENCE, the log-probability the model gives each line
  of FILE as the translation of the same input line (normalised as beam scores are;
  --normalize=false: the plain log-probability).

The model and search flags (--checkpoint, --average_last, --ensemble, --beam_size, --alpha,
--max_len_a, --max_len_b, --batch_size, --quiet) are seq2seq-eval's (seq2seq/commands/decoding.py).
Input from a file or a pipe is translated in batches, with progress on stderr (--quiet: none).
--input (a file, a named pipe such as `<(command)`, or '-': stdin) and --score_reference are
read alike: invalid UTF-8 becomes U+FFFD with a warning naming the line, and no lines at all
is a warning and an empty output (exit 0). Every flag and --output are checked before the
model loads. --output=FILE is replaced whole once the work is done (a failed run leaves an
older FILE as it was); at the prompt too, when the session ends (Ctrl-D or Ctrl-C).
"""

from __future__ import annotations

import contextlib
import io
import sys
from typing import TYPE_CHECKING

from absl import flags

from seq2seq import cli, files
from seq2seq.commands import decoding
from seq2seq.errors import ConfigError
from seq2seq.inference import settings

if TYPE_CHECKING:  # imported where a Translator is made (JAX's 4 s): --help and a bad flag answer at once
  from seq2seq.inference.translate import Translator

_WORKDIR = flags.DEFINE_string("workdir", None, "A training run's directory.")
_MODEL = flags.DEFINE_string("model", None, "A model directory written by `python -m seq2seq.export`.")
_INPUT = flags.DEFINE_string("input", "-", "Text to translate, one sentence per line (plain, .gz or .sgm); '-': stdin.")
_OUTPUT = flags.DEFINE_string("output", "-", "Where the translations go; '-': stdout.")
_SCORES = flags.DEFINE_bool("scores", False, "Write SCORE<TAB>TRANSLATION lines (the search's score).")
_NBEST = flags.DEFINE_integer("nbest", 1, "Write the N best translations of each line (N at most the beam size), "
                              "best first, as N lines LINE<TAB>SCORE<TAB>TRANSLATION; LINE counts input lines from 1.")
_SAMPLING = flags.DEFINE_bool("sampling", False, "Draw translations from the model instead of searching (--nbest "
                              "draws per line); seeded by --seed and each line's number.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "With --sampling: divides the log-probabilities (< 1 sharper).")
_TOP_K = flags.DEFINE_integer("top_k", 0, "With --sampling: draw among the K most likely tokens only (0: all).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "With --sampling: draw within the smallest set of tokens whose probability "
                            "reaches P (nucleus sampling; 1: all).")
_SEED = flags.DEFINE_integer("seed", 0, "With --sampling: the draws' seed.")
_SCORE_REFERENCE = flags.DEFINE_string("score_reference", None, "Score this file's lines as translations of the "
                                       "input's (teacher forcing): SCORE<TAB>REFERENCE lines.")
_NORMALIZE = flags.DEFINE_bool("normalize", None, "With --score_reference: divide by the GNMT length penalty "
                               "(default: as beam search scores are, i.e. for beam > 1).")

def make_translator() -> Translator:
  if (_WORKDIR.value is None) == (_MODEL.value is None):
    raise ConfigError("give one of --workdir=DIR (a training run) and --model=MODEL_DIR (an exported model)")
  if _MODEL.value:
    return decoding.translator_for_export(_MODEL.value)
  return decoding.translator_for_run(_WORKDIR.value, checkpoint=cli.checkpoint_choice(decoding.CHECKPOINT.value))[0]


def sampling() -> settings.Sampling | None:
  if not _SAMPLING.value:
    if (_TEMPERATURE.value, _TOP_K.value, _TOP_P.value) != (1.0, 0, 1.0):
      raise ConfigError("--temperature, --top_k and --top_p shape --sampling; add --sampling")
    return None
  draws = settings.Sampling(_TEMPERATURE.value, _TOP_K.value, _TOP_P.value, _SEED.value)
  return draws.check(shown=lambda key: f"--{key}")


def read_input(path: str, flag: str) -> list[str]:
  """The lines of a file, a named pipe (`<(command)`) or stdin ('-'), read alike: invalid
  UTF-8 is replaced with a warning naming the line (every line keeps its output line), and
  no lines at all is a warning, then nothing to do (exit 0)."""
  from seq2seq.inference import evaluate

  if path == "-":
    lines = list(evaluate.decoded_lines(sys.stdin))
  else:
    lines = evaluate.read_text(path, replace_invalid=True, allow_empty=True)
  if not lines:
    print(f"warning: {'stdin' if path == '-' else f'{flag}={path}'} has no lines", file=sys.stderr, flush=True)
  return lines


def lines_of(translator: Translator, sentences: list[str], progress: bool) -> list[str]:
  """The output lines of `sentences` (one input line each, or `--nbest` each), as the flags ask."""
  nbest, draws = _NBEST.value, sampling()
  if _SCORE_REFERENCE.value is not None:
    references = read_input(_SCORE_REFERENCE.value, "--score_reference")
    if len(references) != len(sentences):
      raise ConfigError(f"--score_reference={_SCORE_REFERENCE.value} has {len(references)} lines but the input has "
                        f"{len(sentences)}; they must be parallel")
    scores = translator.score(sentences, references, normalize=_NORMALIZE.value)
    return [f"{score:.4f}\t{reference}" for score, reference in zip(scores, references)]
  hypotheses, scores = translator.translate(sentences, return_scores=True, nbest=nbest, sampling=draws,
                                            progress=progress)
  if nbest > 1:
    return [f"{number}\t{score:.4f}\t{hyp}" for number, (hyps, best) in enumerate(zip(hypotheses, scores), 1)
            for hyp, score in zip(hyps, best)]
  return [f"{score:.4f}\t{hyp}" if _SCORES.value else hyp for hyp, score in zip(hypotheses, scores)]


def interactive(translator: Translator) -> None:
  """A prompt at a terminal, each line translated as it is typed. --output=FILE is replaced
  as in batch mode: the session's lines go to a temporary file beside it, renamed to FILE
  when the session ends (Ctrl-D, or Ctrl-C at the prompt)."""
  from seq2seq.inference import evaluate

  print(f"Translating with {translator.checkpoint}: type a sentence and Enter (Ctrl-D ends).", file=sys.stderr)
  with contextlib.ExitStack() as stack:
    out = sys.stdout
    if _OUTPUT.value != "-":
      out = io.TextIOWrapper(stack.enter_context(files.output_file(_OUTPUT.value)), encoding="utf-8")
      stack.callback(out.detach)  # the file itself is closed (and renamed into place) by output_file
    try:
      evaluate.interactive(lambda lines: lines_of(translator, lines, progress=False), sys.stdin, out)
    except KeyboardInterrupt:  # Ctrl-C ends the session as Ctrl-D does: what was translated is kept
      print(file=sys.stderr)
    out.flush()


def main(argv) -> None:
  if _SCORE_REFERENCE.value is not None and (_NBEST.value > 1 or _SAMPLING.value or _SCORES.value):
    raise ConfigError("--score_reference scores given translations; it goes with neither --nbest, --sampling nor "
                      "--scores")
  # Every setting and the output path are checked before the model loads.
  decoding.check_flags()
  nbest, draws = settings.check("nbest", _NBEST.value, "--nbest"), sampling()
  for flag, value in (("--input", _INPUT.value), ("--score_reference", _SCORE_REFERENCE.value)):
    if value == "":
      raise ConfigError(f"{flag} is empty; give a file's path" + (", or - for stdin" if flag == "--input" else ""))
  if _OUTPUT.value != "-":
    decoding.check_output(_OUTPUT.value, "--output", reads={"--input": _INPUT.value,
                                                            "--score_reference": _SCORE_REFERENCE.value},
                          keep={_WORKDIR.value: "eval", _MODEL.value: None})
  translator = make_translator()
  if draws is None and nbest > translator.settings.beam_size:
    raise ConfigError(f"--nbest={nbest} must be at most the beam size ({translator.settings.beam_size}; "
                      "--beam_size sets it)")
  if _INPUT.value == "-" and sys.stdin.isatty() and _SCORE_REFERENCE.value is None:
    return interactive(translator)
  sentences = read_input(_INPUT.value, "--input")
  text = "".join(line + "\n" for line in lines_of(translator, sentences, progress=not decoding.QUIET.value))
  if _OUTPUT.value == "-":
    files.write_stdout(text)
  else:  # written whole once translated: a failed run leaves an older file as it was
    files.write_output(_OUTPUT.value, text.encode("utf-8"))


def run() -> None:
  cli.run(main, __name__, also=(decoding.__name__,))


if __name__ == "__main__":
  run()
