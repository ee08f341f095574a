"""Attention: masks, every attention path that runs on the CPU against `explicit_attention`
(XLA with the dense mask, XLA given sequence lengths: the call cuDNN gets on GPU, the GPU
flash kernel and the TPU splash kernel in Pallas' interpreter), gradients, an additive bias
(relative positions), and the choice of implementation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.errors import ConfigError
from seq2seq.model.attention import (
  SegmentMask,
  attention,
  attention_mask,
  choose_implementation,
  dot_product_attention,
  explicit_attention,
  flash_attention,
  lengths_attention,
  single_query_attention,
  splash_attention,
)
from seq2seq.model.config import ModelConfig
from seq2seq.model.multihead import MultiHeadAttention


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
@pytest.mark.parametrize("path, rtol, atol", [("xla", 1e-5, 1e-6), ("explicit", 1e-10, 1e-12)])
def test_attention_gradient_equals_hand_written_backward(path, rtol, atol):
  t, s, n, h = 5, 7, 3, 8
  rng = np.random.default_rng(0)
  q, k, v, dz = (rng.standard_normal(shape).astype(np.float64) for shape in
                 [(t, n, h), (s, n, h), (s, n, h), (t, n, h)])
  mask_ts = rng.random((t, s)) > 0.3
  mask_ts[:, 0] = True  # every query sees at least one key

  attend = dot_product_attention if path == "xla" else explicit_attention

  def loss(q, k, v):
    z = attend(q[None], k[None], v[None], jnp.asarray(mask_ts)[None, None])
    return jnp.sum(z[0] * dz)

  with jax.enable_x64(True):
    grads = jax.grad(loss, argnums=(0, 1, 2))(*(jnp.asarray(x) for x in (q, k, v)))
  for got, want in zip(grads, hand_backward(q, k, v, mask_ts, dz)):
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=atol)


def test_xla_and_explicit_paths_agree():
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


def segment_ids(rows, length):
  """[len(rows), length] segment ids: row r holds segments 1, 2, ... of the given lengths, then padding."""
  out = np.zeros((len(rows), length), np.int32)
  for r, lengths in enumerate(rows):
    ends = np.cumsum(lengths, dtype=int)
    for i, (start, end) in enumerate(zip(ends - lengths, ends)):
      out[r, start:end] = i + 1
  return jnp.asarray(out)


# Row 0 is packed (three segments, then padding); rows 1-3 are unpacked: one segment then padding,
# a full row, an empty row. Lengths are multiples of 128 so that splash attention can run. In the
# cross case tgt row 1 has padding queries but its source row none: those queries see no key at all.
TGT_BT = segment_ids([(40, 50, 20), (70,), (128,), ()], 128)
SRC_BS = segment_ids([(60, 100, 50), (256,), (10,), ()], 256)
CASES = {"self": (TGT_BT, TGT_BT, False), "causal": (TGT_BT, TGT_BT, True), "cross": (TGT_BT, SRC_BS, False)}
# f32: XLA computes what the explicit softmax does (equal to rounding); splash's and flash's
# online softmax sums in another order (measured up to 1.2e-6). bf16: every path computes logits and softmax in f32 but rounds the weights
# and the output to bf16 at different points: up to two bf16 ulps (2 * 2^-7) where |out| < 2.
TOLERANCE = {jnp.float32: dict(rtol=1e-5, atol=3e-6), jnp.bfloat16: dict(rtol=0, atol=2 * 2.0**-7)}


def qkv(case, dtype, seed=0):
  q_segments_bt, k_segments_bs, causal = CASES[case]
  (b, t), s, n, h = q_segments_bt.shape, k_segments_bs.shape[1], 2, 32
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.standard_normal(shape), dtype) for shape in [(b, t, n, h), (b, s, n, h), (b, s, n, h)])
  return q, k, v, SegmentMask(q_segments_bt, k_segments_bs, causal=causal)


def unpacked(mask: SegmentMask) -> SegmentMask:
  """The unpacked rows 1-3 only."""
  return SegmentMask(mask.q_segments_bt[1:], mask.k_segments_bs[1:], causal=mask.causal, packed=False)


# Every kernel that runs on the CPU, as (q, k, v, mask) -> out. "xla_lengths" is the call cuDNN
# gets on GPU, made with implementation="xla"; it is given the unpacked rows 1-3 only.
KERNELS = {
    "explicit": lambda q, k, v, mask: explicit_attention(q, k, v, mask.dense_b1ts()),
    "xla_mask": lambda q, k, v, mask: dot_product_attention(q, k, v, mask.dense_b1ts()),
    "xla_lengths": lambda q, k, v, mask: lengths_attention(q, k, v, mask, implementation="xla"),
    "splash": lambda q, k, v, mask: splash_attention(q, k, v, mask, interpret=True),
    "flash": lambda q, k, v, mask: flash_attention(q, k, v, mask, interpret=True),
}


def rows_of(name):
  return slice(1, None) if name == "xla_lengths" else slice(None)


def mask_for(name, mask):
  return unpacked(mask) if name == "xla_lengths" else mask


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_cpu_kernel_equals_explicit_attention_on_real_queries(case, dtype):
  q, k, v, mask = qkv(case, dtype)

  @jax.jit
  def outputs(q, k, v, mask):
    return {name: kernel(q[rows_of(name)], k[rows_of(name)], v[rows_of(name)], mask_for(name, mask))
            for name, kernel in KERNELS.items()}

  outs = {name: np.asarray(out, np.float32) for name, out in outputs(q, k, v, mask).items()}
  real_bt = np.asarray(mask.q_segments_bt != 0)
  for name, got in outs.items():
    assert np.isfinite(got).all(), f"{name}: non-finite outputs (padding queries included)"
    want = outs["explicit"][rows_of(name)]
    real = real_bt[rows_of(name)]
    np.testing.assert_allclose(got[real], want[real], **TOLERANCE[dtype], err_msg=name)


def test_gradients_of_every_cpu_kernel_are_finite_and_equal_explicit():
  """Cross-attention, where some padding queries see no key at all. The cotangent over every
  query, padding included, gives finite gradients; over real queries only (the model's loss)
  it gives explicit attention's gradients."""
  q, k, v, mask = qkv("cross", jnp.float32)
  real_bt11 = (mask.q_segments_bt != 0)[:, :, None, None]
  dz = jnp.asarray(np.random.default_rng(3).standard_normal(q.shape), jnp.float32)

  @jax.jit
  def gradients(q, k, v, mask):
    """name -> (gradients for every query, gradients for real queries), one backward pass each."""
    out = {}
    for name, kernel in KERNELS.items():
      rows, m = rows_of(name), mask_for(name, mask)
      _, vjp = jax.vjp(lambda q, k, v: kernel(q, k, v, m), q[rows], k[rows], v[rows])
      out[name] = jax.vmap(vjp)(jnp.stack([dz[rows], dz[rows] * real_bt11[rows]]))
    return out

  grads = gradients(q, k, v, mask)
  for name, qkv_grads in grads.items():
    assert all(np.isfinite(np.asarray(g[0])).all() for g in qkv_grads), name
    for got, want in zip(qkv_grads, grads["explicit"]):  # rows do not interact: compare rows 1-3 alone
      np.testing.assert_allclose(got[1], want[1][rows_of(name)], rtol=1e-5, atol=1e-5, err_msg=name)


def test_attention_runs_the_same_numbers_by_any_cpu_implementation():
  """`attention` (what the model calls): padding queries come out as zeros on every path."""
  q, k, v, mask = qkv("causal", jnp.float32)
  impls = ("auto", "xla", "explicit")
  run = jax.jit(lambda q, k, v, mask: {impl: attention(q, k, v, mask, impl=impl) for impl in impls})
  outs = {impl: np.asarray(out) for impl, out in run(q, k, v, mask).items()}
  assert np.all(outs["auto"][np.asarray(mask.q_segments_bt == 0)] == 0)
  for impl in ("xla", "explicit"):
    np.testing.assert_allclose(outs[impl], outs["auto"], rtol=1e-6, atol=1e-6, err_msg=impl)


def test_auto_falls_back_to_xla_when_cudnn_cannot_trace(monkeypatch):
  """A "GPU" without cuDNN (this CPU, posing as one): "auto" picks cuDNN, whose trace raises,
  and XLA runs instead; a requested "cudnn" lets the error through."""
  q, k, v, mask = qkv("causal", jnp.bfloat16)
  q, k, v, mask = q[1:], k[1:], v[1:], unpacked(mask)
  run = jax.jit(attention, static_argnames="impl")
  want = run(q, k, v, mask, impl="xla")
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  np.testing.assert_array_equal(np.asarray(run(q, k, v, mask, impl="auto"), np.float32), np.asarray(want, np.float32))
  with pytest.raises(RuntimeError, match="cuDNN"):
    attention(q, k, v, mask, impl="cudnn")


@pytest.mark.parametrize("impl, match", [("cudnn", "GPU only"), ("flash", "GPU only"), ("splash", "TPU only")])
def test_a_requested_kernel_that_cannot_run_is_an_error_naming_the_setting(impl, match):
  mha = MultiHeadAttention(16, 2, 8, use_bias=False, dropout_rate=0.0, impl=impl, rngs=nnx.Rngs(0))
  x = jnp.ones((1, 4, 16), jnp.float32)
  segments = jnp.ones((1, 4), jnp.int32)
  with pytest.raises(ValueError, match=rf"config.model.attention_impl='{impl}'.*{match}"):
    mha(x, x, SegmentMask(segments, segments))


# (requested, platform, dtype, head_dim, lengths, packed, dropout) -> implementation
BF16, F32 = jnp.bfloat16, jnp.float32
CHOICES = [
    ("auto", "cpu", F32, 64, (128, 128), False, False, "xla"),
    ("auto", "cpu", BF16, 64, (128, 128), False, False, "xla"),
    ("auto", "gpu", BF16, 64, (40, 50), False, False, "cudnn"),
    ("auto", "gpu", jnp.float16, 128, (40, 50), False, False, "cudnn"),
    ("auto", "gpu", F32, 64, (40, 50), False, False, "xla"),  # cuDNN needs bf16/fp16
    ("auto", "gpu", BF16, 64, (48, 64), True, False, "flash"),  # packed rows: the Pallas kernel
    ("auto", "gpu", jnp.float16, 128, (256, 160), True, False, "flash"),
    ("auto", "gpu", BF16, 64, (40, 50), True, False, "xla"),  # packed, lengths not multiples of 16
    ("auto", "gpu", F32, 64, (48, 64), True, False, "xla"),  # packed, float32
    ("auto", "gpu", BF16, 24, (48, 64), True, False, "xla"),  # packed, head dim not a power of two
    ("flash", "gpu", BF16, 64, (48, 64), False, False, "flash"),
    ("auto", "gpu", BF16, 12, (40, 50), False, False, "xla"),  # head dim not a multiple of 8
    ("auto", "gpu", BF16, 256, (40, 50), False, False, "xla"),  # head dim over 128
    ("auto", "gpu", BF16, 64, (40, 50), False, True, "explicit"),  # attention dropout
    ("auto", "tpu", BF16, 64, (128, 256), True, False, "splash"),
    ("auto", "tpu", F32, 64, (256, 128), False, False, "splash"),
    ("auto", "tpu", BF16, 64, (96, 128), True, False, "xla"),  # length not a multiple of 128
    ("auto", "tpu", BF16, 64, (128, 128), True, True, "explicit"),
    ("xla", "gpu", BF16, 64, (40, 50), False, False, "xla"),
    ("explicit", "tpu", BF16, 64, (128, 128), True, False, "explicit"),
    ("cudnn", "gpu", BF16, 64, (40, 50), False, False, "cudnn"),
    ("splash", "tpu", BF16, 64, (128, 128), True, False, "splash"),
]


@pytest.mark.parametrize("requested, platform, dtype, head_dim, lengths, packed, dropout, expected", CHOICES)
def test_choose_implementation(requested, platform, dtype, head_dim, lengths, packed, dropout, expected):
  got = choose_implementation(requested, platform=platform, dtype=dtype, head_dim=head_dim, q_len=lengths[0],
                              kv_len=lengths[1], packed=packed, dropout=dropout)
  assert got == expected


def test_choose_implementation_edge_cases():
  common = dict(dtype=BF16, head_dim=64, q_len=128, kv_len=128, packed=False)
  assert choose_implementation("cudnn", platform="gpu", record_weights=True, **common) == "explicit"
  assert choose_implementation("auto", platform="gpu", segments=False, **common) == "xla"  # a bare dense mask
  # Splash on several devices needs the train step's mesh to shard_map over.
  assert choose_implementation("auto", platform="tpu", device_count=8, **common) == "xla"
  assert choose_implementation("auto", platform="tpu", device_count=8, mesh_size=8, **common) == "splash"
  with pytest.raises(ValueError, match="attention dropout"):
    choose_implementation("cudnn", platform="gpu", dropout=True, **common)
  with pytest.raises(ValueError, match="unpacked rows"):
    choose_implementation("cudnn", platform="gpu", **common | {"packed": True})
  with pytest.raises(ValueError, match="float32"):
    choose_implementation("cudnn", platform="gpu", **common | {"dtype": F32})
  with pytest.raises(ValueError, match="multiples of 128"):
    choose_implementation("splash", platform="tpu", **common | {"q_len": 64})
  with pytest.raises(ValueError, match="must be one of"):
    choose_implementation("flashy", platform="gpu", **common)
  packed = common | {"packed": True}  # the flash kernel on several GPUs needs the mesh too
  assert choose_implementation("auto", platform="gpu", device_count=8, **packed) == "xla"
  assert choose_implementation("auto", platform="gpu", device_count=8, mesh_size=8, **packed) == "flash"
  with pytest.raises(ValueError, match="flash kernel runs on GPU only"):
    choose_implementation("flash", platform="cpu", **packed)


def test_a_bias_enters_the_scores_alike_on_every_path_that_takes_one():
  """softmax(q k^T / sqrt(h) + bias + mask) v in numpy, against XLA, the explicit softmax,
  `attention` (what the model calls: XLA on this CPU, padding queries zeroed) and one query
  over a heads-first cache; the gradients of the bias agree between XLA and explicit."""
  q, k, v, mask = qkv("causal", jnp.float32)
  (_, t, n, h), s = q.shape, k.shape[1]
  bias = jnp.asarray(np.random.default_rng(5).standard_normal((1, n, t, s)), jnp.float32)
  mask_b1ts = np.asarray(mask.dense_b1ts())
  logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(h) + np.asarray(bias)
  logits = np.where(mask_b1ts, logits, -np.inf)
  real_bt = np.asarray(mask.q_segments_bt != 0)
  weights = np.exp(logits - logits.max(-1, keepdims=True, initial=-1e30, where=mask_b1ts))
  total = weights.sum(-1, keepdims=True)  # 0 for padding queries, which see no key
  want = np.einsum("bnts,bsnh->btnh", np.divide(weights, total, out=np.zeros_like(weights), where=total > 0), v)
  want = want[real_bt]
  paths = {"xla": dot_product_attention(q, k, v, mask_b1ts, bias_bnts=bias),
           "explicit": explicit_attention(q, k, v, mask_b1ts, bias_bnts=bias),
           "attention": attention(q, k, v, mask, bias_bnts=bias)}
  for name, got in paths.items():
    np.testing.assert_allclose(np.asarray(got)[real_bt], want, rtol=1e-5, atol=3e-6, err_msg=name)
  assert not np.allclose(np.asarray(attention(q, k, v, mask))[real_bt], want, atol=1e-3)  # the bias matters
  # Query 60 of every row over the keys as a cache [b, n, s, h] with its row's mask, bias [n, s].
  one = single_query_attention(q[:, 60], jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), mask_b1ts[:, 0, 60][:, None],
                               bias[0, :, 60])
  np.testing.assert_allclose(np.asarray(one)[real_bt[:, 60]], np.asarray(paths["explicit"])[:, 60][real_bt[:, 60]],
                             rtol=1e-5, atol=3e-6)
  dz = jnp.asarray(np.random.default_rng(6).standard_normal(q.shape), jnp.float32) * real_bt[:, :, None, None]
  bias_grad = {name: jax.grad(lambda bias: jnp.sum(f(q, k, v, mask_b1ts, bias_bnts=bias) * dz))(bias)
               for name, f in (("xla", dot_product_attention), ("explicit", explicit_attention))}
  np.testing.assert_allclose(bias_grad["xla"], bias_grad["explicit"], rtol=1e-5, atol=1e-6)
  assert np.any(np.asarray(bias_grad["xla"]) != 0)


