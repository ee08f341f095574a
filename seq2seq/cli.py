"""How the command-line programs fail on bad input: one line `error: ...` on stderr and exit
status 2, no traceback. Bad input is a config that does not load, an unknown config key
(named with the closest valid ones), or a ValueError from our code (DataError and
CheckpointError are ValueErrors). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import sys

from absl import app, flags

USAGE_ERROR = 2


def fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(USAGE_ERROR)


def _config_keys(argv: list[str]) -> list[str]:
  """Every leaf key of the config file named by --config= (for suggestions), or []."""
  path = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if not path:
    return []
  try:
    spec = importlib.util.spec_from_file_location("cli_config", path.split(":")[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
  except Exception:  # noqa: BLE001 - only for suggestions
    return []

  def leaves(node, prefix):
    for key, value in node.items():
      if hasattr(value, "items"):
        yield from leaves(value, f"{prefix}{key}.")
      else:
        yield f"{prefix}{key}"
  return list(leaves(config, ""))


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
  return message


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with config errors as `error:` lines."""
  try:
    rest = flags.FLAGS(argv)
    if "config" in flags.FLAGS and flags.FLAGS["config"].present:
      flags.FLAGS["config"].value.keys()  # a config file that does not load fails here, not at first use
    return rest
  except OSError as err:  # ml_collections: the config file is missing or raised
    detail = " ".join(str(err).split()).replace("Configuration is not available because of an earlier failure to "
                                                "load: ", "")
    fail(detail)
  except flags.Error as err:
    cause = err.__cause__ or err.__context__
    fail(explain(cause, argv) if isinstance(cause, (AttributeError, KeyError, ValueError, TypeError)) else str(err))
  except (AttributeError, KeyError, ValueError, TypeError, FileNotFoundError, SyntaxError) as err:
    fail(explain(err, argv))


def run(main, argv=None) -> None:
  """`app.run(main)` where bad input ends as `error: ...`, exit status 2."""
  def guarded(args):
    try:
      return main(args)
    except ValueError as err:  # DataError, CheckpointError and our checks of settings
      fail(str(err))
  app.run(guarded, argv=argv, flags_parser=parse_flags)
