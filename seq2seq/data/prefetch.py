"""Producing ahead of the consumer: `Prefetch(iterable, depth)` runs the iterable in a
background thread and keeps up to `depth` items ready. The corpus reads the next chunk of
text while sentencepiece encodes this one; the training loop builds (and transfers) the
next batches while the device runs this step.

Items come out in order; an exception in the producer is raised in the consumer at the
item where it happened; `close()` (or leaving a `with` block) stops the thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
_DONE = object()


class Prefetch(Generic[T]):
  """An iterator over `iterable`'s items, produced up to `depth` ahead in a thread."""

  def __init__(self, iterable: Iterable[T], depth: int = 2):
    if depth < 1:
      raise ValueError(f"prefetch depth must be >= 1, got {depth}")
    self._queue: queue.Queue = queue.Queue(maxsize=depth)
    self._stop = threading.Event()
    self._finished = False
    self._thread = threading.Thread(target=self._produce, args=(iter(iterable),), daemon=True,
                                    name="seq2seq-prefetch")
    self._thread.start()

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def _produce(self, iterator: Iterator[T]) -> None:
    try:
      for item in iterator:
        if not self._put((item, None)):
          return
    except BaseException as e:  # handed to the consumer, raised there
      self._put((_DONE, e))
      return
    self._put((_DONE, None))

  def __iter__(self) -> Prefetch[T]:
    return self

  def __next__(self) -> T:
    if self._finished:
      raise StopIteration
    item, error = self._queue.get()
    if item is _DONE:
      self._finished = True
      self._thread.join()
      if error is not None:
        raise error
      raise StopIteration
    return item

  def close(self) -> None:
    """Stops the producer (it finishes the item it is making) and waits for it."""
    self._stop.set()
    while self._thread.is_alive():
      try:
        self._queue.get(timeout=0.1)
      except queue.Empty:
        pass
    self._finished = True

  def __enter__(self) -> Prefetch[T]:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
