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


def make_config(name: str, data_dir, cache_dir, **data_overrides):
  """A config from configs/NAME.py pointed at the given data and cache folders."""
  import importlib

  config = importlib.import_module(f"configs.{name}").get_config()
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
