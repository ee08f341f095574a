"""Nothing lost on a shared cluster: one trainer per workdir, inputs of any length, a changed
corpus noticed on resume, settings checked before anything is written, and one `error:`
line (exit 2, no traceback) for every failure a user can fix; a bug keeps its traceback."""

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import pytest
from conftest import REPO, make_config, optimized_env

from seq2seq import Translator, cli, errors, metrics, sharding
from seq2seq.inference import load
from seq2seq.training import checkpoint, lock
from seq2seq.training.train import train_and_evaluate

HOLD = """
import sys
from seq2seq.training import lock
with lock.hold(sys.argv[1], command="holder"):
  print("held", flush=True)
  sys.stdin.read()
"""


def test_a_workdir_has_one_trainer_and_a_dead_ones_lock_never_blocks(tmp_path):
  """A live holder (another process) is named in the refusal; once it is killed -9, the
  lock is free. Each process of a multi-host run has its own lock file."""
  workdir = tmp_path / "run"
  holder = subprocess.Popen([sys.executable, "-c", HOLD, str(workdir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=REPO)
  try:
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(errors.WorkdirBusy, match=rf"{workdir} is in use by another training run \(pid {holder.pid} "
                                                 r"on host .*, started .*; lock .*train.lock\)"):
      with lock.hold(workdir):
        pass
    with lock.hold(workdir, process_index=1):  # another host's process of the same run
      assert (workdir / "train.lock.1").is_file()
  finally:
    holder.kill()
    holder.wait()
  with lock.hold(workdir) as path:  # the kernel released the killed holder's lock
    assert json.loads(path.read_text())["pid"] == os.getpid()


def test_a_run_that_fails_before_writing_leaves_no_workdir(tmp_path):
  """Nothing written, a workdir the run created is removed again; a user's folder stays."""
  with pytest.raises(errors.ConfigError):
    with lock.hold(tmp_path / "new" / "run"):
      raise errors.ConfigError("a bad setting")
  assert not (tmp_path / "new" / "run").exists()
  (tmp_path / "kept").mkdir()
  with pytest.raises(errors.ConfigError):
    with lock.hold(tmp_path / "kept"):
      raise errors.ConfigError("a bad setting")
  assert (tmp_path / "kept").is_dir()  # the user's folder stays
  # The processes of one multi-host run fail at once, each cleaning up the workdir they all created: each
  # removes its own lock file (never another's), the last one the workdir, and each ends in its own error
  # whichever cleaned up first (a FileNotFoundError from another's removal replaced it).
  run = tmp_path / "hosts" / "run"
  with pytest.raises(errors.DataError, match="different sentencepiece models"):
    with lock.hold(run, process_index=0):
      lock.lock_path(run, 1).write_text("{}")  # process 1's lock file, still there
      raise errors.DataError("the processes have different sentencepiece models")
  assert sorted(p.name for p in run.iterdir()) == ["train.lock.1"]
  with pytest.raises(errors.DataError, match="different sentencepiece models"):
    with lock.hold(tmp_path / "hosts" / "other", process_index=1):
      shutil.rmtree(tmp_path / "hosts" / "other")  # process 0 cleaned up first, the workdir with it
      raise errors.DataError("the processes have different sentencepiece models")


def _until(predicate, timeout: float = 240.0):
  """Waits for a condition another process brings about (polls; fails after `timeout`)."""
  deadline = time.monotonic() + timeout
  while not predicate():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.1)


@pytest.mark.slow
def test_a_second_trainer_on_a_running_workdir_exits_2_naming_the_first_and_writes_nothing(data_dir, session_cache,
                                                                                         tmp_path):
  """A requeued job's second copy, while the first still trains: refused in one line naming
  the first's pid; the first goes on, stops on SIGTERM with a readable checkpoint, one row
  per step in metrics.jsonl, one event file and no temporary checkpoint folders."""
  workdir = tmp_path / "run"
  args = [sys.executable, "train.py", "--config=tiny", f"--workdir={workdir}", f"--config.data.dir={data_dir}",
          f"--config.data.cache_dir={session_cache}", "--config.train.steps=100000", "--config.train.log_every=5",
          "--config.train.eval_every=0", "--config.train.checkpoint_every=1000", "--config.train.peak_flops=1e12"]
  first = subprocess.Popen(args, cwd=REPO, env=optimized_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
  try:
    _until(lambda: (workdir / "metrics.jsonl").is_file() and (workdir / "metrics.jsonl").stat().st_size)
    second = subprocess.run(args, cwd=REPO, env=optimized_env(), capture_output=True, text=True, timeout=300)
    assert second.returncode == 2, second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    assert second.stderr.splitlines() == [
        line for line in second.stderr.splitlines() if line.startswith("error: ")] and len(
        second.stderr.splitlines()) == 1, second.stderr
    assert f"in use by another training run (pid {first.pid} on host" in second.stderr
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=300)
  finally:
    if first.poll() is None:
      first.kill()
  assert first.returncode == 0, err[-3000:]
  records = [r for r in metrics.read(workdir) if "loss" in r]
  assert len({r["step"] for r in records}) == len(records) > 0
  assert len(list(workdir.glob("events.out.tfevents.*"))) == 1
  assert (workdir / "commands.txt").read_text().count("\n") == 1
  assert not list((workdir / "checkpoints").glob("*orbax-checkpoint-tmp*"))
  config = load.run_config(workdir)
  label = load.load_params(workdir, config, sharding.make_mesh(config.mesh)).checkpoint.label
  assert label.startswith("step")


LIMITED = "import os, resource, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); " \
          "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"


def _train_rc(args: list[str], env=None, file_size_limit: int = 0, cwd=REPO) -> subprocess.CompletedProcess:
  """A command's result; `file_size_limit`: run under that RLIMIT_FSIZE (bytes)."""
  if file_size_limit:
    args = [sys.executable, "-c", LIMITED, str(file_size_limit), *args[1:]]
  return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})})


