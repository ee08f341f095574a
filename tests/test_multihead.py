"""The attention layer: fused projections compute what separate q, k, v matrices would,
each initialised as a matrix of its own, with as many parameters."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.model.attention import attention_mask
from seq2seq.model.multihead import MultiHeadAttention

D, N, H = 16, 2, 8


def reference(x_btd, c_bsd, wq, wk, wv, wo, bq, bv, bo, mask_ts):
  """Multi-head attention from separate matrices, in numpy (float64)."""
  q, k = np.einsum("btd,dnh->btnh", x_btd, wq) + bq, np.einsum("bsd,dnh->bsnh", c_bsd, wk)
  v = np.einsum("bsd,dnh->bsnh", c_bsd, wv) + bv
  logits = np.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(q.shape[-1])
  logits = np.where(mask_ts, logits, -1e30)  # a fully masked (padding) query: uniform, not compared
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("bnts,bsnh,nhd->btd", weights, v, wo) + bo


def randomize(mha: MultiHeadAttention, seed: int) -> dict[str, np.ndarray]:
  """Random values for every parameter (biases start at zero), returned by name as float64."""
  rng = np.random.default_rng(seed)
  out = {}
  for path, var in nnx.to_flat_state(nnx.state(mha, nnx.Param)):
    var.set_value(jnp.asarray(rng.standard_normal(var.shape) * 0.3, jnp.float32))
    out[path[-1]] = np.asarray(var[...], np.float64)
  return out


@pytest.mark.parametrize("self_attention", [True, False])
def test_fused_projections_equal_separate_matrices(self_attention):
  mha = MultiHeadAttention(D, N, H, use_bias=True, dropout_rate=0.0, self_attention=self_attention,
                           rngs=nnx.Rngs(0))
  p = randomize(mha, 1)
  rng = np.random.default_rng(2)
  x = rng.standard_normal((2, 5, D))
  c = x if self_attention else rng.standard_normal((2, 7, D))
  segments_bt, segments_bs = np.array([[1, 1, 1, 1, 0], [1] * 5]), np.array([[1] * c.shape[1]] * 2)
  if self_attention:
    segments_bs = segments_bt
    wq, wk, wv = (p["wqkv_dn3h"][:, :, i] for i in range(3))
    bq, bv = p["bqv_n2h"][:, 0], p["bqv_n2h"][:, 1]
  else:
    wq, (wk, wv) = p["wq_dnh"], (p["wkv_dn2h"][:, :, i] for i in range(2))
    bq, bv = p["bq_nh"], p["bv_nh"]
  mask = attention_mask(jnp.asarray(segments_bt), jnp.asarray(segments_bs))
  x32 = jnp.asarray(x, jnp.float32)
  got = mha(x32, x32 if self_attention else jnp.asarray(c, jnp.float32), mask)
  want = reference(x, c, wq, wk, wv, p["wo_nhd"], bq, bv, p["bo_d"], np.asarray(mask)[:, 0][:, None])
  real = segments_bt != 0
  np.testing.assert_allclose(np.asarray(got)[real], want[real], rtol=1e-4, atol=1e-4)


def test_a_self_attention_layer_refuses_another_context():
  mha = MultiHeadAttention(D, N, H, use_bias=False, dropout_rate=0.0, rngs=nnx.Rngs(0))
  x = jnp.ones((1, 3, D))
  with pytest.raises(ValueError, match="its own input"):
    mha(x, x + 1, attention_mask(jnp.ones((1, 3), jnp.int32), jnp.ones((1, 3), jnp.int32)))


def test_each_fused_projection_is_initialised_as_its_own_matrix():
  d, n, h = 64, 4, 16
  limit = math.sqrt(6 / (d + n * h))  # Glorot-uniform of one [d, n*h] projection
  self_attn = MultiHeadAttention(d, n, h, use_bias=False, dropout_rate=0.0, rngs=nnx.Rngs(0))
  cross = MultiHeadAttention(d, n, h, use_bias=False, dropout_rate=0.0, self_attention=False, rngs=nnx.Rngs(0))
  w = np.asarray(self_attn.wqkv_dn3h[...])
  parts = [w[:, :, i] for i in range(3)] + [np.asarray(cross.wkv_dn2h[...])[:, :, i] for i in range(2)]
  for part in parts + [np.asarray(cross.wq_dnh[...])]:
    assert part.shape == (d, n, h)
    assert 0.97 * limit < np.abs(part).max() <= limit
    assert abs(part.std() / (limit / math.sqrt(3)) - 1) < 0.05  # uniform on [-limit, limit]
  assert not np.array_equal(parts[0], parts[1])


@pytest.mark.parametrize("self_attention", [True, False])
def test_parameters_are_as_many_as_four_separate_projections(self_attention):
  mha = nnx.eval_shape(lambda: MultiHeadAttention(D, N, H, use_bias=True, dropout_rate=0.0,
                                                  self_attention=self_attention, rngs=nnx.Rngs(0)))
  count = sum(v.size for v in jax.tree.leaves(nnx.state(mha, nnx.Param)))
  assert count == 4 * D * N * H + 2 * N * H + D  # wq wk wv wo, q and v biases (keys have none), output bias
