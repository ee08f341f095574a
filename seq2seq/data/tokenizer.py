"""One joint sentencepiece model for source and target: trained from a seeded sample of
the training pairs, saved atomically, reused when it exists. Ids: pad=0, eos=1, unk=2
(seq2seq/special_tokens.py; the decoder's start token is eos)."""

from __future__ import annotations

import io
import os
import pathlib
from collections.abc import Iterable

import numpy as np
import sentencepiece as spm

from seq2seq.errors import ConfigError, DataError
from seq2seq.special_tokens import SPECIAL, SpecialTokens

PAD_ID, EOS_ID, UNK_ID = SPECIAL.pad, SPECIAL.eos, 2
# sentencepiece's trainer splits its work into `num_threads` parts and adds them up in that
# order, so the pieces' scores, and with them their ids, depend on the count. A fixed count
# makes the model the same on every machine for one sentencepiece version (os.cpu_count()
# gave other ids on 16 cores than on 2). 16 is the count the GPU runs trained with (16 cores),
# so the README's command trains their tokenizer byte for byte; on 2 cores it costs 6% over 2
# threads (100 s against 94 s for a 1M-sentence WMT-like sample, docs/data.md#tokenizing).
TRAIN_THREADS = 16


def sample_sentences(pairs: Iterable[tuple[str, str]], size: int, seed: int) -> list[str]:
  """Up to `size` sentences (both sides of the pairs), a uniform sample for a given seed.

  Reservoir sampling (Vitter's algorithm R): one pass, memory bounded by `size`.
  """
  rng = np.random.default_rng(seed)
  reservoir: list[str] = []
  draws, d = np.empty(0, np.int64), 0
  seen = 0
  for pair in pairs:
    for sentence in pair:
      if not sentence.strip():
        continue
      if seen < size:
        reservoir.append(sentence)
      else:
        if d == len(draws):  # draw uniforms in blocks: one numpy call per 65536 sentences
          draws, d = rng.random(1 << 16), 0
        j = int(draws[d] * (seen + 1))
        d += 1
        if j < size:
          reservoir[j] = sentence
      seen += 1
  return reservoir


def trained_by() -> dict:
  """What a trained model depends on besides its sample and settings."""
  return {"sentencepiece": spm.__version__, "threads": TRAIN_THREADS}


def train(sentences: list[str], *, vocab_size: int, model_type: str = "unigram", character_coverage: float = 1.0,
          seed: int = 0) -> bytes:
  """Trains a sentencepiece model on `sentences`; returns the serialized model."""
  if not sentences:
    raise DataError("cannot train a sentencepiece model on an empty sample")
  if model_type not in ("unigram", "bpe"):
    raise ConfigError(f"config.data.spm_model_type must be 'unigram' or 'bpe', got {model_type!r}")
  model = io.BytesIO()
  # The sample is already seeded and in a fixed order; sentencepiece must not reshuffle it.
  order = np.random.default_rng(seed).permutation(len(sentences))
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=(sentences[i] for i in order), model_writer=model, vocab_size=vocab_size,
        model_type=model_type, character_coverage=character_coverage, pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID,
        bos_id=-1, input_sentence_size=0, shuffle_input_sentence=False, hard_vocab_limit=False,
        max_sentence_length=1 << 14, num_threads=TRAIN_THREADS, minloglevel=2)
  except RuntimeError as err:  # sentencepiece refuses settings it cannot train with, e.g. too few pieces
    detail = str(err).splitlines()[0].split("] ")[-1]
    raise ConfigError(f"sentencepiece cannot train with config.data.vocab_size={vocab_size}, spm_model_type="
                      f"{model_type}, spm_character_coverage={character_coverage} on {len(sentences)} sample "
                      f"sentences: {detail}") from None
  return model.getvalue()


class Tokenizer:
  """Sentencepiece processor with batch encoding to id arrays and decoding to text."""

  def __init__(self, model: bytes):
    self.model_bytes = model
    self.sp = spm.SentencePieceProcessor(model_proto=model)
    if (self.sp.pad_id(), self.sp.eos_id(), self.sp.unk_id()) != (PAD_ID, EOS_ID, UNK_ID):
      raise DataError(f"sentencepiece model must have pad=0, eos=1, unk=2; has pad={self.sp.pad_id()}, "
                       f"eos={self.sp.eos_id()}, unk={self.sp.unk_id()}")

  @classmethod
  def load(cls, path: str | os.PathLike) -> Tokenizer:
    try:
      return cls(pathlib.Path(path).read_bytes())
    except (OSError, RuntimeError) as e:
      raise DataError(f"{path}: cannot load a sentencepiece model: {e}") from None

  @property
  def model_type(self) -> str:
    """'unigram', 'bpe', 'word' or 'char', from the model's trainer settings."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto.FromString(self.model_bytes)
    return sentencepiece_model_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type).lower()

  @property
  def special(self) -> SpecialTokens:
    """The pad, bos and eos ids (checked when the model is loaded)."""
    return SPECIAL

  @property
  def vocab_size(self) -> int:
    return self.sp.get_piece_size()

  def encode(self, sentences: list[str], num_threads: int = -1) -> list[list[int]]:
    """Token ids of each sentence, with eos appended."""
    return self.sp.encode(sentences, out_type=int, add_eos=True, num_threads=num_threads)

  def nbest_encode(self, sentences: list[str], nbest: int) -> list[list[list[int]]]:
    """The `nbest` best segmentations of each sentence (best first), eos appended; deterministic."""
    return self.sp.nbest_encode(sentences, out_type=int, nbest_size=nbest, add_eos=True)

  @property
  def piece_log_probs(self) -> np.ndarray:
    """Each piece's score: its log probability in a unigram model (0 for pad, eos, unk)."""
    return np.array([self.sp.get_score(i) for i in range(self.vocab_size)], np.float64)

  def decode(self, ids: Iterable[int]) -> str:
    """Text of one id sequence; stops at the first eos and skips padding."""
    out = []
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i != PAD_ID:
        out.append(i)
    return self.sp.decode(out)

