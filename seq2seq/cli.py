"""What every command-line program shares (all use absl flags):

- `--config=NAME` names a shipped config (seq2seq/configs, e.g. multi30k) from any
  directory; `--config=PATH.py` loads a file.
- Quiet logs: a run prints only its own lines. Library INFO logs (absl, orbax, JAX) appear
  with `--log_level=INFO` (or DEBUG), or absl's `--verbosity=0`; both are listed by --help.
- Bad input fails with one line `error: ...` on stderr and exit status 2, no traceback: a
  config that does not load, an unknown config key (named with the closest valid ones), a
  `seq2seq.errors.Error` (a setting, data, a checkpoint, a download, a model folder, a busy
  workdir), or an OSError of the environment (disk full, no permission, a file-size limit),
  named by its file. Anything else is a bug and keeps its traceback (exit status 1).
- Compiled programs are kept on disk (`--compilation_cache`, default
  $SEQ2SEQ_CACHE/xla/host-HASH or ~/.cache/seq2seq/xla/host-HASH, one folder per host
  instruction set; seq2seq/compilation.py): a second evaluation, a translation or a resumed
  run loads them instead of compiling again. `--compilation_cache=` turns it off;
  JAX_COMPILATION_CACHE_DIR, when set, wins.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import pathlib
import re
import shlex
import sys

from absl import app, flags

from seq2seq import compilation, errors, interrupts
from seq2seq.errors import ConfigError

USAGE_ERROR = 2
INTERRUPTED, BROKEN_PIPE = 128 + 2, 128 + 13  # the statuses of a process ended by SIGINT, SIGPIPE
LOG_LEVELS = {"DEBUG": 1, "INFO": 0, "WARNING": -1, "ERROR": -2, "FATAL": -3}  # as absl --verbosity values


def fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(USAGE_ERROR)


def resolve_config(argv: list[str]) -> list[str]:
  """argv with `--config=NAME` or `--config NAME` (a shipped config) turned into
  `--config=PATH`; a value that is neither a file nor a shipped config ends the command
  with the shipped names and the closest ones."""
  from seq2seq import configs

  out, rest = [], list(argv)
  while rest:
    arg = rest.pop(0)
    if arg == "--config" and rest and out:  # `--config NAME`, as argparse-style commands take it
      arg = f"--config={rest.pop(0)}"
    if arg.startswith("--config="):
      value = arg.split("=", 1)[1]
      resolved = configs.resolve(value)
      if not os.path.isfile(resolved.partition(":")[0]):
        close = difflib.get_close_matches(pathlib.Path(value.partition(":")[0]).name.removesuffix(".py"),
                                          configs.names(), n=2, cutoff=0.6)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        fail(f"--config={value}: no such file, and no shipped config has that name{hint}; shipped configs: "
             f"{', '.join(configs.names())}")
      arg = f"--config={resolved}"
    out.append(arg)
  return out


def command_line(console_name: str) -> str:
  """This process's command line as a user would retype it: `seq2seq-train ...` when run as
  the console command `console_name`, else `python train.py ...` (sys.argv as it is)."""
  program = console_name if os.path.basename(sys.argv[0]) == console_name else None
  return shlex.join([program] + sys.argv[1:] if program else ["python", *sys.argv])


CHECKPOINT_HELP = ("Which checkpoint: latest (the newest intact one; the default), best (the kept one with the "
                   "lowest validation loss) or a step; with --average_last=K, the K checkpoints ending there.")
AVERAGE_LAST_HELP = "Use the mean of K checkpoints' parameters: the K ending at --checkpoint (default: the newest)."


def checkpoint_choice(value: str | None, flag: str = "--checkpoint") -> None | str | int:
  """A --checkpoint flag's value: None (latest: the newest intact checkpoint), "best" or a step."""
  if value is None or value == "latest":
    return None
  if value == "best":
    return value
  if value.isdigit():
    return int(value)
  raise ConfigError(f"{flag}={value}: expected latest, best or a step number")


def deprecated(old: str, new: str) -> None:
  """The line a flag's old name prints: it still works, and says what replaces it."""
  print(f"warning: {old} is deprecated; use {new} (the same flag in seq2seq-eval, seq2seq-translate, "
        "python -m seq2seq.export and python -m seq2seq.average)", file=sys.stderr, flush=True)


def define_distributed_flags():
  """The multi-host flags of train and eval; returns a function that joins the run with them."""
  address = flags.DEFINE_string("coordinator_address", "", "Multi-host runs: auto, or HOST:PORT of process 0.")
  count = flags.DEFINE_integer("num_processes", 0, "Multi-host runs with HOST:PORT: how many processes.")
  index = flags.DEFINE_integer("process_id", -1, "Multi-host runs with HOST:PORT: this process, 0 to N-1.")

  def join() -> None:
    from seq2seq import sharding  # JAX: not imported for --version or --help

    sharding.initialize_distributed(address.value, count.value, index.value)
  return join


