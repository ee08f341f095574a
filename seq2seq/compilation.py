"""JAX's persistent compilation cache, as the commands and the Python API use it: compiled
programs are kept on disk, so a second evaluation, a translation or a resumed run loads them
instead of compiling again (a wmt14_base beam search takes tens of seconds to compile).

The default folder is $SEQ2SEQ_CACHE/xla/host-HASH (else $XDG_CACHE_HOME/seq2seq/..., else
~/.cache/seq2seq/...), one folder per host CPU type. The commands' `--compilation_cache`
and `Translator.from_workdir(..., compilation_cache=...)` choose another; an empty value
turns it off. JAX_COMPILATION_CACHE_DIR, when set, wins over both.

`compile_problem`: whether a kernel's program compiles here; `kernel_chosen`: whether a setting's
Pallas kernel runs (the GPU kernels' checks).
"""

from __future__ import annotations

import hashlib
import os
import pathlib

from seq2seq.errors import ConfigError

MIN_COMPILE_SECONDS = 0.2  # programs that compile faster are not worth a disk read
KERNEL_IMPLEMENTATIONS = ("auto", "xla", "pallas")  # a Pallas kernel's setting: `kernel_chosen`


def default_folder() -> str:
  """The default cache folder. One per host CPU type: XLA's CPU programs use the host's
  instruction set, so a home directory shared by a cluster's different machines must not
  mix them (accelerator programs are keyed by device already)."""
  try:
    cpu = pathlib.Path("/proc/cpuinfo").read_text()
    cpu = next((line for line in cpu.splitlines() if line.startswith(("flags", "Features"))), cpu[:4096])
  except OSError:
    import platform

    cpu = platform.processor() or platform.machine()
  base = os.environ.get("SEQ2SEQ_CACHE") or pathlib.Path(os.environ.get("XDG_CACHE_HOME") or
                                                         pathlib.Path.home() / ".cache") / "seq2seq"
  return str(pathlib.Path(os.path.expanduser(str(base))) / "xla" / f"host-{hashlib.sha256(cpu.encode()).hexdigest()[:12]}")


def enable(folder: str | None = None) -> str:
  """Keeps compiled programs in `folder` ("": off; None: the folder already configured in
  this process, else `default_folder()`). Returns the folder in use ("" when off).
  JAX_COMPILATION_CACHE_DIR, when set, wins. A folder that cannot be one (a file, or under
  one) is a ConfigError: JAX would warn at every compile and keep nothing."""
  if folder is not None:
    check_folder(folder)
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return os.environ["JAX_COMPILATION_CACHE_DIR"]
  import jax

  if folder is None:
    folder = jax.config.jax_compilation_cache_dir or default_folder()
    check_folder(folder)  # a given folder was checked above
  if not folder:
    return ""

  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
  return folder


def check_folder(folder) -> None:
  """A ConfigError unless `folder` is "" (off) or a path where a folder is or can be made."""
  if not isinstance(folder, (str, os.PathLike)):
    raise ConfigError(f"compilation_cache must be a folder's path, '' (off) or None, got {type(folder).__name__}")
  path = pathlib.Path(os.fspath(folder))
  there = next((p for p in (path, *path.parents) if p.exists()), None) if os.fspath(folder) else None
  if there is not None and not there.is_dir():
    env = os.environ.get("SEQ2SEQ_CACHE", "")
    if env and pathlib.Path(os.path.expanduser(env)).is_relative_to(there):  # the default folder, under it
      raise ConfigError(f"SEQ2SEQ_CACHE={env} is a file, not a folder; set SEQ2SEQ_CACHE to a folder (it holds "
                        "compiled programs, cached tokenizers, token arrays and downloads)")
    raise ConfigError(f"the compilation cache {folder} (--compilation_cache, or SEQ2SEQ_CACHE): {there} is a file; "
                      "give a folder, or --compilation_cache= to compile every time")


def compile_problem(fn, *args) -> str | None:
  """None if `jax.jit(fn)` compiles for `args` (abstract arrays, placed on the device to check),
  else why not, in one line: a kernel that cannot build there (a Triton or driver version, its
  tiles) then costs a warning and XLA's code, not the run."""
  import jax

  try:
    jax.jit(fn).lower(*args).compile()
  except Exception as err:  # noqa: BLE001 - Triton/driver failures come in many kinds
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
  return None


def kernel_chosen(impl: str, setting: str, blockers, problem) -> bool:
  """Whether a Pallas kernel runs for `setting` (config.SECTION.KEY) = `impl`, decided at trace
  time on the platform of the step's devices (the activation mesh's, else JAX's default
  backend): "auto" where it can run (`blockers(platform)`: why not, empty if it can) and
  compiles (`problem(device)`: None, else why not); "pallas" there or a ConfigError saying why
  not; "xla" never; any other value a ConfigError."""
  import jax

  from seq2seq.sharding import current_mesh, kernel_device

  if impl not in KERNEL_IMPLEMENTATIONS:
    raise ConfigError(f"config.{setting} must be one of {KERNEL_IMPLEMENTATIONS}, got {impl!r}")
  if impl == "xla":
    return False
  device = kernel_device(current_mesh())
  why = blockers(jax.default_backend() if device is None else device.platform)
  if not why:
    found = problem(device)
    why = [f"it does not compile on this GPU: {found}"] if found else []
  if why and impl == "pallas":
    raise ConfigError(f"config.{setting}='pallas' cannot run here: {'; '.join(why)}")
  return not why
