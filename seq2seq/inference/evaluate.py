"""BLEU evaluation of a trained run: load a checkpoint (latest, a step, the best by validation
loss, or an average of the last K) on the config's mesh, translate the test sets or given
files, score with sacreBLEU, and write hypotheses and a JSON result into DIR/eval/
(NAME.CHECKPOINT.SEARCH.{hyp,json}, e.g. test_2016_flickr.step20000.beam4-alpha0.6.json).

  python eval.py --workdir=DIR                                   # the config's test sets
  python eval.py --workdir=DIR --source=in.en --reference=ref.de
  python eval.py --workdir=DIR --source=- < in.en > out.de       # translate stdin
  python eval.py --workdir=DIR --ensemble=DIR2 --ensemble=DIR3    # the runs' ensemble

Many hosts (a model too large for one): the same command on every host, plus
--coordinator_address=auto or --coordinator_address=HOST:PORT --num_processes=N --process_id=I;
process 0 writes the files and prints the scores.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
import time

import jax

from seq2seq.errors import DataError
from seq2seq.data.sources import read_lines
from seq2seq.files import write_atomic, write_output, write_stdout
from seq2seq.inference.score import score
from seq2seq.inference.translate import Translator


def read_text(path: str, **options) -> list[str]:
  """Lines of a plain, gzipped or SGML file (one segment per line); `options` as
  seq2seq.data.sources.read_lines takes them (replace_invalid, allow_empty)."""
  try:
    return list(read_lines(path, **options))
  except OSError as e:
    raise DataError(f"cannot read {path}: {e}") from None


def hardware() -> str:
  """What the run is on, for result tables: devices and, on a CPU, the host's processor."""
  devices = f"{jax.device_count()} x {jax.devices()[0].device_kind}"
  if jax.devices()[0].platform != "cpu":
    return devices
  model = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "CPU")
  return f"{os.cpu_count()}-core {model}"


def _cpuinfo() -> list[str]:
  try:
    return pathlib.Path("/proc/cpuinfo").read_text().splitlines()
  except OSError:
    return []


def result_name(split: str) -> str:
  """The NAME part of a test set's result files (a split such as `hf:wmt14/de-en` made a file name)."""
  return split.replace("/", "_").replace(":", "_")


def scoring_name(tokenize: str = "13a", lowercase: bool = False) -> str:
  """What result file names add for scoring other than sacreBLEU's default (tokenizer 13a,
  cased): `-lc` for --lowercase, `-tok_intl` for --tokenize=intl; "" for the default."""
  return ("-lc" if lowercase else "") + ("" if tokenize == "13a" else f"-tok_{tokenize}")


def scoring_of(result: dict) -> tuple[str, bool]:
  """(tokenizer, lowercase) of a saved result, read from its BLEU signature (e.g.
  `nrefs:1|case:lc|eff:no|tok:intl|...`), so results written before they were recorded count too."""
  fields = dict(part.split(":", 1) for part in result.get("bleu_signature", "").split("|") if ":" in part)
  return fields.get("tok", "13a"), fields.get("case", "mixed") == "lc"


def saved_results(outdir: pathlib.Path, name: str, label: str) -> list[dict]:
  """The JSON results written by `evaluate` for NAME at checkpoint LABEL, every search, by file
  name; only those scored as sacreBLEU does by default (13a, cased)."""
  results = [json.loads(p.read_text()) for p in sorted(outdir.glob(f"{name}.{label}.*.json"))]
  return [r for r in results if not scoring_name(*scoring_of(r))]


def evaluate(translator: Translator, params, sources: list[str], references: list[str], *, name: str, label: str,
             outdir: pathlib.Path, output: str = "", tokenize: str = "13a", lowercase: bool = False,
             extra: dict | None = None, progress: bool = True, compare=None) -> dict:
  """Translates, scores and writes DIR/eval/NAME.CHECKPOINT.SEARCH.{hyp,json} (SEARCH ends
  with the scoring options when they are not the default: `scoring_name`); returns the result.
  `compare(hypotheses) -> dict`, if given, goes into the result as "compare" (process 0)."""
  start = time.perf_counter()
  hypotheses = translator(params, sources, progress=progress)
  seconds = time.perf_counter() - start
  result = score(hypotheses, references, tokenize=tokenize, lowercase=lowercase) | {
      "name": name, "checkpoint": label, "tokenize": tokenize, "lowercase": lowercase,
      "sentences": len(sources), "seconds": seconds,
      "sentences_per_s": len(sources) / max(seconds, 1e-9), "decode": dataclasses.asdict(translator.settings),
      "workers": translator.workers, "compiled_programs": translator.compiled_programs,
      "compile_seconds": translator.compile_seconds,
      "truncated_sources": translator.truncated, "hardware": hardware()} | (extra or {})
  if jax.process_index() == 0:
    if compare is not None:
      result["compare"] = compare(hypotheses)
    outdir.mkdir(parents=True, exist_ok=True)
    stem = f"{name}.{label}.{translator.settings.name()}{scoring_name(tokenize, lowercase)}"  # per checkpoint,
    # search and scoring: a lowercased score does not replace the cased one
    hyp_path = outdir / f"{stem}.hyp"
    text = "".join(h + "\n" for h in hypotheses)
    write_atomic(hyp_path, text.encode("utf-8"))
    if output:
      write_output(output, text.encode("utf-8"))  # a device or a pipe (>(gzip > x.gz)) is written as it is
    result["hypotheses"] = str(hyp_path)
    write_atomic(outdir / f"{stem}.json", (json.dumps(result, indent=1) + "\n").encode("utf-8"))
  return result


def decoded_lines(stream):
  """Text lines of a byte or text stream. An invalid UTF-8 byte becomes U+FFFD with a warning
  naming the line, so every input line still gets its output line."""
  raw = getattr(stream, "buffer", stream)
  for number, line in enumerate(raw, 1):
    if isinstance(line, str):
      yield line.rstrip("\r\n")
      continue
    try:
      text = line.decode("utf-8")
    except UnicodeDecodeError as err:
      print(f"warning: stdin:{number}: invalid UTF-8 at byte {err.start}, replaced by U+FFFD", file=sys.stderr)
      text = line.decode("utf-8", errors="replace")
    yield text.rstrip("\r\n")


PROMPT = "> "


def interactive(translate_lines, stdin, out, prompt_to=None) -> None:
  """At a terminal: a prompt (on `prompt_to`, stderr by default), and each typed line's
  output lines (`translate_lines([line])`) as soon as it is typed; end of input ends it."""
  prompt_to = sys.stderr if prompt_to is None else prompt_to
  lines = decoded_lines(stdin)  # read one at a time: invalid UTF-8 is replaced, with a warning
  while True:
    prompt_to.write(PROMPT)
    prompt_to.flush()
    line = next(lines, None)
    if line is None:
      prompt_to.write("\n")
      return
    for text in translate_lines([line]):
      out.write(text + "\n")
    out.flush()


def translate_stream(translator: Translator, params, lines, out) -> None:
  """Stdin to stdout: line by line after a prompt at a terminal, in batches when piped; one output line each."""
  if hasattr(lines, "isatty") and lines.isatty():
    return interactive(lambda batch: translator(params, batch), lines, out)
  text = "".join(hyp + "\n" for hyp in translator(params, list(decoded_lines(lines))))
  if out is sys.stdout:
    write_stdout(text)  # every byte, or an error naming stdout (a full disk under `> FILE`)
  else:
    out.write(text)
    out.flush()
