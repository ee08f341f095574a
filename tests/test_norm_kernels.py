"""The Pallas LayerNorm/RMSNorm kernels (seq2seq/model/norm_kernels.py), run in Pallas'
interpreter on the CPU: equal to `Norm` as XLA computes it, in values and in every gradient,
alone, inside a Transformer (pre- and post-norm), and per device in shard_map on a mesh;
and where `config.model.norm_impl` lets them run."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.errors import ConfigError
from seq2seq.model import norm_kernels
from seq2seq.model.config import ModelConfig
from seq2seq.model.layers import Norm
from seq2seq.model.transformer import Transformer


@pytest.fixture
def kernels(monkeypatch):
  """`Norm` with impl="auto" runs the kernels, interpreted, whatever the platform."""
  monkeypatch.setattr(norm_kernels, "chosen", lambda impl, *_: impl != "xla")
  monkeypatch.setattr(norm_kernels, "fused_norm", functools.partial(norm_kernels.fused_norm, interpret=True))


def _norms(kind: str, d: int):
  """The same norm (random scale and bias) as XLA computes it and as the kernels do."""
  rng = np.random.default_rng(1)
  scale, bias = 1.0 + 0.3 * rng.standard_normal(d, dtype=np.float32), 0.2 * rng.standard_normal(d, dtype=np.float32)
  norms = [Norm(kind, d, impl=impl, rngs=nnx.Rngs(0)) for impl in ("xla", "auto")]
  for norm in norms:
    norm.scale_d[...] = jnp.asarray(scale)
    if kind == "layernorm":
      norm.bias_d[...] = jnp.asarray(bias)
  return norms


def _value_and_grads(norm: Norm, x, w):
  """y, and the gradients of sum(y * w) with respect to x and to the norm's parameters."""
  graphdef, params = nnx.split(norm)

  def loss(params, x):
    y = nnx.merge(graphdef, params)(x)
    return jnp.sum(y.astype(jnp.float32) * w), y
  (_, y), (d_params, d_x) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, x)
  return y, d_x, {"/".join(map(str, k)): v for k, v in nnx.to_flat_state(d_params)}