@pytest.mark.parametrize("platform, dtype, lengths, packed, kernel", [
    ("gpu", BF16, (40, 50), False, "cudnn"), ("gpu", BF16, (48, 64), True, "flash"),
    ("tpu", BF16, (128, 256), True, "splash")])
def test_with_a_bias_auto_takes_xla_and_a_requested_kernel_is_an_error(platform, dtype, lengths, packed, kernel):
  common = dict(platform=platform, dtype=dtype, head_dim=64, q_len=lengths[0], kv_len=lengths[1], packed=packed)
  assert choose_implementation("auto", **common) == kernel  # without a bias, this kernel would run
  assert choose_implementation("auto", bias=True, **common) == "xla"
  assert choose_implementation("auto", bias=True, dropout=True, **common) == "explicit"
  assert choose_implementation("explicit", bias=True, **common) == "explicit"
  with pytest.raises(ConfigError, match=rf"config.model.attention_impl='{kernel}'.*config.model.positions='relative'"):
    choose_implementation(kernel, bias=True, **common)
  # The model's settings refuse the pair before anything runs.
  with pytest.raises(ConfigError, match=rf"config.model.attention_impl='{kernel}'.*config.model.positions='relative'"):
    ModelConfig(vocab_size=10, positions="relative", attention_impl=kernel)
  assert ModelConfig(vocab_size=10, positions="relative", attention_impl="xla").attention_impl == "xla"


