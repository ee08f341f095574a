"""The label-smoothed cross entropy (seq2seq/training/loss.py), in both implementations (the
CPU's reductions in passes, the one-pass reduction GPUs and TPUs run), against a plain reference
(log_softmax and autodiff): values, gradients (logits, hidden states, output projection, a
whole model), padding, a vocabulary split over devices, and the bytes XLA says it moves."""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO, benchmark

from seq2seq.model.layers import dense, tied_logits
from seq2seq.training import loss as loss_lib
from seq2seq.training.loss import chunked_cross_entropy_sums, cross_entropy_sums, vocab_blocks

EPS = 0.1
IMPLS = ("passes", "one_pass")


def reference_sums(logits_btv, labels_bt, weights_bt, label_smoothing=0.0) -> dict:
  """The loss by its definition, differentiated by JAX."""
  logits_btv = logits_btv.astype(jnp.float32)
  logp_btv = jax.nn.log_softmax(logits_btv)
  nll_bt = -jnp.take_along_axis(logp_btv, labels_bt[..., None], -1)[..., 0]
  loss_bt = (1.0 - label_smoothing) * nll_bt - label_smoothing * jnp.mean(logp_btv, -1)
  fixed_btv = jax.lax.stop_gradient(logits_btv)
  correct_bt = jnp.take_along_axis(fixed_btv, labels_bt[..., None], -1)[..., 0] >= jnp.max(fixed_btv, -1)
  w_bt = weights_bt.astype(jnp.float32)
  return {"loss_sum": jnp.sum(loss_bt * w_bt), "nll_sum": jnp.sum(nll_bt * w_bt), "tokens": jnp.sum(w_bt),
          "correct": jnp.sum(correct_bt * w_bt)}


def _grad(sums_fn, argnums=0):
  """d loss_sum / d inputs, and the sums, of sums_fn(*inputs)."""
  return jax.jit(jax.grad(lambda *a: (lambda s: (s["loss_sum"], s))(sums_fn(*a)), argnums, has_aux=True))


def _close(got, want, rtol=1e-5):
  """Equal within rtol of the largest magnitude (gradients have entries near zero)."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  np.testing.assert_allclose(got, want, rtol=0, atol=rtol * max(np.abs(want).max(), 1e-30))


def _inputs(b, t, v, seed=0, scale=4.0):
  rng = np.random.default_rng(seed)
  logits = (rng.standard_normal((b, t, v)) * scale).astype(np.float32)
  labels = rng.integers(0, v, (b, t)).astype(np.int32)
  labels[:, ::2] = logits[:, ::2].argmax(-1)  # half the tokens predicted right
  weights = rng.random((b, t)) < 0.8
  return jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(weights)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("vocab", [7, 500, 4000, 4001])  # one block, several, blocks of 500, a prime
def test_values_and_gradient_equal_the_reference(vocab, impl):
  logits, labels, weights = _inputs(3, 17, vocab)
  fused = functools.partial(cross_entropy_sums, impl=impl)
  (g_new, s_new), (g_ref, s_ref) = (_grad(lambda x, f=f: f(x, labels, weights, EPS))(logits)
                                    for f in (fused, reference_sums))
  for k in ("loss_sum", "nll_sum"):
    assert float(s_new[k]) == pytest.approx(float(s_ref[k]), rel=1e-5), k
  assert float(s_new["tokens"]) == float(s_ref["tokens"]) and float(s_new["correct"]) == float(s_ref["correct"]) > 0
  _close(g_new, g_ref)


@pytest.mark.parametrize("impl", IMPLS)
def test_ties_count_as_correct_and_bf16_logits_are_read_as_f32(impl):
  logits = jnp.asarray([[[1.0, 3.0, 3.0, -2.0], [0.5, 0.25, 0.0, 0.0]]], jnp.bfloat16)
  sums = cross_entropy_sums(logits, jnp.asarray([[2, 1]]), jnp.ones((1, 2), bool), EPS, impl=impl)
  want = reference_sums(logits, jnp.asarray([[2, 1]]), jnp.ones((1, 2), bool), EPS)
  assert float(sums["correct"]) == 1.0 and float(sums["loss_sum"]) == pytest.approx(float(want["loss_sum"]), rel=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_bf16_logits_give_the_f32_loss_of_their_rounded_values_and_a_bf16_gradient(impl):
  """`model.logits_dtype=bfloat16`: the loss of bf16 logits is exactly the f32 loss of the
  rounded logits, and its gradient that gradient rounded to bf16 (the loss works in f32
  and rounds once, at the end). Against the unrounded f32 logits each token's loss moves by
  at most 2 u max|z|: the loss's gradient, p - target, has an l1 norm of at most 2, and
  rounding moves each logit by at most u |z| (u = 2^-8, bf16's unit roundoff)."""
  logits, labels, weights = _inputs(3, 17, 4001, scale=8.0)
  rounded = logits.astype(jnp.bfloat16)
  sums = functools.partial(cross_entropy_sums, impl=impl)
  (g16, s16), (g_ref, s_ref) = (_grad(lambda x: sums(x, labels, weights, EPS))(x)
                                for x in (rounded, rounded.astype(jnp.float32)))
  assert g16.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(g16, np.float32), np.asarray(g_ref.astype(jnp.bfloat16), np.float32))
  assert {k: float(v) for k, v in s16.items()} == {k: float(v) for k, v in s_ref.items()}
  per_token = jax.jit(lambda x: loss_lib.smoothed_xent(x, labels, EPS, impl)[0])
  moved = np.abs(np.asarray(per_token(rounded)) - np.asarray(per_token(logits)))
  bound = 2 * 2.0**-8 * np.abs(np.asarray(logits)).max(-1)
  assert np.all(moved <= bound * (1 + 1e-5)), (moved / bound).max()
  assert moved.max() > 0  # the rounding did change the loss


