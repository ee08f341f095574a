"""The README's results table, generated from runs' files (no hand-typed numbers):
DIR/commands.txt (how it was trained), DIR/metrics.jsonl (steps, wall time, tokens/s) and
DIR/eval/*.json (eval.py's scores, signatures, settings and hardware).

  python -m seq2seq.results DIR [DIR ...]                    # prints the markdown table
  python -m seq2seq.results DIR [DIR ...] --readme=README.md # updates the table there

Updating a README replaces the rows of the runs given and keeps the other runs' rows (made
earlier, from their own files), so adding a run does not need every old workdir on disk.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

from seq2seq import metrics

START, END = "<!-- results:start -->", "<!-- results:end -->"
HEADER = ("| run | test set | BLEU | chrF | checkpoint | decoding | training | last logged step | train time then | tokens/s "
          "| hardware |\n|---|---|---|---|---|---|---|---|---|---|---|")


def _training(workdir: pathlib.Path) -> dict:
  records = [r for r in metrics.read(workdir) if "loss" in r]
  commands = (workdir / "commands.txt").read_text().splitlines() if (workdir / "commands.txt").is_file() else []
  speeds = [r["target_tokens_per_s"] for r in records if "target_tokens_per_s" in r]
  return {"command": commands[0] if commands else "?", "steps": records[-1]["step"] if records else 0,
          "minutes": records[-1].get("wall_time_s", 0) / 60 if records else 0.0,
          "tokens_per_s": sum(speeds) / len(speeds) if speeds else 0.0}


def rows(workdir: str | pathlib.Path) -> list[str]:
  """One markdown row per eval result of a run."""
  workdir = pathlib.Path(workdir)
  results = sorted((workdir / "eval").glob("*.json"))
  if not results:
    raise ValueError(f"no eval results in {workdir / 'eval'}: run `python eval.py --workdir={workdir}` first")
  train = _training(workdir)
  out = []
  for path in results:
    r = json.loads(path.read_text())
    d = r["decode"]
    decoding = "greedy" if d["beam_size"] == 1 else f"beam {d['beam_size']}, alpha {d['alpha']}"
    out.append(f"| `{workdir.name}` | {r['name']} | **{r['bleu']:.2f}** | {r['chrf']:.2f} | {r['checkpoint']} "
               f"| {decoding}<br>`{r.get('command', '?')}` | `{train['command']}` | {train['steps']} "
               f"| {train['minutes']:.0f} min | {train['tokens_per_s']:.0f} | {r.get('hardware', '?')} |")
  return out


def _format(lines: list[str], signatures: set[str]) -> str:
  notes = "".join(f"\nBLEU signature: `{s}`" for s in sorted(signatures))
  return "\n".join([HEADER] + lines) + "\n" + notes.lstrip("\n").replace("\nBLEU", "  \nBLEU") + "\n"


def table(workdirs: list[str]) -> str:
  signatures = set()
  lines = []
  for w in workdirs:
    lines += rows(w)
    for path in sorted((pathlib.Path(w) / "eval").glob("*.json")):
      signatures.add(json.loads(path.read_text())["bleu_signature"])
  return _format(lines, signatures)


def _parse(text: str) -> tuple[dict[str, list[str]], set[str]]:
  """A table's rows grouped by run name (in order) and its BLEU signatures."""
  by_run: dict[str, list[str]] = {}
  for line in text.splitlines():
    if line.startswith("| `"):
      by_run.setdefault(line.split("|")[1].strip(), []).append(line)
  return by_run, set(re.findall(r"BLEU signature: `([^`]*)`", text))


def merge(old: str, new: str) -> str:
  """Table `new`, plus the rows of the runs in table `old` that `new` lacks, in old's order."""
  old_rows, old_signatures = _parse(old)
  new_rows, new_signatures = _parse(new)
  runs = list(old_rows) + [run for run in new_rows if run not in old_rows]
  lines = [line for run in runs for line in new_rows.get(run, old_rows.get(run))]
  return _format(lines, old_signatures | new_signatures)


def update_readme(readme: str | pathlib.Path, text: str) -> str:
  """Merges table `text` into the table between the markers of `readme`; returns the result."""
  path = pathlib.Path(readme)
  content = path.read_text()
  if START not in content or END not in content:
    raise ValueError(f"{path} has no {START} ... {END} markers")
  text = merge(content.split(START, 1)[1].split(END, 1)[0], text)
  new = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: f"{START}\n{text}{END}", content, flags=re.S)
  path.write_text(new)
  return text


def main(argv: list[str] | None = None) -> None:
  import argparse

  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("workdirs", nargs="+")
  parser.add_argument("--readme", default="", help="update the table between the results markers of this file (other runs' rows stay)")
  args = parser.parse_args(argv)
  try:
    text = table(args.workdirs)
    if args.readme:
      text = update_readme(args.readme, text)
  except ValueError as e:
    sys.exit(f"error: {e}")
  print(text, end="")


if __name__ == "__main__":
  main()
