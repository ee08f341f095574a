"""Training: schedules and loss against formulas, weight-decay mask, gradient accumulation,
sharded meshes equal to one device, end-to-end runs (the synthetic corpus; bf16 against f32 on
the real Multi30k)."""

import hashlib
import json
import math
import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO, communicate_all, free_port, make_config, optimized_env
from sharded_run import batches

from seq2seq import metrics, sharding
from seq2seq.model.config import ModelConfig
from seq2seq.training import optimizer, report
from seq2seq.training.config import TrainConfig
from seq2seq.training.loss import cross_entropy_sums
from seq2seq.training.train import STEPS_IN_FLIGHT, Steps, init_state, train_and_evaluate


@pytest.mark.parametrize("count", [0, 9, 3999, 4000, 20000])
def test_rsqrt_schedule_is_vaswani(count):
  lr = optimizer.schedule("rsqrt", learning_rate=2.0, warmup_steps=4000, total_steps=10**5, d_model=512)
  n = count + 1
  assert float(lr(count)) == pytest.approx(2.0 * 512**-0.5 * min(n**-0.5, n * 4000**-1.5), rel=1e-6)


def test_warmup_then_decay_schedules():
  kw = dict(learning_rate=1e-3, warmup_steps=100, total_steps=1100, d_model=512)
  for name in ("warmup_cosine", "warmup_linear", "warmup_rsqrt"):
    lr = optimizer.schedule(name, **kw)
    assert float(lr(0)) == 0.0 and float(lr(50)) == pytest.approx(5e-4) and float(lr(100)) == pytest.approx(1e-3)
  cosine, linear, rsqrt = (optimizer.schedule(n, **kw) for n in ("warmup_cosine", "warmup_linear", "warmup_rsqrt"))
  assert float(cosine(600)) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)), rel=1e-5)
  assert float(linear(600)) == pytest.approx(0.5e-3, rel=1e-5) and float(linear(1100)) == pytest.approx(0.0)
  assert float(rsqrt(400)) == pytest.approx(1e-3 * math.sqrt(100 / 400), rel=1e-6)
  with pytest.raises(ValueError, match="config.train.schedule"):
    optimizer.schedule("step", **kw)


def test_label_smoothed_loss_by_hand():
  logits = np.array([[[2.0, 0.5, -1.0], [0.0, 1.0, 3.0]]], np.float32)
  labels, weights, eps = np.array([[0, 1]]), np.array([[1, 0]]), 0.1  # second token is padding
  logp = logits[0, 0] - np.log(np.exp(logits[0, 0]).sum())
  want = (1 - eps) * -logp[0] + eps * -logp.mean()  # target (1-eps) one-hot + eps/V
  sums = cross_entropy_sums(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(weights), eps)
  assert float(sums["loss_sum"]) == pytest.approx(want, rel=1e-6)
  assert float(sums["nll_sum"]) == pytest.approx(-logp[0], rel=1e-6)
  assert float(sums["tokens"]) == 1.0 and float(sums["correct"]) == 1.0


def test_weight_decay_skips_norms_and_biases():
  from flax import nnx

  from seq2seq.model.transformer import Transformer

  params = nnx.state(Transformer(ModelConfig(vocab_size=20, d_model=8, num_heads=2, num_encoder_layers=1,
                                             num_decoder_layers=1, d_ff=16), rngs=nnx.Rngs(0)), nnx.Param)
  flat = {jax.tree_util.keystr(p): m for p, m in jax.tree_util.tree_leaves_with_path(optimizer.decay_mask(params))}
  decayed = {k for k, v in flat.items() if v}
  assert all(any(w in k for k in decayed) for w in ("wqkv_dn3h", "wq_dnh", "wkv_dn2h", "embedding_vd"))
  assert not any(s in k for k in decayed for s in ("bias_d", "scale_d", "bqv_n2h", "bq_nh", "bv_nh", "bo_d", "bi_f"))


def _small_params():
  from flax import nnx

  from seq2seq.model.transformer import Transformer

  return nnx.state(Transformer(ModelConfig(vocab_size=20, d_model=8, num_heads=2, num_encoder_layers=1,
                                           num_decoder_layers=2, d_ff=8), rngs=nnx.Rngs(0)), nnx.Param)


