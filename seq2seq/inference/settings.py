"""The search settings that decide a translation besides the model, and the name they give
result files (DIR/eval/NAME.CHECKPOINT.SEARCH.json, seq2seq/inference/evaluate.py)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SearchSettings:
  """Beam size (1: greedy), length penalty exponent, the output length limit
  a * source length + b, and the shortest output (eos not allowed before it)."""

  beam_size: int = 4
  alpha: float = 0.6
  max_len_a: float = 1.0
  max_len_b: int = 50
  min_len: int = 0

  def name(self) -> str:
    """The SEARCH part of result file names: greedy or beamK-alphaA, plus the length limits
    where they differ from the defaults (so differently decoded runs do not overwrite each
    other), e.g. beam4-alpha0.6, greedy-len1x+5, beam4-alpha0.6-min3."""
    default = SearchSettings()
    name = "greedy" if self.beam_size == 1 else f"beam{self.beam_size}-alpha{self.alpha:g}"
    if (self.max_len_a, self.max_len_b) != (default.max_len_a, default.max_len_b):
      name += f"-len{self.max_len_a:g}x+{self.max_len_b}"
    return name + (f"-min{self.min_len}" if self.min_len != default.min_len else "")
