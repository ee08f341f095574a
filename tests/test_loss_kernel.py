"""The loss kernel (seq2seq/training/loss_kernel.py), run in Pallas' interpreter on the CPU: its
statistics and gradient against the formula in float64, the chunked loss with it against the
loss without it (sums, every gradient), the train step's gradient with it, on a mesh, and when
`train.loss_impl` picks it."""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO

from seq2seq.errors import ConfigError
from seq2seq.training import loss_kernel
from seq2seq.training.loss import chunked_cross_entropy_sums

EPS = 0.1
F32, BF16 = 2.0**-23, 2.0**-8  # a unit in the last place, relative


@pytest.fixture
def interpreted(monkeypatch):
  """The kernel in Pallas' interpreter, in blocks of 128 entries: several a row, the last ragged."""
  monkeypatch.setattr(loss_kernel, "BLOCK", 128)
  monkeypatch.setattr(loss_kernel, "stats_and_grad", functools.partial(loss_kernel.stats_and_grad, interpret=True))


def _formula(z, labels, weights, eps):
  """(max, log-sum-exp, label logit, sum) and weight * (p - (1 - eps) onehot - eps / V), in float64."""
  z = np.asarray(z, np.float64)
  high = z.max(-1)
  lse = high + np.log(np.exp(z - high[..., None]).sum(-1))
  label = np.take_along_axis(z, np.asarray(labels)[..., None], -1)[..., 0]
  onehot = np.arange(z.shape[-1]) == np.asarray(labels)[..., None]
  w = np.asarray(weights, np.float64)[..., None]
  return (high, lse, label, z.sum(-1)), w * (np.exp(z - lse[..., None]) - (1 - eps) * onehot - eps / z.shape[-1])


@pytest.mark.parametrize("vocab", [7, 128, 300])  # one block (shorter than it), one whole, three with a ragged end
@pytest.mark.parametrize("dtypes", [("float32", "float32"), ("float32", "bfloat16"), ("bfloat16", "bfloat16")])
@pytest.mark.parametrize("eps", [0.0, EPS])
def test_the_kernel_equals_the_formula_in_float64(interpreted, vocab, dtypes, eps):
  """Max and label logit exactly (they are entries of z); log-sum-exp, sum and the gradient
  within f32 rounding; a gradient written in bf16 within one bf16 rounding of the formula's;
  weights 0 (padding) give a gradient of zeros."""
  z_dtype, out_dtype = (jnp.dtype(d) for d in dtypes)
  rng = np.random.default_rng(vocab)
  z = jnp.asarray(rng.standard_normal((3, 5, vocab)) * 4, z_dtype)
  labels = jnp.asarray(rng.integers(0, vocab, (3, 5)), jnp.int32)
  weights = jnp.asarray(rng.random((3, 5)) * (rng.random((3, 5)) < 0.8), jnp.float32)
  (high, lse, label, total), d = loss_kernel.stats_and_grad(z, labels, weights, eps=eps, out_dtype=out_dtype)
  (want_high, want_lse, want_label, want_total), want_d = _formula(z.astype(jnp.float32), labels, weights, eps)
  assert d.dtype == out_dtype and d.shape == z.shape and high.dtype == jnp.float32
  np.testing.assert_array_equal(high, want_high)
  np.testing.assert_array_equal(label, want_label)
  # a sum of V f32 terms: within V units of its largest magnitude's last place (ordered as it is)
  np.testing.assert_allclose(lse, want_lse, rtol=0, atol=vocab * F32 * np.abs(want_lse).max())
  assert np.all(np.abs(np.asarray(total, np.float64) - want_total) <= vocab * F32 * np.abs(np.asarray(z, np.float64)).sum(-1))
  # p = exp(z - lse) with lse as above: a relative error of |z - lse| times lse's, and the f32 operations
  spread = np.abs(np.asarray(z, np.float64) - want_lse[..., None]).max()
  rounding = (BF16 if out_dtype == jnp.bfloat16 else 0.0) + (vocab + spread + 4) * F32
  np.testing.assert_allclose(np.asarray(d, np.float64), want_d, rtol=0,
                             atol=rounding * max(np.abs(want_d).max(), 1e-30))
  assert not np.any(np.asarray(d)[np.asarray(weights) == 0])