def _integer_tree(params, offset=0):
  """Integers -3..3 in every leaf: their squares sum exactly in float32, in any order."""
  leaves, treedef = jax.tree.flatten(params)
  return treedef.unflatten([(jnp.arange(x.size, dtype=jnp.float32).reshape(x.shape) * (i + 1) + offset) % 7 - 3
                            for i, x in enumerate(leaves)])


@pytest.mark.parametrize("grouped", [True, False])
def test_the_global_norm_is_optaxs_summed_by_groups_of_one_shape_and_axes(monkeypatch, grouped):
  """`optimizer.global_norm` equals optax's: exactly where the sum is exact, to float32 rounding
  otherwise. Grouped, it takes one reduction per (shape, dtype, logical axes), not per leaf."""
  import optax
  from flax import nnx

  monkeypatch.setattr(optimizer, "GROUPED_NORM", grouped)
  params = _small_params()
  ints = _integer_tree(params)
  assert float(optimizer.global_norm(ints)) == float(optax.tree.norm(ints)) > 0
  rng = np.random.default_rng(0)
  noise = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32), params)
  np.testing.assert_allclose(optimizer.global_norm(noise), optax.tree.norm(noise), rtol=2e-7)
  leaves = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
  groups = {(x.shape, x.get_metadata()["axes"]) for x in leaves}
  assert len({x.shape for x in leaves}) < len(groups) < len(leaves)  # d_ff = d_model: [8, 8] is (embed, mlp) or (mlp, embed)
  jaxpr = str(jax.make_jaxpr(lambda tree: optimizer.global_norm(tree))(params))  # a new function: traced anew
  assert jaxpr.count("reduce_sum") == (len(groups) if grouped else len(leaves))


def test_clipping_by_the_global_norm_is_optaxs_with_its_state():
  """`optimizer.clip_by_global_norm` gives optax's updates, to the bit on integer gradients,
  below and above the threshold, and the same (empty) state: checkpoints of either restore."""
  import optax

  params = _small_params()
  grads = _integer_tree(params, offset=1)
  norm = float(optax.tree.norm(grads))
  for max_norm in (norm / 3, 2 * norm):
    ours, theirs = optimizer.clip_by_global_norm(max_norm), optax.clip_by_global_norm(max_norm)
    state = ours.init(params)
    assert jax.tree.structure(state) == jax.tree.structure(theirs.init(params))
    for a, b in zip(jax.tree.leaves(ours.update(grads, state)[0]), jax.tree.leaves(theirs.update(grads, state)[0])):
      np.testing.assert_array_equal(a, b)
  clipped = optimizer.clip_by_global_norm(norm / 3).update(grads, None)[0]
  assert float(optax.tree.norm(clipped)) == pytest.approx(norm / 3, rel=1e-6)


def test_mesh_sizes_from_config():
  assert sharding.mesh_shape({"data": -1, "fsdp": 2, "tensor": 1}, 8) == (4, 2, 1)
  with pytest.raises(ValueError, match="needs 4 devices, but 8"):
    sharding.mesh_shape({"data": 2, "fsdp": 2, "tensor": 1}, 8)
  with pytest.raises(ValueError, match="at most one"):
    sharding.mesh_shape({"data": -1, "fsdp": -1, "tensor": 1}, 8)


def _steps(accum_steps, loss_chunk=0, grad_norm=True, **model):
  from seq2seq.configs import default

  config = default.get_config()
  config.train.update(label_smoothing=0.1, schedule="constant", learning_rate=1e-2, warmup_steps=0, steps=5,
                      adam_b1=0.9, adam_b2=0.98, adam_eps=1e-9, weight_decay=0.0, grad_clip_norm=0.0,
                      accum_steps=accum_steps, loss_chunk=loss_chunk, grad_norm=grad_norm)
  model_cfg = ModelConfig(**dict(vocab_size=64, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                                 d_ff=32, dropout_rate=0.0) | model)
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
  tx, lr = optimizer.make(config.train, d_model=16)
  graphdef, state, shardings = init_state(model_cfg, tx, mesh, 0)
  return Steps(config, graphdef, shardings, mesh, tx, lr), state, mesh