@pytest.mark.parametrize("kind", norm_kernels.KINDS)
@pytest.mark.parametrize("shape", [(3, 40, 128), (1, 7, 64)])  # 120 rows in blocks of 8; 7 rows in blocks of 1
def test_the_kernels_equal_the_xla_norm_in_values_and_gradients(kernels, kind, shape):
  """f32: the output, d x and d scale (and d bias) of the kernels equal XLA's `Norm` to float32
  rounding (|x| up to ~8, 7 to 120 rows, each a block or several)."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(3.0 * rng.standard_normal(shape, dtype=np.float32) + 1.0)
  w = jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
  want, got = (_value_and_grads(norm, x, w) for norm in _norms(kind, shape[-1]))
  np.testing.assert_allclose(got[0], want[0], rtol=0, atol=2e-6)
  np.testing.assert_allclose(got[1], want[1], rtol=0, atol=2e-6 * float(jnp.max(jnp.abs(want[1]))))
  assert got[2].keys() == want[2].keys() == ({"scale_d", "bias_d"} if kind == "layernorm" else {"scale_d"})
  for name in want[2]:
    np.testing.assert_allclose(got[2][name], want[2][name], rtol=2e-6, atol=2e-6 * float(jnp.max(jnp.abs(want[2][name]))))


def _steps_apart(got, want) -> np.ndarray:
  """|got - want| in bf16 steps: the spacing of bf16 numbers where they are (the larger of the
  two's, so that values either side of a power of two are one step apart)."""
  got, want = np.asarray(got), np.asarray(want)
  step = np.maximum(np.abs(np.spacing(got)), np.abs(np.spacing(want))).astype(np.float32)
  return np.abs(got.astype(np.float32) - want.astype(np.float32)) / step


def test_in_bfloat16_the_kernels_round_once_as_xla_does(kernels):
  """bf16 input: the output is XLA's but for the rounding of one f32 value to bf16: at most one
  bf16 step apart (two f32 values a rounding apart can round to neighbours; XLA's CPU code for
  the f32 arithmetic differs by machine and flags); the input's gradient the same, but near
  zero, where f32 cancellation leaves 2^-8 of a thousandth."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(2.0 * rng.standard_normal((4, 32, 256), dtype=np.float32)).astype(jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((4, 32, 256), dtype=np.float32))
  (y0, dx0, dp0), (y1, dx1, dp1) = (_value_and_grads(norm, x, w) for norm in _norms("layernorm", 256))
  assert y1.dtype == dx1.dtype == jnp.bfloat16
  assert np.all(_steps_apart(y1, y0) <= 1)
  assert np.all((_steps_apart(dx1, dx0) <= 1) | (np.abs(np.float32(dx1) - np.float32(dx0)) <= 2.0**-8 * 1e-3))
  for name in dp0:
    np.testing.assert_allclose(dp1[name], dp0[name], rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(dp0[name]))))


def _norm_adds(f, *args) -> int:
  """JAX's additions of [rows, d] gradients (`add_any`) in the gradient of `f` (d = 128)."""
  return sum(e.primitive.name == "add_any" and e.outvars[0].aval.shape[-1] == 128
             for e in jax.make_jaxpr(jax.grad(f))(*args).jaxpr.eqns)


@pytest.mark.parametrize("kind", norm_kernels.KINDS)
@pytest.mark.parametrize("handed_on", ["copies", "with_input"])
def test_the_kernel_adds_the_gradients_of_what_it_hands_on(kind, handed_on):
  """`copies=2` returns the output twice (a post-norm's Fork), `with_input` x beside it (a
  pre-norm's residual path); each copy takes a gradient of its own, and the backward kernel adds
  them as it reads them (copies) or adds x's to its d x (with_input). d x and the parameters'
  gradients equal, to the bit, those of the one-output kernel with JAX adding the gradients (f32,
  the same additions), and JAX adds nothing of [rows, d] itself."""
  rng = np.random.default_rng(2)
  x, w1, w2 = (jnp.asarray(rng.standard_normal((3, 40, 128), dtype=np.float32)) for _ in range(3))
  scale, bias = (jnp.asarray(rng.standard_normal(128, dtype=np.float32)) for _ in range(2))
  bias = bias if kind == "layernorm" else None
  norm = functools.partial(norm_kernels.fused_norm, eps=1e-6, interpret=True)
  copies = handed_on == "copies"
  second = lambda x, y: y if copies else x  # what the second output is: the output again, or x

  def kernel(x, scale, bias):
    y, other = norm(x, scale, bias, **({"copies": 2} if copies else {"with_input": True}))
    return jnp.sum(y * w1) + jnp.sum(other * w2)

  def jax_adds(x, scale, bias):  # one output; its uses' gradients added by JAX
    y = norm(x, scale, bias)
    return jnp.sum(y * w1) + jnp.sum(second(x, y) * w2)

  y, other = norm(x, scale, bias, **({"copies": 2} if copies else {"with_input": True}))
  np.testing.assert_array_equal(y, norm(x, scale, bias))
  np.testing.assert_array_equal(other, second(x, y))
  argnums = (0, 1, 2) if bias is not None else (0, 1)
  for got, want in zip(jax.grad(kernel, argnums)(x, scale, bias), jax.grad(jax_adds, argnums)(x, scale, bias)):
    np.testing.assert_array_equal(got, want)
  assert _norm_adds(kernel, x, scale, bias) == 0 and _norm_adds(jax_adds, x, scale, bias) == 1


@pytest.mark.parametrize("kind, position", [("layernorm", "post"), ("layernorm", "pre"), ("rmsnorm", "pre")])
def test_a_transformer_with_the_kernels_equals_one_without(kernels, kind, position, monkeypatch):
  """The whole model (f32, packed padding in the batch): logits and every parameter's gradient
  with norm_impl="auto" (the kernels) equal those with norm_impl="xla"."""
  def run(impl):
    cfg = ModelConfig(vocab_size=41, d_model=64, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=96,
                      max_len=32, dropout_rate=0.0, norm=kind, norm_position=position, norm_impl=impl)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    src = jnp.array([[5, 6, 7, 8, 9, 10, 0, 0], [11, 12, 13, 14, 15, 16, 17, 18]])
    tgt = jnp.array([[1, 20, 21, 22, 23, 24, 25, 0], [1, 26, 27, 28, 0, 0, 0, 0]])

    def loss(params):
      logits = nnx.merge(graphdef, params)(src, tgt)
      return jnp.sum(jax.nn.log_softmax(logits)[..., 3]), logits
    (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return logits, dict(nnx.to_flat_state(grads))
  cotangents = []
  backward = norm_kernels._backward
  monkeypatch.setattr(norm_kernels, "_backward",
                      lambda x, dys, dx_in, *a: cotangents.append((len(dys), dx_in is not None))
                      or backward(x, dys, dx_in, *a))
  (want, want_grads), (got, got_grads) = run("xla"), run("auto")
  # post-norm: every norm's output is a Fork (residual path, next sublayer), its two gradients
  # added in the kernel; the last of each stack gives the sublayer copy's zeros. Pre-norm: each
  # block's norm hands x on to the residual path and adds that gradient; the final norms, neither.
  sublayers = 2 * 2 + 3 * 2
  assert sorted(cotangents) == (sorted([(1, False)] * 2 + [(1, True)] * sublayers) if position == "pre"
                                else [(2, False)] * sublayers)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(jnp.max(jnp.abs(want))))
  assert got_grads.keys() == want_grads.keys()
  for name, g in want_grads.items():
    np.testing.assert_allclose(got_grads[name][...], g[...], rtol=0, atol=1e-5 * float(jnp.max(jnp.abs(g[...]))) + 1e-9,
                               err_msg=str(name))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("keys", ["key", "table"])
@pytest.mark.parametrize("position", ["post", "pre"])
def test_the_kernels_add_the_residual_and_its_dropout(dtype, keys, position):
  """A residual add in the kernels (`branch_btd`, `branch_bias_d`) against the add in XLA before
  the kernels (`layers.biased`, `dropout.dropout`: the same key, given alone or read from a
  `DropoutKeys` table): a post-norm's (the output twice) and a pre-norm's (`with_input`: the
  output and the sum, which the forward kernel writes and the backward kernel reads back). The
  same elements dropped (the branch's gradient is zero exactly there, about 10% of them); in bf16
  the outputs (the sum too) and the gradients of residual and branch equal to the bit (each
  operation rounded as JAX rounds it: the biased branch, the scaled branch, the sum, the branch's
  gradient), the branch bias's the f32 sum of that gradient (XLA sums it in bf16: 2% off here),
  the scale's and bias's to f32 rounding (the blocks' f32 partial sums added up in another order);
  in f32 all to f32 rounding (XLA's CPU compiles the interpreted kernels' arithmetic its own way)."""
  from seq2seq.model import dropout as drop
  from seq2seq.model.layers import biased

  rng = np.random.default_rng(4)
  shape = (3, 40, 128)
  residual, branch = (jnp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dtype) for _ in range(2))
  w1, w2 = (jnp.asarray(rng.standard_normal(shape, dtype=np.float32)) for _ in range(2))
  scale, bias, branch_bias = (jnp.asarray(1.0 + 0.3 * rng.standard_normal(128, dtype=np.float32)) for _ in range(3))
  key = jax.random.key(3)
  key = drop.DropoutKeys.derive(key, (3, 4)).fold(2).fold(1) if keys == "table" else key
  handed_on = {"copies": 2} if position == "post" else {"with_input": True}
  norm = functools.partial(norm_kernels.fused_norm, eps=1e-6, interpret=True, **handed_on)

  def outputs(residual, branch, branch_bias, scale, bias, kernel: bool):
    if kernel:
      return norm(residual, scale, bias, branch_btd=branch, branch_bias_d=branch_bias, rate=0.1, rng=key)
    return norm(residual + drop.dropout(biased(branch, branch_bias), 0.1, key), scale, bias)  # XLA's add

  def loss(*args, kernel: bool):
    y1, y2 = outputs(*args, kernel=kernel)
    return jnp.sum(y1.astype(jnp.float32) * w1) + jnp.sum(y2.astype(jnp.float32) * w2)

  args = (residual, branch, branch_bias, scale, bias)
  for got, want in zip(outputs(*args, kernel=True), outputs(*args, kernel=False)):
    assert got.dtype == want.dtype
    (np.testing.assert_array_equal if dtype == jnp.bfloat16 else functools.partial(
        np.testing.assert_allclose, rtol=0, atol=2e-6 * float(jnp.max(jnp.abs(want)))))(got, want)
  want = jax.value_and_grad(functools.partial(loss, kernel=False), argnums=(0, 1, 2, 3, 4))(*args)
  got = jax.value_and_grad(functools.partial(loss, kernel=True), argnums=(0, 1, 2, 3, 4))(*args)
  dropped = ~drop.keep_mask(key, shape, 0.1)
  assert 0.07 < float(dropped.mean()) < 0.13 and bool(jnp.all((got[1][1] == 0) == dropped))
  for i, (g, w) in enumerate(zip((got[0], *got[1]), (want[0], *want[1]))):
    assert g.dtype == w.dtype
    if dtype == jnp.bfloat16 and i == 3:  # the branch bias's: the f32 sum of the (equal) branch gradients
      w = jnp.sum(want[1][1].astype(jnp.float32), axis=(0, 1))
    if dtype == jnp.bfloat16 and i < 3:
      np.testing.assert_array_equal(g, w)
    else:
      np.testing.assert_allclose(g, w, rtol=0, atol=2e-6 * float(jnp.max(jnp.abs(w))))