@pytest.mark.parametrize("impl", IMPLS)
def test_padding_contributes_nothing(impl):
  logits, labels, weights = _inputs(2, 9, 300)
  weights = weights.at[:, -3:].set(False)
  wild = logits.at[:, -3:].set(1e4 * jnp.sign(logits[:, -3:]))  # padded positions hold anything
  grad = _grad(lambda x: cross_entropy_sums(x, labels, weights, EPS, impl=impl))
  (g, s), (g_wild, s_wild) = grad(logits), grad(wild)
  assert np.all(np.asarray(g_wild)[:, -3:] == 0.0) and np.all(np.asarray(g)[~np.asarray(weights)] == 0.0)
  for k in s:
    assert float(s_wild[k]) == float(s[k]), k
  _close(g_wild[:, :-3], g[:, :-3], rtol=1e-7)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("tied", [True, False])
def test_gradients_through_the_output_projection_equal_the_reference(tied, impl):
  """With respect to the decoder's final states and the output embedding (tied: [v, d], as
  `Embed.attend`; untied: [d, v], as `Transformer.output_dv`)."""
  rng = np.random.default_rng(1)
  b, t, d, v = 2, 11, 16, 1000
  h = jnp.asarray(rng.standard_normal((b, t, d)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((v, d) if tied else (d, v)) * d**-0.5, jnp.float32)
  _, labels, weights = _inputs(b, t, v)
  project = tied_logits if tied else (lambda h, w: dense(h, w, out_dtype=jnp.float32))
  (g_new, s_new), (g_ref, s_ref) = (
      _grad(lambda h, w, f=f: f(project(h, w), labels, weights, EPS), (0, 1))(h, w)
      for f in (functools.partial(cross_entropy_sums, impl=impl), reference_sums))
  assert float(s_new["loss_sum"]) == pytest.approx(float(s_ref["loss_sum"]), rel=1e-5)
  for got, want in zip(g_new, g_ref):
    _close(got, want)


@pytest.mark.parametrize("impl, overrides", [
    ("auto", {}), pytest.param("one_pass", {"tie_output": False, "norm_position": "pre"}, marks=pytest.mark.long)])
def test_gradients_of_a_whole_model_equal_the_reference(monkeypatch, impl, overrides):
  from flax import nnx

  from seq2seq.model import transformer
  from seq2seq.model.config import ModelConfig
  from seq2seq.training import train

  cfg = ModelConfig(vocab_size=600, d_model=32, num_heads=4, num_encoder_layers=1, num_decoder_layers=2, d_ff=64,
                    **overrides)
  params, graphdef = nnx.state(transformer.Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param), transformer.graphdef(cfg)
  rng = np.random.default_rng(2)
  tgt = rng.integers(3, 600, (4, 9)).astype(np.int32)
  tgt[1, -3:] = 0
  seg_t = (tgt > 0).astype(np.int32)
  pos = np.broadcast_to(np.arange(9, dtype=np.int32), (4, 9))
  batch = {"src_bs": rng.integers(3, 600, (4, 9)).astype(np.int32), "src_segments_bs": np.ones((4, 9), np.int32),
           "src_positions_bs": pos, "tgt_in_bt": np.concatenate([np.ones((4, 1), np.int32), tgt[:, :-1]], 1) * seg_t,
           "tgt_out_bt": tgt, "tgt_segments_bt": seg_t, "tgt_positions_bt": pos}
  batch = {k: jnp.asarray(x) for k, x in batch.items()}
  grads = {}
  for name, fn in (("fused", functools.partial(cross_entropy_sums, impl=impl)), ("reference", reference_sums)):
    monkeypatch.setattr(train, "cross_entropy_sums", fn)
    grads[name] = jax.jit(lambda p: train.grad_sums(p, batch, None, graphdef=graphdef, label_smoothing=EPS))(params)
  (g_new, s_new), (g_ref, s_ref) = grads["fused"], grads["reference"]
  assert float(s_new["loss_sum"]) == pytest.approx(float(s_ref["loss_sum"]), rel=1e-5)
  leaves_new, leaves_ref = jax.tree.leaves(g_new), jax.tree.leaves(g_ref)
  assert len(leaves_new) == len(leaves_ref) > 10
  for got, want in zip(leaves_new, leaves_ref):
    _close(got, want)


def test_vocabulary_blocks_are_short_and_divide_it_when_they_can():
  assert vocab_blocks(37000) == (74, 500) and vocab_blocks(37000 // 8) == (10, 463)  # 4625 = 10 x 463 - 5
  assert vocab_blocks(8000) == (16, 500) and vocab_blocks(300) == (1, 300) and vocab_blocks(4001) == (8, 501)
  for v in (7, 512, 513, 1000, 4001, 32000, 37000, 50257):
    g, k = vocab_blocks(v)
    assert k <= loss_lib.MAX_BLOCK and 0 <= g * k - v < g


SHARDED = """
import jax, jax.numpy as jnp, json, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from seq2seq import sharding
from seq2seq.training.loss import cross_entropy_sums
mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "tensor": 4})
rng = np.random.default_rng(0)
logits = jnp.asarray(rng.standard_normal((2, 6, 2000)) * 4, jnp.float32)
labels, weights = jnp.asarray(rng.integers(0, 2000, (2, 6))), jnp.ones((2, 6), bool)
out = {}
for impl in ("passes", "one_pass"):
  def f(x):
    sums = lambda x: (lambda s: (s["loss_sum"], s))(cross_entropy_sums(x, labels, weights, 0.1, impl=impl))
    return jax.grad(sums, has_aux=True)(x)
  one = jax.jit(f)(logits)
  split = jax.jit(sharding.with_activation_mesh(f, mesh))
  x = jax.device_put(logits, NamedSharding(mesh, P("data", None, "tensor")))
  hlo = split.lower(x).compile().as_text()
  got = split(x)
  out[impl] = {"grad": float(jnp.max(jnp.abs(got[0] - one[0]))), "sums": {k: [float(got[1][k]), float(one[1][k])]
               for k in one[1]}, "all_gathers": hlo.count(" all-gather("), "all_reduces": hlo.count(" all-reduce(")}
print(json.dumps(out))
"""


def test_a_vocabulary_split_over_devices_gives_the_same_loss_and_moves_no_logits():
  env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8",
             PYTHONPATH=str(REPO))
  out = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  for impl, result in json.loads(out.stdout.strip().splitlines()[-1]).items():
    assert result["grad"] < 1e-6, impl
    for k, (got, want) in result["sums"].items():
      assert got == pytest.approx(want, rel=1e-6), (impl, k)
    assert result["all_gathers"] == 0 and result["all_reduces"] >= 1, impl  # per-token reductions only


def _loss_bytes():
  return benchmark("loss_bytes")


def test_the_loss_moves_fewer_bytes_than_the_reference_and_the_legacy_loss():
  """XLA's bytes accessed for logits [8 * 64, 4000] -> sums, forward and backward, in units of
  the logits' size. One pass: the forward pass reads the logits once, the backward pass reads
  them and writes their gradient (3). Passes: max, exp-sum and sum read them (and XLA counts
  the label gather's fusion as one more, though it reads one logit per token): 6. The loss
  before issue 45 moved 8 (a masked label sum written out), the autodiff reference more.
  On bf16 logits one pass moves 3 units of their own (half the f32 logits' bytes)."""
  bench = _loss_bytes()
  tokens, vocab = 8 * 64, 4000
  units = {name: bench.loss_cost(name, tokens, vocab)["bytes_accessed"] / (tokens * vocab * 4)
           for name in ("one_pass", "passes", "auto", "legacy", reference_sums)}
  assert units["one_pass"] < 3.1 < units["passes"] < 6.1 < 7.9 < units["legacy"] < units[reference_sums]
  assert units["auto"] == units["passes"]  # a CPU program
  # bf16 logits (model.logits_dtype=bfloat16): the same three passes over half the bytes.
  bf16 = bench.loss_cost("one_pass", tokens, vocab, dtype="bfloat16")
  assert bf16["logits_bytes"] * 2 == tokens * vocab * 4 and bf16["bytes_accessed"] / bf16["logits_bytes"] < 3.1
  # Same values as the legacy loss on those inputs.
  logits, labels, weights = _inputs(1, tokens, vocab)
  for impl in IMPLS:
    (g_new, s_new), (g_old, s_old) = (_grad(lambda x, f=f: f(x, labels, weights, EPS))(logits) for f in (
        functools.partial(cross_entropy_sums, impl=impl), bench.legacy_cross_entropy_sums))
    assert float(s_new["correct"]) == float(s_old["correct"]) and float(s_new["tokens"]) == float(s_old["tokens"])
    assert float(s_new["nll_sum"]) == pytest.approx(float(s_old["nll_sum"]), rel=1e-6)
    _close(g_new, g_old)


# -- the projection and the loss in chunks of positions (train.loss_chunk) -----------------
def _projected(tied, logits_dtype):
  """The unchunked path: logits made by the model's projection, then `cross_entropy_sums`."""
  if tied:
    return lambda h, w: tied_logits(h, w, logits_dtype)
  return lambda h, w: dense(h, w, out_dtype=jnp.dtype(logits_dtype))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("tied", [True, False])
def test_the_chunked_projection_and_loss_equal_the_unchunked_ones_in_float64(tied, impl):
  """Sums and gradients (states and weight) of `chunked_cross_entropy_sums` equal the logits'
  path to float64 rounding, for a chunk of one position, one the length does not divide
  (padding), the whole length and more; the metrics carry no gradient and a NaN cotangent (the
  divergence guard's poison) reaches every entry."""
  rng = np.random.default_rng(3)
  b, t, d, v = 3, 11, 16, 300
  with jax.enable_x64(True):
    h = jnp.asarray(rng.standard_normal((b, t, d)))
    w = jnp.asarray(rng.standard_normal((v, d) if tied else (d, v)) * d**-0.5 * 4)
    labels = jnp.asarray(rng.integers(0, v, (b, t)).astype(np.int32))
    weights = jnp.asarray(rng.random((b, t)) < 0.8)
    project = _projected(tied, "float64")
    g_ref, s_ref = _grad(lambda h, w: cross_entropy_sums(project(h, w), labels, weights, EPS, impl), (0, 1))(h, w)
    for chunk in (1, 4, 11, 16):
      sums = lambda h, w: chunked_cross_entropy_sums(h, w, labels, weights, tied=tied, chunk=chunk, label_smoothing=EPS,
                                                     logits_dtype="float64", impl=impl)
      g_new, s_new = _grad(sums, (0, 1))(h, w)
      s_primal = jax.jit(sums)(h, w)  # without jax.grad: the loop without the gradient's products
      for k in s_ref:
        assert float(s_new[k]) == pytest.approx(float(s_ref[k]), rel=1e-13, abs=1e-13), (chunk, k)
        assert float(s_primal[k]) == float(s_new[k]), (chunk, k)
      for got, want in zip(g_new, g_ref):
        assert got.dtype == want.dtype
        _close(got, want, rtol=1e-12)
    metrics = jax.grad(lambda h: (lambda s: s["nll_sum"] + s["correct"])(
        chunked_cross_entropy_sums(h, w, labels, weights, tied=tied, chunk=4)))(h)
    assert not np.any(np.asarray(metrics))
    poisoned = jax.grad(lambda h, w: chunked_cross_entropy_sums(h, w, labels, weights, tied=tied, chunk=4)["loss_sum"]
                        * jnp.nan, (0, 1))(h, w)
    assert all(np.isnan(np.asarray(g)).all() for g in poisoned)
  with pytest.raises(ValueError, match="loss chunk 0"):
    chunked_cross_entropy_sums(h, w, labels, weights, tied=tied, chunk=0)


@pytest.mark.parametrize("tied", [True, False])
def test_chunks_of_bf16_logits_equal_the_unchunked_bf16_logits_within_their_rounding(tied):
  """`model.logits_dtype=bfloat16` with chunks, f32 states: the sums within f32 rounding of
  the unchunked bf16 path, the gradients within bf16's (2^-8 of the largest): the loss runs in
  f32, and its gradient, rounded to bf16 before the products, may round the other way. The
  unchunked untied weight's gradient is also written in bf16 (its product's output dtype),
  the chunks' in f32: one more bf16 rounding of each entry."""
  rng = np.random.default_rng(4)
  b, t, d, v = 3, 11, 16, 300
  h = jnp.asarray(rng.standard_normal((b, t, d)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((v, d) if tied else (d, v)) * d**-0.5 * 4, jnp.float32)
  labels, weights = jnp.asarray(rng.integers(0, v, (b, t)).astype(np.int32)), jnp.asarray(rng.random((b, t)) < 0.8)
  project = _projected(tied, "bfloat16")
  g_ref, s_ref = _grad(lambda h, w: cross_entropy_sums(project(h, w), labels, weights, EPS), (0, 1))(h, w)
  g_new, s_new = _grad(lambda h, w: chunked_cross_entropy_sums(h, w, labels, weights, tied=tied, chunk=4,
                                                               label_smoothing=EPS, logits_dtype="bfloat16"), (0, 1))(h, w)
  assert float(s_new["correct"]) == float(s_ref["correct"]) and float(s_new["tokens"]) == float(s_ref["tokens"])
  for k in ("loss_sum", "nll_sum"):
    assert float(s_new[k]) == pytest.approx(float(s_ref[k]), rel=1e-6), k
  _close(g_new[0], g_ref[0], rtol=2.0**-8)
  dw_new, dw_ref = np.asarray(g_new[1], np.float64), np.asarray(g_ref[1], np.float64)
  ulp = 0.0 if tied else 2.0 ** (np.floor(np.log2(np.maximum(np.abs(dw_ref), 1e-30))) - 7)  # bf16: 8 bits
  assert np.all(np.abs(dw_new - dw_ref) <= ulp + 2.0**-8 * np.abs(dw_ref).max())


CHUNKED_SHARDED = """
import jax, jax.numpy as jnp, json, math, re, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from seq2seq import sharding
from seq2seq.training.loss import chunked_cross_entropy_sums
rng = np.random.default_rng(0)
b, t, d, v, chunk = 8, 12, 16, 2000, 5
y = jnp.asarray(rng.standard_normal((b, t, d)), jnp.float32)
labels, weights = jnp.asarray(rng.integers(0, v, (b, t)).astype(np.int32)), jnp.asarray(rng.random((b, t)) < 0.8)
COLLECTIVE = re.compile(r"= (.*?) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\\(")
out = {}
for tied in (True, False):
  w = jnp.asarray(rng.standard_normal((v, d) if tied else (d, v)) * d**-0.5, jnp.float32)
  def f(y, w):
    sums = lambda y, w: chunked_cross_entropy_sums(y, w, labels, weights, tied=tied, chunk=chunk, label_smoothing=0.1,
                                                   impl="one_pass")
    return jax.grad(lambda y, w: (lambda s: (s["loss_sum"], s))(sums(y, w)), (0, 1), has_aux=True)(y, w)
  one = jax.jit(f)(y, w)
  for axes in ((8, 1, 1), (2, 1, 4), (2, 2, 2)):
    mesh = sharding.make_mesh(dict(zip(("data", "fsdp", "tensor"), axes)))
    split = jax.jit(sharding.with_activation_mesh(f, mesh))
    ys = jax.device_put(y, NamedSharding(mesh, P(("data", "fsdp"))))
    ws = jax.device_put(w, NamedSharding(mesh, sharding.spec_for(("vocab", "embed") if tied else ("embed", "vocab"),
                                                                 w.shape, mesh)))
    hlo = split.lower(ys, ws).compile().as_text()
    got = split(ys, ws)
    bodies = set(re.findall(r"body=%?([\\w.\\-]+)", hlo))
    comps = dict(re.findall(r"\\n%?([\\w.\\-]+) [^\\n]*\\{\\n(.*?)\\n\\}", hlo, re.S))
    in_loop = [(m.group(2), max(math.prod(int(x) for x in dims.split(",") if x) for dims in re.findall(r"\\[([\\d,]*)\\]", m.group(1))))
               for name in bodies for m in COLLECTIVE.finditer(comps.get(name, ""))]
    out[f"{tied} {axes}"] = {"grad": [float(jnp.max(jnp.abs(a - b_)) / jnp.max(jnp.abs(b_))) for a, b_ in zip(got[0], one[0])],
                             "sums": {k: [float(got[1][k]), float(one[1][k])] for k in one[1]}, "loops": len(bodies),
                             "in_loop": in_loop}
print(json.dumps(out))
"""


def test_chunks_on_a_mesh_give_one_devices_values_and_sum_the_weight_gradient_once():
  """On 8 CPU devices (data, data x tensor, data x fsdp x tensor): the chunked loss and its
  gradients equal one device's. Inside the chunk loop nothing crosses devices with data
  parallelism alone (each batch shard sums its own weight gradient, added once after the
  loop), and with the vocabulary split over devices only per-token values and the states'
  gradient of a chunk do ([b, chunk] and [b * chunk, d], never the [v, d] weight)."""
  env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8",
             PYTHONPATH=str(REPO))
  out = subprocess.run([sys.executable, "-c", CHUNKED_SHARDED], capture_output=True, text=True, timeout=300, cwd=REPO,
                       env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  b, d, chunk = 8, 16, 5
  for name, result in json.loads(out.stdout.strip().splitlines()[-1]).items():
    assert max(result["grad"]) < 1e-5, name  # f32, sums split over devices in another order
    for k, (got, want) in result["sums"].items():
      assert got == pytest.approx(want, rel=1e-6), (name, k)
    assert result["loops"] == 1, name
    if name.endswith("(8, 1, 1)"):
      assert result["in_loop"] == [], name
    else:
      assert result["in_loop"] and all(op == "all-reduce" and size <= b * chunk * d for op, size in result["in_loop"]), name
