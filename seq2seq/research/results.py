"""The results table (docs/results.md), generated from runs' files (no hand-typed numbers):
DIR/commands.txt (how it was trained), DIR/metrics.jsonl (steps, wall time, tokens/s) and
DIR/eval/*.json (eval.py's scores, signatures, settings and hardware).

  python -m seq2seq.research.results DIR [DIR ...]                            # prints the markdown table
  python -m seq2seq.research.results DIR [DIR ...] --update=docs/results.md   # updates the table there

Updating a file's table (between its results markers) replaces the rows of the runs given
and keeps the other runs' rows (made earlier, from their own files), so adding a run does
not need every old workdir on disk.
"""

from __future__ import annotations

import json
import pathlib
import re

from seq2seq.errors import DataError
from seq2seq import errors, metrics
from seq2seq.files import write_atomic

START, END = "<!-- results:start -->", "<!-- results:end -->"
HEADER = ("| run | test set | BLEU | chrF | checkpoint | decoding | training | last logged step | train time then | tokens/s "
          "| hardware | BLEU signature |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def rows(workdir: str | pathlib.Path) -> list[str]:
  """One markdown row per eval result of a run."""
  workdir = pathlib.Path(workdir)
  results = sorted((workdir / "eval").glob("*.json"))
  if not results:
    raise DataError(f"no eval results in {workdir / 'eval'}: run `{errors.command('eval')} --workdir={workdir}` first")
  train = metrics.training_summary(workdir)
  out = []
  for path in results:
    r = json.loads(path.read_text())
    d = r["decode"]
    decoding = "greedy" if d["beam_size"] == 1 else f"beam {d['beam_size']}, alpha {d['alpha']}"
    checkpoint, minutes = r["checkpoint"], f"{train['minutes']:.0f} min"
    if r.get("ensemble"):  # this run's checkpoint first, then the other members, as eval.py recorded them
      others = r["ensemble"][1:]
      checkpoint = f"ensemble of {len(others) + 1}: {r['ensemble'][0]['checkpoint']}" + "".join(
          f" + `{pathlib.Path(m['workdir']).name}` {m['checkpoint']}" for m in others)
      minutes = f"{train['minutes'] + sum(m['minutes'] for m in others):.0f} min ({len(others) + 1} runs)"
    out.append(f"| `{workdir.name}` | {r['name']} | **{r['bleu']:.2f}** | {r['chrf']:.2f} | {checkpoint} "
               f"| {decoding}<br>`{r.get('command', '?')}` | `{train['command']}` | {train['steps']} "
               f"| {minutes} | {train['tokens_per_s']:.0f} | {r.get('hardware', '?')} "
               f"| {signature_cell(r['bleu_signature'])} |")
  return out


def signature_cell(signature: str) -> str:
  """A sacreBLEU signature as a table cell: its `|` escaped, so it stays one cell."""
  return "`" + signature.replace("|", "\\|") + "`"


def _format(lines: list[str]) -> str:
  return "\n".join([HEADER] + lines) + "\n"


def table(workdirs: list[str]) -> str:
  """The rows of every eval result of the runs; each row carries its own BLEU signature (the
  tokenizer, casing and sacreBLEU version it was scored with), so rows scored differently
  are told apart where they stand."""
  return _format([line for w in workdirs for line in rows(w)])


def _parse(text: str) -> dict[str, list[str]]:
  """A table's rows grouped by run name (in order). Rows of the older layout, without the
  signature column, get the one signature listed under their table; when it listed several,
  which row had which is not known, and that is an error rather than a guess."""
  signatures = sorted(set(re.findall(r"BLEU signature: `([^`]*)`", text)))
  by_run: dict[str, list[str]] = {}
  for line in text.splitlines():
    if not line.startswith("| `"):
      continue
    if "nrefs:" not in line:
      if len(signatures) != 1:
        raise DataError(f"a results row without its BLEU signature, under a table listing {len(signatures)}: "
                        f"{line[:80]}...; regenerate the table from the runs' files")
      line += f" {signature_cell(signatures[0])} |"
    by_run.setdefault(line.split("|")[1].strip(), []).append(line)
  return by_run


def merge(old: str, new: str) -> str:
  """Table `new`, plus the rows of the runs in table `old` that `new` lacks, in old's order."""
  old_rows, new_rows = _parse(old), _parse(new)
  runs = list(old_rows) + [run for run in new_rows if run not in old_rows]
  return _format([line for run in runs for line in new_rows.get(run, old_rows.get(run))])


def _with_markers(path: str | pathlib.Path, start: str, end: str) -> str:
  """The text of file `path` (DataError naming the file without the markers)."""
  if not pathlib.Path(path).is_file():
    raise DataError(f"{path} does not exist: the file whose {start} ... {end} section to write")
  content = pathlib.Path(path).read_text()
  if start not in content or end not in content:
    raise DataError(f"{path} has no {start} ... {end} markers")
  return content


def marked(path: str | pathlib.Path, start: str = START, end: str = END) -> str:
  """The text between the markers of file `path`."""
  return _with_markers(path, start, end).split(start, 1)[1].split(end, 1)[0]


def write_marked(path: str | pathlib.Path, text: str, start: str = START, end: str = END) -> None:
  """Replaces the text between the markers of file `path` with `text`."""
  content = _with_markers(path, start, end)
  write_atomic(path, re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: f"{start}\n{text}{end}",
                          content, flags=re.S))


def update_file(path: str | pathlib.Path, text: str) -> str:
  """Merges table `text` into the table between the markers of file `path`; returns the result."""
  text = merge(marked(path), text)
  write_marked(path, text)
  return text


def marked_command(module: str, usage: str, make, nargs: int, start: str, end: str, argv: list[str] | None) -> None:
  """The command of a generated section (recipe_search, family): prints `make(args)` and, with
  --update=FILE, writes it between the `start` and `end` markers of FILE. `nargs`: how many
  positional arguments it takes."""
  from absl import app, flags

  from seq2seq import cli

  update = flags.DEFINE_string("update", "", "Write the text between the markers of this file.")

  def run(args):
    if len(args) != 1 + nargs:
      raise app.UsageError(usage)
    text = make(args[1:])
    if update.value:
      write_marked(update.value, text, start, end)
    print(text, end="")

  cli.run(run, module, argv)


def main(argv: list[str] | None = None) -> None:
  from absl import app, flags

  from seq2seq import cli

  update = flags.DEFINE_string("update", "", "Update the table between the results markers of this file, e.g. "
                               "docs/results.md (other runs' rows stay).")

  def run(args):
    if len(args) < 2:
      raise app.UsageError("give one or more WORKDIRs: python -m seq2seq.research.results WORKDIR... [--update=FILE]")
    text = table(args[1:])
    if update.value:
      text = update_file(update.value, text)
    print(text, end="")

  cli.run(run, __name__, argv)


if __name__ == "__main__":
  main()