@pytest.mark.parametrize("position, use_bias", [("post", True), ("pre", True), ("post", False), ("pre", False)])
def test_a_transformer_with_dropout_adds_its_residuals_in_the_kernels(kernels, position, use_bias, monkeypatch):
  """Training with dropout (f32): the logits and every gradient with the residual adds (and the
  sublayers' output biases, where the model has them) in the kernels equal those of the XLA formula,
  the same dropout masks.
  Post-norm: every block's add went into its norm's kernels. Pre-norm: every block's add but the
  stack's last went into the next block's norm, which wrote the sum and whose backward kernel read
  it back (not residual and branch), and the last into the stack's final norm; the first norm of a
  stack took the embeddings alone. None with the switches off."""
  adds, reads = [], []
  forward, backward = norm_kernels._forward, norm_kernels._backward
  monkeypatch.setattr(norm_kernels, "_forward", lambda xs, *a: adds.append(len(xs)) or forward(xs, *a))
  monkeypatch.setattr(norm_kernels, "_backward", lambda xs, dys, dx_in, *a: reads.append((len(xs), dx_in is not None))
                      or backward(xs, dys, dx_in, *a))

  def run(impl):
    cfg = ModelConfig(vocab_size=41, d_model=64, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=96,
                      max_len=32, dropout_rate=0.3, norm="layernorm", norm_position=position, norm_impl=impl,
                      use_bias=use_bias)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    src = jnp.array([[5, 6, 7, 8, 9, 10, 0, 0], [11, 12, 13, 14, 15, 16, 17, 18]])
    tgt = jnp.array([[1, 20, 21, 22, 23, 24, 25, 0], [1, 26, 27, 28, 0, 0, 0, 0]])

    def loss(params):
      logits = nnx.merge(graphdef, params)(src, tgt, dropout_rng=jax.random.key(7))
      return jnp.sum(jax.nn.log_softmax(logits)[..., 3]), logits
    (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return logits, dict(nnx.to_flat_state(grads))
  (want, want_grads), (got, got_grads) = run("xla"), run("auto")
  blocks = 2 * 2 + 3 * 2
  # operands: residual, branch, its bias (with biases) and the dropout's words; 1: x alone; 2: a
  # pre-norm's sum and the words
  add = 3 + use_bias
  if position == "post":
    assert adds == [add] * blocks and reads == [(add, False)] * blocks
  else:  # the stacks' first norms take x, the next ones the block before's add, the final norms the last
    assert adds == [1] + [add] * 4 + [1] + [add] * 6
    assert sorted(reads) == sorted([(1, True)] * 2 + [(2, True)] * (blocks - 2) + [(add, False)] * 2)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(jnp.max(jnp.abs(want))))
  for name, g in want_grads.items():
    np.testing.assert_allclose(got_grads[name][...], g[...], rtol=0, atol=1e-5 * float(jnp.max(jnp.abs(g[...]))) + 1e-9,
                               err_msg=str(name))
  for switch in ("PRE_ADD_IN_KERNEL",) * (position == "pre") + ("ADD_IN_KERNEL",):
    adds.clear()
    with monkeypatch.context() as off:
      off.setattr(norm_kernels, switch, False)
      np.testing.assert_allclose(run("auto")[0], got, rtol=0, atol=1e-5 * float(jnp.max(jnp.abs(got))))  # adds in XLA
    assert adds == [1] * (blocks + 2 * (position == "pre"))