@pytest.mark.long  # 12 s; the fast suite keeps its 4-minute budget
def test_accumulating_k_micro_batches_equals_one_k_times_batch():
  big = batches(1, rows=16)[0]
  halves = [{k: v[:8] for k, v in big.items()}, {k: v[8:] for k, v in big.items()}]
  steps, state, mesh = _steps(1)
  step0 = state.step
  big_grads, big_sums = steps.accumulate(None, state.params, sharding.put_batch(big, mesh), step0, 0)
  acc = None
  for micro, half in enumerate(halves):
    acc = steps.accumulate(acc, state.params, sharding.put_batch(half, mesh), step0, micro)
  assert float(acc[1]["tokens"]) == float(big_sums["tokens"])
  assert float(acc[1]["loss_sum"]) == pytest.approx(float(big_sums["loss_sum"]), rel=1e-6)
  # Equal up to float32 summation order, whose noise scales with the largest gradient (key
  # biases have a gradient that is zero in exact arithmetic: only that noise is left).
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(big_grads))
  for a, b in zip(jax.tree.leaves(acc[0]), jax.tree.leaves(big_grads)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * scale)
  # The update path: two micro-batches through Steps.update give one optimizer step.
  steps2, state2, _ = _steps(2)
  new_state, m = steps2.update(state2, [sharding.put_batch(h, mesh) for h in halves])
  assert int(new_state.step) == 1
  assert float(m["grad_norm"]) == pytest.approx(float(optax_global_norm(big_grads) / big_sums["tokens"]), rel=1e-5)


@pytest.mark.parametrize("tie_output", [True, False])
def test_a_step_with_the_loss_in_chunks_equals_the_step_without(tie_output):
  """`train.loss_chunk`: the train step's gradients, metric sums and evaluation sums equal the
  unchunked step's up to float32 summation order (chunks of 3 positions: 10 do not divide)."""
  batch = batches(1, rows=8)[0]
  runs = {}
  for chunk in (0, 3):
    steps, state, mesh = _steps(1, loss_chunk=chunk, tie_output=tie_output, share_embeddings=tie_output)
    on_mesh = sharding.put_batch(batch, mesh)
    runs[chunk] = (*steps.accumulate(None, state.params, on_mesh, state.step, 0), steps.eval(state.params, on_mesh))
  (grads, sums, evals), (grads_0, sums_0, evals_0) = runs[3], runs[0]
  for new, old in ((sums, sums_0), (evals, evals_0)):
    assert float(new["tokens"]) == float(old["tokens"]) and float(new["correct"]) == float(old["correct"])
    for k in ("loss_sum", "nll_sum"):
      assert float(new[k]) == pytest.approx(float(old[k]), rel=1e-6), k
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads_0))
  assert len(jax.tree.leaves(grads)) == len(jax.tree.leaves(grads_0))
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_0)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * scale)


