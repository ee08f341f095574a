"""Checkpoints in DIR/checkpoints with orbax: the train state (params, optimizer state,
step), the data iterator's position and the run's identity (model settings, vocabulary),
saved asynchronously. Orbax writes each step to a temporary directory and renames it when
complete, so restore only ever sees finished checkpoints. Nothing is pickled.

Once a save has finished, process 0 records the size and sha256 of every file of it in
STEP/seq2seq_checksums.json. Restore verifies them: a checkpoint with a changed, truncated
or missing file is reported (step and file) and the next older one is tried, so bit rot or
a torn copy costs one checkpoint interval, never a silently wrong model.

A save that fails stops training with one error naming the file or folder it was writing
and the last good checkpoint (a full disk or a file-size limit: a ResourceError), and its
unfinished STEP.orbax-checkpoint-tmp folder is removed. What orbax, tensorstore and
tensorboardX log or print about such a failure (tracebacks from their threads and
callbacks) goes to the log at INFO (seq2seq/training/quiet.py), not to the terminal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import signal
import threading
import time

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy as policies

from seq2seq import metrics
from seq2seq.errors import RESOURCE_ERRNOS, CheckpointError, IdentityError, ResourceError
from seq2seq.files import file_sha256, write_atomic
from seq2seq.model import upgrade
from seq2seq.model.config import ModelConfig

CHECKSUMS = "seq2seq_checksums.json"
_log = logging.getLogger(__name__)
_OS_ERROR_CODE = re.compile(r"\[os_error_code='?(\d+)'?\]")  # how tensorstore's errors carry the errno
_QUOTED_PATH = re.compile(r'"(/[^"]+)"')
SAVE_THREADS_TIMEOUT_S = 120.0  # how long a failed save's writes may go on (each fails at once on a full disk)


def _cause(err: BaseException | None) -> tuple[int | None, str | None]:
  """(errno, path) of what made a save fail: an OSError in the exception's chain, or the errno
  and last path that a tensorstore error names ('Failed writing: "PATH" ... [os_error_code='28']');
  None for what it does not say."""
  seen = set()
  while err is not None and id(err) not in seen:
    seen.add(id(err))
    if isinstance(err, OSError) and err.errno:
      return err.errno, None if err.filename is None else str(err.filename)
    if code := _OS_ERROR_CODE.search(str(err)):
      paths = _QUOTED_PATH.findall(str(err))
      return int(code.group(1)), paths[-1].removesuffix(".__lock") if paths else None  # not tensorstore's lock file
    err = err.__cause__ or err.__context__
  return None, None


def write_checksums(step_dir: pathlib.Path) -> None:
  """Records {relative path: [size, sha256]} of every file of a finished checkpoint."""
  files = {str(p.relative_to(step_dir)): [p.stat().st_size, file_sha256(p)]
           for p in sorted(step_dir.rglob("*")) if p.is_file() and p.name != CHECKSUMS}
  write_atomic(step_dir / CHECKSUMS, json.dumps({"files": files}, indent=0))


def verify(step_dir: pathlib.Path) -> str | None:
  """What is wrong with a checkpoint's files, naming the first bad file; None if they match
  their checksums. A checkpoint without checksums (its run stopped right after the save)
  passes, with a warning: only reading it can tell."""
  manifest = step_dir / CHECKSUMS
  if not manifest.is_file():
    _log.warning("%s has no %s (the run stopped before recording them); it is not verified", step_dir, CHECKSUMS)
    return None
  try:
    files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
  except (ValueError, KeyError) as err:
    return f"{manifest}: unreadable ({err})"
  for name, (size, sha256) in files.items():
    path = step_dir / name
    if not path.is_file():
      return f"{path}: missing"
    if path.stat().st_size != size:
      return f"{path}: {path.stat().st_size} bytes, {size} recorded"
    if file_sha256(path) != sha256:
      return f"{path}: contents differ from the recorded sha256"
  return None


# Model settings that choose how the same function is computed, not what the parameters mean:
# a run may resume or be evaluated with another value (e.g. on another platform).
NOT_IDENTITY = ("attention_impl", "norm_impl", "logits_dtype")


def identity(model_cfg: ModelConfig, spm_model: bytes, data: dict | None = None) -> dict:
  """What must match between a checkpoint and the run restoring it. `data`: the data settings
  an exact resume depends on (seq2seq.data.resume_settings); evaluation leaves them out."""
  model = {k: v for k, v in dataclasses.asdict(model_cfg).items() if k not in NOT_IDENTITY}
  out = {"model": model, "spm_sha256": hashlib.sha256(spm_model).hexdigest()}
  return out | ({"data": data} if data is not None else {})


def _data_diff(key: str, saved, current) -> str:
  if key == "train_corpus":  # the content of the tokenized training corpus (seq2seq.data.corpus.Corpus.fingerprint)
    return (f"the training corpus (config.data.train_split) has other content: its tokens hash to {current!r} now, "
            f"{saved!r} in the checkpoint")
  return f"config.data.{key}: checkpoint has {saved!r}, config has {current!r}"


def check_identity(saved: dict, current: dict, where: str, allow_data_change: bool = False) -> list[str]:
  """Raises an IdentityError listing every setting that differs from the checkpoint's. Data
  settings (and corpus content) that differ are refused too (the resumed run would not be the
  same run), unless `allow_data_change` (config.train.allow_data_change): then they are
  returned, for the run to report."""
  # A retired setting (checkpoints written before it was retired) must have the value now fixed.
  model = ModelConfig.RETIRED | current["model"]
  diffs = [f"config.model.{k}: checkpoint has {v!r}, config has {model.get(k)!r}"
           for k, v in saved["model"].items() if model.get(k) != v]
  if saved["spm_sha256"] != current["spm_sha256"]:
    diffs.append("the sentencepiece model (vocabulary) differs from the one the checkpoint was trained with")
  if diffs:
    raise IdentityError(f"{where} does not match this run's config; restoring it would give garbage:\n  "
                     + "\n  ".join(diffs))
  if "data" in saved and "data" in current:
    data_diffs = [_data_diff(k, v, current["data"].get(k)) for k, v in saved["data"].items()
                  if current["data"].get(k) != v]
    if data_diffs and not allow_data_change:
      raise IdentityError(f"{where} was trained with other data or data settings; resuming would not continue the same "
                          "run:\n  "
                       + "\n  ".join(data_diffs) + "\nUse a new --workdir, or pass "
                       "--config.train.allow_data_change=true to go on with the new settings")
    return data_diffs
  return []


def restore_layout(restore, state_dir: pathlib.Path, target):
  """`restore(tree)` (what orbax reads into the layout of `tree`) laid out like `target`. A
  tree saved with separate q/k/v attention weights (orbax's metadata at `state_dir` says) is
  read in that layout and fused (seq2seq.model.upgrade)."""
  if not upgrade.is_old(ocp.PyTreeCheckpointHandler().metadata(state_dir)):
    return restore(target)
  _log.info("%s has separate q/k/v attention weights; fusing them as they are restored", state_dir)
  return upgrade.fuse(target, restore(upgrade.split(target)))


class Checkpoints:
  """Saves when asked; keeps the last `keep` and the one with the
  lowest validation loss; restores the latest."""

  def __init__(self, workdir: str, *, keep: int = 3, asynchronous: bool = True, allow_data_change: bool = False,
               writer: bool = False, root: str | os.PathLike | None = None):
    """`writer`: the training run, which holds the workdir's lock (seq2seq.training.lock):
    any unfinished save (STEP.orbax-checkpoint-tmp) is then a killed run's, and is removed.
    `root`: where the workdir's files are read and written, if not at its path: the held
    directory's `WorkdirLock.anchor`, so that a save in flight when the workdir is moved or
    replaced goes on into the run's own directory (or fails, once it is removed), never into a
    folder now at its path. Messages name the workdir's path."""
    self.workdir = pathlib.Path(workdir).resolve()
    self.directory = self.workdir / "checkpoints"  # as messages name it
    self._root = pathlib.Path(root) if root is not None else self.workdir
    self._dir = self._root / "checkpoints"  # where the checkpoints are
    keep_policy = policies.AnyPreservationPolicy([
        policies.LatestN(n=keep),
        policies.BestN(get_metric_fn=lambda m: -m["val_loss"], n=1, keep_checkpoints_without_metrics=False)])
    options = ocp.CheckpointManagerOptions(preservation_policy=keep_policy, create=True,
                                           enable_async_checkpointing=asynchronous, cleanup_tmp_directories=writer)
    self.manager = ocp.CheckpointManager(self._dir, options=options)
    self._unsealed: int | None = None  # a save whose checksums are not written yet
    self.allow_data_change = allow_data_change
    self.fallbacks: list[dict] = []  # {"step", "problem"} of damaged checkpoints the last restore skipped
    self.data_changes: list[str] = []  # data differences the last restore allowed (allow_data_change)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def _seal(self, block: bool) -> None:
    """Writes the checksums of the last save once it has finished (waiting for it if `block`)."""
    if self._unsealed is None or (not block and (jax.process_count() > 1 or self.manager.is_saving_in_progress())):
      return  # several processes seal only where they all block (finishing a save is collective)
    self.manager.wait_until_finished()  # raises if the save failed
    step_dir = self._dir / str(self._unsealed)
    if jax.process_index() == 0 and step_dir.is_dir():
      write_checksums(step_dir)
    self._unsealed = None

  def check(self) -> None:
    """Raises CheckpointError now if an asynchronous save failed; seals a save that has
    finished. Cheap: the loop calls it after every step."""
    try:
      self.manager.check_for_errors()
      self._seal(block=False)
    except Exception as err:  # noqa: BLE001 - whatever the writer raised (disk full, permissions)
      raise self._save_failed(err) from err

  def last_good(self) -> str:
    """The newest finished checkpoint, as a stopped run names it: "STEP (PATH)", or "none"."""
    good = [s for s in sorted(self.manager.all_steps(), reverse=True) if s != self._unsealed]
    return f"{good[0]} ({self.directory / str(good[0])})" if good else "none"

  def _stopped(self) -> str:
    return f"Training stopped; the last good checkpoint is {self.last_good()}: rerun the same command to resume from it"

  def _save_failed(self, err: Exception) -> CheckpointError | ResourceError:
    """The error of a failed save, naming what it was writing and the last good checkpoint; the
    environment's refusal (a full disk, a file-size limit) is a ResourceError. The save's
    unfinished folder is removed."""
    step = self._unsealed
    self._discard(step)
    code, written = _cause(err)
    if code in RESOURCE_ERRNOS:
      written = self._shown(written) if written else self.directory / f"{step}.orbax-checkpoint-tmp"
      return ResourceError(code, f"saving checkpoint {step} failed: {os.strerror(code)} writing {written}. "
                                 f"{self._stopped()}")
    return CheckpointError(f"saving checkpoint {step} in {self.directory} failed: {type(err).__name__}: "
                           f"{self._shown(err)}. {self._stopped()}")

  def _shown(self, text) -> str:
    """`text` with the paths under `root` named by the workdir's path."""
    return str(text).replace(str(self._dir), str(self.directory))

  def _discard(self, step: int | None) -> None:
    """Removes what a failed save of `step` left (process 0), once orbax has stopped writing:
    its threads that serialize arrays go on after the save has failed."""
    if step is None or jax.process_index() != 0:
      return
    with contextlib.suppress(Exception):  # the save's failure, raised again
      self.manager.wait_until_finished()
    deadline = time.monotonic() + SAVE_THREADS_TIMEOUT_S
    for thread in threading.enumerate():
      if type(thread).__module__.startswith("orbax.") and thread is not threading.current_thread():
        with contextlib.suppress(Exception):  # orbax's threads raise their failure again on join
          thread.join(max(0.0, deadline - time.monotonic()))
    for unfinished in self._dir.glob(f"{step}.orbax-checkpoint-tmp*"):
      shutil.rmtree(unfinished, ignore_errors=True)

  def stopped(self, err: OSError) -> OSError:
    """An OSError that stops training outside a save (a full disk under metrics.jsonl): the
    environment's refusal as a ResourceError naming the file and the last good checkpoint,
    anything else as it is."""
    if isinstance(err, ResourceError) or err.errno not in RESOURCE_ERRNOS:
      return err
    return ResourceError(err.errno, f"{err.filename or self.workdir}: {os.strerror(err.errno)}. {self._stopped()}")

  def quarantine(self, steps) -> None:
    """Moves damaged checkpoints to DIR/damaged_checkpoints/STEP (kept for inspection, out
    of the way of the steps training will save again)."""
    if jax.process_index() == 0:
      for step in steps:
        target = self._root / "damaged_checkpoints" / str(step)
        n = 1
        while target.exists():
          target, n = self._root / "damaged_checkpoints" / f"{step}.{n}", n + 1
        target.parent.mkdir(parents=True, exist_ok=True)
        (self._dir / str(step)).rename(target)
        _log.info("moved damaged checkpoint %d to %s", step, self.workdir / target.relative_to(self._root))
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices("seq2seq_quarantine")
    self.manager.reload()

  def problem(self, step: int) -> str | None:
    """Why checkpoint `step` cannot be used (see `verify`), or None."""
    problem = verify(self._dir / str(step))
    return None if problem is None else self._shown(problem)

  def best_step(self) -> int | None:
    """The kept checkpoint with the lowest validation loss in metrics.jsonl."""
    kept = set(self.manager.all_steps())
    scored = [(r["val_loss"], r["step"]) for r in metrics.read(self.workdir) if "val_loss" in r and r["step"] in kept]
    return min(scored)[1] if scored else None

  def save(self, step: int, state, data_state: dict, run_identity: dict, val_loss: float | None = None) -> None:
    """Saves asynchronously; `val_loss` (when validation ran at this step) ranks it for "best"."""
    self.wait()
    try:
      self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
          identity=ocp.args.JsonSave(run_identity)), metrics=None if val_loss is None else {"val_loss": val_loss},
          force=True)
    except Exception as err:  # noqa: BLE001
      self._unsealed = step
      raise self._save_failed(err) from err
    self._unsealed = step

  def _newest_intact(self, read, step: int | None, skip=()):
    """(step, read(step)) of `step`, or of the newest checkpoint that verifies and reads,
    recording the ones passed over in `self.fallbacks`. A checkpoint that does not match
    the run (check_identity) is an error, not damage."""
    self.fallbacks = []
    candidates = [step] if step is not None else sorted(set(self.manager.all_steps()) - set(skip), reverse=True)
    for candidate in candidates:
      if step is None and not (self._dir / str(candidate)).is_dir():
        continue  # deleted since listed (a training run keeping only its newest): not damage
      try:  # a checkpoint deleted meanwhile (a run keeping its newest) fails here in many ways
        problem = self.problem(candidate)
        if problem is None:
          return candidate, read(candidate)
      except CheckpointError:  # IdentityError too: another run's checkpoint is not damage
        raise
      except Exception as err:  # noqa: BLE001 - orbax/tensorstore raise many kinds on damaged files
        problem = f"cannot be read: {type(err).__name__}: {self._shown(err)}"
      where, there = self.directory / str(candidate), (self._dir / str(candidate)).is_dir()
      if step is None and not there:
        _log.info("checkpoint %d was deleted while being read (a run is training here); trying the next", candidate)
        if candidate == candidates[0]:  # the run may have saved a newer one meanwhile
          self.manager.reload()
          newer = sorted(s for s in self.manager.all_steps() if s > candidate and s not in skip)
          if newer:
            return self._newest_intact(read, None, skip)
        continue
      if step is not None:
        raise CheckpointError(f"checkpoint {candidate} ({where}) " + (f"is damaged: {problem}" if there else
                                                                      "was deleted while being read"))
      _log.info("checkpoint %d is damaged, trying an older one: %s", candidate, problem)
      self.fallbacks.append({"step": int(candidate), "problem": problem})
    damaged = "; ".join(f"{f['step']}: {f['problem']}" for f in self.fallbacks) or "none saved"
    raise CheckpointError(f"no intact checkpoint in {self.directory} ({damaged})")

  def restore(self, target_state, run_identity: dict, step: int | None = None, skip=()):
    """(state, data_state, step) of `step`, or of the newest intact checkpoint not in
    `skip`, laid out like `target_state`; damaged ones passed over are in `self.fallbacks`."""
    def read(step):
      saved = self.manager.restore(step, args=ocp.args.Composite(identity=ocp.args.JsonRestore(),
                                                                 data=ocp.args.JsonRestore()))
      self.data_changes = check_identity(saved.identity, run_identity, str(self.directory / str(step)),
                                         self.allow_data_change)
      state = restore_layout(lambda target: self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target))).state, self._dir / str(step) / "state", target_state)
      return state, saved.data

    step, (state, data_state) = self._newest_intact(read, step, skip)
    return state, data_state, step

  def restore_params(self, target_params, run_identity: dict, step: int | None = None):
    """(parameters, step) of `step`, or of the newest intact checkpoint (no optimizer
    state), laid out like `target_params`."""
    def read(step):
      saved = self.manager.restore(step, args=ocp.args.Composite(identity=ocp.args.JsonRestore()))
      check_identity(saved.identity, run_identity, str(self.directory / str(step)))

      def params(target):
        return self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True))).state
      return restore_layout(params, self._dir / str(step) / "state", {"params": target_params})["params"]

    step, params = self._newest_intact(read, step)
    return params, step

  def wait(self) -> None:
    """Waits for the last save; raises CheckpointError if it failed."""
    try:
      self._seal(block=True)
    except Exception as err:  # noqa: BLE001
      raise self._save_failed(err) from err

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self.manager.close()

  def settle(self) -> None:
    """On a failing run's way out: waits for a save still in flight (sealing it if it finished)
    and closes the manager, so nothing is written once the run lets go of its workdir (and of
    the directory `root` names). The save's own failure goes to the log: the run's first failure
    is the one reported."""
    try:
      self.wait()
    except Exception as err:  # noqa: BLE001 - a full disk, a workdir removed under the save
      _log.info("the checkpoint save in flight when the run stopped did not finish: %s", err)
    finally:
      with contextlib.suppress(Exception):
        self.manager.close()


class StopSignal:
  """Turns SIGTERM / SIGINT (preemption, Ctrl-C) into a flag the loop checks after each step."""

  def __init__(self):
    self.received: int | None = None
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, _frame):
    self.received = signum

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