@pytest.mark.parametrize("position", ["post", "pre"])
def test_a_decoding_step_with_the_kernels_equals_one_without(kernels, position, monkeypatch):
  """Cached decoding (f32): two steps' logits with the norm kernels equal XLA's; the decoder
  blocks' adds are made in them there too (a pre-norm block's by the next norm, the output bias
  its sublayer's own)."""
  adds = []
  forward = norm_kernels._forward
  monkeypatch.setattr(norm_kernels, "_forward", lambda xs, *a: adds.append(len(xs)) or forward(xs, *a))

  def run(impl):
    cfg = ModelConfig(vocab_size=41, d_model=64, num_heads=4, num_encoder_layers=1, num_decoder_layers=2, d_ff=96,
                      max_len=32, dropout_rate=0.3, norm="layernorm", norm_position=position, norm_impl=impl)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    src = jnp.array([[5, 6, 7, 8, 9, 10, 0, 0], [11, 12, 13, 14, 15, 16, 17, 18]])
    cache = model.init_cache(model.encode(src), src != 0, 4)
    logits = []
    for token in ([1, 1], [20, 26]):
      step_logits, cache = model.decode_step(jnp.array(token), cache)
      logits.append(step_logits)
    return jnp.stack(logits)
  want = run("xla")
  assert adds == []
  got = run("auto")
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(jnp.max(jnp.abs(want))))
  # operands of the forward kernels: x alone (1), residual and branch (2; the sublayer added its own
  # bias: a decoding step's attention), and the branch's bias (3: the FFN's, given); no dropout words.
  # Encoding: its block (pre: the first norm takes x, the next one and the final norm make the adds);
  # each step: self-attention, cross-attention and FFN of each decoder layer (pre: the final norm too)
  if position == "post":
    assert adds == [3, 3] + [2, 2, 3] * 2 * 2
  else:
    assert adds == [1, 3, 3] + ([1] + [2, 2, 3] * 2) * 2


