"""Layers: dropout, norms (incl. AdaNorm's detached gradient), positions (T5's relative
buckets by hand, learned positions refusing what the table does not hold), feed-forward, the matrix products (dense, dense_bias, tied_logits)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.errors import ConfigError
from seq2seq.model.dropout import dropout, keep_mask
from seq2seq.model.layers import (
  FeedForward,
  LearnedPositions,
  Norm,
  RelativePositionBias,
  dense,
  dense_bias,
  relative_bucket,
  rope,
  sinusoidal,
  tied_logits,
)


def test_dropout_identity_without_key_and_unbiased_with_it():
  x = jnp.ones((1000, 1000))
  np.testing.assert_array_equal(dropout(x, 0.3, None), x)
  y = np.asarray(dropout(x, 0.3, jax.random.key(0)))
  kept = y != 0
  np.testing.assert_allclose(y[kept], 1 / 0.7, rtol=1e-6)  # survivors scaled by 1/(1-p)
  # Fraction dropped of 1e6 Bernoulli(0.3) draws: standard deviation 4.6e-4; allow 5 sigma.
  assert abs((1 - kept.mean()) - 0.3) < 5 * math.sqrt(0.3 * 0.7 / kept.size)
  np.testing.assert_array_equal(y, dropout(x, 0.3, jax.random.key(0)))



def _fmix32_np(h):
  h = h.astype(np.uint64)
  h ^= h >> 16
  h = (h * 0x85EBCA6B) & 0xFFFFFFFF
  h ^= h >> 13
  h = (h * 0xC2B2AE35) & 0xFFFFFFFF
  return h ^ (h >> 16)


def test_keep_mask_is_the_documented_hash_of_the_global_index():
  key = jax.random.key(7)
  k0, k1 = (int(w) for w in jax.random.key_data(key))
  index = np.arange(3 * 5 * 7, dtype=np.uint64)
  h = _fmix32_np(_fmix32_np((index * 0x9E3779B9) & 0xFFFFFFFF ^ k0) ^ k1)
  want = (h >= int(0.25 * 2**32)).reshape(3, 5, 7)
  np.testing.assert_array_equal(keep_mask(key, (3, 5, 7), 0.25), want)


def test_keep_masks_are_independent_across_neighbours_and_keys():
  p, n = 0.7, 10**6  # keep probability, draws
  a = np.asarray(keep_mask(jax.random.key(0), (n,), 1 - p))
  b = np.asarray(keep_mask(jax.random.key(1), (n,), 1 - p))
  # Joint keep rates of independent Bernoulli(p) pairs are p^2 with standard deviation
  # sqrt(p^2 (1 - p^2) / n) = 4.8e-4; allow 5 sigma.
  bound = 5 * math.sqrt(p * p * (1 - p * p) / n)
  for joint in ((a[1:] & a[:-1]).mean(), (a[1024:] & a[:-1024]).mean(), (a & b).mean()):
    assert abs(joint - p * p) < bound
  assert abs(a.mean() - p) < 5 * math.sqrt(p * (1 - p) / n)


def test_keep_mask_of_a_huge_array_falls_back_to_random_bits():
  jaxpr = str(jax.make_jaxpr(lambda k: keep_mask(k, (2**16, 2**16), 0.1))(jax.random.key(0)))
  assert "random_bits" in jaxpr and "shift_right" not in jaxpr
  assert "random_bits" not in str(jax.make_jaxpr(lambda k: keep_mask(k, (2**16, 2**15), 0.1))(jax.random.key(0)))

def _x(shape=(2, 3, 8), seed=0):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * 3 + 1, jnp.float32)


def test_layernorm_and_rmsnorm_match_formulas():
  x = np.asarray(_x(), np.float64)
  ln = Norm("layernorm", 8, rngs=nnx.Rngs(0))
  ln.scale_d[...] = jnp.arange(8.0)
  ln.bias_d[...] = jnp.ones(8)
  want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6) * np.arange(8) + 1
  np.testing.assert_allclose(ln(_x()), want, rtol=1e-5, atol=1e-5)
  rms = Norm("rmsnorm", 8, rngs=nnx.Rngs(0))
  want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(rms(_x()), want, rtol=1e-5, atol=1e-6)


def test_adanorm_value_and_detached_gradient():
  k, c = 0.1, 2.0
  norm = Norm("adanorm", 8, adanorm_k=k, adanorm_c=c, rngs=nnx.Rngs(0))
  assert not nnx.state(norm, nnx.Param)  # no gain, no bias
  x = _x()

  def standardise(x):
    centred = x - x.mean(-1, keepdims=True)
    return centred / jnp.sqrt((centred * centred).mean(-1, keepdims=True) + 1e-6)

  y = standardise(x)
  np.testing.assert_allclose(norm(x), c * (1 - k * y) * y, rtol=1e-5, atol=1e-6)
  # The gradient flows through y only: d/dx sum(g * z) = vjp_y(g * C(1 - k y)).
  g = _x(seed=1)
  got = jax.grad(lambda x: jnp.sum(norm(x) * g))(x)
  _, vjp = jax.vjp(standardise, x)
  (want,) = vjp(g * c * (1 - k * y))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  full = jax.grad(lambda x: jnp.sum(c * (1 - k * standardise(x)) * standardise(x) * g))(x)
  assert not np.allclose(got, full, atol=1e-3)  # detaching changes the gradient


def test_sinusoidal_matches_vaswani_formula():
  d = 8
  pe = np.asarray(sinusoidal(jnp.array([[0, 3, 17]]), d))[0]
  for row, pos in zip(pe, [0, 3, 17]):
    freqs = 1.0 / 10000 ** (2 * np.arange(d // 2) / d)
    np.testing.assert_allclose(row, np.concatenate([np.sin(pos * freqs), np.cos(pos * freqs)]), atol=1e-5)


def test_rope_is_relative_and_norm_preserving():
  q, k = _x((1, 1, 2, 16), 2), _x((1, 1, 2, 16), 3)

  def score(m, n):
    return jnp.sum(rope(q, jnp.array([[m]])) * rope(k, jnp.array([[n]])), axis=-1)

  np.testing.assert_allclose(score(7, 3), score(12, 8), rtol=1e-4)  # depends on m - n only
  assert not np.allclose(score(7, 3), score(7, 4), rtol=1e-3)
  np.testing.assert_array_equal(rope(q, jnp.array([[0]])), q)  # position 0: identity
  np.testing.assert_allclose(jnp.linalg.norm(rope(q, jnp.array([[9]])), axis=-1), jnp.linalg.norm(q, axis=-1),
                             rtol=1e-5)


# T5's buckets (Raffel et al. 2020), 32 of them, max_distance 128, worked by hand; relative
# position = key - query. Bidirectional: 16 a side (keys after the query from 16), exact below
# 8, then 8 + floor(8 * log(d / 8) / log(128 / 8)) = 8 + floor(2 log2(d / 8)), at most 15:
# d = 20: 2 log2(2.5) = 2.64 -> 10; d = 127: 2 log2(15.875) = 7.98 -> 15; d = 16, 32, 64: exactly
# 2, 4, 6 (where float rounding could give one less). Causal: 32 for keys at or before the
# query, exact below 16, then 16 + floor(16 log(d / 16) / log(8)) = 16 + floor(16/3 log2(d / 16)):
# d = 20: 1.72 -> 17; 32: 5.33 -> 21; 64: 10.67 -> 26; 100: 14.10 -> 30; 128: 16 -> 31 (capped);
# keys after the query share bucket 0 (the causal mask hides them).
BIDIRECTIONAL = {-1: 1, 0: 0, 1: 17, 7: 23, 8: 24, 16: 26, 20: 26, 32: 28, 64: 30, 127: 31, 128: 31, 200: 31,
                 -7: 7, -8: 8, -16: 10, -20: 10, -127: 15, -200: 15}
CAUSAL = {0: 0, -1: 1, -15: 15, -16: 16, -20: 17, -32: 21, -64: 26, -100: 30, -127: 31, -128: 31, -1000: 31,
          1: 0, 20: 0}


@pytest.mark.parametrize("bidirectional, expected", [(True, BIDIRECTIONAL), (False, CAUSAL)],
                         ids=["bidirectional", "causal"])
def test_relative_buckets_match_t5_by_hand(bidirectional, expected):
  bucket = lambda rel: np.asarray(relative_bucket(jnp.asarray(rel, jnp.int32), bidirectional=bidirectional,
                                                  num_buckets=32, max_distance=128))
  assert dict(zip(expected, bucket(list(expected)).tolist())) == expected
  # Monotone in the distance on each side, the buckets used all within [0, 32).
  behind = bucket(-np.arange(0, 400))
  assert np.all(np.diff(behind) >= 0) and behind[-1] == (15 if bidirectional else 31)
  ahead = bucket(np.arange(1, 400))
  assert np.all(np.diff(ahead) >= 0) if bidirectional else np.all(ahead == 0)
  unused = {16} if bidirectional else set()  # as in T5: the keys-after side's distance 0 cannot occur
  assert set(behind.tolist()) | set(ahead.tolist()) == set(range(32)) - unused


def test_relative_bias_depends_only_on_key_minus_query():
  table = RelativePositionBias(3, 32, 128, bidirectional=True, rngs=nnx.Rngs(0))
  positions = jnp.array([[0, 1, 2, 3, 4, 40, 200]])
  bias = np.asarray(table(positions, positions))
  assert bias.shape == (1, 3, 7, 7)
  for shift in (1, 17, 1000):  # shifting every position by a constant leaves the bias alone
    np.testing.assert_array_equal(table(positions + shift, positions + shift), bias)
  # Entry (i, j) of head n is the table's row for bucket(p_j - p_i).
  p = np.asarray(positions[0])
  buckets = np.asarray(relative_bucket(jnp.asarray(p[None, :] - p[:, None]), bidirectional=True, num_buckets=32,
                                       max_distance=128))
  np.testing.assert_array_equal(bias[0], np.asarray(table.bias_rn[...])[buckets].transpose(2, 0, 1))
  assert table.bias_rn.get_metadata()["axes"] == (None, "heads")  # heads split on the tensor axis
  # One query over every key (a decoding step over its cache): that query's row of the full bias.
  full = table(jnp.arange(7)[None], jnp.arange(7)[None])
  np.testing.assert_array_equal(table(jnp.array([[4]]), jnp.arange(7)[None])[:, :, 0], full[:, :, 4])


def test_learned_positions_refuse_positions_past_the_table():
  table = LearnedPositions(8, 4, rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(table(jnp.arange(8)[None]), np.asarray(table.table_ld[...])[None])
  with pytest.raises(ConfigError, match=r"a row of 9 tokens reaches position 8, past .*config.model.max_len=8"):
    table(jnp.arange(9)[None])
  with pytest.raises(ConfigError, match="config.model.max_len=8"):  # inside jit too: from the shapes
    jax.jit(lambda positions: table(positions))(jnp.zeros((2, 9), jnp.int32))


@pytest.mark.parametrize("activation", ["relu", "gelu", "swish", "glu", "reglu", "geglu", "swiglu"])
def test_feed_forward_matches_formula(activation):
  ffn = FeedForward(8, 16, activation, use_bias=True, hidden_dropout=0.0, rngs=nnx.Rngs(0))
  ffn.bi_f[...] = jnp.linspace(-1, 1, 16)
  x = np.asarray(_x(), np.float64)
  wi, wo, bi = (np.asarray(w[...], np.float64) for w in (ffn.wi_df, ffn.wo_fd, ffn.bi_f))
  h = x @ wi + bi
  # Written out in float64, apart from gelu's tanh approximation (jax.nn.gelu's default).
  sigmoid = lambda z: 1 / (1 + np.exp(-z))
  act = dict(relu=lambda z: np.maximum(z, 0), gelu=lambda z: np.asarray(jax.nn.gelu(z)), swish=lambda z: z * sigmoid(z))
  gate = dict(glu=sigmoid, reglu=act["relu"], geglu=act["gelu"], swiglu=act["swish"])
  if activation in gate:
    h = gate[activation](x @ np.asarray(ffn.wg_df[...], np.float64)) * h
  else:
    h = act[activation](h)
  np.testing.assert_allclose(ffn(_x(), None), h @ wo, rtol=1e-4, atol=1e-5)


def test_feed_forward_in_bf16_adds_its_first_bias_to_the_f32_product():
  """The bf16 layer is dense_bias's one rounding then the activation and the second matrix:
  equal to that formula written with the f32 product, and its gradients reach every parameter."""
  ffn = FeedForward(8, 16, "relu", use_bias=True, hidden_dropout=0.0, rngs=nnx.Rngs(0))
  ffn.bi_f[...], ffn.bo_d[...] = jnp.linspace(-1, 1, 16), jnp.linspace(-0.5, 0.5, 8)
  x = _x().astype(jnp.bfloat16)
  wi, wo = (w[...].astype(jnp.bfloat16) for w in (ffn.wi_df, ffn.wo_fd))
  h = jax.nn.relu((jnp.dot(x, wi, preferred_element_type=jnp.float32) + ffn.bi_f[...]).astype(jnp.bfloat16))
  np.testing.assert_array_equal(ffn(x, None), jnp.dot(h, wo) + ffn.bo_d[...].astype(jnp.bfloat16))
  grads = nnx.grad(lambda m: jnp.sum(m(x, None).astype(jnp.float32) ** 2))(ffn)
  for name in ("wi_df", "bi_f", "wo_fd", "bo_d"):
    g = getattr(grads, name)[...]
    assert g.dtype == jnp.float32 and np.all(np.isfinite(g)) and np.any(g != 0), name


@pytest.mark.parametrize("spec,contract,transposed", [("btd,df->btf", 1, False), ("btnh,nhd->btd", 2, False),
                                                      ("btd,vd->btv", 1, True)])
def test_dense_and_its_gradients_equal_the_einsum(spec, contract, transposed):
  # Small integers: every product and sum is exact in f32, so the results must be equal.
  terms, out = spec.split("->")[0].split(","), spec.split("->")[1]
  sizes = dict(b=2, t=3, d=4, f=5, n=2, h=3, v=7)
  rng = np.random.default_rng(0)
  x, w, c = (jnp.asarray(rng.integers(-3, 4, tuple(sizes[ch] for ch in term)), jnp.float32)
             for term in (*terms, out))
  ours = lambda x, w: jnp.sum(dense(x, w, contract=contract, w_transposed=transposed) * c)
  ref = lambda x, w: jnp.sum(jnp.einsum(spec, x, w) * c)
  np.testing.assert_array_equal(dense(x, w, contract=contract, w_transposed=transposed), jnp.einsum(spec, x, w))
  want = jax.grad(ref, (0, 1))(x, w)
  for g, wanted in zip(jax.grad(ours, (0, 1))(x, w), want):
    np.testing.assert_array_equal(g, wanted)
  if transposed:  # the tied output layer's hand-written backward pass
    tied = lambda x, w: jnp.sum(tied_logits(x, w) * c)
    for g, wanted in zip(jax.grad(tied, (0, 1))(x, w), want):
      np.testing.assert_array_equal(g, wanted)


def test_dense_bias_in_bf16_and_its_gradients_equal_the_formula():
  # Small integers: every product and sum is exact in bf16 and f32, so the results must be equal.
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.integers(-3, 4, (2, 3, 4)), jnp.bfloat16)
  w, b = (jnp.asarray(rng.integers(-3, 4, shape), jnp.float32) for shape in ((4, 5), (5,)))
  c = jnp.asarray(rng.integers(-3, 4, (2, 3, 5)), jnp.bfloat16)
  y = dense_bias(x, w, b)
  assert y.dtype == jnp.bfloat16
  ref = lambda x, w, b: jnp.einsum("btd,df->btf", x.astype(jnp.float32), w) + b
  np.testing.assert_array_equal(y.astype(jnp.float32), ref(x, w, b))
  got = jax.vjp(dense_bias, x, w, b)[1](c)
  want = jax.vjp(ref, x, w, b)[1](c.astype(jnp.float32))
  for g, wanted, like in zip(got, want, (x, w, b)):
    assert g.dtype == like.dtype and g.shape == like.shape  # dx in bf16, dw and db in the parameters' f32
    np.testing.assert_array_equal(g.astype(jnp.float32), wanted)


def test_dense_bias_in_bf16_rounds_once_and_in_f32_adds_as_before(monkeypatch):
  # x @ w = 1 + 2^-8, exact in f32 but a tie in bf16 (rounds to even: 1); with b = 2^-9 the
  # sum 1 + 2^-8 + 2^-9 is past the halfway point to bf16's next value, 1 + 2^-7. Rounding the
  # product first and adding the bias after gives 1 + 2^-9, which rounds to 1.
  x = jnp.asarray([[1.0, 1.0]], jnp.bfloat16)
  w = jnp.asarray([[1.0], [2.0**-8]], jnp.float32)
  b = jnp.asarray([2.0**-9], jnp.float32)
  assert float(dense_bias(x, w, b)[0, 0]) == 1 + 2.0**-7
  assert float(dense(x, w)[0, 0] + b.astype(jnp.bfloat16)[0]) == 1.0  # rounded twice
  from seq2seq.model import layers

  monkeypatch.setattr(layers, "BIAS_IN_MATMUL", False)  # as before: device_check's ffn_bias_apart
  assert float(dense_bias(x, w, b)[0, 0]) == 1.0
  monkeypatch.undo()
  x32 = jax.random.normal(jax.random.key(0), (3, 4))
  w32, b32 = jax.random.normal(jax.random.key(1), (4, 5)), jax.random.normal(jax.random.key(2), (5,))
  np.testing.assert_array_equal(dense_bias(x32, w32, b32), dense(x32, w32) + b32)