def test_on_a_gpu_packed_rows_take_the_flash_kernel_unless_it_does_not_compile(monkeypatch, caplog):
  """A "GPU" (this CPU posing as one; the kernel interpreted): "auto" runs the flash kernel
  on packed bf16 rows; if the kernel did not compile there, XLA with a warning; a requested
  "flash" that does not compile is an error naming the setting."""
  from seq2seq.model import attention as attention_module
  from seq2seq.model import flash

  q, k, v, mask = qkv("cross", jnp.bfloat16)
  run = lambda impl: np.asarray(jax.jit(lambda *a: attention(*a, impl=impl))(q, k, v, mask), np.float32)  # traced anew
  want = run("xla")
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  ran = []
  monkeypatch.setattr(attention_module, "flash_attention",
                      lambda *a, **kw: ran.append(1) or flash_attention(*a, **kw, interpret=True))
  monkeypatch.setattr(flash, "compiles", lambda *setting: None)
  got = run("auto")
  assert ran and np.allclose(got, want, **TOLERANCE[jnp.bfloat16])
  monkeypatch.setattr(flash, "compiles", lambda *setting: "TritonError: unsupported")
  ran.clear()
  got = run("auto")
  assert not ran and np.array_equal(got, want)
  with pytest.raises(ValueError, match="attention_impl='flash' does not compile on this GPU: TritonError"):
    attention(q, k, v, mask, impl="flash")


