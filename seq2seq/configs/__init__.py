"""The experiment configs, shipped in the package as `seq2seq.configs`.

Each NAME.py has `get_config()` returning an ml_collections ConfigDict. It opens with a
comment of the command that runs it and the result it should reach (`# Expected: ...`),
then a docstring of what it sets, starting from the config it imports
(tests/test_configs.py checks the form). `--config=NAME` on any command names one of these;
`--config=path/to/file.py` loads any config file.
"""

from __future__ import annotations

import importlib.util
import pathlib

from seq2seq.errors import ConfigError

DIRECTORY = pathlib.Path(__file__).parent


def names() -> list[str]:
  """The shipped configs: tiny, multi30k, wmt14_base, ..."""
  return sorted(p.stem for p in DIRECTORY.glob("*.py") if not p.stem.startswith("_"))


def resolve(name_or_path: str) -> str:
  """A config file path: an existing file as given, a shipped config by NAME (or
  configs/NAME.py from any directory); `:argument` suffixes are kept."""
  path, colon, argument = name_or_path.partition(":")
  if pathlib.Path(path).is_file():
    return name_or_path
  stem = pathlib.Path(path).name.removesuffix(".py")
  shipped = DIRECTORY / f"{stem}.py"
  if stem in names() and (path == stem or pathlib.Path(path).parent.name == "configs"):
    return f"{shipped}{colon}{argument}"
  return name_or_path  # the loader names the missing file


def get(name_or_path: str):
  """The ConfigDict of a shipped config's NAME or of a config file."""
  path = resolve(name_or_path).partition(":")[0]
  if not pathlib.Path(path).is_file():
    raise ConfigError(f"config {name_or_path!r} not found: give a file or one of {', '.join(names())}")
  spec = importlib.util.spec_from_file_location(f"seq2seq_config_{pathlib.Path(path).stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()
