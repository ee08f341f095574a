"""The package's layout: what may import what (one way, no cycles), how long a module may
grow, and the research tools' room (seq2seq/research/) with their old command names
forwarded."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest
from conftest import REPO

# What may import what. A module may import the modules of its own room and of the rooms its
# row names, nothing else of seq2seq (imports inside functions count too). Rooms:
#   top       seq2seq/*.py: the shared modules (cli, errors, files, metrics, sharding,
#             compilation), average and export, and the package itself
#   configs   seq2seq/configs/ (configs/ links to it)
#   data, model, training, inference, research, commands: those subpackages
# The core is every room but research and commands: it never imports either. Research may
# import the core; the commands may import anything. (seq2seq/sweep.py, results.py and plot.py
# forward to research by name, through runpy, not by an import.)
MAY_IMPORT = """
room        may import
configs     top
top         configs data model training inference
data        top
model       top
training    top data model inference
inference   top data model training
research    top configs data model training inference
commands    top configs data model training inference research
"""
LAYERS = {row.split()[0]: set(row.split()[1:]) for row in MAY_IMPORT.strip().splitlines()[1:]}
MAX_LINES = 420
FORWARDED = ["sweep", "results", "plot"]  # python -m seq2seq.NAME runs seq2seq.research.NAME


def package_modules() -> dict[str, pathlib.Path]:
  modules = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (REPO / "seq2seq").rglob("*.py")}
  return modules


def room(module: str) -> str:
  part = module.split(".")[1] if module.count(".") else ""
  return part if part in LAYERS and part != "top" else "top"


def _imports(path: pathlib.Path, modules, top_level_only: bool = False) -> set[str]:
  """The seq2seq modules `path` imports (`from seq2seq.data import corpus` names the module
  seq2seq.data.corpus, not its package)."""
  tree = ast.parse(path.read_text())
  names = set()
  for node in tree.body if top_level_only else ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("seq2seq"):
      for a in node.names:
        names.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module)
    elif isinstance(node, ast.Import):
      names |= {a.name for a in node.names if a.name.startswith("seq2seq")}
  return names


def test_the_layout_flows_one_way_without_import_cycles():
  """Each module imports only what MAY_IMPORT allows its room (so data never imports the model
  or later stages, the model never imports data or later stages, and the core never imports
  research or the commands), and no chain of module-level imports leads back to where it
  started."""
  modules = package_modules()
  assert set(map(room, modules)) == set(LAYERS), "a room without a row in MAY_IMPORT"
  graph = {m: {n for n in _imports(p, modules) if n in modules and n != m} for m, p in modules.items()}
  for m, deps in graph.items():
    if m.startswith("seq2seq.data"):
      assert not {d for d in deps if d.startswith(("seq2seq.model", "seq2seq.training", "seq2seq.inference"))}, m
    if m.startswith("seq2seq.model"):
      assert not {d for d in deps if d.startswith(("seq2seq.data", "seq2seq.training", "seq2seq.inference"))}, m
    wrong = sorted(d for d in deps if room(d) not in LAYERS[room(m)] | {room(m)})
    assert not wrong, f"{m} ({room(m)}) imports {wrong}: MAY_IMPORT does not allow it"
  # Module-level imports only: a function's lazy import (for a command or a cycle-free
  # `from_workdir`) runs when called, after every module has loaded.
  top = {m: {n for n in _imports(p, modules, True) if n in modules and n != m} for m, p in modules.items()}
  state = {}

  def visit(m, chain):
    state[m] = "open"
    for d in top[m]:
      assert state.get(d) != "open", f"import cycle: {' -> '.join(chain + [d])}"
      if d not in state:
        visit(d, chain + [d])
    state[m] = "done"

  for m in top:
    if m not in state:
      visit(m, [m])


def test_no_module_is_longer_than_420_lines():
  lengths = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in package_modules().values()}
  long = {path: n for path, n in lengths.items() if n > MAX_LINES}
  assert not long, (f"{long}: a module holds at most {MAX_LINES} lines. Split it by what its parts do into "
                    "modules of the same room (as training/report.py and training/guard.py came out of "
                    "training/train.py) and import them where they are used; MAY_IMPORT above still applies.")


@pytest.mark.parametrize("name", [n if n == "sweep" else pytest.param(n, marks=pytest.mark.slow) for n in FORWARDED])
def test_the_old_research_command_lines_still_run(name):
  """`python -m seq2seq.NAME` (the name before seq2seq/research/, in users' notes and old sweep
  manifests) runs seq2seq.research.NAME: the same usage, exit status 0."""
  old, new = (subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=300,
                             cwd=REPO) for module in (f"seq2seq.{name}", f"seq2seq.research.{name}"))
  assert old.returncode == new.returncode == 0 and old.stderr == new.stderr == "", old.stderr[-2000:]
  assert old.stdout == new.stdout and f"python -m seq2seq.research.{name}" in new.stdout
  shim = (REPO / "seq2seq" / f"{name}.py").read_text()
  assert shim.startswith('"""Forwarding:') and len(shim.splitlines()) <= 8


def test_the_docs_show_the_research_tools_by_their_new_names():
  """README, docs, notebooks, configs, benchmarks and the code name the research tools as
  seq2seq.research.NAME; only the forwarding modules, the research package's docstring, the
  manifest reader and the tests of forwarding name the old form."""
  old = re.compile(r"seq2seq[./](sweep|results|plot|ablations|variants)\b")
  allowed = {REPO / "seq2seq" / f"{name}.py" for name in FORWARDED} | {
      REPO / "seq2seq/research/__init__.py", REPO / "seq2seq/research/ablations.py", REPO / "tests/test_sweep.py",
      pathlib.Path(__file__)}
  paths = [REPO / "README.md", REPO / "pyproject.toml", *(REPO / "docs").glob("*.md"),
           *(REPO / "notebooks").glob("*.ipynb")]
  paths += [p for folder in ("seq2seq", "configs", "benchmarks", "tests") for p in (REPO / folder).rglob("*.py")]
  stale = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in paths if p not in allowed
           for m in old.finditer(p.read_text())]
  assert not stale, stale