def _config_leaves(argv: list[str]) -> dict:
  """{key: default value} of every leaf of the config file named by --config= (for
  explaining a bad override), or {}."""
  path = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if not path:
    return {}
  try:
    spec = importlib.util.spec_from_file_location("cli_config", path.split(":")[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
  except Exception:  # noqa: BLE001 - only for explanations
    return {}

  def leaves(node, prefix):
    for key, value in node.items():
      if hasattr(value, "items"):
        yield from leaves(value, f"{prefix}{key}.")
      else:
        yield f"{prefix}{key}", value
  return dict(leaves(config, ""))


def _config_keys(argv: list[str]) -> list[str]:
  return list(_config_leaves(argv))


def _bad_value(argv: list[str]) -> str | None:
  """`config.KEY=VALUE: ...` for the first override whose value does not parse as its
  setting's type (a number or a bool), or None."""
  defaults = _config_leaves(argv)
  for arg in argv:
    if not arg.startswith("--config.") or "=" not in arg:
      continue
    key, value = arg[len("--config."):].split("=", 1)
    default = defaults.get(key)
    kind = type(default)
    if kind not in (int, float, bool):
      continue
    try:
      if kind is bool:
        if value.lower() not in ("true", "false", "1", "0"):
          raise ValueError(value)
      else:
        kind(value)
    except ValueError:
      return f"config.{key}={value}: expected {'an' if kind is int else 'a'} {kind.__name__} (the default is {default})"
  return None


def explain(err: Exception, argv: list[str]) -> str:
  """A one-line account of a flag or config error, naming an unknown key's closest matches."""
  message = str(err).replace("\\'", "'").replace("\\n", " ").strip("\"' ")
  overrides = [a[len("--config."):].split("=", 1)[0] for a in argv if a.startswith("--config.")]
  quoted = re.match(r"'?([^'\s]+)'?", message)
  name = quoted.group(1) if quoted else message
  unknown = [o for o in overrides if o.split(".")[-1] == name]
  if unknown and isinstance(err, (AttributeError, KeyError)):
    key = unknown[0]
    close = difflib.get_close_matches(key, _config_keys(argv), n=3, cutoff=0.5)
    return f"unknown config key config.{key}" + (f"; did you mean {', '.join('config.' + c for c in close)}?"
                                                 if close else "")
  if isinstance(err, (ValueError, TypeError)):
    return _bad_value(argv) or message
  return message


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with config errors as `error:` lines and quiet library logs."""
  argv = resolve_config(argv)
  try:
    rest = flags.FLAGS(argv)
    _set_log_level()
    if "config" in flags.FLAGS and flags.FLAGS["config"].present:
      flags.FLAGS["config"].value.keys()  # a config file that does not load fails here, not at first use
    return rest
  except OSError as err:  # ml_collections: the config file is missing or raised
    detail = " ".join(str(err).split()).replace("Configuration is not available because of an earlier failure to "
                                                "load: ", "")
    fail(detail)
  except flags.Error as err:
    cause = err.__cause__ or err.__context__
    fail(flag_error(err) or (explain(cause, argv) if isinstance(cause, (AttributeError, KeyError, ValueError, TypeError))
                             else str(err)))
  except (AttributeError, KeyError, ValueError, TypeError, FileNotFoundError, SyntaxError) as err:
    fail(explain(err, argv))
  except (NameError, ImportError) as err:  # a config file that is not Python, or imports what is not installed
    config = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), "")
    fail(f"--config={config}: the config file does not load: {type(err).__name__}: {err}")


FLAG_TYPES = {"int": "an integer", "float": "a number", "bool": "true or false"}


def flag_error(err: Exception) -> str | None:
  """A command flag's parse error as one line naming the flag (`--batch_size=abc: expected an
  integer`, `--workdir is required`), or None for a --config override (see `explain`)."""
  match = re.match(r"flag --([\w-]+)=(.*?): (.*)$", str(err), re.S)
  if not match or match.group(1) not in flags.FLAGS:
    return None
  name, value, detail = match.groups()
  flag = flags.FLAGS[name]
  if "must have a value other than None" in detail:
    return f"--{name} is required ({flag.help.rstrip('.')}); --help lists every flag"
  kind = FLAG_TYPES.get(flag.parser.flag_type())
  return f"--{name}={value}: expected {kind}" if kind else f"--{name}={value}: {detail}"


def _set_log_level() -> None:
  """Library logs at --log_level (default WARNING) unless only absl's --verbosity (-v) was given."""
  if flags.FLAGS["log_level"].present or not flags.FLAGS["verbosity"].present:
    flags.FLAGS.verbosity = LOG_LEVELS[flags.FLAGS.log_level]  # absl applies it to Python's logging (orbax, JAX)


HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull")
CONFIG_HELP = """Config overrides: --config.KEY=VALUE sets any setting of the config, e.g.
  --config.train.steps=5000 --config.model.norm=rmsnorm --config.data.dir=/data
An unknown key is an error naming the closest ones. Shipped configs (--config=NAME or
--config NAME, from any directory): {names}; --config=PATH.py loads a file."""


def answer_before_imports(module: str, define_flags) -> None:
  """`--version` and `--help` answered at the top of a command's module, before it imports JAX
  (4 to 6 s), when `module` is what runs (`python -m`): `define_flags()` defines the command's
  flags for --help (a module whose imports are light needs none of this: `run` answers)."""
  if module != "__main__":
    return
  if "--version" in sys.argv[1:]:
    answer_version(sys.argv[0])
  if any(a in HELP_FLAGS for a in sys.argv[1:]):
    define_flags()
    run(lambda argv: None, module)  # prints the usage and exits


def answer_version(program: str) -> None:
  """Prints the version line of `program` as typed, and exits 0."""
  print(version_line(typed_command(program)), flush=True)
  sys.exit(0)


def typed_command(program: str) -> str:
  """The command as the user typed it: `python -m seq2seq.export`, `seq2seq-train`, `train.py`."""
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  if spec is not None and spec.name not in ("__main__", None) and pathlib.Path(program).resolve() == \
      pathlib.Path(spec.origin or "").resolve():
    return f"python -m {spec.name.removesuffix('.__main__')}"  # a package's __main__: as typed
  return os.path.basename(program)


def version_line(program: str) -> str:
  from importlib import metadata

  import seq2seq

  try:
    installed = metadata.version(seq2seq.DISTRIBUTION)
  except metadata.PackageNotFoundError:
    installed = "not installed"
  return f"{program} {seq2seq.__version__} ({seq2seq.DISTRIBUTION}, installed {installed})"


def usage(program: str, module: str | None, full: bool) -> str:
  """What --help prints: the command's docstring, its flags (the key flags `run` registers
  for `program`: its own, the shared ones), and for a command with --config the override
  syntax and the shipped config names."""
  from seq2seq import configs

  doc = (sys.modules[module].__doc__ or "") if module in sys.modules else ""
  listed = flags.FLAGS.get_help() if full else flags.FLAGS.module_help(program)
  parts = [doc.strip(), listed, "  --version: print the version and exit\n  --helpfull: every flag, the libraries' too"]
  if "config" in flags.FLAGS:
    parts.append(CONFIG_HELP.format(names=", ".join(configs.names())))
  return "\n\n".join(p for p in parts if p) + "\n"


def run(main, module: str | None = None, argv=None, *, also: tuple[str, ...] = ()) -> None:
  """`app.run(main)` with the shared flags, where bad input ends as `error: ...`, exit status 2.
  `module` (the command's module name) puts its flags first in --help, then those of the
  modules `also` names."""
  if "log_level" not in flags.FLAGS:
    flags.DEFINE_enum("log_level", "WARNING", list(LOG_LEVELS), "Library log messages shown (absl, orbax, JAX); "
                      "the run's own lines always are. INFO shows the libraries' progress messages.")
  if "compilation_cache" not in flags.FLAGS:
    flags.DEFINE_string("compilation_cache", compilation.default_folder(), "Folder of compiled programs kept "
                        "between runs (JAX's persistent compilation cache); empty: compile every time.")
  program = (argv or sys.argv)[0]
  shared = [flags.FLAGS[name] for name in ("coordinator_address", "num_processes", "process_id", "log_level",
                                           "compilation_cache", "verbosity") if name in flags.FLAGS]
  by_module = flags.FLAGS.flags_by_module_dict()
  own = sys.argv[0] if module == "__main__" else module  # absl files a `python -m` module's flags under argv[0]
  for flag in [*by_module.get(own, []), *(f for name in also for f in by_module.get(name, [])), *shared]:
    flags.FLAGS.register_key_flag_for_module(program, flag)  # listed by --help, not only --helpfull

  args = list(argv or sys.argv)
  if any(a in HELP_FLAGS for a in args[1:]):  # usage on stdout, exit 0 (absl's own --help exits 1)
    sys.stdout.write(usage(program, module, full="--helpfull" in args[1:]))
    sys.exit(0)
  if "--version" in args[1:]:
    answer_version(program)

  def guarded(args):
    try:
      interrupts.install()
      compilation.enable(flags.FLAGS.compilation_cache)
      status = main(args)
      interrupts.check()
      return status
    except KeyboardInterrupt:  # Ctrl-C: what was written stays (outputs are written whole, at the end)
      print("interrupted (Ctrl-C)", file=sys.stderr, flush=True)
      sys.exit(INTERRUPTED)
    except BrokenPipeError:  # the reader of stdout went away (`| head`): stop quietly, as Unix tools do
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
      sys.exit(BROKEN_PIPE)
    except errors.Error as err:  # the user's mistakes and the environment's refusals (seq2seq/errors.py)
      fail(str(err))
    except OSError as err:  # disk full, no permission, a file-size limit: named, without a traceback
      refused = errors.from_os_error(err)
      if refused is None:
        raise
      fail(str(refused))
  app.run(guarded, argv=argv, flags_parser=parse_flags)
