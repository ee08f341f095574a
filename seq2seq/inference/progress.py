"""What a long translation shows while it runs, on stderr (process 0 only):

- at a terminal, a progress bar with sentences/s, reading "compiling" while the search
  programs compile;
- elsewhere (a log file, a batch job), a line "compiling N search programs" when it starts
  compiling, and a line per finished group of batches, at most one every `every` seconds:
    translated 640/3003 sentences in 12.1 s (52.9 sentences/s)
- nothing when it is off (`progress=False`, the commands' --quiet).
"""

from __future__ import annotations

import sys
import time

from seq2seq import interrupts


class Progress:

  def __init__(self, total: int, *, enabled: bool, stream=None, every: float = 10.0, clock=time.monotonic):
    self.total, self.every, self.clock = total, every, clock
    self.stream = sys.stderr if stream is None else stream
    self.enabled = enabled and total > 0
    self.done, self.start = 0, clock()
    self.last_line = self.start
    self.bar, self.told_compiling = None, False
    if self.enabled and self.stream.isatty():
      from tqdm import tqdm

      self.bar = tqdm(total=total, unit="sent", dynamic_ncols=True, leave=False, file=self.stream)

  def compiling(self, programs: int) -> None:
    """`programs` search programs are being compiled (0: no longer)."""
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.set_description_str(f"compiling {programs} search program{'s' * (programs != 1)}" if programs else "")
    elif programs and not self.told_compiling:
      self.told_compiling = True
      self._line(f"compiling {programs} search program{'s' * (programs != 1)}")

  def update(self, sentences: int) -> None:
    interrupts.check()  # after each batch: a Ctrl-C that Python lost stops here
    self.done += sentences
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.update(sentences)
      return
    now = self.clock()
    if now - self.last_line >= self.every and self.done < self.total:
      seconds = now - self.start
      self._line(f"translated {self.done}/{self.total} sentences in {seconds:.1f} s "
                 f"({self.done / max(seconds, 1e-9):.1f} sentences/s)")

  def _line(self, text: str) -> None:
    self.last_line = self.clock()
    print(text, file=self.stream, flush=True)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