def output_and_grads(kernel, q, k, v, dz):
  """(out, dq, dk, dv) of kernel(q, k, v) for the output gradient dz."""
  out, vjp = jax.vjp(kernel, q, k, v)
  return (out, *vjp(dz))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "self"])
def test_flash_gradients_equal_explicit_on_packed_rows(causal):
  """Several segments a row and padding, causal or not: the kernel's backward (two Pallas
  kernels, interpreted) equals autodiff through the explicit softmax on real queries."""
  segments = segment_ids([(20, 30, 10), (64,)], 64)
  mask = SegmentMask(segments, segments, causal=causal)
  rng = np.random.default_rng(5)
  q, k, v, dz = (jnp.asarray(rng.standard_normal((2, 64, 2, 16)), jnp.float32) for _ in range(4))
  real = (segments != 0)[:, :, None, None]
  grads = {}
  for name, kernel in (("flash", KERNELS["flash"]), ("explicit", KERNELS["explicit"])):
    _, vjp = jax.vjp(lambda q, k, v: jnp.where(real, kernel(q, k, v, mask), 0.0), q, k, v)
    grads[name] = vjp(dz)
  for got, want in zip(grads["flash"], grads["explicit"]):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# Asymmetric tiles, as the Triton tutorial's backward has them (outer 64, inner 16 here, to keep