@pytest.mark.parametrize("accum_steps", [1, 2])
def test_without_the_gradient_norm_a_step_updates_the_same_and_the_guard_checks_the_loss(accum_steps, capsys):
  """`train.grad_norm=False`: the state after a step (one batch, or two micro-batches) equals the
  default's to the bit, and its metrics hold no grad_norm, nor does the logged record or line;
  the guard still finds a step whose gradients (and so loss) are NaN. Applying accumulated
  gradients compiles without XLA's warning of donated buffers it cannot use."""
  from seq2seq.training import report
  from seq2seq.training.guard import DivergenceGuard
  from seq2seq.training.train import _check
  from seq2seq.training.window import Window

  batch = batches(1, rows=8)[0]
  split = [{k: v[:4] for k, v in batch.items()}, {k: v[4:] for k, v in batch.items()}][:accum_steps]
  after = {}
  for grad_norm in (True, False):
    steps, state, mesh = _steps(accum_steps, grad_norm=grad_norm)
    with warnings.catch_warnings():
      warnings.filterwarnings("error", message="Some donated buffers were not usable")  # apply donates the state only
      after[grad_norm] = steps.update(state, [sharding.put_batch(b, mesh)
                                              for b in (split if accum_steps > 1 else [batch])])
  (with_norm, m_with), (without, m_without) = after[True], after[False]
  for a, b in zip(jax.tree.leaves((with_norm.params, with_norm.opt_state)),
                  jax.tree.leaves((without.params, without.opt_state)), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert set(m_with) - set(m_without) == {"grad_norm"} and float(m_with["grad_norm"]) > 0
  window = Window.after(0)
  window.add(m_without, [{"tokens": 1, "real": 1, "slots": 1, "flops": 1.0}], 0.0)
  record = window.summary([jax.device_get(m_without)], (1.0, "config"), 1.0)
  assert "grad_norm" not in record and record["learning_rate"] > 0
  bar = type("Bar", (), {"disable": True, "set_postfix": lambda self, **kw: None})()
  report.log_line(bar, 1, dict(record, loss=1.0, accuracy=0.5, perplexity=2.7))
  line = capsys.readouterr().out
  assert line.startswith("step 1: loss 1.0000") and " lr " in line and "gnorm" not in line, line
  steps, state, mesh = _steps(1, grad_norm=False)
  _, poisoned = steps.update(state, [sharding.put_batch(batch, mesh)], True)
  window = Window.after(0)
  window.add(poisoned, [], 0.0)
  reason, step = _check(DivergenceGuard(), window)
  assert step == 1 and reason.startswith("non-finite loss nan"), reason


def test_the_loss_in_chunks_holds_no_logits():
  """The compiled train step's temporary memory (XLA's own figure) falls by more than the
  f32 logits [rows, T, vocab] take, with chunks of 4 of 32 positions (the unchunked step holds
  them for the backward pass, and their gradient after it); a negative chunk is a config error."""
  from jax.sharding import NamedSharding, PartitionSpec

  rows, length, vocab = 8, 32, 4000
  temp = {}
  for chunk in (0, 4):
    steps, state, mesh = _steps(1, loss_chunk=chunk, vocab_size=vocab, d_model=32)
    batch = {k: jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=NamedSharding(mesh, PartitionSpec()))
             for k in batches(1)[0]}
    temp[chunk] = steps.train.lower(state, batch, False).compile().memory_analysis().temp_size_in_bytes
  assert temp[0] - temp[4] > rows * length * vocab * 4
  with pytest.raises(ValueError, match=r"config.train.loss_chunk must be 0 \(all positions at once\) or positive"):
    TrainConfig.from_config(dict(_train_defaults(), loss_chunk=-1))


def _train_defaults() -> dict:
  from seq2seq.configs import default

  return dict(default.get_config().train.items())


def optax_global_norm(tree):
  import optax

  return optax.global_norm(tree)


