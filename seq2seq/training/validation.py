"""Validation during training: the loss on the validation split's fixed batches and, when
`eval.val_bleu_sentences` is set, BLEU of the first N sentences decoded as seq2seq-eval does."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from seq2seq import data, sharding
from seq2seq.data.batching import epoch_plan, make_batch
from seq2seq.inference.score import score
from seq2seq.inference.translate import Translator, search_settings
from seq2seq.model.config import ModelConfig
from seq2seq.training.loss import summarize


def validation_batches(config, tok, mesh) -> list[dict]:
  """The validation split as fixed, deterministic batches (this process's rows)."""
  corpus = data.load_corpus(config, config.data.validation_split, tok)
  plan = epoch_plan(corpus.src_lengths, corpus.tgt_lengths, data.batching_config(config), seed=0, epoch=0)
  return [make_batch(corpus, p, jax.process_index(), jax.process_count()) for p in plan]


def evaluate(steps, params, batches: list[dict], mesh) -> dict[str, float]:
  totals = None
  for local in batches:
    sums = steps.eval(params, sharding.put_batch(local, mesh))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  return summarize(jax.device_get(totals))


def bleu_validator(config, model_cfg, graphdef, tok, mesh):
  """A function params -> {"bleu", "chrf", "bleu_seconds"} on the first `eval.val_bleu_sentences`
  validation pairs (the same decoding as eval.py), or None when that is 0. bleu_seconds is
  the cost of translating and scoring them (the first call compiles). With `val_beam_size`
  equal to `beam_size` its search programs are eval.py's, so the compilation cache they go
  into spares eval.py compiling them (`validate.translator`)."""
  e = config.eval
  n = e.val_bleu_sentences
  if not n:
    return None
  pairs = data.eval_pairs(config, config.data.validation_split)[:n]
  translator = Translator(model_cfg, graphdef, tok, mesh, **search_settings(e, beam_size=e.val_beam_size))

  def validate(params) -> dict[str, float]:
    start = time.perf_counter()
    result = score(translator(params, [s for s, _ in pairs]), [t for _, t in pairs])
    return {"bleu": result["bleu"], "chrf": result["chrf"], "bleu_seconds": time.perf_counter() - start}

  validate.translator = translator
  return validate


class Validation:
  """params -> {"loss", "perplexity", ...} on the validation split's fixed batches, with
  "bleu", "chrf" and "bleu_seconds" when `eval.val_bleu_sentences` is set."""

  def __init__(self, config, model_cfg: ModelConfig, graphdef, tok, mesh, steps):
    self.batches = validation_batches(config, tok, mesh)
    self.bleu = bleu_validator(config, model_cfg, graphdef, tok, mesh)
    self.steps, self.mesh = steps, mesh

  def __call__(self, params, bleu: bool = True) -> dict[str, float]:
    """The validation metrics of `params`; `bleu` False leaves BLEU out (report.skips_validation_bleu)."""
    return evaluate(self.steps, params, self.batches, self.mesh) | (self.bleu(params) if self.bleu and bleu else {})