# the interpreter fast): the forward's query block is below its key block, the backward's above.
ASYMMETRIC = "forward=16x64,dkdv=64x16,dq=64x16,warps=8,stages=3"
# case -> (query segments, key segments, causal). 96 is not a multiple of 64: those blocks fall
# back to 32. "causal_cross" has more queries than keys: the last query blocks see every key.
BLOCK_CASES = {
    "self": (segment_ids([(30, 50, 20), (128,)], 128), segment_ids([(30, 50, 20), (128,)], 128), False),
    "causal": (segment_ids([(20, 40, 10), (96,)], 96), segment_ids([(20, 40, 10), (96,)], 96), True),
    "cross": (segment_ids([(30, 40, 10), (96,)], 96), segment_ids([(50, 20, 40), (128,)], 128), False),
    "causal_cross": (segment_ids([(100, 20), (128,)], 128), segment_ids([(40, 20), (64,)], 64), True),
}


@pytest.mark.parametrize("case", list(BLOCK_CASES))
def test_flash_with_asymmetric_blocks_equals_explicit(case):
  """Values and gradients of the kernel at tiles other than the defaults, several segments a
  row and padding, equal autodiff through the explicit softmax on real queries."""
  assert_flash_equals_explicit(*BLOCK_CASES[case], seed=7)


def assert_flash_equals_explicit(q_segments_bt, k_segments_bs, causal: bool, seed: int) -> None:
  """The kernel at ASYMMETRIC tiles (interpreted) equals autodiff through the explicit softmax
  in values and gradients on real queries, for random q, k, v of 2 heads of 16."""
  from seq2seq.model.flash import Blocks

  mask = SegmentMask(q_segments_bt, k_segments_bs, causal=causal)
  (b, t), s = q_segments_bt.shape, k_segments_bs.shape[1]
  rng = np.random.default_rng(seed)
  q, dz = (jnp.asarray(rng.standard_normal((b, t, 2, 16)), jnp.float32) for _ in range(2))
  k, v = (jnp.asarray(rng.standard_normal((b, s, 2, 16)), jnp.float32) for _ in range(2))
  real = (q_segments_bt != 0)[:, :, None, None]
  kernels = {"flash": lambda q, k, v: flash_attention(q, k, v, mask, interpret=True, blocks=Blocks.parse(ASYMMETRIC)),
             "explicit": lambda q, k, v: KERNELS["explicit"](q, k, v, mask)}
  outs = {name: output_and_grads(lambda q, k, v, f=kernel: jnp.where(real, f(q, k, v), 0.0), q, k, v, dz)
          for name, kernel in kernels.items()}
  for what, got, want in zip(("out", "dq", "dk", "dv"), outs["flash"], outs["explicit"]):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=what)