def _one_error_line(out: subprocess.CompletedProcess, pattern: str) -> None:
  import re

  assert out.returncode == 2, out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  errors_ = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors_) == 1 and re.search(pattern, errors_[0]), out.stderr[-3000:]


# Settings that cannot work: refused before anything is written (no workdir is left).
BAD_SETTINGS = {
    "steps=abc": (["--config.train.steps=abc"], r"config.train.steps=abc: expected an int"),
    "learning_rate=nan": (["--config.train.learning_rate=nan"], r"config.train.learning_rate=nan is not a finite"),
    "vocab_size=5": (["--config.data.vocab_size=5"], r"config.data.vocab_size=5 is too small"),
    "vocab_size=9": (["--config.data.vocab_size=9"], r"sentencepiece cannot train with config.data.vocab_size=9"),
    "learned positions": (["--config.model.positions=learned", "--config.model.max_len=1"],
                          r"config.model.max_len=1, the learned position table, is shorter .* at least 64"),
    "max_tokens=0": (["--config.data.max_tokens=0"], r"config.data.max_tokens=0 cannot hold"),
    "max_len=1": (["--config.data.max_len=1"], r"config.data.max_len=1: a side holds at least one token"),
}


@pytest.mark.long
@pytest.mark.parametrize("probe", sorted(BAD_SETTINGS))
def test_a_setting_that_cannot_work_is_one_error_line_before_anything_is_written(probe, data_dir, tmp_path):
  overrides, pattern = BAD_SETTINGS[probe]
  workdir = tmp_path / "run"
  out = _train_rc([sys.executable, "train.py", "--config=tiny", f"--workdir={workdir}", f"--config.data.dir={data_dir}",
                   f"--config.data.cache_dir={tmp_path / 'cache'}", *overrides])
  _one_error_line(out, pattern)
  assert not workdir.exists()


@pytest.mark.long
def test_no_network_and_no_data_folder_is_one_error_line_naming_the_url_and_leaves_no_folders(tmp_path):
  """Multi30k to download, the URL unreachable (a closed local port stands for no network)."""
  workdir, cache = tmp_path / "run", tmp_path / "cache"
  out = _train_rc([sys.executable, "train.py", "--config=multi30k", f"--workdir={workdir}", "--config.data.dir=",
                   f"--config.data.cache_dir={cache}", "--config.data.multi30k_url=http://127.0.0.1:9/raw"],
                  env={"SEQ2SEQ_DATA_DIR": ""})
  _one_error_line(out, r"http://127.0.0.1:9/raw/train.en.gz: download failed .*SEQ2SEQ_DATA_DIR")
  assert not workdir.exists()
  assert not [p for p in cache.rglob("*") if p.is_dir() and not any(p.iterdir())]


@pytest.mark.long
def test_a_file_size_limit_while_tokenizing_is_one_error_line_naming_the_file(data_dir, tmp_path):
  """Python ignores SIGXFSZ, so a write past RLIMIT_FSIZE fails with EFBIG: an environment
  failure, named, and the half-written cache folder is not left behind."""
  limit = 50_000  # the tokenizer or the token cache goes past it
  cache = tmp_path / "cache"
  out = _train_rc([sys.executable, "train.py", "--config=tiny", f"--workdir={tmp_path / 'run'}",
                   f"--config.data.dir={data_dir}", f"--config.data.cache_dir={cache}", "--compilation_cache="],
                  file_size_limit=limit)
  _one_error_line(out, rf"(?=.*File too large)(?=.*{cache})")
  assert not list(cache.rglob(".*.owner"))


