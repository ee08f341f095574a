"""Label-smoothed cross entropy over non-pad target tokens, and the metrics derived from it."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy_sums(logits_btv: jax.Array, labels_bt: jax.Array, weights_bt: jax.Array,
                       label_smoothing: float = 0.0) -> dict[str, jax.Array]:
  """Sums over weighted tokens: smoothed loss, plain NLL, token count, correct predictions.

  The smoothed target puts 1 - eps on the label and eps / V on every entry (optax's
  `smooth_labels`), so loss_t = (1 - eps) * nll_t + eps * mean_v(-log p_v). Sums (not
  means) let gradient accumulation and data-parallel reduction weigh every token equally;
  divide by `tokens` at the end.
  """
  logp_btv = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
  nll_bt = -jnp.take_along_axis(logp_btv, labels_bt[..., None], axis=-1)[..., 0]
  loss_bt = (1.0 - label_smoothing) * nll_bt - label_smoothing * jnp.mean(logp_btv, axis=-1)
  w_bt = weights_bt.astype(jnp.float32)
  correct_bt = (jnp.argmax(logits_btv, axis=-1) == labels_bt).astype(jnp.float32)
  return {"loss_sum": jnp.sum(loss_bt * w_bt), "nll_sum": jnp.sum(nll_bt * w_bt), "tokens": jnp.sum(w_bt),
          "correct": jnp.sum(correct_bt * w_bt)}


def summarize(sums: dict) -> dict[str, float]:
  """Per-token loss, accuracy and perplexity from (possibly accumulated) sums."""
  tokens = max(float(sums["tokens"]), 1.0)
  nll = float(sums["nll_sum"]) / tokens
  return {"loss": float(sums["loss_sum"]) / tokens, "nll": nll, "accuracy": float(sums["correct"]) / tokens,
          "perplexity": float(jnp.exp(jnp.minimum(nll, 50.0))), "tokens": float(sums["tokens"])}