def test_flash_blocks_parse_spec_and_defaults(monkeypatch):
  """The defaults are the tiles the kernel always ran; the command-line form round-trips; a
  block a length does not divide falls back to a smaller power of two; `flash.BLOCKS` is read
  when a call is traced, not when the module is imported."""
  from seq2seq.model import flash
  from seq2seq.model.flash import Blocks

  default = Blocks()
  assert default == Blocks.parse("") and flash.BLOCKS == default
  fitted = default.fitted(256, 256)
  assert (fitted.forward, fitted.dkdv, fitted.dq) == ((64, 64), (32, 32), (32, 32))
  assert (default.forward_warps(64), default.forward_warps(128), default.backward_warps, default.stages) == (4, 8, 4, 2)
  assert str(default) == default.spec() == "forward=64x64,dkdv=32x32,dq=32x32,warps=auto,backward_warps=4,stages=2"
  blocks = Blocks.parse(" forward=128x64, dkdv=128x32,dq=128x32 ,stages=3")
  assert blocks == Blocks(forward=(128, 64), dkdv=(128, 32), dq=(128, 32), stages=3)
  assert Blocks.parse(blocks.spec()) == blocks and Blocks.parse(str(Blocks(warps=2))).warps == 2
  assert blocks.forward_warps(64) == 4 and blocks.largest() == 128
  fitted = blocks.fitted(96, 80)  # 96 = 32 * 3, 80 = 16 * 5
  assert (fitted.forward, fitted.dkdv, fitted.dq) == ((32, 16), (16, 32), (32, 16))

  q_bt, k_bs = jnp.ones((2, 64), jnp.int32), jnp.ones((2, 64), jnp.int32)
  x = jnp.zeros((2, 64, 2, 16), jnp.float32)

  def grids():  # of the forward, dQ and dK/dV kernels, traced anew (a traced function keeps its tiles)
    grad = jax.grad(lambda x: jnp.sum(flash.flash_attention(x, x, x, q_bt, k_bs, True, True)))
    return [line.split("grid=")[1].split(")")[0] + ")" for line in str(jax.make_jaxpr(grad)(x)).split("\n")
            if "grid=" in line]

  assert grids() == ["(1, 2, 2)", "(2, 2, 2)", "(2, 2, 2)"]  # 64 / 64, 64 / 32, 64 / 32 blocks
  monkeypatch.setattr(flash, "BLOCKS", Blocks.parse("forward=16x32,dkdv=32x16,dq=64x16"))
  assert grids() == ["(4, 2, 2)", "(1, 2, 2)", "(2, 2, 2)"]


@pytest.mark.parametrize("text, match", [
    ("forward=128", "'forward=128'.*AxB"), ("forward=128x64x32", "'forward=128x64x32'.*AxB"),
    ("dq=96x32", "dq must be two powers of two >= 16, got \\(96, 32\\)"), ("dkdv=8x8", "dkdv must be two powers"),
    ("fwd=64x64", "'fwd=64x64'.*no such field"), ("forward=64x64,stages=two", "'stages=two'.*an integer"),
    ("stages=0", "stages must be a positive integer"), ("warps=3", "warps must be powers of two"),
    ("dq=32x32,dq=64x64", "'dq=64x64'.*given twice"), ("forward", "'forward'.*AxB")])
def test_flash_blocks_refuse_a_bad_string_naming_the_bad_part(text, match):
  from seq2seq.model.flash import Blocks

  with pytest.raises(ValueError, match=match):
    Blocks.parse(text)


@pytest.mark.parametrize("causal", [False, True], ids=["self", "causal"])
def test_flash_visits_only_the_blocks_that_share_a_segment(causal):
  """Each program loops over the other side's blocks that hold one of its block's segments
  (flash_kernels._segment_span): blocks wholly of other segments or padding are skipped, not
  masked. NaN keys and values in whole blocks of padding (which a masked block would multiply
  by zero weights, giving NaN) reach no output and no gradient; the rest is explicit attention
  on the same arrays with those positions zeroed. Default tiles: 64-key forward blocks, 32 in
  the backward; row 0 holds two pairs in its first 64 positions, row 1 one pair in all 128."""
  segments = segment_ids([(40, 24), (128,)], 128)
  mask = SegmentMask(segments, segments, causal=causal)
  rng = np.random.default_rng(11)
  q, k, v, dz = (jnp.asarray(rng.standard_normal((2, 128, 2, 16)), jnp.float32) for _ in range(4))
  padding = (segments == 0)[:, :, None, None]
  poisoned = [jnp.where(padding, jnp.nan, x) for x in (k, v)]
  real = ~padding
  flash = output_and_grads(lambda q, k, v: jnp.where(real, KERNELS["flash"](q, k, v, mask), 0.0), q, *poisoned, dz)
  explicit = output_and_grads(lambda q, k, v: jnp.where(real, KERNELS["explicit"](q, k, v, mask), 0.0), q,
                              *(jnp.where(padding, 0.0, x) for x in (k, v)), dz)
  for what, got, want in zip(("out", "dq", "dk", "dv"), flash, explicit):
    assert bool(jnp.all(jnp.isfinite(got))), what
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=what)