@pytest.mark.parametrize("tied", [True, False])
def test_the_chunked_loss_with_the_kernel_equals_it_without(interpreted, tied):
  """`chunked_cross_entropy_sums(kernel=True)`: under `jax.grad` its sums equal those without the
  kernel within f32 rounding and its gradients (states, weight) within f32 rounding of the
  largest; without `jax.grad` it does not run the kernel (the same values to the bit); a NaN
  cotangent (the divergence guard's poison) reaches every entry; for one chunk of all positions
  (the train step's) and for chunks of 4 positions, the last padded."""
  rng = np.random.default_rng(5)
  b, t, d, v = 3, 11, 16, 300
  h = jnp.asarray(rng.standard_normal((b, t, d)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((v, d) if tied else (d, v)) * d**-0.5 * 4, jnp.float32)
  labels, weights = jnp.asarray(rng.integers(0, v, (b, t)).astype(np.int32)), jnp.asarray(rng.random((b, t)) < 0.8)

  def grads(kernel, chunk):
    def loss(h, w):
      sums = chunked_cross_entropy_sums(h, w, labels, weights, tied=tied, chunk=chunk, label_smoothing=EPS,
                                        kernel=kernel)
      return sums["loss_sum"], sums
    return jax.jit(jax.grad(loss, (0, 1), has_aux=True))(h, w)

  for chunk in (t, 4):
    (gh, gw), sums = grads(True, chunk)
    (want_gh, want_gw), want = grads(False, chunk)
    for k in want:
      assert float(sums[k]) == pytest.approx(float(want[k]), rel=v * F32), (chunk, k)
    for got, ref in ((gh, want_gh), (gw, want_gw)):
      np.testing.assert_allclose(got, ref, rtol=0, atol=(v + d) * F32 * float(jnp.abs(ref).max()))
    primal = [jax.jit(functools.partial(chunked_cross_entropy_sums, tied=tied, chunk=chunk, label_smoothing=EPS,
                                        kernel=kernel))(h, w, labels, weights) for kernel in (True, False)]
    assert all(float(primal[0][k]) == float(primal[1][k]) for k in want)
  primal_jaxpr = str(jax.make_jaxpr(lambda h, w: chunked_cross_entropy_sums(h, w, labels, weights, tied=tied, chunk=t,
                                                                            kernel=True))(h, w))
  grad_jaxpr = str(jax.make_jaxpr(lambda h, w: grads(True, t))(h, w))
  assert "seq2seq_loss_fwd_bwd" not in primal_jaxpr and "seq2seq_loss_fwd_bwd" in grad_jaxpr
  poisoned = jax.grad(lambda h, w: chunked_cross_entropy_sums(h, w, labels, weights, tied=tied, chunk=t, kernel=True)
                      ["loss_sum"] * jnp.nan, (0, 1))(h, w)
  assert all(np.isnan(np.asarray(g)).all() for g in poisoned)


def test_loss_impl_picks_the_kernel_on_gpus_only(monkeypatch):
  """"auto": the kernel where it runs (not on this CPU, not with the vocabulary split over
  devices, not with `loss_kernel.AUTO` off: the device check's `loss_in_xla`); "pallas" where it
  cannot run is a ConfigError naming the key and why; "xla" never; another value is an error
  in TrainConfig too."""
  from seq2seq.configs import default
  from seq2seq.training.config import TrainConfig

  assert not loss_kernel.chosen("auto", 1, "float32") and not loss_kernel.chosen("xla", 1, "float32")
  with pytest.raises(ConfigError, match=r"config.train.loss_impl='pallas' cannot run here: .*GPU only"):
    loss_kernel.chosen("pallas", 1, "float32")
  assert loss_kernel.blockers(platform="gpu", vocab_shards=1) == ([] if loss_kernel.plgpu is not None else
                                                                  loss_kernel.blockers(platform="gpu", vocab_shards=1))
  assert any("split over 2 devices" in why for why in loss_kernel.blockers(platform="gpu", vocab_shards=2))
  monkeypatch.setattr(loss_kernel, "blockers", lambda **_: [])
  monkeypatch.setattr(loss_kernel, "_compiles", lambda *_: None)
  assert loss_kernel.chosen("auto", 1, "float32") and loss_kernel.chosen("pallas", 1, "float32")
  monkeypatch.setattr(loss_kernel, "AUTO", False)
  assert not loss_kernel.chosen("auto", 1, "float32") and loss_kernel.chosen("pallas", 1, "float32")
  with pytest.raises(ConfigError, match="config.train.loss_impl must be one of"):
    loss_kernel.chosen("triton", 1, "float32")
  config = default.get_config()
  assert config.train.loss_impl == "auto"
  config.train.loss_impl = "fused"
  with pytest.raises(ConfigError, match=r"config.train.loss_impl must be one of \('auto', 'xla', 'pallas'\)"):
    TrainConfig.from_config(config.train)


def test_the_train_steps_gradient_with_the_kernel_equals_xlas(interpreted, monkeypatch):
  """A tiny model's train-step gradient (`train.grad_sums`, dropout on, label smoothing) with
  `loss_impl` picking the kernel equals XLA's loss within f32 rounding of each parameter's
  largest entry; its sums likewise; the program runs the kernel once (forward and backward)."""
  from flax import nnx

  from seq2seq.model.config import ModelConfig
  from seq2seq.model.transformer import Transformer
  from seq2seq.training import train

  monkeypatch.setattr(loss_kernel, "chosen", lambda impl, *_: impl == "pallas")
  cfg = ModelConfig(vocab_size=300, d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  rng = np.random.default_rng(0)
  src, tgt = rng.integers(3, 300, (4, 9)).astype(np.int32), rng.integers(3, 300, (4, 7)).astype(np.int32)
  tgt[1, 4:] = 0
  pos = lambda x: np.broadcast_to(np.arange(x.shape[1], dtype=np.int32), x.shape)
  batch = {"src_bs": src, "src_segments_bs": np.ones_like(src), "src_positions_bs": pos(src),
           "tgt_in_bt": np.concatenate([np.ones((4, 1), np.int32), tgt[:, :-1]], 1), "tgt_out_bt": tgt,
           "tgt_segments_bt": (tgt > 0).astype(np.int32), "tgt_positions_bt": pos(tgt)}
  step = lambda impl: functools.partial(train.grad_sums, graphdef=graphdef, label_smoothing=EPS, loss_impl=impl)
  key = jax.random.key(3)
  (grads, sums), (want_grads, want_sums) = (jax.jit(step(impl))(params, batch, key) for impl in ("pallas", "xla"))
  for k in want_sums:
    assert float(sums[k]) == pytest.approx(float(want_sums[k]), rel=300 * F32), k
  for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * float(jnp.abs(ref).max()))
  assert str(jax.make_jaxpr(step("pallas"))(params, batch, key)).count("name=seq2seq_loss_fwd_bwd") == 1
  assert "seq2seq_loss_fwd_bwd" not in str(jax.make_jaxpr(step("xla"))(params, batch, key))


ON_A_MESH = """
import functools, json
import jax, jax.numpy as jnp, numpy as np
from seq2seq import sharding
from seq2seq.training import loss_kernel
from seq2seq.training.loss import chunked_cross_entropy_sums, loss_plan
loss_kernel.BLOCK = 128
loss_kernel.stats_and_grad = functools.partial(loss_kernel.stats_and_grad, interpret=True)
rng = np.random.default_rng(0)
b, t, d, v = 8, 6, 16, 300
y = jnp.asarray(rng.standard_normal((b, t, d)), jnp.float32)
w = jnp.asarray(rng.standard_normal((d, v)) * 0.5, jnp.float32)
labels, weights = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32), jnp.asarray(rng.random((b, t)) < 0.8)

def f(y, w):
  loss = lambda y, w: (lambda s: (s["loss_sum"], s))(chunked_cross_entropy_sums(
      y, w, labels, weights, tied=False, chunk=t, label_smoothing=0.1, kernel=True))
  return jax.grad(loss, (0, 1), has_aux=True)(y, w)

one = jax.jit(f)(y, w)
out = {}
for axes in ((8, 1, 1), (2, 4, 1)):
  mesh = sharding.make_mesh(dict(zip(("data", "fsdp", "tensor"), axes)))
  split = jax.jit(sharding.with_activation_mesh(f, mesh))
  got = split(y, w)
  out[str(axes)] = {"grad": [float(jnp.max(jnp.abs(a - c)) / jnp.max(jnp.abs(c))) for a, c in zip(got[0], one[0])],
                    "sums": {k: [float(got[1][k]), float(one[1][k])] for k in one[1]},
                    "shard_map": "shard_map" in str(jax.make_jaxpr(split)(y, w))}
with sharding.activation_mesh(sharding.make_mesh({"data": 2, "fsdp": 1, "tensor": 4})):
  out["vocab split"] = loss_plan(0, "auto", (b, t), w, False, "float32")
  try:
    loss_kernel.stats_and_grad(jnp.zeros((b, t, v)), labels, weights, eps=0.1, out_dtype=jnp.float32)
    out["split rows"] = "ran"
  except ValueError as err:
    out["split rows"] = str(err)
print(json.dumps(out))
"""


def test_the_kernel_runs_per_device_on_a_mesh():
  """On 8 CPU devices (data; data x fsdp) the kernel runs in shard_map on each device's rows and
  the chunked loss with it equals one device's, sums and gradients within f32 rounding; with the
  vocabulary split over devices (tensor) the kernel is not picked, and called anyway it refuses
  (each device would hold part of every row)."""
  env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8",
             PYTHONPATH=str(REPO))
  out = subprocess.run([sys.executable, "-c", ON_A_MESH], capture_output=True, text=True, timeout=300, cwd=REPO,
                       env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  for axes in ("(8, 1, 1)", "(2, 4, 1)"):
    assert result[axes]["shard_map"] and max(result[axes]["grad"]) < 300 * F32, axes
    for k, (got, want) in result[axes]["sums"].items():
      assert got == pytest.approx(want, rel=300 * F32), (axes, k)
  assert result["vocab split"] == [0, False]
  assert "vocabulary" in result["split rows"] and "split over" in result["split rows"]


def test_the_device_checks_loss_rows_compare_the_kernel_with_xla(interpreted, capsys):
  """benchmarks/device_check.py's GPU check of the kernel, with it interpreted here: the loss's
  sums within f32 rounding of XLA's, the gradients of the states and the weight within bf16's
  (the states are bf16), and a forward+backward time of each."""
  from conftest import benchmark

  benchmark("device_check").loss_rows(2, 8, 1, vocab=300, d=16)
  rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  check, timings = rows[0], {r["timing"]: r for r in rows[1:]}
  assert check["case"] == "loss_kernel" and "error" not in check, check
  assert {k for k in check if k.endswith("_rel_err")} == {f"{k}_rel_err" for k in ("loss_sum", "nll_sum", "tokens",
                                                                                   "correct")}
  assert all(check[k] <= 300 * F32 for k in check if k.endswith("_rel_err")), check
  for name in ("dy", "dw"):
    assert 0 < check[f"{name}_max_abs"] and check[f"{name}_max_abs_err"] <= BF16 * check[f"{name}_max_abs"], check
  assert set(timings) == {"loss_pallas", "loss_xla"} and all(r["loss_fwd_bwd_ms"] > 0 for r in timings.values())
