"""ruff's error rules (pyflakes and syntax, `[tool.ruff]` in pyproject.toml) pass on the whole tree."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ruff_finds_no_errors():
  result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], cwd=ROOT,
                          capture_output=True, text=True)
  assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_reports_an_undefined_name(tmp_path):
  # The check can fail: the same command on a file with an undefined name exits non-zero and names it.
  bad = tmp_path / "bad.py"
  bad.write_text("def f():\n  return undefined_name\n")
  result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", "F",
                           str(bad)], capture_output=True, text=True)
  assert result.returncode == 1 and "undefined_name" in result.stdout, result.stdout + result.stderr