def test_flash_with_interleaved_segments_equals_explicit():
  """Segment ids in any order (the model's packing never interleaves pairs, but the kernel's
  skipping must not assume it): a block's span of the other side covers every block holding one
  of its segments, so the blocks between them are computed and masked, and values and gradients
  equal explicit attention's."""
  pattern = np.array([1] * 16 + [2] * 16 + [1] * 16 + [3] * 16 + [2] * 16 + [0] * 16 + [3] * 16 + [0] * 16, np.int32)
  segments = jnp.asarray(np.stack([pattern, pattern[::-1]]))
  assert_flash_equals_explicit(segments, segments, causal=False, seed=13)


def test_flash_queries_without_keys_attend_to_nothing():
  """Cross-attention where one target segment has no source segment: those queries give zeros
  and no gradient, whatever their output's gradient, so the other queries' outputs and every
  gradient are explicit attention's on the queries that have keys. (The first H100 check gave
  such queries an output gradient: dq was off by 77 and dk by 33 where the backward pass
  recomputed their weights as 1 each, not 1/s.)"""
  q_segments = segment_ids([(10, 10, 12)], 32)  # segment 3 has no source
  k_segments = segment_ids([(20, 20)], 48)
  mask = SegmentMask(q_segments, k_segments)
  rng = np.random.default_rng(7)
  q, dz = (jnp.asarray(rng.standard_normal((1, 32, 2, 16)), jnp.float32) for _ in range(2))
  k, v = (jnp.asarray(rng.standard_normal((1, 48, 2, 16)), jnp.float32) for _ in range(2))
  has_keys = jnp.arange(32)[None, :, None, None] < 20

  def outputs(name, dz):
    return output_and_grads(lambda q, k, v: KERNELS[name](q, k, v, mask), q, k, v, dz)

  flash, flash_masked_dz = outputs("flash", dz), outputs("flash", jnp.where(has_keys, dz, 0.0))
  explicit = outputs("explicit", jnp.where(has_keys, dz, 0.0))
  assert float(jnp.abs(flash[0][:, 20:]).max()) == 0.0
  np.testing.assert_allclose(flash[0][:, :20], explicit[0][:, :20], rtol=1e-5, atol=1e-5)
  for got, same, want in zip(flash[1:], flash_masked_dz[1:], explicit[1:]):
    np.testing.assert_array_equal(got, same)  # the output gradient of queries without keys goes nowhere
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["self", "cross"])
def test_the_flash_backward_sums_in_its_kernels_as_xla_summed_them(monkeypatch, layout):
  """flash.SUMS_IN_KERNELS: the dQ kernel computes delta = rowsum(dO * O) and the kernels sum dq
  and dv over their blocks for the biases' gradients. Every gradient (the fused arrays', the
  biases') equals, to f32 sums in another order, the one with XLA computing delta and the
  sums from the arrays (as before), and explicit attention's; packed rows, padding queries,
  several blocks of queries and keys (interpreted kernels, f32)."""
  from seq2seq.model import flash
  from seq2seq.model.attention import SegmentMask

  rng = np.random.default_rng(7)
  b, t, s, n, h = 2, 64, 48 if layout == "cross" else 64, 2, 16
  q_seg = jnp.asarray([[1] * 20 + [2] * 28 + [0] * 16, [1] * 64], jnp.int32)
  k_seg = q_seg if layout == "self" else jnp.asarray([[1] * 10 + [2] * 30 + [0] * 8, [1] * 48], jnp.int32)
  q, k, v = (jnp.asarray(rng.normal(size=(b, length, n, h)), jnp.float32) for length in (t, s, s))
  bq, bv = (jnp.asarray(rng.normal(size=(n, h)), jnp.float32) for _ in range(2))
  dz = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32) * (q_seg != 0)[:, :, None, None]
  blocks = flash.Blocks.parse("forward=16x16,dkdv=16x16,dq=16x16")  # several blocks each way

  def fused(q, k, v, bq, bv):
    if layout == "self":
      arrays, where = (jnp.stack([q, k, v], axis=3),), flash.SELF
    else:
      arrays, where = (q[:, :, :, None], jnp.stack([k, v], axis=3)), flash.CROSS
    return flash.fused_flash_attention(arrays, where, q_seg, k_seg, q_bias_nh=bq, v_bias_nh=bv,
                                       causal=layout == "self", interpret=True, blocks=blocks)

  grads = {}
  for sums in (True, False):
    monkeypatch.setattr(flash, "SUMS_IN_KERNELS", sums)
    grads[sums] = jax.vjp(fused, q, k, v, bq, bv)[1](dz)
  mask = SegmentMask(q_seg, k_seg, causal=layout == "self").dense_b1ts()
  real = (q_seg != 0)[:, :, None, None]
  want = jax.vjp(lambda q, k, v, bq, bv: jnp.where(real, explicit_attention(q + bq, k, v + bv, mask), 0.0),
                 q, k, v, bq, bv)[1](dz)
  for name, in_kernels, by_xla, wanted in zip("q k v bq bv".split(), grads[True], grads[False], want):
    np.testing.assert_allclose(in_kernels, by_xla, rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(in_kernels, wanted, rtol=1e-4, atol=1e-5, err_msg=name)


def test_transformer_takes_the_packed_flag_and_the_implementation_setting():
  """The model's `packed` flag and `attention_impl` change how attention runs, not the numbers."""
  from seq2seq.model.config import ModelConfig
  from seq2seq.model.transformer import Transformer

  src_bs, tgt_bt = np.array([[5, 6, 7, 0], [8, 9, 10, 11]]), np.array([[1, 12, 13], [1, 14, 0]])
  cfg = dict(vocab_size=16, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=16, max_len=8)
  run = nnx.jit(lambda model, packed: model(src_bs, tgt_bt, packed=packed), static_argnums=1)
  logits = run(Transformer(ModelConfig(**cfg), rngs=nnx.Rngs(0)), False)
  explicit = run(Transformer(ModelConfig(**cfg, attention_impl="explicit"), rngs=nnx.Rngs(0)), True)
  np.testing.assert_allclose(explicit, logits, rtol=1e-5, atol=1e-5)


SPLASH_ON_A_MESH = """
import os
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
from seq2seq import sharding
import sys
from seq2seq.model import flash
from seq2seq.model.attention import (SegmentMask, explicit_attention, flash_attention, fused_flash_attention,
                                     splash_attention)
rng = np.random.default_rng(0)
q, k, v = (jnp.asarray(rng.normal(size=(4, 128, 4, 16)), jnp.float32) for _ in range(3))
bq, bv = (jnp.asarray(rng.normal(size=(4, 16)), jnp.float32) for _ in range(2))
seg = np.ones((4, 128), np.int32); seg[0, 60:] = 2; seg[1, 100:] = 0; seg = jnp.asarray(seg)
mask = SegmentMask(seg, seg, causal=True)
mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
real = (seg != 0)[:, :, None, None]  # padding queries: attention() zeroes them on every path
if sys.argv[1] == "flash_fused":  # one [b, t, n, 3, h] array and the biases, split on heads too; and gradients
  def run(q, k, v, bq, bv):
    with sharding.activation_mesh(mesh):
      return fused_flash_attention((jnp.stack([q, k, v], axis=3),), flash.SELF, mask, q_bias_nh=bq, v_bias_nh=bv,
                                   interpret=True)
  want_fn = lambda q, k, v, bq, bv: jnp.where(real, explicit_attention(q + bq, k, v + bv, mask.dense_b1ts()), 0.0)
  args, dz = (q, k, v, bq, bv), jnp.asarray(rng.normal(size=q.shape), jnp.float32)
  got, got_vjp = jax.vjp(lambda *a: jnp.where(real, jax.jit(run)(*a), 0.0), *args)
  want, want_vjp = jax.vjp(want_fn, *args)
  # each output's largest error relative to its largest value (sums over 128 keys: gradients of about 10)
  error = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in zip((got, *got_vjp(dz)),
                                                                                     (want, *want_vjp(dz))))
  print(error, "shard_map" in str(jax.make_jaxpr(run)(*args)))
else:
  kernel = {"splash": splash_attention, "flash": flash_attention}[sys.argv[1]]
  def run(q, k, v, mask):
    with sharding.activation_mesh(mesh):
      return kernel(q, k, v, mask, interpret=True)
  got = jnp.where(real, jax.jit(run)(q, k, v, mask), 0.0)
  want = jnp.where(real, explicit_attention(q, k, v, mask.dense_b1ts()), 0.0)
  print(float(jnp.max(jnp.abs(got - want))), "shard_map" in str(jax.make_jaxpr(run)(q, k, v, mask)))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["splash", "flash", "flash_fused"])
def test_pallas_kernels_run_per_device_in_shard_map_on_a_data_fsdp_tensor_mesh(kernel):
  """On a (2, 2, 2) mesh of fake CPU devices the Pallas kernel (interpreted) runs in
  shard_map on each device's rows and heads and equals explicit attention; the flash kernel
  reading a fused [b, t, n, 3, h] projection with its biases (split on heads too) in its
  gradients as well."""
  import subprocess
  import sys

  from conftest import REPO

  out = subprocess.run([sys.executable, "-c", SPLASH_ON_A_MESH, kernel], capture_output=True, text=True, timeout=300,
                       cwd=REPO)
  assert out.returncode == 0, out.stderr[-3000:]
  error, used_shard_map = out.stdout.split()
  assert used_shard_map == "True" and float(error) < 3e-6
