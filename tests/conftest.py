"""Test-wide settings and fixtures.

- Data: tests read a synthetic corpus (tests/synthetic.py) written into a session folder laid
  out as SEQ2SEQ_DATA_DIR is (`data_dir`), so `pytest` needs no data folder. Tests about the
  real corpora take `real_data_dir` (the real folder: $SEQ2SEQ_DATA_DIR, else ../shared/data)
  and carry `@pytest.mark.data`; they skip where it is missing. SEQ2SEQ_DATA_DIR itself is
  removed from the environment, so that no test reads real data without saying so.
- Compilation: faster XLA compiles on the CPU (results stay exact per program), and JAX's
  persistent compilation cache shared by the session's processes (workers, and the commands
  tests start): $JAX_COMPILATION_CACHE_DIR when set (.ci/run sets one for the whole run), else
  a temporary folder removed at the end.
- Order: tests marked `longest` start first, so a parallel run (pytest-xdist) does not end
  waiting on one of them; then those of the trained tiny run.
- Built once: the synthetic data, the data cache and the trained tiny run are made by the
  first process that needs them and used by the others (`built_once`; .ci/run points both
  suites at one folder with SEQ2SEQ_TESTS_SHARED).
"""

import os
import pathlib
import shutil
import tempfile

# Tests compile many small programs; LLVM's expensive passes cost more than they save here.
# Long trainings in a subprocess (the notebook, soak and bf16 tests) run without them: `optimized_env`.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
OPTIMIZED_XLA_FLAGS = " ".join(os.environ.get("XLA_FLAGS", "").replace(FAST_COMPILE, "").split())  # as a worker inherits it
os.environ["XLA_FLAGS"] = (OPTIMIZED_XLA_FLAGS + " " + FAST_COMPILE).strip()

REPO = pathlib.Path(__file__).resolve().parents[1]
# Moved to a variable of the tests' own (xdist workers inherit the environment the first process made).
REAL_DATA = pathlib.Path(os.environ.setdefault(
    "SEQ2SEQ_TESTS_REAL_DATA", os.environ.pop("SEQ2SEQ_DATA_DIR", "") or str(REPO.parent / "shared" / "data")))

if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):  # the first process of the session (workers inherit it)
  _OWN_CACHE = tempfile.mkdtemp(prefix="seq2seq-tests-xla-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
else:
  _OWN_CACHE = None
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # the tests' programs compile fast

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
  for item in items:
    if "real_data_dir" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("data"):
      raise pytest.UsageError(f"{item.nodeid} reads the real corpora (real_data_dir): mark it @pytest.mark.data")
  # Stable: otherwise as collected. The tests of the trained tiny run come early: the first
  # worker to need it trains it (`built_once`), while the other goes on with other tests.
  items.sort(key=lambda item: (item.get_closest_marker("longest") is None,
                               "tiny_run" not in getattr(item, "fixturenames", ())))


def pytest_unconfigure(config):
  if _OWN_CACHE and not hasattr(config, "workerinput"):  # the controller (or a run without workers)
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook
def pytest_xdist_auto_num_workers(config):
  """`-n auto`: one worker per core, at most 4 (each builds the session fixtures again)."""
  return max(1, min(os.cpu_count() or 1, 4))


def optimized_env() -> dict[str, str]:
  """os.environ for a subprocess that trains long enough for compiled code speed to matter:
  XLA's default optimization, not the tests' fast-compile flags."""
  return {**os.environ, "XLA_FLAGS": OPTIMIZED_XLA_FLAGS}


def shared_folder(tmp_path_factory) -> pathlib.Path:
  """Where the session fixtures below are built once for every process that asks:
  $SEQ2SEQ_TESTS_SHARED when set (.ci/run: one folder for the fast and the slow suite), else
  the folder the xdist workers of this session share (else this session's own)."""
  if os.environ.get("SEQ2SEQ_TESTS_SHARED"):
    path = pathlib.Path(os.environ["SEQ2SEQ_TESTS_SHARED"])
  else:
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
  path.mkdir(parents=True, exist_ok=True)
  return path


def built_once(folder: pathlib.Path, build) -> pathlib.Path:
  """`folder`, made by `build(folder)` in the first process that asks for it; the others wait
  for it (a lock file beside it), then use it as it is. A build that failed or was killed
  leaves no `.done` mark, so the next process builds it again from nothing."""
  import fcntl

  done = folder.with_name(folder.name + ".done")
  with open(folder.with_name(folder.name + ".lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
    if not done.exists():
      shutil.rmtree(folder, ignore_errors=True)
      folder.mkdir(parents=True)
      build(folder)
      done.touch()
  return folder


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> pathlib.Path:
  """A data folder with the synthetic corpus: multi30k/ (train 6000 pairs, val 300,
  test_2016_flickr and test_2017_flickr 200, en and de) and wmt14/ (newstest2013 and 2014,
  plain and SGML). Written once (`built_once`); tests read it, and copy what they change."""
  import synthetic

  return built_once(shared_folder(tmp_path_factory) / "data", synthetic.write)


@pytest.fixture(scope="session")
def real_data_dir() -> pathlib.Path:
  """The real data folder: $SEQ2SEQ_DATA_DIR, else ../shared/data beside the repository.
  Only for tests marked `data`."""
  if not (REAL_DATA / "multi30k" / "train.en.gz").is_file():
    pytest.skip(f"real data not found at {REAL_DATA} (set SEQ2SEQ_DATA_DIR)")
  return REAL_DATA


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> pathlib.Path:
  """One cache folder (tokenizers, corpora) shared by the tests of a session and its workers
  (the data code writes it atomically: concurrent runs share caches as cluster jobs do)."""
  path = shared_folder(tmp_path_factory) / "cache"
  path.mkdir(exist_ok=True)
  return path


@pytest.fixture(scope="session")
def tiny_run(data_dir, session_cache, tmp_path_factory) -> pathlib.Path:
  """A tiny model trained 60 steps with validation (loss and greedy BLEU on 24 sentences) and a
  checkpoint every 20. Trained once (`built_once`); each worker gets its own copy, where its
  tests may add files (eval results, averages). Tests that change the run work on a copy."""
  from seq2seq.training.train import train_and_evaluate

  def train(workdir):
    config = make_config("tiny", data_dir, session_cache)
    config.train.update(steps=60, log_every=20, eval_every=20, checkpoint_every=20, keep_checkpoints=3,
                        peak_flops=1e12)  # no matmul measured at each evaluation (2 s)
    config.eval.update(val_bleu_sentences=24, val_beam_size=1, batch_size=16)
    train_and_evaluate(config, str(workdir))

  workdir = tmp_path_factory.mktemp("tiny_run")
  shutil.copytree(built_once(shared_folder(tmp_path_factory) / "tiny_run", train), workdir, dirs_exist_ok=True)
  return workdir


def make_config(name: str, data_dir, cache_dir, **data_overrides):
  """A shipped config (configs/NAME.py) pointed at the given data and cache folders."""
  from seq2seq import configs

  config = configs.get(name)
  config.data.dir = str(data_dir)
  config.data.cache_dir = str(cache_dir)
  config.data.update(data_overrides)
  return config


def benchmark(name: str):
  """benchmarks/NAME.py imported as module NAME (registered in sys.modules, where its
  dataclasses look their module up; its own imports find benchmarks/ as it puts it on the path)."""
  import importlib.util
  import sys

  spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


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
