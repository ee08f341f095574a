"""Reading the markdown tables of the committed reports (docs/*.md), for the tests that hold
the README's and docs' prose to them."""

from __future__ import annotations

import json
import pathlib
from decimal import ROUND_HALF_UP, Decimal

REPO = pathlib.Path(__file__).resolve().parents[1]

TESTED = ("Final loss", "BLEU test_2016_flickr", "BLEU test_2017_flickr")


def signed(x: float, digits: int = 3) -> str:
  """How the reports and prose quote a difference: its sign always, a minus sign (U+2212)."""
  return f"{x:+.{digits}f}".replace("-", "\u2212")


def cells(line: str) -> list[str]:
  """The cells of one markdown table row."""
  return [c.strip() for c in line.strip().strip("|").split("|")]


def rows(text: str) -> list[list[str]]:
  """The cells of every table row in `text`, of every table."""
  return [cells(line) for line in text.splitlines() if line.startswith("| ")]


def table_rows(text: str) -> list[list[str]]:
  """The cells of each body row of the first markdown table in `text`."""
  found, started = [], False
  for line in text.splitlines():
    if line.startswith("|"):
      started = True
      row = cells(line)
      if not set("".join(row)) <= set("-: "):
        found.append(row)
    elif started:
      break
  return found[1:]  # without the header


def printed_tests(path: pathlib.Path) -> dict[tuple[str, str], list[str]]:
  """A sweep report's Welch tests as printed ({(variant, column): the row's cells: 9, or 11 with
  the TOST p and the reading}), for the final NLL and both test sets' BLEU; variant without its
  backquotes."""
  return {(row[0].strip("`"), row[1]): row for row in rows(path.read_text(encoding="utf-8"))
          if len(row) in (9, 11) and row[1] in TESTED}


def record(name: str):
  """A committed benchmark record, benchmarks/results/NAME."""
  return json.loads((REPO / "benchmarks" / "results" / name).read_text(encoding="utf-8"))


def fixed(x, places: int) -> str:
  """x to `places` decimals, half up on its decimal digits (1.615 -> 1.62, not float's 1.61): how
  the pages round a record's figures."""
  x = x if isinstance(x, Decimal) else Decimal(repr(x))
  return str(x.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))


def table_lines(raw: str, header: str) -> list[str]:
  """The body rows, as lines, of the markdown table in `raw` that starts with `header`."""
  lines = raw[raw.index(header):].splitlines()[2:]
  return lines[:next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))]


def words(name: str) -> str:
  """The text of REPO/name with its whitespace normalised, as prose is matched against it."""
  return " ".join((REPO / name).read_text(encoding="utf-8").split())


# The results table's header (docs/results.md, and docs/history.md's table of earlier runs).
RESULTS_HEADER = "| run | test set | BLEU | chrF | checkpoint | decoding | training | last logged step | train time then |"


def results_table(name: str = "docs/results.md") -> dict[str, list[list[str]]]:
  """The results table of docs/NAME: each run's rows (cells), by run name without backticks."""
  page = (REPO / name).read_text(encoding="utf-8")
  found = {}
  for row in table_rows(page[page.index(RESULTS_HEADER):]):
    found.setdefault(row[0].strip("`"), []).append(row)
  return found
