"""What `Translator.translate` and `Translator.score` accept, checked at the call that received
it: text (a string, or a list or other iterable of strings), an n-best size, sampling
settings. A wrong type or value is a ConfigError naming the argument, raised before any work,
instead of a TypeError or IndexError from deep inside a search."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import NamedTuple

from seq2seq.errors import ConfigError
from seq2seq.inference.settings import Sampling, check


class Want(NamedTuple):
  """What a translation returns per sentence: the `nbest` best of a beam search, or with
  `sampling` that many drawn outputs."""
  nbest: int = 1
  sampling: Sampling | None = None


def texts(value, name: str) -> tuple[bool, list[str]]:
  """(whether `value` is one string, its strings as a list) of a string or an iterable of
  strings; anything else (None, numbers, bytes, a list holding them) is a ConfigError naming
  `name` and, for a list, the first bad item's position."""
  if isinstance(value, str):
    return True, [value]
  if isinstance(value, (bytes, bytearray)) or not isinstance(value, Iterable):
    raise ConfigError(f"{name} must be a string or a list of strings, got {type(value).__name__}")
  items = list(value)
  for i, item in enumerate(items):
    if not isinstance(item, str):
      raise ConfigError(f"{name}[{i}] must be a string, got {type(item).__name__} ({item!r:.40})")
  return False, items


def want(nbest, sampling, beam_size: int) -> Want:
  """`nbest` and `sampling` checked: nbest an integer >= 1, and at most the beam size for a
  beam search; sampling None or a `Sampling` with settings that can work."""
  nbest = check("nbest", nbest)
  if sampling is not None and not isinstance(sampling, Sampling):
    raise ConfigError(f"sampling must be None or a seq2seq.Sampling (e.g. Sampling(temperature=0.8, top_p=0.9, "
                      f"seed=1)), got {type(sampling).__name__}")
  if sampling is None and nbest > beam_size:
    raise ConfigError(f"nbest={nbest} must be between 1 and the beam size ({beam_size})")
  return Want(nbest, None if sampling is None else sampling.check())


def flag(value, name: str) -> bool:
  """A True/False argument (not a string that spells one, nor a number)."""
  if not isinstance(value, bool):
    raise ConfigError(f"{name} must be True or False, got {type(value).__name__} ({value!r:.40})")
  return value


def path(value, name: str):
  """A folder or file argument: a str or an os.PathLike."""
  if not isinstance(value, (str, os.PathLike)):
    raise ConfigError(f"{name} must be a path (str or os.PathLike), got {type(value).__name__} ({value!r:.40})")
  return value


def padded(items: list, n: int, fill) -> list:
  """`items` filled up to `n` entries with `fill`: the n-best entries a search left empty."""
  return items + [fill] * (n - len(items))
