"""Checkpoints, averages and exports written before the attention projections were fused
(separate wq_dnh, wk_dnh, wv_dnh in every layer) load into today's layout."""

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from seq2seq import average, export, sharding
from seq2seq.model.config import ModelConfig
from seq2seq.model.transformer import Transformer
from seq2seq.training import checkpoint

CFG = ModelConfig(vocab_size=40, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=24)
IDENTITY = {"model": {}, "spm_sha256": "x"}


def _attention_layer(x) -> bool:
  return isinstance(x, Mapping) and ("wqkv_dn3h" in x or "wkv_dn2h" in x)


def old_layout(tree):
  """`tree` with every attention layer as the separate layout held it, written out by hand."""
  def layer(m):
    if not _attention_layer(m):
      return m
    old = {k: v for k, v in m.items() if k not in ("wqkv_dn3h", "wkv_dn2h", "bqv_n2h")}
    w = m.get("wqkv_dn3h", m.get("wkv_dn2h"))
    parts = ("wq_dnh", "wk_dnh", "wv_dnh") if "wqkv_dn3h" in m else ("wk_dnh", "wv_dnh")
    old |= {name: w.replace(value=w[...][:, :, i]) for i, name in enumerate(parts)}
    if "bqv_n2h" in m:
      b = m["bqv_n2h"]
      old |= {"bq_nh": b.replace(value=b[...][:, 0]), "bv_nh": b.replace(value=b[...][:, 1])}
    return nnx.State(old)
  return jax.tree.map(layer, tree, is_leaf=_attention_layer)


def train_state(seed: int):
  """A train state whose parameters and Adam moments are all different numbers."""
  def make():
    params = nnx.state(Transformer(CFG, rngs=nnx.Rngs(seed)), nnx.Param)
    params = jax.tree.map(lambda x: x + jax.random.normal(jax.random.key(seed), x.shape), params)  # biases too
    tx = optax.adam(1e-3)
    _, opt_state = tx.update(jax.tree.map(jnp.sin, params), tx.init(params), params)
    return {"params": params, "opt_state": opt_state, "step": jnp.int32(seed)}
  return jax.jit(make)()


def assert_same(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_checkpoint_of_separate_projections_restores_fused(tmp_path):
  ckpts = checkpoint.Checkpoints(str(tmp_path), asynchronous=False)
  states = {step: train_state(step) for step in (1, 2)}
  for step, state in states.items():
    ckpts.save(step, old_layout(state), {"position": step}, IDENTITY)
  ckpts.wait()
  assert "wk_dnh" in str(jax.tree_util.tree_flatten_with_path(old_layout(states[2]))[0])
  target = train_state(7)  # today's layout, other values
  restored, data_state, step = ckpts.restore(target, IDENTITY)
  assert step == 2 and data_state == {"position": 2}
  assert_same(restored, states[2])  # parameters and both Adam moments
  ckpts.close()
  ckpts = checkpoint.Checkpoints(str(tmp_path), asynchronous=False)  # as evaluation reads them
  params, step = ckpts.restore_params(target["params"], IDENTITY, step=1)
  assert step == 1
  assert_same(params, states[1]["params"])
  ckpts.close()
  # An average of old checkpoints (DIR/average/last2) loads fused too.
  average.save_average(str(tmp_path), [1, 2])
  mean, identity = average.load_average(average.directory(tmp_path, 2), target["params"])
  assert identity["averaged_steps"] == [1, 2]
  want = jax.tree.map(lambda a, b: ((np.float64(a) + np.float64(b)) / 2).astype(np.float32),
                      states[1]["params"], states[2]["params"])
  assert_same(mean, want)


def test_an_export_of_separate_projections_loads_fused(tmp_path):
  from safetensors.numpy import save_file

  params = train_state(3)["params"]
  tensors = export.flatten(old_layout(params))
  assert "encoder_layers.0.self_attn.wk_dnh" in tensors and "decoder_layers.0.cross_attn.wq_dnh" in tensors
  save_file(tensors, str(tmp_path / export.PARAMS_FILE))
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  _, loaded = export.load_params(tmp_path, CFG, mesh)
  assert_same(loaded, params)