def test_rows_come_in_power_of_two_blocks_that_divide_them():
  assert norm_kernels.rows_block(24576, 512) == 32 and norm_kernels.rows_block(24576, 1024) == 16
  assert norm_kernels.rows_block(120, 128) == 8 and norm_kernels.rows_block(7, 64) == 1
  assert norm_kernels.rows_block(96 * 256, 64) == 256


def test_the_setting_says_where_the_kernels_run():
  """On this CPU "auto" takes XLA, "pallas" is a ConfigError naming the setting and why, and a
  norm the kernels do not compute is refused before anything is built."""
  assert not norm_kernels.chosen("auto", "layernorm", 512, jnp.bfloat16)
  assert not norm_kernels.chosen("xla", "layernorm", 512, jnp.bfloat16)
  with pytest.raises(ConfigError, match=r"norm_impl='pallas' cannot run here: .*GPU only \(platform is cpu\)"):
    norm_kernels.chosen("pallas", "layernorm", 512, jnp.bfloat16)
  with pytest.raises(ConfigError, match="norm_impl must be one of"):
    ModelConfig(vocab_size=8, norm_impl="triton")
  with pytest.raises(ConfigError, match="not adanorm"):
    ModelConfig(vocab_size=8, norm="adanorm", norm_impl="pallas")
  assert norm_kernels.blockers(platform="gpu", kind="layernorm", d_model=512) in ([], [
      "this JAX has no Pallas Triton backend (jax.experimental.pallas.triton)"])
  assert norm_kernels.blockers(platform="gpu", kind="adanorm", d_model=384)[-2:] == [
      "the norm kernels compute ('layernorm', 'rmsnorm'), not adanorm",
      "the norm kernels need d_model in (64, 128, 256, 512, 1024, 2048, 4096, 8192), got 384"]


