"""Attention: masks, the two attention paths, and gradients against a hand-written backward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.attention import MultiHeadAttention, attention_mask, dot_product_attention, explicit_attention


def test_attention_mask_padding_segments_and_causality():
  segments_bt = jnp.array([[1, 1, 2, 0]])
  mask = np.asarray(attention_mask(segments_bt, segments_bt))[0, 0]
  expected = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], bool)
  np.testing.assert_array_equal(mask, expected)
  causal = np.asarray(attention_mask(segments_bt, segments_bt, causal=True))[0, 0]
  np.testing.assert_array_equal(causal, expected & np.tri(4, dtype=bool))


def hand_backward(q_tnh, k_snh, v_snh, mask_ts, dz_tnh):
  """dL/dQ, dL/dK, dL/dV of Z = softmax(Q K^T / sqrt(d) + mask) V, written out per head."""
  d = q_tnh.shape[-1]
  dq, dk, dv = np.zeros_like(q_tnh), np.zeros_like(k_snh), np.zeros_like(v_snh)
  for n in range(q_tnh.shape[1]):
    q, k, v, dz = q_tnh[:, n], k_snh[:, n], v_snh[:, n], dz_tnh[:, n]
    s = q @ k.T / np.sqrt(d)
    s = np.where(mask_ts, s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    dv[:, n] = a.T @ dz  # dL/dV = A^T dZ
    da = dz @ v.T  # dL/dA
    ds = a * (da - (da * a).sum(-1, keepdims=True))  # through the softmax Jacobian
    dq[:, n] = ds @ k / np.sqrt(d)  # dL/dQ = dS K / sqrt(d_k)
    dk[:, n] = ds.T @ q / np.sqrt(d)  # dL/dK = dS^T Q / sqrt(d_k)
  return dq, dk, dv


# The explicit path keeps float64 throughout; jax.nn.dot_product_attention takes its
# softmax in float32 by design, so it is held to float32 precision (a few ulp).
@pytest.mark.parametrize("path, rtol, atol", [("fused", 1e-5, 1e-6), ("explicit", 1e-10, 1e-12)])
def test_attention_gradient_equals_hand_written_backward(path, rtol, atol):
  t, s, n, h = 5, 7, 3, 8
  rng = np.random.default_rng(0)
  q, k, v, dz = (rng.standard_normal(shape).astype(np.float64) for shape in
                 [(t, n, h), (s, n, h), (s, n, h), (t, n, h)])
  mask_ts = rng.random((t, s)) > 0.3
  mask_ts[:, 0] = True  # every query sees at least one key

  attend = dot_product_attention if path == "fused" else explicit_attention

  def loss(q, k, v):
    z = attend(q[None], k[None], v[None], jnp.asarray(mask_ts)[None, None])
    return jnp.sum(z[0] * dz)

  with jax.enable_x64(True):
    grads = jax.grad(loss, argnums=(0, 1, 2))(*(jnp.asarray(x) for x in (q, k, v)))
  for got, want in zip(grads, hand_backward(q, k, v, mask_ts, dz)):
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=atol)


def test_fused_and_explicit_paths_agree():
  rng = np.random.default_rng(1)
  q, k, v = (jnp.asarray(rng.standard_normal((2, 6, 2, 4)), jnp.float32) for _ in range(3))
  mask = attention_mask(jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]),
                        jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]), causal=True)
  np.testing.assert_allclose(dot_product_attention(q, k, v, mask), explicit_attention(q, k, v, mask), atol=1e-6)


def test_attention_dropout_is_a_function_of_the_key():
  mha = MultiHeadAttention(16, 2, 8, use_bias=True, dropout_rate=0.5, rngs=nnx.Rngs(0))
  x = jnp.asarray(np.random.default_rng(2).standard_normal((1, 5, 16)), jnp.float32)
  mask = attention_mask(jnp.ones((1, 5), jnp.int32), jnp.ones((1, 5), jnp.int32))
  a = mha(x, x, mask, rng=jax.random.key(1))
  np.testing.assert_array_equal(a, mha(x, x, mask, rng=jax.random.key(1)))
  assert not np.allclose(a, mha(x, x, mask, rng=jax.random.key(2)))
  np.testing.assert_array_equal(mha(x, x, mask), mha(x, x, mask, rng=None))
