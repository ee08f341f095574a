"""The search settings that decide a translation besides the model, the name they give
result files (DIR/eval/NAME.CHECKPOINT.SEARCH.json, seq2seq/inference/evaluate.py), and the
checks every decoding setting passes where it enters: `Translator` constructors and methods,
and the commands' flags (seq2seq/commands/decoding.py). One table, `RULES`, says what each
setting accepts; a value outside it is a ConfigError naming the setting as the caller wrote it
(`alpha=nan` from Python, `--alpha=nan` from a command), raised before any work starts."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import NamedTuple

from seq2seq.errors import ConfigError


class Rule(NamedTuple):
  """What a setting accepts: an integer or a finite real number, at least `low` (more than it
  when `above`), at most `high`."""
  kind: type  # int or float
  low: float | None = None
  high: float | None = None
  above: bool = False
  meaning: str = ""


INT32 = 2**31 - 1
RULES = {
    "beam_size": Rule(int, 1, meaning="the beam size (1: greedy search)"),
    "alpha": Rule(float, 0, 10, meaning="the length penalty exponent"),  # past 10 the penalty overflows float32
    # Output limits a * source length + b stay far inside int32 (sources hold at most MAX_SOURCE_LEN tokens).
    "max_len_a": Rule(float, 0, 100, meaning="the output length limit's factor (a in a * source length + b)"),
    "max_len_b": Rule(int, 0, 100_000, meaning="the output length limit's constant (b in a * source length + b)"),
    "min_len": Rule(int, 0, 100_000, meaning="the shortest output"),
    "batch_size": Rule(int, 1, meaning="sentences per batch"),
    "workers": Rule(int, 1, meaning="batches decoded at once"),
    "max_programs": Rule(int, 0, meaning="compiled searches per call (0: one per source-length bucket)"),
    "max_source_len": Rule(int, 2, 2**20, meaning="the longest source in tokens"),
    "nbest": Rule(int, 1, meaning="translations per sentence"),
    "temperature": Rule(float, 0, above=True, meaning="the sampling temperature"),
    "top_k": Rule(int, 0, meaning="the tokens sampling draws among (0: all)"),
    "top_p": Rule(float, 0, 1, above=True, meaning="the nucleus' probability (1: all tokens)"),
    "seed": Rule(int, -INT32 - 1, INT32, meaning="the sampling seed (a 32-bit integer)"),
}


def check(key: str, value, shown: str | None = None):
  """`value` if it is what setting `key` accepts (RULES), as an int or a float; else a
  ConfigError naming it as `shown` (default `key`): the Python argument or the flag. A bool is
  not a number here, nor is a string that spells one."""
  rule, shown = RULES[key], shown or key
  integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
  real = isinstance(value, numbers.Real) and not isinstance(value, bool)
  if rule.kind is int and not integral:
    raise ConfigError(f"{shown}={value!r}: {rule.meaning} must be an integer, got {type(value).__name__}")
  if rule.kind is float and not real:
    raise ConfigError(f"{shown}={value!r}: {rule.meaning} must be a number, got {type(value).__name__}")
  value = rule.kind(value)
  if rule.kind is float and not math.isfinite(value):
    raise ConfigError(f"{shown}={value}: {rule.meaning} must be a finite number")
  low_ok = rule.low is None or (value > rule.low if rule.above else value >= rule.low)
  if not low_ok or (rule.high is not None and value > rule.high):
    show = lambda x: f"{rule.kind(x):g}" if rule.kind is float else str(int(x))
    bounds = [f"{'>' if rule.above else '>='} {show(rule.low)}" if rule.low is not None else "",
              f"<= {show(rule.high)}" if rule.high is not None else ""]
    raise ConfigError(f"{shown}={show(value)}: {rule.meaning} must be {' and '.join(b for b in bounds if b)}")
  return value


def check_length_limit(max_len_a: float, max_len_b: int, shown=lambda key: key) -> None:
  """An output limit a * source length + b that lets every output hold at least its eos."""
  if max_len_a == 0 and max_len_b < 1:
    raise ConfigError(f"{shown('max_len_a')}=0 and {shown('max_len_b')}={max_len_b} allow no output token: give "
                      f"{shown('max_len_b')} >= 1 or {shown('max_len_a')} > 0")


@dataclasses.dataclass(frozen=True)
class SearchSettings:
  """Beam size (1: greedy), length penalty exponent, the output length limit
  a * source length + b, and the shortest output (eos not allowed before it). Checked when
  made (`RULES`): a value that cannot work is a ConfigError naming the setting."""

  beam_size: int = 4
  alpha: float = 0.6
  max_len_a: float = 1.0
  max_len_b: int = 50
  min_len: int = 0

  def __post_init__(self):
    for field in dataclasses.fields(self):
      object.__setattr__(self, field.name, check(field.name, getattr(self, field.name)))
    check_length_limit(self.max_len_a, self.max_len_b)

  def name(self) -> str:
    """The SEARCH part of result file names: greedy or beamK-alphaA, plus the length limits
    where they differ from the defaults (so differently decoded runs do not overwrite each
    other), e.g. beam4-alpha0.6, greedy-len1x+5, beam4-alpha0.6-min3."""
    default = SearchSettings()
    name = "greedy" if self.beam_size == 1 else f"beam{self.beam_size}-alpha{self.alpha:g}"
    if (self.max_len_a, self.max_len_b) != (default.max_len_a, default.max_len_b):
      name += f"-len{self.max_len_a:g}x+{self.max_len_b}"
    return name + (f"-min{self.min_len}" if self.min_len != default.min_len else "")


class Sampling(NamedTuple):
  """Ancestral sampling instead of search: each next token is drawn from the model's
  distribution with the length rules applied, sharpened or flattened by `temperature`, kept
  to the `top_k` most likely tokens (0: all) and to the smallest set whose probability
  reaches `top_p` (1: all; Holtzman et al. 2020). Draws follow `seed` and each sentence's
  number, so they do not depend on batching (seq2seq/inference/decode.py draws them)."""
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0

  def check(self, shown=lambda key: key) -> Sampling:
    """These settings as numbers, each checked (`RULES`: a ConfigError names the first that
    cannot work, as `shown(key)`)."""
    return Sampling(*(check(key, getattr(self, key), shown(key)) for key in self._fields))


def search_settings(eval_cfg, **overrides) -> dict:
  """Translator keyword arguments from a config's `eval` section, with overrides (None: keep)."""
  from_config = ("beam_size", "alpha", "max_len_a", "max_len_b", "batch_size", "max_source_len", "max_programs")
  known = sorted({*from_config, "min_len", "use_cache", "compact", "workers"})  # the rest: overrides only
  settings = {key: eval_cfg[key] for key in from_config if key in eval_cfg}
  unknown = sorted(set(overrides) - set(known))
  if unknown:
    raise ConfigError(f"unknown search setting(s) {unknown}; known: {known}")
  return settings | {k: v for k, v in overrides.items() if v is not None}