ON_A_MESH = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh
from seq2seq import sharding
from seq2seq.model import norm_kernels
mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), sharding.MESH_AXES)
rng = np.random.default_rng(0)
x, w, w2 = (jnp.asarray(rng.standard_normal((8, 16, 128), dtype=np.float32)) for _ in range(3))
scale, bias = (jnp.asarray(rng.standard_normal(128, dtype=np.float32)) for _ in range(2))

def reference(x, scale, bias, w=w):
  centred = x - x.mean(-1, keepdims=True)
  return jnp.sum((centred * jax.lax.rsqrt(jnp.mean(centred ** 2, -1, keepdims=True) + 1e-6) * scale + bias) * w)

def kernel(x, scale, bias):
  with sharding.activation_mesh(mesh):
    return jnp.sum(norm_kernels.fused_norm(x, scale, bias, eps=1e-6, interpret=True) * w)

def copies(x, scale, bias):  # two copies of the output, each with a gradient of its own
  with sharding.activation_mesh(mesh):
    y, y2 = norm_kernels.fused_norm(x, scale, bias, eps=1e-6, interpret=True, copies=2)
    return jnp.sum(y * w) + jnp.sum(y2 * w2)

def error(f, reference):
  got = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(x, scale, bias)
  want = jax.grad(reference, argnums=(0, 1, 2))(x, scale, bias)
  return max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in zip(got, want))

def handed_on(x, scale, bias):  # x itself beside the output, with a gradient of its own
  with sharding.activation_mesh(mesh):
    y, x_copy = norm_kernels.fused_norm(x, scale, bias, eps=1e-6, interpret=True, with_input=True)
    return jnp.sum(y * w) + jnp.sum(x_copy * w2)

from seq2seq.model import dropout
branch, key = jnp.asarray(rng.standard_normal((8, 16, 128), dtype=np.float32)), jax.random.key(5)

def added(x, scale, bias):  # a post-norm's residual add: each device's dropout mask its rows' of the whole
  with sharding.activation_mesh(mesh):
    return jnp.sum(norm_kernels.fused_norm(x, scale, bias, eps=1e-6, interpret=True, branch_btd=branch,
                                           branch_bias_d=bias, rate=0.25, rng=key) * w)

def added_pre(x, scale, bias):  # a pre-norm's: the sum handed on beside the output
  with sharding.activation_mesh(mesh):
    y, summed = norm_kernels.fused_norm(x, scale, bias, eps=1e-6, interpret=True, with_input=True, branch_btd=branch,
                                        branch_bias_d=bias, rate=0.25, rng=key)
    return jnp.sum(y * w) + jnp.sum(summed * w2)

def added_reference(x, scale, bias, handed_on=False):
  summed = x + dropout.dropout(branch + bias, 0.25, key)
  return reference(summed, scale, bias) + (jnp.sum(summed * w2) if handed_on else 0.0)

print(error(kernel, reference), error(copies, lambda *a: reference(*a, w=w + w2)),
      error(handed_on, lambda x, *a: reference(x, *a) + jnp.sum(x * w2)),
      error(added, added_reference), error(added_pre, lambda *a: added_reference(*a, handed_on=True)),
      "shard_map" in str(jax.make_jaxpr(kernel)(x, scale, bias)))
