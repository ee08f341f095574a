"""Probes of a training run as a user or an admin script pokes it (issue 59): one writer
however the lock file goes (1), a token cache whose own record is checked (5), and a full
disk that is one line naming the file and the last good checkpoint (6). The second round:
a --workdir that is not a run's folder (an export, a user's files, an empty path, a file)
or a cache path that is a file is refused before anything is written (7), and a save in
flight when the workdir is moved, replaced or removed never writes into what stands at its
path (8). Each case failed before its fix. Those that train are slow; the lock, the cache
and the workdir checks are also probed in process, in the fast suite."""

import errno
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import REPO, make_config, optimized_env
from probing import command, one_error_line, snapshot

from seq2seq import configs, errors, metrics
from seq2seq import data as data_lib
from seq2seq.data import corpus as corpus_lib
from seq2seq.data import tokenizer as tk
from seq2seq.data.sources import Source
from seq2seq.training import checkpoint, lock


def _until(predicate, timeout: float = 240.0):
  """Waits for a condition another process brings about (polls; fails after `timeout`)."""
  deadline = time.monotonic() + timeout
  while not predicate():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.1)


def _user_files(tmp_path):
  """A folder of the user's beside the runs: no probe may change it."""
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "notes.txt").write_text("precious\n")
  (mine / "train.lock").write_text("not a lock\n")
  return mine


def _pid_in(path) -> int | None:
  try:
    return json.loads(path.read_text())["pid"]
  except (OSError, ValueError, KeyError):
    return None


# -- 1. one writer per run, however its lock file went ---------------------------------------
def _replace(path):
  new = path.with_name("train.lock.new")
  new.write_text('{"pid": 1, "host": "elsewhere", "started": "then"}\n')
  os.replace(new, path)


LOCK_FILE_GONE = {  # what a user or a cleanup script does to a running trainer's DIR/train.lock
    "removed": lambda path: path.unlink(),
    "renamed": lambda path: path.rename(path.with_name("train.lock.old")),
    "replaced": _replace,
}

HOLD = """
import sys
from seq2seq.training import lock
with lock.hold(sys.argv[1], command="holder"):
  print("held", flush=True)
  sys.stdin.read()
"""