@pytest.mark.long
def test_divergence_before_any_checkpoint_is_one_error_line(data_dir, session_cache, tmp_path):
  out = _train_rc([sys.executable, "train.py", "--config=tiny", f"--workdir={tmp_path / 'run'}",
                   f"--config.data.dir={data_dir}", f"--config.data.cache_dir={session_cache}",
                   "--config.train.inject_nan_at_step=2", "--config.train.steps=10", "--config.train.log_every=5",
                   "--config.train.eval_every=0", "--config.train.peak_flops=1e12"])
  _one_error_line(out, r"training diverged at step 2 .* before any checkpoint was saved; lower "
                       r"config.train.learning_rate")


def test_a_broken_config_json_is_one_error_line_naming_it(tiny_run, tmp_path):
  run = shutil.copytree(tiny_run, tmp_path / "run")
  text = (run / "config.json").read_text()
  (run / "config.json").write_text(text[: len(text) // 2])
  out = _train_rc([sys.executable, "-m", "seq2seq.commands.eval", f"--workdir={run}", "--split=multi30k:val"])
  _one_error_line(out, rf"{run}/config.json: not a JSON config")


def test_only_the_users_mistakes_and_the_environments_refusals_are_error_lines(tmp_path):
  """cli.run: a seq2seq.errors.Error or an OSError of the environment is one line naming
  the file (exit 2); a ValueError from a bug keeps its traceback (exit 1)."""
  script = """
import errno, sys
from seq2seq import cli, errors
def main(_):
  kind = sys.argv[1]
  if kind == "data": raise errors.DataError("corpus.en:3: bad line")
  if kind == "disk": raise OSError(errno.ENOSPC, "No space left on device", "/full/disk/file")
  if kind == "readonly": raise PermissionError(errno.EROFS, "Read-only file system", "/ro/run/config.json")
  if kind == "bug": raise ValueError("operands could not be broadcast together")
  raise OSError(errno.EIO, "Input/output error")
cli.run(main, argv=[sys.argv[0]])
"""
  expect = {"data": (2, "error: corpus.en:3: bad line"), "disk": (2, "error: /full/disk/file: No space left on device"),
            "readonly": (2, "error: /ro/run/config.json: Read-only file system"),
            "bug": (1, "ValueError: operands could not be broadcast together"), "io": (1, "OSError: [Errno 5]")}
  for kind, (rc, line) in expect.items():
    out = subprocess.run([sys.executable, "-c", script, kind], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == rc, (kind, out.stderr)
    assert line in out.stderr, (kind, out.stderr)
    assert ("Traceback" in out.stderr) == (rc == 1), (kind, out.stderr)


def test_a_checkpoint_deleted_under_eval_falls_back_or_is_one_error(tiny_run, tmp_path, monkeypatch):
  """A training run keeping its newest checkpoints deletes the one eval is verifying: eval
  goes on with the next newest; asked for that step, it is a CheckpointError."""
  run = shutil.copytree(tiny_run, tmp_path / "run")
  config = load.run_config(run)
  mesh = sharding.make_mesh(config.mesh)
  newest = max(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
  verify = checkpoint.verify

  def deleting_verify(step_dir):
    if step_dir.name == str(newest) and step_dir.is_dir():
      shutil.rmtree(step_dir)  # as the training run's cleanup would, between listing and reading
    return verify(step_dir)

  monkeypatch.setattr(checkpoint, "verify", deleting_verify)
  label = load.load_params(run, config, mesh).checkpoint.label
  assert label == f"step{newest - 20}"
  shutil.rmtree(run)
  run = shutil.copytree(tiny_run, tmp_path / "run")
  with pytest.raises(errors.CheckpointError, match=rf"checkpoint {newest} .* was deleted while being read"):
    load.load_params(run, config, mesh, checkpoint=newest)


# -- inputs of any length ------------------------------------------------------------------
def test_long_sources_are_cut_with_a_warning_and_batches_hold_as_many_tokens(tiny_run, capsys):
  translator = Translator.from_workdir(tiny_run, beam_size=1, max_source_len=40)
  assert [translator.rows_for(w) for w in (16, 128, 256, 512, 1024, 4096)] == [16, 16, 8, 4, 2, 1]
  long = " ".join(["A man rides a bike."] * 30)
  short = ["A dog runs.", "Two girls play."]
  out = translator.translate([short[0], long, short[1]])
  assert translator.truncated == 1
  assert out[0] == translator.translate(short[0]) and out[2] == translator.translate(short[1])
  err = capsys.readouterr().err
  assert err.count("warning: line 2: ") == 1 and "translating its first 40 (eval.max_source_len)" in err
  cut = translator.tok.encode([long])[0][:39] + [1]
  assert out[1] == translator.tok.decode(translator.translate_ids(translator.params, [cut])[0])


def test_a_batch_out_of_device_memory_is_decoded_again_in_halves_with_the_same_output(tiny_run, monkeypatch, capsys):
  translator = Translator.from_workdir(tiny_run, beam_size=2, batch_size=8, workers=1)
  sentences = [f"A man number {i} rides a bike." for i in range(11)]
  expected = translator.translate(sentences)
  search, tried, decoded = translator._search, [], []

  def small_memory(params, src_bs, *rest):
    tried.append(src_bs.shape[0])
    if src_bs.shape[0] > 2:
      raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 55990814760 bytes")
    decoded.append(src_bs.shape[0])
    return search(params, src_bs, *rest)

  monkeypatch.setattr(translator, "_search", small_memory)
  assert translator.translate(sentences) == expected
  assert tried[:3] == [8, 4, 2] and decoded == [2] * 6  # 11 sentences in pairs
  assert "warning: out of memory decoding 8 sentences" in capsys.readouterr().err
  monkeypatch.setattr(translator, "_search", lambda *a, **k: (_ for _ in ()).throw(
      jax.errors.JaxRuntimeError("INTERNAL: something else")))
  with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):  # only memory is retried
    translator.translate(sentences)


@pytest.mark.long
def test_a_20000_word_line_between_two_short_ones_gives_three_lines_and_exit_0(tiny_run, tmp_path):
  words = ("a man in a blue shirt rides a red bike down the street " * 1700).split()[:20000]
  lines = ["A dog runs.", " ".join(words), "Two girls play."]
  out = subprocess.run([sys.executable, "-m", "seq2seq.commands.translate", f"--workdir={tiny_run}", "--beam_size=1"],
                       input="".join(line + "\n" for line in lines), capture_output=True, text=True, timeout=600,
                       cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  hyps = out.stdout.split("\n")
  assert len(hyps) == 4 and hyps[3] == ""
  translator = Translator.from_workdir(tiny_run, beam_size=1)
  assert [hyps[0], hyps[2]] == translator.translate([lines[0], lines[2]])
  assert "warning: line 2: " in out.stderr and "translating its first 1024" in out.stderr


# -- the training corpus on resume ---------------------------------------------------------
@pytest.mark.long
def test_a_changed_corpus_is_refused_on_resume_unless_allowed_and_then_logged(data_dir, session_cache, tmp_path):
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  for lang in ("en", "de"):
    with gzip.open(data_dir / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
      (corpus / f"train.{lang}").write_text(f.read(), encoding="utf-8")
  config = make_config("tiny", data_dir, session_cache, train_split=f"files:{corpus}/train.{{lang}}")
  config.train.update(steps=10, log_every=5, eval_every=0, checkpoint_every=10, peak_flops=1e12)
  workdir = tmp_path / "run"
  train_and_evaluate(config, str(workdir))
  (workdir / "checkpoints" / "40.orbax-checkpoint-tmp-123").mkdir()  # a killed run's unfinished save
  lines = (corpus / "train.de").read_text(encoding="utf-8").splitlines()
  lines[::2] = [line.upper() for line in lines[::2]]  # half the targets changed, same file name
  (corpus / "train.de").write_text("\n".join(lines) + "\n", encoding="utf-8")
  config.train.steps = 20
  with pytest.raises(errors.IdentityError, match=r"the training corpus \(config.data.train_split\) has other content"):
    train_and_evaluate(config, str(workdir))
  config.train.allow_data_change = True
  train_and_evaluate(config, str(workdir))
  events = [r for r in metrics.read(workdir) if r.get("event") == "data_change"]
  assert len(events) == 1 and "the training corpus" in events[0]["change"]
  assert not list((workdir / "checkpoints").glob("*orbax-checkpoint-tmp*"))


def test_the_error_classes_are_what_callers_caught_before():
  assert issubclass(errors.ConfigError, ValueError) and issubclass(errors.CheckpointError, ValueError)
  assert issubclass(errors.ResourceError, OSError) and issubclass(errors.TrainingDiverged, RuntimeError)
  refused = errors.from_os_error(OSError(27, "File too large", "/cache/x.bin"), "writing the token cache")
  assert str(refused) == "/cache/x.bin: File too large (writing the token cache)" and refused.errno == 27
  assert errors.from_os_error(OSError(5, "Input/output error")) is None
  assert cli.USAGE_ERROR == 2
