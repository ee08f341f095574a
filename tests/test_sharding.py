"""Sharded activations: the train step compiled for meshes of 8 fake CPU devices needs no
involuntary rematerialization, and its collectives are the ones each mesh axis should cost:

- data: one all-reduce of every gradient (per use of the parameter: XLA:CPU reduces the three
  uses of the shared embedding separately), plus the metric sums;
- fsdp: one all-gather of every parameter it shards, in the forward pass only, and the same
  gradient reduction as data (XLA:CPU emits an all-reduce and keeps its slice; GPU and TPU
  compilers turn that pair into a reduce-scatter);
- tensor: per-layer reductions of [tokens, d_model] activations (Megatron-style), no
  gradient reduction at all, and per-token reductions over the vocabulary for the loss.
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

from seq2seq import sharding

pytestmark = pytest.mark.slow  # compiles the train step for five 8-device meshes (~30 s)

MESHES = ("8,1,1", "1,8,1", "1,1,8", "2,2,2", "1,2,4")


@pytest.fixture(scope="module")
def compiled():
  out = subprocess.run([sys.executable, str(REPO / "tests" / "hlo_run.py"), *MESHES], capture_output=True, text=True,
                       timeout=900, cwd=REPO)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_no_mesh_needs_an_involuntary_full_rematerialization(compiled):
  _, stderr = compiled
  assert "Involuntary full rematerialization" not in stderr


def _elements(collectives, kind, shape=None):
  """Element counts of the results of `kind` collectives (tuple results count per element)."""
  return [math.prod(s) for c in collectives if c["kind"] == kind for s in c["shapes"] if shape is None or s == shape]


def _activation_reductions(model) -> int:
  """[tokens, d_model] all-reduces of a tensor-parallel train step. Forward: one after each
  attention and feed-forward output projection (2 per encoder layer, 3 per decoder layer).
  Backward: one per input projection whose input gradient is summed over heads or the mlp;
  q, k and v of self-attention are one projection, and k, v of cross-attention another
  (encoder: qkv, ffn in = 2; decoder: self qkv, cross q, cross kv, ffn in = 4), one for the
  tied output projection, and one per vocabulary-parallel embedding lookup (source and
  target)."""
  e, d = model["num_encoder_layers"], model["num_decoder_layers"]
  return (2 * e + 3 * d) + (2 * e + 4 * d) + 1 + 2


@pytest.mark.parametrize("mesh", MESHES)
def test_collectives_follow_the_mesh_axes(compiled, mesh):
  result, _ = compiled
  model, rows, length = result["model"], result["rows"], result["length"]
  data, fsdp, tensor = (int(x) for x in mesh.split(","))
  dp, d, vocab = data * fsdp, model["d_model"], model["vocab_size"]
  ops = result["meshes"][mesh]
  assert {c["kind"] for c in ops} <= {"all-reduce", "all-gather", "reduce-scatter"}, "no all-to-all or permute"
  params = result["param_shapes"]
  n_params = sum(math.prod(s) for s in params)
  embedding = vocab * d
  token_shapes = ([rows * length // dp, d], [rows // dp, length, d])
  activation = sum(len(_elements(ops, "all-reduce", s)) for s in token_shapes)
  assert activation == (_activation_reductions(model) if tensor > 1 else 0)
  # No logits move: the loss reduces over the sharded vocabulary per token.
  assert not [s for c in ops for s in c["shapes"] if len(s) > 1 and s[-1] in (vocab, vocab // tensor)
              and {length, rows * length // dp} & set(s[:-1])]
  if (data, fsdp, tensor) == (8, 1, 1) or (data, fsdp, tensor) == (1, 8, 1):
    # Every gradient is reduced once per use: the shared embedding has three (source and target
    # lookups, tied output projection), every other parameter one; plus 4 metric sums.
    reduced = sum(_elements(ops, "all-reduce")) + sum(_elements(ops, "reduce-scatter")) * dp
    scalars = len(_elements(ops, "all-reduce", []))
    assert reduced - scalars == n_params + 2 * embedding
  if (data, fsdp, tensor) == (8, 1, 1):
    assert _elements(ops, "all-gather") == [] and len(_elements(ops, "all-reduce", [])) == 4
  if fsdp > 1:
    # The forward pass gathers each matrix fsdp shards once and the backward pass reuses it
    # (each is split along heads, mlp or vocab by tensor too). Norm scales, 64 floats, may be
    # gathered again for the backward pass instead of being kept.
    sharded = [s for s in params if d in s]
    matrices = [math.prod(s) // tensor for s in sharded if len(s) > 1]
    vectors = [math.prod(s) for s in sharded if len(s) == 1]
    gathered = [c["shapes"][0] for c in ops if c["kind"] == "all-gather"]
    assert sorted(math.prod(s) for s in gathered if len(s) > 1) == sorted(matrices)
    assert sum(vectors) <= sum(math.prod(s) for s in gathered if len(s) == 1) <= 2 * sum(vectors)
  else:
    assert _elements(ops, "all-gather") == []
  if (data, fsdp, tensor) == (1, 1, 8):  # no gradient reduction: each device owns its shard's gradient
    assert set(map(tuple, (s for c in ops for s in c["shapes"]))) <= {tuple(s) for s in token_shapes} | {
        (rows, length), ()}


def test_activation_specs_skip_axes_that_do_not_divide():
  assert sharding.constrain(np.ones((3, 5)), ("batch", "embed")).shape == (3, 5)  # one device: unchanged

  class FakeMesh:
    shape = {"data": 2, "fsdp": 4, "tensor": 2}

  spec = sharding.activation_spec(("batch", "length", "heads", "kv"), (8, 7, 6, 5), FakeMesh())
  assert tuple(spec) == (("data", "fsdp"), None, "tensor", None)
  spec = sharding.activation_spec(("batch", "length", "vocab"), (6, 7, 9), FakeMesh())
  assert tuple(spec) == (None, None, None)  # 6 rows over 8 devices, 9 over 2: left whole
