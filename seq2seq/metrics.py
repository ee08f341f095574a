"""Where training reports go: DIR/metrics.jsonl (one JSON object per logged step, flat keys:
loss, val_loss, ...) and TensorBoard event files in DIR, where the tags are grouped so that
train and validation curves share charts: train/loss beside val/loss, eval/NAME/bleu for
eval.py's scores. Only process 0 writes."""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import pathlib

from seq2seq.errors import DataError
from seq2seq.files import write_atomic


class MetricsWriter:
  def __init__(self, workdir: str | os.PathLike, *, enabled: bool = True):
    self.enabled = enabled
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self._tb = None
    if enabled:
      from tensorboardX import SummaryWriter  # writes event files without TensorFlow

      # A queue longer than one record's scalars: a write never waits on it (see _events_stopped).
      self._tb = SummaryWriter(str(workdir), flush_secs=30, max_queue=1000)

  def write(self, step: int, values: dict) -> None:
    """Appends {"step": step, **values} and the scalars to TensorBoard."""
    if not self.enabled:
      return
    if (stopped := self._events_stopped()) is not None:
      raise stopped
    record = {"step": int(step)} | {k: _plain(v) for k, v in values.items()}
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(json.dumps(record) + "\n")
    for k, v in record.items():
      if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        self._tb.add_scalar(tensorboard_tag(k), v, int(step))

  def _events_stopped(self) -> OSError | None:
    """The OSError that stopped tensorboardX's writer thread (a full disk), naming the event
    file, or None while it runs. Once it has stopped, its queue fills and a write would wait
    forever: the run stops with this error instead."""
    events = getattr(getattr(self._tb, "file_writer", None), "event_writer", None)
    worker = getattr(events, "_worker", None)
    if worker is None or worker.is_alive() or getattr(events, "_closed", False):
      return None
    from seq2seq.training import quiet  # where the thread's error was recorded

    cause = quiet.thread_errors.get(worker)
    name = str(getattr(getattr(events, "_ev_writer", None), "_file_name", None) or self.path.parent)
    if isinstance(cause, OSError) and cause.errno:
      return OSError(cause.errno, cause.strerror, name)
    return OSError(errno.EIO, f"TensorBoard's event writer stopped: {cause!r}", name)

  def flush(self) -> None:
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def tensorboard_tag(key: str) -> str:
  """train/loss for loss, val/loss for val_loss; keys with a group already keep it."""
  if "/" in key:
    return key
  return f"val/{key[4:]}" if key.startswith("val_") else f"train/{key}"


def write_scalars(workdir: str | os.PathLike, step: int, values: dict[str, float]) -> None:
  """Adds scalars under their tags (e.g. eval/test_2016_flickr/bleu) to the run's TensorBoard."""
  from tensorboardX import SummaryWriter

  with SummaryWriter(str(workdir)) as tb:
    for tag, value in values.items():
      tb.add_scalar(tag, value, int(step))


def _plain(v):
  if hasattr(v, "item"):
    v = v.item()
  if isinstance(v, float) and not math.isfinite(v):
    return str(v)  # JSON has no NaN/inf
  return v


def read(workdir: str | os.PathLike) -> list[dict]:
  """All records of DIR/metrics.jsonl. A torn last line (a crash or a full disk mid-write) is
  dropped with a warning; a bad line elsewhere is an error naming the file and line."""
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.is_file():
    return []
  lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
  records = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError as err:
      if any(rest.strip() for rest in lines[number:]):
        raise DataError(f"{path}:{number}: not a JSON record ({err}): {line[:80]!r}") from None
      logging.getLogger(__name__).warning("%s:%d: dropped a torn last line (%s): %r", path, number, err, line[:80])
  return records


def training_summary(workdir: str | os.PathLike) -> dict:
  """How a run was trained, from its files: the first command of DIR/commands.txt, the last
  logged step, its wall time in minutes and the mean target tokens/s."""
  workdir = pathlib.Path(workdir)
  records = [r for r in read(workdir) if "loss" in r]
  commands = (workdir / "commands.txt").read_text().splitlines() if (workdir / "commands.txt").is_file() else []
  speeds = [r["target_tokens_per_s"] for r in records if "target_tokens_per_s" in r]
  return {"command": commands[0] if commands else "?", "steps": records[-1]["step"] if records else 0,
          "minutes": records[-1].get("wall_time_s", 0) / 60 if records else 0.0,
          "tokens_per_s": sum(speeds) / len(speeds) if speeds else 0.0}


def truncate_after(workdir: str | os.PathLike, step: int) -> list[dict]:
  """Drops records of steps after `step` (a restart redoes them), rewriting atomically; returns those kept."""
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.is_file():
    return []
  kept = [r for r in read(workdir) if r["step"] <= step]
  write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))  # as MetricsWriter writes them
  return kept