@pytest.mark.longest
@pytest.mark.slow
def test_sharded_meshes_train_like_one_device():
  # Data parallelism alone (8,1,1) is left to test_sharding's collectives and to two processes
  # training as one (test_two_processes_train_like_one): CI's time.
  out = subprocess.run([sys.executable, str(REPO / "tests" / "sharded_run.py"), "1,1,1", "2,2,2", "1,8,1"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  runs = json.loads(out.stdout.strip().splitlines()[-1])
  reference = runs["1,1,1"]["losses"]
  assert reference[-1] < reference[0]
  for mesh, run in runs.items():
    np.testing.assert_allclose(run["losses"], reference, atol=1e-5, err_msg=mesh)
    assert run["specs"] == run["expected_specs"], mesh
  specs = runs["2,2,2"]["specs"]
  assert specs["['src_embed']['embedding_vd']"] == "('tensor', 'fsdp')"
  assert specs["['encoder_layers'][0]['self_attn']['wqkv_dn3h']"] == "('fsdp', 'tensor', None, None)"
  assert specs["['decoder_layers'][0]['cross_attn']['wkv_dn2h']"] == "('fsdp', 'tensor', None, None)"
  assert specs["['encoder_layers'][0]['ffn']['wo_fd']"] == "('tensor', 'fsdp')"
  # Each device really holds its part: wi_df is [32, 64] = [embed, mlp].
  assert runs["2,2,2"]["wi_df_shard_shape"] == [16, 32]
  assert runs["1,8,1"]["wi_df_shard_shape"] == [4, 64]


def test_mfu_peak_is_the_nominal_peak_of_the_compute_dtype_on_accelerators(monkeypatch):
  from seq2seq.model import flops

  monkeypatch.setattr(flops, "measure_matmul_peak", lambda repeats=10: 1e11)  # this "device" measured
  h100, h200, v5e = "NVIDIA H100 80GB HBM3", "NVIDIA H200", "TPU v5 lite"
  assert flops.peak_flops(h100, "gpu", "bfloat16", 8) == (8 * 989.4e12, f"table:{h100} bfloat16")
  assert flops.peak_flops(h100, "gpu", "float32", 1) == (494.7e12, f"table:{h100} float32")  # TF32
  assert flops.peak_flops(h200, "gpu", "bfloat16", 1) == (989.4e12, f"table:{h200} bfloat16")
  assert flops.peak_flops(h200, "gpu", "float32", 2) == (2 * 494.7e12, f"table:{h200} float32")
  assert flops.peak_flops(v5e, "tpu", "bfloat16", 4) == (4 * 197e12, f"table:{v5e} bfloat16")
  assert flops.peak_flops(v5e, "tpu", "float32", 1) == (197e12, f"table:{v5e} float32")  # one bf16 pass
  assert flops.peak_flops("TPU v5", "tpu", "bfloat16", 1)[0] == 459e12  # v5p's device kind
  for dtype in ("bfloat16", "float32"):
    assert flops.peak_flops("cpu", "cpu", dtype, 2) == (2e11, "measured f32 matmul")
    assert flops.peak_flops(h200, "gpu", dtype, 8, configured=3e15) == (3e15, "config")
  assert flops.peak_flops("NVIDIA Quantum X9", "gpu", "bfloat16", 1) == (1e11, "measured f32 matmul")
  assert flops.peak_flops("Tesla V100-SXM2-16GB", "gpu", "bfloat16", 1) == (1e11, "measured f32 matmul")


def test_tiny_config_learns_and_reports(data_dir, session_cache, tmp_path, monkeypatch):
  from seq2seq.model import flops

  measured, calls = iter([1e11, 3e11, 2e11]), []  # the matmul peak at start and at the two evaluations
  monkeypatch.setattr(flops, "measure_matmul_peak", lambda repeats=10: calls.append(repeats) or next(measured))
  # The loop waits (without reading back) for each step's metrics once STEPS_IN_FLIGHT newer steps are queued.
  dispatched, waited, behind = [], [], []
  update, block = Steps.update, jax.block_until_ready

  def counted_update(self, *args, **kwargs):
    behind.append(len(dispatched) - sum(1 for w in waited if w in map(id, dispatched)))  # unwaited steps queued
    result = update(self, *args, **kwargs)
    dispatched.append(result[1])
    return result

  monkeypatch.setattr(Steps, "update", counted_update)
  monkeypatch.setattr(jax, "block_until_ready", lambda x: waited.append(id(x)) or block(x))
  config = make_config("tiny", data_dir, session_cache)
  config.train.update(steps=40, log_every=10, eval_every=20)
  last = train_and_evaluate(config, str(tmp_path))
  assert [i for i in waited if i in set(map(id, dispatched))] == list(map(id, dispatched[:-STEPS_IN_FLIGHT]))
  assert max(behind) == STEPS_IN_FLIGHT  # before each step, at most that many earlier ones not yet waited for
  records = metrics.read(tmp_path)
  train_records = [r for r in records if "loss" in r]
  assert [r["step"] for r in train_records] == [10, 20, 30, 40]
  assert train_records[-1]["loss"] < train_records[0]["loss"] - 1.0
  for key in ("accuracy", "learning_rate", "grad_norm", "target_tokens_per_s", "padding_fraction", "mfu",
              "wall_time_s", "perplexity"):
    assert key in train_records[-1], key
  assert all(0 <= r["data_wait_fraction"] < 1 for r in train_records)
  # MFU's denominator on every row: the fastest peak measured before it (a slower one later is ignored).
  assert calls == [10, 3, 3]
  assert [r["peak_flops"] for r in train_records] == [1e11, 1e11, 3e11, 3e11]
  assert {r["peak_source"] for r in train_records} == {"measured f32 matmul"}  # a CPU: no nominal peak
  val = [r for r in records if "val_loss" in r]
  assert [r["step"] for r in val] == [20, 40] and val[1]["val_loss"] < val[0]["val_loss"]
  assert last["val_loss"] == val[1]["val_loss"]
  assert list(tmp_path.glob("events.out.tfevents.*"))
  assert json.loads((tmp_path / "config.json").read_text())["model"]["d_model"] == 64


@pytest.mark.long
def test_an_epoch_compiles_the_train_step_once_per_batch_shape(data_dir, session_cache, tmp_path):
  import logging

  from seq2seq import data

  # 1024 tokens a batch: several shapes, some seen more than once (4 shapes in 7 batches with
  # sentencepiece 0.2.2's pieces; 4096 gave 0.2.2 only 2 shapes).
  config = make_config("tiny", data_dir, session_cache, train_split="val", packing=False, fill_rows=False,
                       max_tokens=1024, vocab_size=500)
  stats = data.statistics(config, data.load_tokenizer(config))
  assert stats["batches"] > len(stats["batch_shapes"]) >= 3
  config.train.update(steps=stats["batches"], eval_every=0, checkpoint_every=10**6, log_every=10)

  compiles = []
  handler = logging.Handler()
  handler.emit = lambda record: compiles.append(record.getMessage().startswith("Compiling jit(train_step)"))
  logging.getLogger("jax").addHandler(handler)
  try:
    with jax.log_compiles():
      train_and_evaluate(config, str(tmp_path))
  finally:
    logging.getLogger("jax").removeHandler(handler)
  assert len(stats["batch_shapes"]) >= 3 and sum(compiles) == len(stats["batch_shapes"])


def test_hand_written_gradients_equal_autodiff():
  from seq2seq.model.layers import tied_logits
  from seq2seq.training.loss import smoothed_xent

  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.standard_normal((2, 3, 7)))
  labels = jnp.asarray(rng.integers(0, 7, (2, 3)))
  g_loss, g_nll = (jnp.asarray(rng.standard_normal((2, 3))) for _ in range(2))

  def reference(logits):
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, labels[..., None], -1)[..., 0]
    return (0.9 * nll - 0.1 * jnp.mean(logp, -1)), nll

  with jax.enable_x64(True):
    logits, g_loss, g_nll = logits.astype(jnp.float64), g_loss.astype(jnp.float64), g_nll.astype(jnp.float64)
    custom = jax.vjp(lambda l: smoothed_xent(l, labels, 0.1), logits)
    ref = jax.vjp(reference, logits)
    np.testing.assert_allclose(custom[0][0], ref[0][0], rtol=1e-12)
    np.testing.assert_allclose(custom[1]((g_loss, g_nll))[0], ref[1]((g_loss, g_nll))[0], rtol=1e-10, atol=1e-12)
    x, w, g = (jnp.asarray(rng.standard_normal(s), jnp.float64) for s in [(2, 3, 4), (7, 4), (2, 3, 7)])
    got = jax.vjp(tied_logits, x, w)[1](g)
    want = jax.vjp(lambda x, w: jnp.einsum("btd,vd->btv", x, w), x, w)[1](g)
    for a, b in zip(got, want):
      np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.slow