@pytest.mark.parametrize("change", sorted(LOCK_FILE_GONE))
def test_probe_1_a_second_trainer_is_refused_however_the_holders_lock_file_went(change, tmp_path):
  """Before: once the holder's train.lock was gone, a second process took a new one."""
  workdir, mine = tmp_path / "run", _user_files(tmp_path)
  holder = subprocess.Popen([sys.executable, "-c", HOLD, str(workdir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=REPO)
  try:
    assert holder.stdout.readline() == "held\n"
    LOCK_FILE_GONE[change](workdir / "train.lock")
    before = snapshot(workdir, mine)
    with pytest.raises(errors.WorkdirBusy, match=rf"{workdir} is in use by another training run \(pid {holder.pid} "
                                                 r"on host "):
      with lock.hold(workdir):
        pass
    assert snapshot(workdir, mine) == before  # the refused one wrote nothing
  finally:
    holder.kill()
    holder.wait()
  with lock.hold(workdir) as path:  # the killed holder's lock never blocks
    assert _pid_in(path) == os.getpid()


WORKDIR_GONE = {
    "moved": lambda workdir: workdir.rename(workdir.with_name("moved")),
    "replaced": lambda workdir: (workdir.rename(workdir.with_name("moved")), workdir.mkdir()),
    "removed": shutil.rmtree,
}


@pytest.mark.parametrize("change", sorted(WORKDIR_GONE))
def test_probe_1_a_run_takes_its_lock_file_again_and_stops_once_its_workdir_is_gone(change, tmp_path):
  """The check before each save: a lock file removed, renamed or replaced is locked again with
  this run's record; a workdir moved, replaced or removed stops the run, naming it and the
  last good checkpoint."""
  workdir = tmp_path / "run"
  with lock.take(workdir, command="train") as held:
    assert held.check("none") is None
    for gone in LOCK_FILE_GONE.values():
      gone(held.path)
      assert "was removed or replaced while this run trained; recreated it" in held.check("none")
      assert _pid_in(held.path) == os.getpid()
      with open(held.path) as other:  # locked again: another open file cannot take it
        with pytest.raises(BlockingIOError):
          fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    held.path.write_text("")  # emptied: the record is written again, quietly
    assert held.check("none") is None and _pid_in(held.path) == os.getpid()
    WORKDIR_GONE[change](workdir)
    now = rf" \(the directory this run holds is now {tmp_path / 'moved'}\)" if change != "removed" else ""
    with pytest.raises(errors.WorkdirBusy, match=rf"the workdir {workdir} was moved, removed or replaced while this run "
                                                 rf"trained{now}; it no longer writes there. Training stopped; the last "
                                                 r"good checkpoint is 10 \(/x/10\)"):
      held.check("10 (/x/10)")


def test_probe_1_without_a_directory_lock_a_lock_file_another_holds_stops_the_run(tmp_path, monkeypatch, caplog):
  """Where the file system cannot lock a directory (NFS: ENOLCK, EBADF, EINVAL), the lock
  file alone is held; a new lock file that another process holds stops the run."""
  flock = fcntl.flock

  def no_directories(fd, operation):
    if os.path.isdir(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}"):
      raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
    return flock(fd, operation)

  monkeypatch.setattr(fcntl, "flock", no_directories)
  workdir = tmp_path / "run"
  with caplog.at_level(logging.INFO, logger=lock.__name__), lock.take(workdir) as held:
    assert held.directory_fd is None and "does not lock directories" in caplog.text
    held.path.unlink()
    assert "recreated it" in held.check("none")  # nobody else took the new one: this run did
    held.path.unlink()
    with open(held.path, "a+") as other:  # a second trainer let in: it holds the new lock file
      flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
      with pytest.raises(errors.WorkdirBusy, match=rf"{held.path} was replaced while this run trained, and another "
                                                   rf"process holds it .*two runs may be writing {workdir}. Training "
                                                   r"stopped; the last good checkpoint is 20"):
        held.check("20")


@pytest.mark.slow
def test_probe_1_a_second_trainer_is_refused_while_the_first_trains_without_its_lock_file(data_dir, session_cache,
                                                                                         tmp_path):
  """Real trainers: while the first trains, its train.lock is removed, renamed or replaced; a
  second (the same command) exits 2 in one line naming the first, which takes its lock file
  again and goes on, then stops on SIGTERM with one row per step and no temporary folders.
  Before: the second trained too (and the first failed to save, 42 tracebacks)."""
  workdir, mine = tmp_path / "run", _user_files(tmp_path)
  args = [sys.executable, "train.py", "--config=tiny", f"--workdir={workdir}", f"--config.data.dir={data_dir}",
          f"--config.data.cache_dir={session_cache}", "--config.train.steps=100000", "--config.train.log_every=5",
          "--config.train.eval_every=0", "--config.train.checkpoint_every=50", "--config.train.peak_flops=1e12"]
  before = snapshot(data_dir, mine)
  first = subprocess.Popen(args, cwd=REPO, env=optimized_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
  path = workdir / "train.lock"
  try:
    _until(lambda: (workdir / "metrics.jsonl").is_file() and (workdir / "metrics.jsonl").stat().st_size)
    for change, gone in LOCK_FILE_GONE.items():
      inode = path.stat().st_ino
      gone(path)
      second = subprocess.run(args, cwd=REPO, env=optimized_env(), capture_output=True, text=True, timeout=240)
      one_error_line(second, rf"{workdir} is in use by another training run \(pid {first.pid} on host ")
      assert len(second.stderr.splitlines()) == 1, (change, second.stderr)
      _until(lambda: path.exists() and path.stat().st_ino != inode and _pid_in(path) == first.pid)  # taken again
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=300)
  finally:
    if first.poll() is None:
      first.kill()
  assert first.returncode == 0, err[-3000:]
  assert "Traceback" not in err and out.count("was removed or replaced while this run trained; recreated it") == 3
  records = [r for r in metrics.read(workdir) if "loss" in r]
  assert len({r["step"] for r in records}) == len(records) > 0
  assert (workdir / "commands.txt").read_text().count("\n") == 1
  assert not list((workdir / "checkpoints").glob("*orbax-checkpoint-tmp*"))
  assert _pid_in(path) == first.pid
  assert snapshot(data_dir, mine) == before


# -- 5. the token cache's own record -----------------------------------------------------------
@pytest.fixture(scope="module")
def val_pairs(data_dir):
  return list(Source("multi30k:val", "en", "de", data_dir=str(data_dir)))


@pytest.fixture(scope="module")
def tok(val_pairs):
  return tk.Tokenizer(tk.train(tk.sample_sentences(val_pairs, 10**6, 0), vocab_size=400))


STATS_EDITS = {  # edits of stats.json alone, the data files untouched
    "tokens.src=0": lambda stats: stats["tokens"].update(src=0),  # the issue's: IndexError in training, every run
    "pairs.kept": lambda stats: stats["pairs"].update(kept=stats["pairs"]["kept"] - 1),
    "max_id": lambda stats: stats["max_id"].update(tgt=0),
    "dtype": lambda stats: stats.update(dtype="int16"),
    "checksum removed": lambda stats: stats.pop("checksum"),
}


@pytest.mark.parametrize("edit", sorted(STATS_EDITS))
def test_probe_5_an_edited_token_cache_record_is_rebuilt_with_a_warning(edit, tok, val_pairs, tmp_path, monkeypatch,
                                                                        capsys):
  """Before: the edited record passed the cache check and was used as it was."""
  cleaning = corpus_lib.Cleaning()
  fresh = corpus_lib.build(val_pairs, "fp-val", tok, cleaning, tmp_path, "val pairs")
  stats_path = tmp_path / "corpus" / corpus_lib.cache_key("fp-val", tok, cleaning) / "stats.json"
  stats = json.loads(stats_path.read_text())
  STATS_EDITS[edit](stats)
  stats_path.write_text(json.dumps(stats, indent=1))
  monkeypatch.setattr(corpus_lib, "_verified", set())  # as in a new process
  assert corpus_lib.verify(stats_path.parent, tok.vocab_size)[0] == stats_path
  capsys.readouterr()
  again = corpus_lib.build(val_pairs, "fp-val", tok, cleaning, tmp_path, "val pairs")
  assert re.fullmatch(rf"warning: token cache {re.escape(str(stats_path))} is damaged \(.+\); rebuilding it\n",
                      capsys.readouterr().err)
  assert again.stats == fresh.stats and corpus_lib.verify(stats_path.parent, tok.vocab_size) is None
  for name in ("src", "src_offsets", "tgt", "tgt_offsets"):
    np.testing.assert_array_equal(getattr(again, name), getattr(fresh, name))


@pytest.mark.long
def test_probe_5_training_on_an_edited_token_cache_rebuilds_it_and_trains(data_dir, tmp_path):
  """Before: `IndexError: index ... is out of bounds for axis 0 with size 0`, exit 1, on every run."""
  workdir, cache, mine = tmp_path / "run", tmp_path / "cache", _user_files(tmp_path)
  args = [sys.executable, "train.py", "--config=tiny", f"--workdir={workdir}", f"--config.data.dir={data_dir}",
          f"--config.data.cache_dir={cache}", "--config.train.log_every=2", "--config.train.eval_every=0",
          "--config.train.checkpoint_every=2", "--config.train.peak_flops=1e12"]
  first = subprocess.run([*args, "--config.train.steps=2"], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  edited = sorted(cache.glob("corpus/*/stats.json"))
  assert edited
  for stats_path in edited:
    stats = json.loads(stats_path.read_text())
    stats["tokens"]["src"] = 0
    stats_path.write_text(json.dumps(stats, indent=1))
  before = snapshot(data_dir, mine)
  out = subprocess.run([*args, "--config.train.steps=4"], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
  warned = [line for line in out.stderr.splitlines() if line.startswith("warning: token cache ")]
  assert len(warned) == len(edited) and all("stats.json is damaged" in line for line in warned), out.stderr[-3000:]
  assert not [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert [r["step"] for r in metrics.read(workdir) if "loss" in r] == [2, 4]
  assert snapshot(data_dir, mine) == before


# -- 6. a full disk is one line --------------------------------------------------------------
FULL_DISK_RUN = """
import errno, os, resource, runpy, sys
mode = sys.argv.pop(1)
full = []

def refuse(path=None):
  full.append(path)
  raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *([str(path)] if path else []))

if mode == "efbig":  # ulimit -f 256: Python ignores SIGXFSZ, so a write past it fails with EFBIG
  resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
else:  # once the disk is full, tensorboardX's writes fail too (they reach the disk when its buffer is flushed)
  from tensorboardX import record_writer
  flush = record_writer.RecordWriter.flush
  record_writer.RecordWriter.flush = lambda self: refuse() if full else flush(self)
if mode == "orbax":  # the disk fills up while checkpoint 20 is written
  from orbax.checkpoint._src.path import async_path
  write_text = async_path.write_text

  async def failing_write_text(path, text):
    if "/20.orbax-checkpoint-tmp/" in str(path):
      refuse()
    return await write_text(path, text)

  async_path.write_text = failing_write_text
if mode == "metrics":  # the disk fills up under metrics.jsonl after checkpoint 10
  from seq2seq import metrics
  metrics_write = metrics.MetricsWriter.write
  metrics.MetricsWriter.write = lambda self, step, values: refuse(self.path) if step > 10 else metrics_write(
      self, step, values)
if mode == "events":  # the disk fills up under TensorBoard's event file after checkpoint 10: its writer thread dies
  from seq2seq import metrics
  metrics_write, record_write = metrics.MetricsWriter.write, record_writer.RecordWriter.write
  metrics.MetricsWriter.write = lambda self, step, values: (full.append(None) if step > 10 else None,
                                                            metrics_write(self, step, values))[1]
  record_writer.RecordWriter.write = lambda self, data: refuse() if full else record_write(self, data)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

FULL_DISK = {  # mode: the one line expected ({ckpts}: DIR/checkpoints)
    "efbig": r"saving checkpoint 20 failed: File too large writing {ckpts}/20\.orbax-checkpoint-tmp/\S+\. Training "
             r"stopped; the last good checkpoint is 10 \({ckpts}/10\): rerun the same command to resume from it",
    "orbax": r"saving checkpoint 20 failed: No space left on device writing {ckpts}/20\.orbax-checkpoint-tmp\. Training "
             r"stopped; the last good checkpoint is 10 \({ckpts}/10\): rerun the same command to resume from it",
    "metrics": r"{workdir}/metrics\.jsonl: No space left on device\. Training stopped; the last good checkpoint is 10 "
               r"\({ckpts}/10\): rerun the same command to resume from it",
    # tensorboardX's thread died and its queue of 10 filled: the next write waited forever (a hung run)
    "events": r"{workdir}/events\.out\.tfevents\.\S+: No space left on device\. Training stopped; the last good "
              r"checkpoint is 10 \({ckpts}/10\): rerun the same command to resume from it",
}


@pytest.fixture(scope="module")
def ten(data_dir, session_cache, tmp_path_factory):
  """A tiny run trained 10 steps, with checkpoint 10; probes resume copies of it."""
  from seq2seq.training.train import train_and_evaluate

  workdir = tmp_path_factory.mktemp("ten")
  config = make_config("tiny", data_dir, session_cache)
  config.train.update(steps=10, log_every=5, eval_every=0, checkpoint_every=10, peak_flops=2.5e11)
  train_and_evaluate(config, str(workdir))
  return workdir


@pytest.mark.long
@pytest.mark.parametrize("mode", sorted(FULL_DISK))
def test_probe_6_a_full_disk_is_one_line_naming_the_file_and_the_last_good_checkpoint(mode, ten, data_dir,
                                                                                      session_cache, tmp_path):
  """Resumed to 40 steps with checkpoints every 10, on a disk that fills up (ENOSPC, injected)
  or a file-size limit (EFBIG): stderr is one `error:` line, nothing of orbax's or
  tensorboardX's, no temporary checkpoint folder is left and checkpoint 10 stays intact.
  Before: 200-600 lines and 5-50 tracebacks, a last line `error: No space left on device`
  naming no file, and the `20.orbax-checkpoint-tmp` folder left."""
  workdir, mine = shutil.copytree(ten, tmp_path / "run"), _user_files(tmp_path)
  before = snapshot(data_dir, mine)
  out = subprocess.run([sys.executable, "-c", FULL_DISK_RUN, mode, "train.py", "--config=tiny", f"--workdir={workdir}",
                        f"--config.data.dir={data_dir}", f"--config.data.cache_dir={session_cache}",
                        "--config.train.steps=40", "--config.train.log_every=5", "--config.train.eval_every=0",
                        "--config.train.checkpoint_every=10", "--config.train.peak_flops=2.5e11"],
                       cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  ckpts = re.escape(str(workdir / "checkpoints"))
  one_error_line(out, "^error: " + FULL_DISK[mode].format(ckpts=ckpts, workdir=re.escape(str(workdir))) + "$")
  assert len(out.stderr.splitlines()) == 1, out.stderr[-3000:]  # nothing but the error
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["10"]
  assert checkpoint.verify(workdir / "checkpoints" / "10") is None
  assert max(r["step"] for r in metrics.read(workdir) if "loss" in r) < 30, "training went on past the failure"
  assert snapshot(data_dir, mine) == before


# -- 7. a --workdir that is not a run's folder, a path that is a file --------------------------
def _files(folder, *names):
  folder.mkdir(parents=True, exist_ok=True)
  for name in names:
    (folder / name).write_text(f"the user's {name}\n")
  return folder


EXPORT = ("model.safetensors", "export.json", "config.json", "spm.model", "README.md")  # python -m seq2seq.export's
NOT_A_RUN = {  # name: (make(tmp_path) -> --workdir, the refusal)
    "an export": (lambda t: _files(t / "E", *EXPORT), r"--workdir={w} is an exported model \(it holds README\.md, "
                  r"config\.json, export\.json, model\.safetensors, spm\.model\), not a training run's folder: .*"
                  r"Choose a new or empty folder for --workdir"),
    "a user's files": (lambda t: _files(t / "mine", "config.json", "metrics.jsonl"), r"--workdir={w} is not empty and "
                       r"is not a training run's folder \(it holds config\.json, metrics\.jsonl\): training there "
                       r"would overwrite .*Choose a new or empty folder for --workdir"),
    "an empty path": (lambda t: "", r"--workdir is empty \(an unset \$VARIABLE\?\)"),
    "a file": (lambda t: _files(t, "file") / "file", r"--workdir={w} is a file, not a folder; choose a new or empty "
               r"folder for --workdir$"),
    "under a file": (lambda t: _files(t, "file") / "file" / "sub", r"--workdir={w}: {t}/file is a file, not a folder"),
}


def _fixture_run(t):
  return shutil.copytree(REPO / "tests" / "fixtures" / "run_0_1_0", t / "old")  # checkpoints/, no train.lock


A_RUN = {  # what a run may train in: new, empty, or a run's (to resume it, or rerun one that failed early)
    "new": lambda t: t / "new" / "run",
    "empty": lambda t: _files(t / "empty"),
    "a fresh file system": lambda t: (t / "mnt" / "lost+found").mkdir(parents=True) or t / "mnt",
    "failed before its first checkpoint": lambda t: _files(t / "failed", "train.lock", "spm.model", "config.json"),
    "another process's lock file": lambda t: _files(t / "p1", "train.lock.1"),
    "load_tokenizer's": lambda t: _files(t / "tok", "spm.model", "spm_settings.json"),
    "a run by 0.1.0": _fixture_run,
}


def test_probe_7_a_run_trains_in_a_new_or_empty_folder_or_a_runs_and_nowhere_else(tmp_path, monkeypatch):
  """Each folder of A_RUN is taken; each of NOT_A_RUN is refused with its line, nothing written
  (the current directory included). Before: the export's and the user's config.json were
  overwritten, an empty path took the current directory, a file was a FileExistsError or
  NotADirectoryError traceback."""
  for case, make in A_RUN.items():
    with lock.take(str(make(tmp_path / case))) as held:
      assert _pid_in(held.path) == os.getpid(), case
  for case, (make, refusal) in NOT_A_RUN.items():
    t = tmp_path / case
    (t / "cwd").mkdir(parents=True)
    monkeypatch.chdir(t / "cwd")
    workdir = make(t)
    before = snapshot(t)
    with pytest.raises(errors.ConfigError, match=refusal.format(w=re.escape(str(workdir)), t=re.escape(str(t)))):
      with lock.take(str(workdir)):
        pass
    assert snapshot(t) == before, case


def test_probe_7_a_cache_path_that_is_a_file_names_its_setting(tmp_path, monkeypatch):
  config = configs.get("tiny")
  _files(tmp_path, "file")
  monkeypatch.setenv("SEQ2SEQ_CACHE", str(tmp_path / "file"))
  with pytest.raises(errors.ConfigError, match=rf"^SEQ2SEQ_CACHE={tmp_path}/file is a file, not a folder; set "
                                               r"SEQ2SEQ_CACHE to a folder"):
    data_lib.cache_dir(config)
  config.data.cache_dir = str(tmp_path / "file" / "sub")  # the config's setting wins, and is named
  with pytest.raises(errors.ConfigError, match=rf"^config.data.cache_dir={tmp_path}/file/sub: {tmp_path}/file is a "
                                               r"file, not a folder; set config.data.cache_dir to a folder"):
    data_lib.cache_dir(config)
  config.data.cache_dir = str(tmp_path / "new" / "cache")
  assert data_lib.cache_dir(config) == tmp_path / "new" / "cache"


COMMAND_CASES = {  # through seq2seq-train: name: (NOT_A_RUN case or None, environment)
    "an export": ("an export", {}),
    "a user's files": ("a user's files", {}),
    "an empty path": ("an empty path", {}),
    "a file": ("a file", {}),
    "under a file": ("under a file", {}),
    "SEQ2SEQ_CACHE a file": (None, {"SEQ2SEQ_CACHE": "{t}/file"}),
}


@pytest.mark.parametrize("case", sorted(COMMAND_CASES))
def test_probe_7_seq2seq_train_refuses_in_one_line_and_writes_nothing(case, data_dir, tmp_path):
  """Before: exit 0 having rewritten the folder's files, a run in the current directory with
  TensorBoard's ./runs/DATE_HOST, or a traceback."""
  probe, env = COMMAND_CASES[case]
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  if probe:
    make, refusal = NOT_A_RUN[probe]
    workdir, cache = make(tmp_path), ["--config.data.cache_dir=" + str(tmp_path / "cache")]
  else:
    _files(tmp_path, "file")
    workdir, cache, refusal = tmp_path / "run", [], r"SEQ2SEQ_CACHE={t}/file is a file, not a folder"
  before = snapshot(tmp_path)
  out = command("seq2seq.commands.train", "--config=tiny", f"--workdir={workdir}", f"--config.data.dir={data_dir}",
                *cache, "--config.train.steps=2", "--config.train.eval_every=0", cwd=cwd, timeout=300,
                env={k: v.format(t=tmp_path) for k, v in env.items()})
  one_error_line(out, "^error: " + refusal.format(w=re.escape(str(workdir)), t=re.escape(str(tmp_path))))
  assert snapshot(tmp_path) == before


# -- 8. a save in flight when the workdir is moved, replaced or removed ------------------------
HELD_SAVE_RUN = """
import runpy, sys
from orbax.checkpoint._src.path import async_path
go = sys.argv.pop(1)
write_text, held = async_path.write_text, []

async def write_text_when_told(path, text):  # checkpoint 20's save waits, in flight, until the test says go
  if "/20.orbax-checkpoint-tmp/" in str(path) and not held:
    held.append(path)
    print("save of checkpoint 20 held", flush=True)
    with open(go) as fifo:
      fifo.read()
  return await write_text(path, text)

async_path.write_text = write_text_when_told
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _replace(workdir):
  moved = workdir.rename(workdir.with_name("run.old"))
  for _ in range(20):  # as the user did: `mv R R.old && cp -a R.old R`
    copied = subprocess.run(["cp", "-a", str(moved), str(workdir)], capture_output=True, text=True)
    if copied.returncode == 0:
      return
    shutil.rmtree(workdir, ignore_errors=True)  # a file of the save in flight (a lock) vanished mid-copy: again
  raise AssertionError(copied.stderr)


def _remove(workdir):
  while workdir.exists():  # rm -rf: again where the run created an entry meanwhile
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.long
@pytest.mark.parametrize("change", ["replaced", "removed"])
def test_probe_8_a_save_in_flight_never_writes_into_what_stands_at_the_workdirs_path(change, data_dir, session_cache,
                                                                                     tmp_path):
  """Checkpoint 20's save is held in flight (orbax's metadata write waits on a FIFO) while the
  workdir is replaced by a copy (`mv R R.old && cp -a R.old R`) or removed (`rm -rf R`); then
  it goes on. The run stops at step 25 with one line; nothing changed in the copy, and a
  removed workdir stays removed. Before: orbax committed checkpoint 20 (unchecked) into the
  copy and its retention deleted older ones there; a removed workdir was made again."""
  workdir, go = tmp_path / "run", tmp_path / "go"
  os.mkfifo(go)
  trainer = subprocess.Popen(
      [sys.executable, "-c", HELD_SAVE_RUN, str(go), "train.py", "--config=tiny", f"--workdir={workdir}",
       f"--config.data.dir={data_dir}", f"--config.data.cache_dir={session_cache}", "--config.train.steps=1000",
       "--config.train.log_every=5", "--config.train.eval_every=0", "--config.train.checkpoint_every=5",
       "--config.train.keep_checkpoints=2", "--config.train.peak_flops=1e12"],
      cwd=REPO, stdout=subprocess.PIPE, stderr=(tmp_path / "stderr").open("w"), text=True,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  try:
    lines = iter(trainer.stdout.readline, "")
    assert "save of checkpoint 20 held\n" in lines, (tmp_path / "stderr").read_text()[-3000:]
    (_replace if change == "replaced" else _remove)(workdir)
    after = snapshot(workdir) if change == "replaced" else None
    with open(go, "w") as fifo:
      fifo.write("go")
    out = trainer.stdout.read()
    trainer.wait(timeout=300)
  finally:
    if trainer.poll() is None:
      trainer.kill()
  now = f" \\(the directory this run holds is now {re.escape(str(tmp_path / 'run.old'))}\\)" if after else ""
  one_error_line(subprocess.CompletedProcess([], trainer.returncode, out, (tmp_path / "stderr").read_text()),
                 rf"^error: the workdir {re.escape(str(workdir))} was moved, removed or replaced while this run "
                 rf"trained{now}; it no longer writes there\. Training stopped; the last good checkpoint is (15|20) ")
  if change == "removed":
    assert not workdir.exists()
    return
  assert snapshot(workdir) == after
  old = tmp_path / "run.old" / "checkpoints"
  assert sorted(p.name for p in old.iterdir()) == ["15", "20"]  # the save went on in the run's own directory
  assert (old / "20" / checkpoint.CHECKSUMS).is_file() and checkpoint.verify(old / "20") is None
