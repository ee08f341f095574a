"""Bad input on the command line ends as one `error: ...` line and exit status 2, without a
traceback, and writes nothing; damaged or empty input files are named."""

import gzip
import io
import subprocess
import sys

import pytest
from conftest import REPO

from seq2seq.data.sources import DataError, read_lines
from seq2seq.inference import evaluate
from seq2seq.training import checkpoint

BAD_RUNS = [
    (["--config.model.nrom=rmsnorm"], r"unknown config key config.model.nrom; did you mean config.model.norm"),
    (["--config.model.norm=bad"], r"config.model.norm must be one of \('layernorm', 'rmsnorm', 'adanorm'\), got 'bad'"),
    (["--config.train.checkpoint_every=0"], r"config.train.checkpoint_every must be at least 1, got 0"),
    (["--config.data.dir=/nonexistent"], r"config.data.dir=/nonexistent \(or SEQ2SEQ_DATA_DIR\) is not a folder"),
]


@pytest.mark.long
def test_bad_settings_are_one_error_line_exit_2_and_write_nothing(tmp_path):
  import re

  for overrides, message in BAD_RUNS + [([], None)]:
    workdir = tmp_path / "run"
    config = "configs/tiny.py" if message else "configs/nope.py"
    out = subprocess.run([sys.executable, "train.py", f"--config={config}", f"--workdir={workdir}", *overrides],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, (overrides, out.stderr[-2000:])
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    missing = r"--config=configs/nope\.py: no such file, and no shipped config has that name; shipped configs: .*tiny"
    assert len(errors) == 1 and re.search(message or missing, errors[0]), out.stderr
    assert not (workdir / "spm.model").exists() and not (workdir / "config.json").exists()


def test_a_truncated_gzip_and_an_empty_file_are_named(tmp_path):
  data = gzip.compress(("a line of text\n" * 5000).encode())
  (tmp_path / "cut.en.gz").write_bytes(data[: len(data) // 2])
  with pytest.raises(DataError, match=r"cut.en.gz: damaged gzip file after line \d+"):
    list(read_lines(tmp_path / "cut.en.gz"))
  (tmp_path / "empty.en").write_text("")
  with pytest.raises(DataError, match=r"empty.en: empty file"):
    list(read_lines(tmp_path / "empty.en"))


def test_invalid_utf8_on_stdin_is_replaced_with_a_warning_and_every_line_is_kept(capsys):
  stream = io.BytesIO(b"good line\nbad \xff byte\n\nlast\n")
  assert list(evaluate.decoded_lines(stream)) == ["good line", "bad \ufffd byte", "", "last"]
  assert "stdin:2: invalid UTF-8 at byte 4, replaced by U+FFFD" in capsys.readouterr().err


def test_a_restart_with_other_data_settings_is_refused_unless_allowed():
  saved = {"model": {"d_model": 8}, "spm_sha256": "x", "data": {"max_tokens": 4096, "fill_rows": True}}
  current = {"model": {"d_model": 8}, "spm_sha256": "x", "data": {"max_tokens": 8192, "fill_rows": True}}
  with pytest.raises(ValueError, match=r"other data or data settings(.|\n)*config.data.max_tokens: checkpoint has 4096, "
                                       r"config has 8192(.|\n)*allow_data_change"):
    checkpoint.check_identity(saved, current, "ckpt")
  assert checkpoint.check_identity(saved, current, "ckpt", allow_data_change=True) == [
      "config.data.max_tokens: checkpoint has 4096, config has 8192"]
  checkpoint.check_identity({k: v for k, v in saved.items() if k != "data"}, current, "old checkpoint")


def test_checkpoint_flag_values():
  """--checkpoint of seq2seq-translate and seq2seq.export: newest, best or a step; else an error."""
  from seq2seq import cli

  assert [cli.checkpoint_choice(v) for v in (None, "latest", "best", "300")] == [None, None, "best", 300]
  with pytest.raises(ValueError, match="--checkpoint=last: expected latest, best or a step number"):
    cli.checkpoint_choice("last")


@pytest.mark.parametrize("text, error", [("hello\n", "NameError: name 'hello' is not defined"),
                                         ("import no_such_module\n", "ModuleNotFoundError: No module named")])
def test_a_config_file_that_does_not_load_is_one_error_line_naming_it(text, error, tmp_path):
  """A --config that is not Python, or imports what is not installed, gave a traceback."""
  from probing import command, one_error_line

  (tmp_path / "config.txt").write_text(text)
  out = command("seq2seq.commands.train", f"--config={tmp_path / 'config.txt'}", f"--workdir={tmp_path / 'run'}")
  one_error_line(out, rf"^error: --config={tmp_path}/config\.txt: the config file does not load: {error}")
  assert not (tmp_path / "run").exists()


LOST_CTRL_C = """
import sys
from seq2seq import cli, files

class Collected:
  def __del__(self):  # as JAX's gc callback: Python prints what it raises and goes on
    raise KeyboardInterrupt

def main(argv):
  Collected()
  files.write_output(sys.argv[1], b"new\\n")

cli.run(main, argv=["prog"])
"""


def test_a_ctrl_c_python_loses_in_a_gc_callback_still_ends_the_command_and_keeps_the_old_output(tmp_path):
  """A Ctrl-C that landed in JAX's `_xla_gc_callback` was printed as 'Exception ignored' and
  lost: the translation went on and replaced its output (CI, stop 67)."""
  (tmp_path / "out").write_text("older\n")
  proc = subprocess.run([sys.executable, "-c", LOST_CTRL_C, str(tmp_path / "out")], capture_output=True, text=True,
                        cwd=REPO)
  assert (proc.returncode, proc.stderr) == (130, "interrupted (Ctrl-C)\n")
  assert (tmp_path / "out").read_text() == "older\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary file left


def test_a_lost_ctrl_c_stops_a_translation_at_its_next_batch(monkeypatch):
  from seq2seq import interrupts
  from seq2seq.inference.progress import Progress

  monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
  interrupts.install()
  bar = Progress(10, enabled=False)
  bar.update(4)
  sys.unraisablehook(type("Unraisable", (), {"exc_value": KeyboardInterrupt()})())
  with pytest.raises(KeyboardInterrupt):
    bar.update(4)
  bar.update(2)  # raised once: an interactive session goes on after it
  assert bar.done == 6