def test_two_processes_train_like_one():
  """Multi-host on one machine: 2 processes (gloo collectives on 127.0.0.1), each feeding
  only its half of every batch, give the losses of one process that sees whole batches."""
  port = free_port()
  script = str(REPO / "tests" / "multihost_run.py")
  env = dict(os.environ, PYTHONPATH=str(REPO / "tests"))
  procs = [subprocess.Popen([sys.executable, script, str(i), "2", str(port)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
  outs = communicate_all(procs, timeout=600)
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  two = json.loads(outs[0][0].strip().splitlines()[-1])
  one = subprocess.run([sys.executable, script, "0", "1", "0"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=600)
  assert one.returncode == 0, one.stderr[-3000:]
  single = json.loads(one.stdout.strip().splitlines()[-1])
  assert (two["processes"], two["devices"], single["processes"]) == (2, 2, 1)
  np.testing.assert_allclose(two["losses"], single["losses"], atol=1e-5)


def test_processes_that_made_other_tokenizers_are_stopped(monkeypatch):
  """Each host trains its own sentencepiece model where they share no cache: the run goes on
  only if every process got the same bytes, else names the first thing that differs."""
  from jax.experimental import multihost_utils

  from seq2seq.errors import DataError
  monkeypatch.setattr(jax, "process_count", lambda: 3)
  own = {"corpora": b"c", "models": b"m"}
  others = [own, own, {"corpora": b"c", "models": b"other"}]
  monkeypatch.setattr(multihost_utils, "process_allgather", lambda words: np.stack(
      [np.stack([np.frombuffer(hashlib.sha256(v).digest(), np.int32) for v in p.values()]) for p in others]))
  with pytest.raises(DataError, match=rf"^the processes have different models: sha256 "
                     rf"{hashlib.sha256(b'm').hexdigest()[:12]}\.\.\. on process 0, "
                     rf"{hashlib.sha256(b'other').hexdigest()[:12]}\.\.\. on process 2; share them$"):
    sharding.check_same_on_every_process(own, "share them")
  others[2] = own
  sharding.check_same_on_every_process(own, "share them")


@pytest.mark.long  # two processes start JAX, join and tokenize: ~15 s
def test_two_hosts_that_trained_other_tokenizers_stop_with_one_error_line(data_dir, tmp_path):
  """seq2seq-train on 2 processes (gloo on 127.0.0.1), each with its own cache, so each trains
  its own sentencepiece model, here from samples of other seeds: both stop before training,
  exit 2."""
  port = free_port()
  procs = [subprocess.Popen([sys.executable, "train.py", "--config=tiny", f"--workdir={tmp_path / 'run'}",
                             f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}",
                             f"--config.seed={i}", f"--config.data.cache_dir={tmp_path / f'cache{i}'}",
                             "--config.data.spm_sample_size=4000", "--config.train.steps=2"],
                            cwd=REPO, env=dict(os.environ, SEQ2SEQ_DATA_DIR=str(data_dir)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(2)]
  for p, (_, err) in zip(procs, communicate_all(procs, timeout=300)):
    assert p.returncode == 2, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("error: the processes have different sentencepiece models: sha256 ")
    assert err.strip().endswith("on process 1; each host made its own: give them one config.data.cache_dir, or "
                                "config.data.spm_model, and one sentencepiece")
  assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.long  # 2 fake devices in a subprocess, 11 s per case
@pytest.mark.parametrize("read_every_step", [False, True])
def test_steps_that_do_not_log_evaluate_or_checkpoint_read_nothing_from_the_devices(
    read_every_step, data_dir, session_cache, tmp_path):
  """Log every 5, evaluate every 7, checkpoint every 10 of 14 steps, under an emulated
  `transfer_guard_device_to_host("disallow")` on the other steps (tests/transfer_run.py). A
  loop that reads the loss after every step, as the divergence guard used to, is caught."""
  args = [sys.executable, str(REPO / "tests" / "transfer_run.py"), str(data_dir), str(session_cache), str(tmp_path)]
  out = subprocess.run(args + (["read_every_step"] if read_every_step else []), capture_output=True, text=True,
                       timeout=600, cwd=REPO)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  if read_every_step:
    assert not result["ok"] and "neither logs, evaluates nor checkpoints" in result["error"]
  else:
    assert result["ok"] and result["step"] == 14 and np.isfinite(result["loss"])


@pytest.mark.long  # two real-data trainings (the fast suite checks bfloat16 compute on one model)
@pytest.mark.data
def test_bfloat16_trains_like_float32(real_data_dir, session_cache, tmp_path):
  """300 steps of the tiny config on the real Multi30k in bf16 compute (f32 parameters, softmax,
  norms and loss) follow the f32 run's loss curve within 1% at every logged step. 1% is the
  spread between two f32 runs with different seeds at step 300 (measured 1.0%); bf16 differed
  by 0.1%. bf16 first moments (train.adam_mu_dtype) join the bf16 run. Both train as a user's
  run does (train.py, XLA's usual optimization)."""
  curves = {}
  for dtype in ("float32", "bfloat16"):
    out = subprocess.run(
        [sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={tmp_path / dtype}",
         f"--config.data.dir={real_data_dir}", f"--config.data.cache_dir={session_cache}",
         f"--config.model.dtype={dtype}", "--config.train.steps=300", "--config.train.eval_every=0",
         "--config.train.checkpoint_every=1000000", "--config.train.log_every=50", "--config.train.peak_flops=1e12",
         f"--config.train.adam_mu_dtype={'bfloat16' if dtype == 'bfloat16' else ''}"],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=optimized_env())
    assert out.returncode == 0, out.stderr[-3000:]
    curves[dtype] = [r["loss"] for r in metrics.read(tmp_path / dtype) if "loss" in r]
  assert len(curves["float32"]) == len(curves["bfloat16"]) == 6
  assert curves["float32"][-1] < curves["float32"][0] - 1.0  # it learned: 5.6 to 3.9 nats
  np.testing.assert_allclose(curves["bfloat16"], curves["float32"], rtol=0.01)


def test_the_train_section_is_read_once_into_a_checked_train_config():
  from seq2seq.configs import default
  from seq2seq.errors import ConfigError
  from seq2seq.training.config import TrainConfig

  section = default.get_config().train
  t = TrainConfig.from_config(section)
  assert {k: getattr(t, k) for k in section} == dict(section.items())  # every key, the value configs/default.py sets
  with pytest.raises(ConfigError, match=r"unknown key\(s\) config.train.guard_rollbacks"):
    TrainConfig.from_config(dict(section.items()) | {"guard_rollbacks": 3})
  with pytest.raises(ConfigError, match="config.train lacks guard_lr_factor: start the config from configs/default.py"):
    TrainConfig.from_config({k: v for k, v in section.items() if k != "guard_lr_factor"})
  with pytest.raises(ConfigError, match="config.train.transfer_guard must be one of"):
    TrainConfig.from_config(dict(section.items()) | {"transfer_guard": "deny"})


def test_a_run_shorter_than_its_warmup_or_log_interval_is_told_so():
  """--config=multi30k --config.train.steps=30 trained silently at a rate that never left
  warmup (500 steps) and logged nothing until the end (log_every 50)."""
  from seq2seq import get_config

  t = TrainConfig.from_config(dict(get_config("multi30k").train.items()) | {"steps": 30})
  _, schedule = optimizer.make(t, d_model=256)
  warmup, log = report.short_run_warnings(t, schedule)
  assert warmup.startswith(f"warning: config.train.warmup_steps={t.warmup_steps} is more than config.train.steps=30: "
                           f"the learning rate never reaches its peak (it ends at {float(schedule(29)):.3g})")
  assert log.startswith(f"warning: config.train.log_every={t.log_every} is more than config.train.steps=30: ")
  long_enough = TrainConfig.from_config(dict(get_config("multi30k").train.items()))
  assert report.short_run_warnings(long_enough, schedule) == []
  # Its one validation (at step 30) leaves out BLEU, which took 74 s to say 0; a run that reaches eval_every does not.
  bleu_sentences = get_config("multi30k").eval.val_bleu_sentences
  assert report.skips_validation_bleu(t, bleu_sentences) and not report.skips_validation_bleu(long_enough,
                                                                                               bleu_sentences)
  note = report.short_run_warnings(t, schedule, bleu_sentences)[-1]
  assert note.startswith(f"note: config.train.eval_every={t.eval_every} is more than config.train.steps=30: the "
                         "validation at step 30 computes the loss only, not BLEU")
  assert not report.skips_validation_bleu(t, 0)  # no validation BLEU asked for: nothing to say
  # The loop's validation asks for BLEU as Run.skip_bleu says (train_and_evaluate sets it from the rule above).
  from types import SimpleNamespace

  from seq2seq.training import train

  for skip in (True, False):
    asked = []
    run = SimpleNamespace(validation=lambda params, bleu: asked.append(bleu) or {"loss": 1.0}, skip_bleu=skip,
                          peak=(1.0, "configured"), writer=SimpleNamespace(write=lambda step, values: None),
                          bar=SimpleNamespace(disable=True, write=print))
    window = SimpleNamespace(exclude=lambda seconds: None)
    assert train._evaluate(run, 30, SimpleNamespace(params=None), window) == {"val_loss": 1.0, "val_step": 30}
    assert asked == [not skip]
