"""notebooks/quickstart.ipynb runs top to bottom on the real Multi30k: it trains a small model
(3 to 6 minutes on the 2-core CPU, as the notebook says), its own cells assert that the demo
translations hold the expected German words, that the validation BLEU and loss are sensible and that the attention
rows are distributions, and it shows its two figures."""

import re

import pytest
from conftest import OPTIMIZED_XLA_FLAGS, REPO

# The notebook's demo sentences and words their translations must contain (its own assertion).
EXPECTED = {
    "A man is riding a bike.": ("Mann", "Fahrrad"),
    "Two dogs are playing in the snow.": ("Hunde", "Schnee"),
    "A woman is reading a book.": ("Frau", "Buch"),
}


@pytest.mark.long
@pytest.mark.data
@pytest.mark.longest
def test_quickstart_notebook_runs(real_data_dir, monkeypatch, tmp_path):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  # The kernel inherits the environment: the real data, a fresh training run (no saved run to
  # load) and its temporary workdir under tmp_path, and XLA's usual optimization (a user's:
  # compiled code runs 1.7x faster than with the tests' fast-compile flags).
  monkeypatch.setenv("SEQ2SEQ_DATA_DIR", str(real_data_dir))
  monkeypatch.setenv("XLA_FLAGS", OPTIMIZED_XLA_FLAGS)
  monkeypatch.delenv("SEQ2SEQ_NOTEBOOK_WORKDIR", raising=False)
  monkeypatch.setenv("TMPDIR", str(tmp_path))
  notebook = nbformat.read(REPO / "notebooks" / "quickstart.ipynb", as_version=4)
  client = nbclient.NotebookClient(notebook, timeout=1200, kernel_name="python3",  # the training cell
                                   resources={"metadata": {"path": str(REPO / "notebooks")}})
  client.execute()  # raises CellExecutionError, with the failing cell, if any cell fails
  outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  images = [o for o in outputs if "image/png" in o.get("data", {})]
  assert len(images) == 2  # the loss/learning-rate figure and the attention heatmap
  text = "".join(o.get("text", "") for o in outputs)
  for source, words in EXPECTED.items():
    found = re.search(re.escape(source) + r"\n  -> (.+?)   \(-?[\d.]+\)\n", text)
    assert found, f"no translation of {source!r} printed"
    assert all(w in found.group(1) for w in words), f"{source!r} -> {found.group(1)!r} lacks one of {words}"
  bleu = re.search(r"^BLEU ([\d.]+) ", text, re.MULTILINE)
  assert bleu and float(bleu.group(1)) > 12


def test_results_md_quotes_the_notebooks_saved_figures():
  """docs/results.md's line on the notebook quotes its saved output: the BLEU of its 300
  validation sentences (rounded) and the minutes its own first cell says training takes."""
  import json

  notebook = json.loads((REPO / "notebooks" / "quickstart.ipynb").read_text(encoding="utf-8"))
  text = lambda cell: "\n".join(["".join(cell.get("source", []))] + [
      "".join(out.get("text", [])) for out in cell.get("outputs", [])])
  every = "\n".join(text(cell) for cell in notebook["cells"])
  (bleu,) = re.findall(r"^BLEU (\d+\.\d)  chrF", every, flags=re.M)
  (minutes,) = re.findall(r"Training takes about (\d+ to \d+) minutes on a 2-core CPU", every)
  page = " ".join((REPO / "docs" / "results.md").read_text(encoding="utf-8").split())
  assert f"({minutes} minutes on the 2-core CPU; about {round(float(bleu))} BLEU on 300 validation sentences" in page
