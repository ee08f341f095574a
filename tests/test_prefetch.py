"""Prefetch: items in order, never more than `depth` ahead, errors raised where they
happened, and closing stops the producer."""

import pytest

from seq2seq.data.prefetch import Prefetch


def test_items_come_in_order_and_the_producer_stays_at_most_depth_ahead():
  consumed = 0
  lead = []

  def produce():
    for i in range(200):
      lead.append(i - consumed)  # items made before the consumer took item `consumed`
      yield i

  got = []
  for item in Prefetch(produce(), depth=3):
    got.append(item)
    consumed += 1
  assert got == list(range(200))
  # Up to 3 queued and 1 taken by the consumer but not yet counted.
  assert max(lead) <= 3 + 1


def test_an_error_is_raised_after_the_items_before_it():
  def produce():
    yield from range(5)
    raise ValueError("line 6 is bad")

  it = Prefetch(produce(), depth=2)
  assert [next(it) for _ in range(5)] == list(range(5))
  with pytest.raises(ValueError, match="line 6 is bad"):
    next(it)
  with pytest.raises(StopIteration):
    next(it)


def test_close_stops_an_endless_producer():
  def produce():
    i = 0
    while True:
      yield i
      i += 1

  with Prefetch(produce(), depth=2) as it:
    assert next(it) == 0
  assert not it._thread.is_alive()
  with pytest.raises(StopIteration):
    next(it)


def test_depth_must_be_positive():
  with pytest.raises(ValueError, match="depth must be >= 1"):
    Prefetch([], depth=0)
