"""Scoring given outputs: the log-probability a model (or an ensemble) gives a reference
translation, by teacher forcing, with the training loss's own per-token cross entropy.

  translator.score(["A man rides a bike."], ["Ein Mann fährt Fahrrad."])   # -> [-4.21]
  seq2seq-translate --workdir=DIR --score_reference=ref.de < src.en      # SCORE<TAB>REFERENCE lines

A pair's log-probability sums its target tokens and the final eos: the sum of the per-token
negative log-likelihoods that training's loss (`seq2seq.training.loss`, no label smoothing)
gives, negated. `normalize` divides it by the GNMT length penalty of beam search (the same
alpha), so it compares with the scores beam search reports for beam > 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from seq2seq.inference.decode import length_penalty
from seq2seq.special_tokens import SPECIAL, SpecialTokens
from seq2seq.training.loss import smoothed_xent


def log_probs(graphdefs, params_list, src_bs, tgt_out_bt, *, alpha: float, normalize: bool,
              tokens: SpecialTokens = SPECIAL):
  """Log-probability [b] of each row's output (eos-terminated, padded) given its source, the
  mean of the models' probabilities per token for an ensemble; divided by the GNMT length
  penalty with `normalize`."""
  src_segments_bs = (src_bs != tokens.pad).astype(jnp.int32)
  tgt_segments_bt = (tgt_out_bt != tokens.pad).astype(jnp.int32)
  tgt_in_bt = jnp.where(jnp.arange(tgt_out_bt.shape[1])[None, :] == 0, tokens.bos,
                        jnp.pad(tgt_out_bt, ((0, 0), (1, 0)))[:, :-1]) * tgt_segments_bt
  token_logp_mbt = []
  for graphdef, params in zip(graphdefs, params_list):
    model = nnx.merge(graphdef, params)
    logits_btv = model(src_bs, tgt_in_bt, src_segments_bs=src_segments_bs, tgt_segments_bt=tgt_segments_bt,
                       packed=False)
    token_logp_mbt.append(-smoothed_xent(logits_btv, tgt_out_bt, 0.0)[1])
  logp_mbt = jnp.stack(token_logp_mbt)
  logp_bt = jax.nn.logsumexp(logp_mbt, axis=0) - jnp.log(float(len(token_logp_mbt)))
  logp_b = jnp.sum(jnp.where(tgt_segments_bt > 0, logp_bt, 0.0), axis=1)
  return logp_b / length_penalty(jnp.sum(tgt_segments_bt, axis=1), alpha) if normalize else logp_b
