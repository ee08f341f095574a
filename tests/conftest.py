"""Test-wide settings: faster XLA compiles on the CPU (results stay exact per program)."""

import os

# Tests compile many small programs; LLVM's expensive passes cost more than they save here.
_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FAST_COMPILE).strip()

import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
  """The real data folder: $SEQ2SEQ_DATA_DIR, else ../shared/data beside the repository."""
  path = pathlib.Path(os.environ.get("SEQ2SEQ_DATA_DIR") or REPO.parent / "shared" / "data")
  if not (path / "multi30k" / "train.en.gz").is_file():
    pytest.skip(f"real data not found at {path} (set SEQ2SEQ_DATA_DIR)")
  return path


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> pathlib.Path:
  """One cache folder (tokenizers, corpora) shared by the tests of a session."""
  return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def tiny_run(data_dir, session_cache, tmp_path_factory) -> pathlib.Path:
  """A tiny model trained 60 steps with validation (loss and greedy BLEU on 24 sentences) and a
  checkpoint every 20. Tests that change the run work on a copy."""
  from seq2seq.training.train import train_and_evaluate

  workdir = tmp_path_factory.mktemp("tiny_run")
  config = make_config("tiny", data_dir, session_cache)
  config.train.update(steps=60, log_every=20, eval_every=20, checkpoint_every=20, keep_checkpoints=3)
  config.eval.update(val_bleu_sentences=24, val_beam_size=1, batch_size=16)
  train_and_evaluate(config, str(workdir))
  return workdir


def make_config(name: str, data_dir, cache_dir, **data_overrides):
  """A shipped config (configs/NAME.py) pointed at the given data and cache folders."""
  from seq2seq import configs

  config = configs.get(name)
  config.data.dir = str(data_dir)
  config.data.cache_dir = str(cache_dir)
  config.data.update(data_overrides)
  return config


def free_port() -> int:
  """A TCP port on 127.0.0.1 nothing listens on, for a multi-process run's coordinator."""
  import socket

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def communicate_all(procs, timeout: float = 300) -> list[tuple]:
  """(stdout, stderr) of each process of a multi-process run; any still running afterwards
  (left waiting in a collective by a failed peer, or past the timeout) is killed."""
  try:
    return [p.communicate(timeout=timeout) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()


def tensorboard_scalars(workdir) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value), ...]} of every TensorBoard event file in `workdir` (TFRecord
  framing: length, its crc, the Event proto, its crc)."""
  import struct

  from tensorboardX.proto import event_pb2

  scalars: dict[str, list[tuple[int, float]]] = {}
  for path in sorted(pathlib.Path(workdir).glob("events.out.tfevents.*")):
    raw, offset = path.read_bytes(), 0
    while offset + 12 <= len(raw):
      (length,) = struct.unpack("<Q", raw[offset:offset + 8])
      event = event_pb2.Event.FromString(raw[offset + 12:offset + 12 + length])
      offset += 12 + length + 4
      for value in event.summary.value:
        scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
  return scalars