"""


@pytest.mark.slow
def test_the_kernels_run_per_device_in_shard_map_on_a_data_fsdp_tensor_mesh():
  """On a (2, 2, 2) mesh of fake CPU devices the kernels run in shard_map on each device's rows
  (the features whole) and the gradients of x, scale and bias equal the formula's: the scale
  and bias gradients summed over the devices that hold rows, once; with two copies of the
  output, the formula's given the sum of their gradients; with x handed on beside the output,
  the formula's plus that copy's gradient; with a residual add, a post-norm's or a pre-norm's (the
  sum handed on), the formula's with the whole batch's dropout mask (each device's first row of the
  batch given to its kernels)."""
  import os
  import subprocess
  import sys

  from conftest import REPO

  env = os.environ | {"XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"}
  out = subprocess.run([sys.executable, "-c", ON_A_MESH], capture_output=True, text=True, timeout=300, cwd=REPO,
                       env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  *errors, used_shard_map = out.stdout.split()
  assert used_shard_map == "True" and max(map(float, errors)) < 1e-6


def test_the_device_checks_norm_rows_compare_the_kernels_with_xla(kernels, capsys):
  """benchmarks/device_check.py's GPU check of the kernels, with them interpreted here: one row
  per norm whose output and every gradient (x, scale, bias) it compares with XLA's, all within
  bf16 rounding; one for a post-norm's residual add in the kernels against the add in XLA (the
  same dropped elements, the same gradients: bf16, to the bit here); and a timing of each."""
  import json

  from conftest import benchmark

  benchmark("device_check").norm_rows(2, 16, 1)
  rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  checks, timings = [r for r in rows if "case" in r], {r["timing"]: r for r in rows if "timing" in r}
  added = checks.pop()
  assert [r["case"] for r in checks] == ["norm_layernorm", "norm_rmsnorm"] and added["case"] == "norm_residual_add"
  # the residual add in the kernels against XLA's before them: the same dropped elements, the same values
  assert added["dropped_equal"] and 0.05 < added["dropped_fraction"] < 0.15, added
  assert all(added[f"{name}_max_abs_err"] == 0 < added[f"{name}_max_abs"]
             for name in ("d_residual", "d_branch", "dparams")), added
  assert added["d_branch_bias_max_abs_err"] <= 2.0 ** -6 * added["d_branch_bias_max_abs"], added  # XLA's: a bf16 sum
  assert {k.rsplit("_max_abs", 1)[0] for k in checks[0] if k.endswith("_max_abs")} == {
      "out", "dx", "dparams[bias_d]", "dparams[scale_d]"}, checks[0]
  assert {k.rsplit("_max_abs", 1)[0] for k in checks[1] if k.endswith("_max_abs")} == {"out", "dx", "dparams[scale_d]"}
  for row in checks:
    assert row["out_within_1_bf16_ulp"], row
    for key in row:
      if key.endswith("_max_abs_err"):
        assert row[key] <= 2.0 ** -7 * row[key.replace("_err", "")], (key, row)
  assert set(timings) == {"norm_pallas", "norm_xla", "residual_add_kernel", "residual_add_xla"}
  assert all(r.get("layernorm_fwd_bwd_ms", r.get("fwd_bwd_ms")) > 0 for r in timings.values()), timings


def test_kernels_are_checked_for_a_device_of_this_process():
  """On many hosts the mesh's first device may be another process's: a kernel's compile check
  at trace time takes the first device this process holds; with none, the first; without a
  mesh, JAX's default (None)."""
  import types

  from seq2seq import sharding

  me, other = jax.process_index(), jax.process_index() + 1
  devices = [types.SimpleNamespace(id=i, process_index=p) for i, p in enumerate([other, other, me, me])]
  mesh = types.SimpleNamespace(devices=np.array(devices, dtype=object).reshape(2, 2))
  assert sharding.kernel_device(mesh) is devices[2]
  theirs = types.SimpleNamespace(devices=np.array(devices[:2], dtype=object))
  assert sharding.kernel_device(theirs) is devices[0] and sharding.kernel_device(None) is None
