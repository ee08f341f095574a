"""notebooks/quickstart.ipynb runs top to bottom (its own cells assert the loss falls and the
attention rows are distributions) and shows its two figures."""

import pytest
from conftest import REPO


@pytest.mark.slow
def test_quickstart_notebook_runs(data_dir, monkeypatch):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  monkeypatch.setenv("SEQ2SEQ_DATA_DIR", str(data_dir))  # the kernel inherits the environment
  notebook = nbformat.read(REPO / "notebooks" / "quickstart.ipynb", as_version=4)
  client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": str(REPO / "notebooks")}})
  client.execute()  # raises CellExecutionError, with the failing cell, if any cell fails
  outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  images = [o for o in outputs if "image/png" in o.get("data", {})]
  assert len(images) == 2  # the schedule/loss figure and the attention heatmap
  text = "".join(o.get("text", "") for o in outputs)
  assert "A man in a blue shirt is riding a bike.\n  -> " in text
