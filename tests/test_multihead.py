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


@pytest.mark.parametrize("self_attention", [True, False], ids=["self", "cross"])
def test_the_flash_kernel_reading_the_fused_projections_in_place_equals_slicing_them(monkeypatch, self_attention):
  """On a "GPU" (this CPU posing as one, the kernels interpreted; f32 let through, for exact
  figures) the layer hands the flash kernel its fused projection(s) and biases, read in place,
  no slice of q, k, v taken (flash.IN_PLACE). Its output and the gradients of the input, the
  context and every parameter equal those of q, k and v sliced out, their biases added by XLA,
  and the same kernel (IN_PLACE off, as before), on the real queries of packed rows."""
  from seq2seq.model import attention as attention_module
  from seq2seq.model import flash
  from seq2seq.model import multihead
  from seq2seq.model.attention import SegmentMask

  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(flash, "blockers", lambda **facts: [])  # f32 too: tighter than bf16's rounding
  monkeypatch.setattr(flash, "compiles", lambda *setting: None)
  calls = []
  monkeypatch.setattr(multihead, "fused_flash_attention", lambda *a, **kw: calls.append("in place") or
                      attention_module.fused_flash_attention(*a, **kw, interpret=True))
  monkeypatch.setattr(attention_module, "flash_attention", lambda *a, **kw: calls.append("sliced") or
                      flash.flash_attention(*a[:3], a[3].q_segments_bt, a[3].k_segments_bs, a[3].causal, True))
  mha = MultiHeadAttention(32, 2, 16, use_bias=True, dropout_rate=0.0, self_attention=self_attention,
                           rngs=nnx.Rngs(0))
  randomize(mha, 3)
  rng = np.random.default_rng(4)
  q_segments = jnp.asarray([[1] * 20 + [2] * 28 + [0] * 16, [1] * 64], jnp.int32)
  k_segments = q_segments if self_attention else jnp.asarray([[1] * 10 + [2] * 30 + [0] * 8, [1] * 48], jnp.int32)
  mask = SegmentMask(q_segments, k_segments, causal=self_attention)
  x = jnp.asarray(rng.standard_normal((2, 64, 32)), jnp.float32)
  c = x if self_attention else jnp.asarray(rng.standard_normal((2, 48, 32)), jnp.float32)
  dy = jnp.asarray(rng.standard_normal((2, 64, 32)), jnp.float32) * (q_segments != 0)[:, :, None]
  graphdef, params = nnx.split(mha)

  def forward(params, x, c):
    layer = nnx.merge(graphdef, params)
    return layer(x, x if self_attention else c, mask)

  results = {}
  for in_place in (True, False):
    monkeypatch.setattr(flash, "IN_PLACE", in_place)
    y, vjp = jax.vjp(forward, params, x, c)
    results[in_place] = (y, *vjp(dy))
  assert calls == ["in place", "sliced"]
  (y1, p1, x1, c1), (y0, p0, x0, c0) = results[True], results[False]
  real = np.asarray(q_segments != 0)
  np.testing.assert_allclose(np.asarray(y1)[real], np.asarray(y0)[real], rtol=1e-5, atol=1e-5)
  for name, (g1, g0) in {"x": (x1, x0), "context": (c1, c0)}.items():
    np.testing.assert_allclose(g1, g0, rtol=1e-5, atol=2e-5, err_msg=name)
  flat1, flat0 = nnx.to_flat_state(p1), nnx.to_flat_state(p0)
  assert [path for path, _ in flat1] == [path for path, _ in flat0]
  for (path, g1), (_, g0) in zip(flat1, flat0):
    np.testing.assert_allclose(g1[...], g0[...], rtol=1e-5, atol=2e-5, err_msg=str(path))
