"""The Transformer: causality, padding invariance, cached decoding, packed rows, relative
positions' shift invariance, learned positions' limits, gradients, sizes.

Combinations of positions x norm x placement x activation: the fast suite runs a set in which
every pair of positions, norm and placement occurs (12 models); `pytest -m long` (not in CI,
for its time) adds what it takes for every pair of the four settings to occur (30 of the 168),
then for every triple (86). A fault
that needs all four at once is left to the studies' runs.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.errors import ConfigError
from seq2seq.model.config import CHOICES, ModelConfig
from seq2seq.model.layers import LOGICAL_AXES
from seq2seq.model.transformer import Transformer, count_params

VOCAB = 37
SRC_BS = np.array([[5, 6, 7, 8, 9, 10, 0, 0], [11, 12, 13, 14, 15, 16, 17, 18]])
TGT_BT = np.array([[1, 20, 21, 22, 23, 24, 25], [1, 26, 27, 28, 0, 0, 0]])


def small_config(**overrides) -> ModelConfig:
  settings = dict(vocab_size=VOCAB, d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=2, d_ff=24,
                  max_len=32, dropout_rate=0.0)
  return ModelConfig(**(settings | overrides))


def covering(grid: list[tuple], strength: int, chosen: list[tuple] = ()) -> list[tuple]:
  """`chosen`, then combinations of `grid` (a full product) until every `strength` values of
  any `strength` axes occur together: greedily, the combination that covers the most
  uncovered ones first."""
  def tuples(combo):
    return set(itertools.combinations(enumerate(combo), strength))

  chosen = list(chosen)
  todo = set().union(*map(tuples, grid)) - set().union(set(), *map(tuples, chosen))
  while todo:
    best = max(grid, key=lambda combo: len(tuples(combo) & todo))
    chosen.append(best)
    todo -= tuples(best)
  return chosen


def pairwise(grid: list[tuple]) -> list[tuple]:
  """A subset of `grid` in which every pair of values of any two axes occurs."""
  return covering(grid, 2)


def with_activations(combos: list[tuple]) -> list[tuple]:
  """Each (positions, norm, norm_position) combination with one activation, in turn."""
  return [(*c, CHOICES["activation"][i % len(CHOICES["activation"])]) for i, c in enumerate(combos)]


def fast_settings() -> list[tuple]:
  """The fast suite's models: every pair of positions, norm and norm position, each with an
  activation in turn, so that every activation is tried (the feed-forward is position-wise
  and meets the other settings only through the residual stream; `pytest -m long` has all)."""
  return with_activations(pairwise(list(itertools.product(CHOICES["positions"], CHOICES["norm"],
                                                          CHOICES["norm_position"]))))


def variants():
  fast = fast_settings()
  grid = list(itertools.product(CHOICES["positions"], CHOICES["norm"], CHOICES["norm_position"],
                                CHOICES["activation"]))
  # fast, then what completes every pair, then every triple (`covering` keeps what it is given first)
  more = covering(grid, 3, covering(grid, 2, fast))[len(fast):]
  return fast + [pytest.param(*c, marks=pytest.mark.long) for c in more]


@pytest.mark.parametrize("positions, norm, norm_position, activation", variants())
def test_variant_causal_padding_invariant_and_trainable(positions, norm, norm_position, activation):
  cfg = small_config(positions=positions, norm=norm, norm_position=norm_position, activation=activation,
                     dropout_rate=0.1, attention_dropout_rate=0.1, ffn_dropout_rate=0.1)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  t_change = 3
  tgt_changed = TGT_BT.copy()
  tgt_changed[:, t_change] += 1
  pad = np.zeros((2, 3), TGT_BT.dtype)

  def run(params, dropout_rng):
    # Three passes, not five: the changed target rides in the plain pass's batch, and the pads on
    # both sides share one (eager on this CPU: each pass's shapes compile each operation anew).
    model = nnx.merge(graphdef, params)
    logits, changed = np.split(np.asarray(model(np.concatenate([SRC_BS, SRC_BS]),
                                                np.concatenate([TGT_BT, tgt_changed]))), 2)
    padded = model(np.concatenate([SRC_BS, pad], 1), np.concatenate([TGT_BT, pad], 1))[:, :TGT_BT.shape[1]]

    def loss(params):
      logp = jax.nn.log_softmax(nnx.merge(graphdef, params)(SRC_BS, TGT_BT, dropout_rng=dropout_rng))
      return -jnp.mean(jnp.take_along_axis(logp, (TGT_BT[..., None] + 1) % VOCAB, axis=-1))

    return logits, changed, padded, jax.value_and_grad(loss)(params)

  logits, changed, padded, (loss, grads) = run(params, jax.random.key(1))
  # Causality: a change at target position t leaves every earlier position's logits alone.
  np.testing.assert_array_equal(changed[:, :t_change], logits[:, :t_change])
  assert not np.allclose(changed[:, t_change:], logits[:, t_change:])
  # Padding: extra pad tokens on both sides change no real position's logits.
  real = TGT_BT != 0
  np.testing.assert_allclose(padded[real], logits[real], atol=1e-5)
  # Forward and backward are finite, and every parameter receives a gradient.
  assert np.isfinite(loss) and np.all(np.isfinite(logits))
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    assert np.all(np.isfinite(g)), path
    assert np.any(g != 0), f"no gradient reaches {jax.tree_util.keystr(path)}"


def cache_grid():
  """positions x norm x norm_position, each with one activation in turn: the fast suite's
  pairwise set, and the rest of the product under `pytest -m long` (not in CI, for its time)."""
  fast = fast_settings()
  grid = list(itertools.product(CHOICES["positions"], CHOICES["norm"], CHOICES["norm_position"]))
  rest = with_activations([c for c in grid if c not in {f[:3] for f in fast}])
  return fast + [pytest.param(*c, marks=pytest.mark.long) for c in rest]


@pytest.mark.parametrize("positions, norm, norm_position, activation", cache_grid())
def test_cached_decoding_reproduces_full_forward(positions, norm, norm_position, activation):
  cfg = small_config(positions=positions, norm=norm, norm_position=norm_position, activation=activation)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  tgt_bt = np.array([[1, 20, 21, 22, 23, 24, 25], [1, 26, 27, 28, 29, 30, 31]])
  full_btv = nnx.jit(lambda m: m(SRC_BS, tgt_bt))(model)

  src_segments_bs = (SRC_BS != 0).astype(np.int32)
  cache = nnx.jit(lambda m: m.init_cache(m.encode(SRC_BS), src_segments_bs, tgt_bt.shape[1] + 3))(model)
  step = nnx.jit(lambda m, tokens_b, cache: m.decode_step(tokens_b, cache))
  for t in range(tgt_bt.shape[1]):
    logits_bv, cache = step(model, tgt_bt[:, t], cache)
    np.testing.assert_allclose(logits_bv, full_btv[:, t], atol=1e-5, err_msg=f"position {t}")
  assert int(cache.index) == tgt_bt.shape[1]


def test_the_fast_grid_covers_every_pair_of_settings():
  fast = fast_settings()
  grid = list(itertools.product(CHOICES["positions"], CHOICES["norm"], CHOICES["norm_position"]))
  for i, j in itertools.combinations(range(3), 2):
    assert {(c[i], c[j]) for c in fast} == {(c[i], c[j]) for c in grid}
  assert {c[3] for c in fast} == set(CHOICES["activation"])  # every activation
  assert len(fast) < len(grid) * len(CHOICES["activation"]) / 10


def test_the_long_grid_covers_every_pair_then_every_triple_of_the_four_settings():
  marks = {}
  for param in variants():
    values = tuple(param.values) if hasattr(param, "values") else param
    marks[values] = param.marks[0].name if hasattr(param, "marks") else "fast"
  grid = list(itertools.product(CHOICES["positions"], CHOICES["norm"], CHOICES["norm_position"],
                                CHOICES["activation"]))
  ordered = list(marks)  # the fast set, then what completes every pair, then every triple
  for strength, chosen in ((2, ordered[:len(fast_settings()) + 18]), (3, ordered)):
    for axes in itertools.combinations(range(4), strength):
      assert {tuple(c[i] for i in axes) for c in chosen} == {tuple(c[i] for i in axes) for c in grid}, axes
  assert set(marks.values()) == {"fast", "long"} and len(marks) == 86


def test_residual_blocks_are_their_formulas_to_the_bit():
  """With XLA's norms (the CPU's), post-norm residual blocks that hand on a Fork (the norm's
  output twice: residual path, next sublayer) give the formula norm(x + drop(f(x))) applied to a
  plain array exactly, and pre-norm blocks that hand x on through the norm (`with_input`) give
  x + drop(f(norm(x))): the same output and the same gradients, to the bit, dropout on."""
  from seq2seq.model import transformer
  from seq2seq.model.layers import Norm

  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2, 5, 16), dtype=np.float32))
  w1, w2 = (jnp.asarray(rng.standard_normal((16, 16), dtype=np.float32)) for _ in range(2))
  norms = [Norm("layernorm", 16, impl="xla", rngs=nnx.Rngs(i)) for i in range(2)]
  keys = [jax.random.key(1), jax.random.key(2)]

  def forked(x, w1, w2):
    y = transformer.residual(x, lambda h, _: jnp.tanh(h @ w1), norms[0], pre=False, rate=0.3, rng=keys[0])
    assert isinstance(y, transformer.Fork)
    y = transformer.residual(y, lambda h, _: jnp.tanh(h @ w2), norms[1], pre=False, rate=0.3, rng=keys[1])
    return jnp.sum(transformer.joined(y) ** 2)

  def formula(x, w1, w2):
    from seq2seq.model.dropout import dropout
    y = norms[0](x + dropout(jnp.tanh(x @ w1), 0.3, keys[0]))
    y = norms[1](y + dropout(jnp.tanh(y @ w2), 0.3, keys[1]))
    return jnp.sum(y ** 2)

  got, want = (jax.value_and_grad(f, argnums=(0, 1, 2))(x, w1, w2) for f in (forked, formula))
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)

  def pre_blocks(x, w1, w2):  # pre-norm: x handed on through the norm (with_input)
    for norm, w, key in zip(norms, (w1, w2), keys):
      x = transformer.residual(x, lambda h, _, w=w: jnp.tanh(h @ w), norm, pre=True, rate=0.3, rng=key)
    return jnp.sum(x ** 2)

  def pre_formula(x, w1, w2):
    from seq2seq.model.dropout import dropout
    for norm, w, key in zip(norms, (w1, w2), keys):
      x = x + dropout(jnp.tanh(norm(x) @ w), 0.3, key)
    return jnp.sum(x ** 2)

  got, want = (jax.value_and_grad(f, argnums=(0, 1, 2))(x, w1, w2) for f in (pre_blocks, pre_formula))
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)


def test_dropout_depends_only_on_the_key():
  model = Transformer(small_config(dropout_rate=0.3), rngs=nnx.Rngs(0))
  fwd = nnx.jit(lambda m, key: m(SRC_BS, TGT_BT, dropout_rng=key))
  a = fwd(model, jax.random.key(3))
  np.testing.assert_array_equal(a, fwd(model, jax.random.key(3)))
  assert not np.allclose(a, fwd(model, jax.random.key(4)))
  clean = nnx.jit(lambda m: m(SRC_BS, TGT_BT))(model)
  assert not np.allclose(a, clean)


def test_dropout_keys_derived_at_once_are_fold_ins_keys():
  """`DropoutKeys` gives every path fold_in's key to the bit: inside its grid, past it (folded
  on from the longest prefix inside), and deeper than it."""
  from seq2seq.model.dropout import DropoutKeys, fold

  root = jax.random.fold_in(jax.random.key(3), 7)
  keys = DropoutKeys.derive(root, (2, 4, 6))
  for path in [(), (1,), (0, 3), (1, 2, 5), (0, 4, 1), (1, 0, 6), (2,), (1, 3, 5, 2)]:
    table, want = keys, root
    for i in path:
      table, want = fold(table, i), fold(want, i)
    np.testing.assert_array_equal(jax.random.key_data(table.key()), jax.random.key_data(want))


def test_a_model_with_its_dropout_keys_at_once_equals_one_folding_them_apart(monkeypatch):
  """The Transformer derives its dropout keys at once (`transformer.DROPOUT_KEYS_AT_ONCE`):
  its logits and every parameter's gradient, with dropout in the residuals, the feed-forward
  layers and the attention weights, equal those of a model folding each key apart, to the bit;
  and the batched derivation is three fold_in computations (one a depth), where each fold was one."""
  from seq2seq.model import transformer

  model = Transformer(small_config(dropout_rate=0.3, ffn_dropout_rate=0.1,
                                   attention_dropout_rate=0.2), rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  key = jax.random.fold_in(jax.random.key(1), 5)

  def loss(p):
    return jnp.sum(nnx.merge(graphdef, p)(SRC_BS, TGT_BT, dropout_rng=key) ** 2)

  results, threefry = [], []
  for at_once in (True, False):
    monkeypatch.setattr(transformer, "DROPOUT_KEYS_AT_ONCE", at_once)
    results.append(jax.jit(jax.value_and_grad(lambda p: loss(p)))(params))  # a new function: traced anew
    threefry.append(str(jax.make_jaxpr(lambda p: loss(p))(params)).count("random_fold_in"))
  for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
    np.testing.assert_array_equal(a, b)
  assert threefry[0] == 3 < threefry[1]
  clean = jnp.sum(model(SRC_BS, TGT_BT) ** 2)
  assert float(results[0][0]) != float(clean)  # dropout was on


def test_bfloat16_compute_keeps_float32_parameters_and_logits():
  model = Transformer(small_config(dtype="bfloat16"), rngs=nnx.Rngs(0))
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert model.encode(SRC_BS).dtype == jnp.bfloat16
  logits = model(SRC_BS, TGT_BT)
  assert logits.dtype == jnp.float32 and np.all(np.isfinite(logits))


@pytest.mark.parametrize("dtype, tie_output", [("bfloat16", True), ("float32", False)])
def test_bf16_logits_are_the_f32_logits_rounded_and_decoding_keeps_f32(dtype, tie_output):
  """`logits_dtype=bfloat16` writes the teacher-forced logits in bf16 from the same f32
  accumulation: equal to the f32 logits rounded, for the tied and the untied projection.
  Decoding steps (cached, and the uncached reference stepper) still give f32 logits, equal
  to those of a float32-logits model."""
  from seq2seq.inference import decode

  models = {d: Transformer(small_config(dtype=dtype, tie_output=tie_output, logits_dtype=d), rngs=nnx.Rngs(0))
            for d in ("float32", "bfloat16")}
  full = {d: nnx.jit(lambda m: m(SRC_BS, TGT_BT))(m) for d, m in models.items()}
  assert full["bfloat16"].dtype == jnp.bfloat16 and full["float32"].dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(full["bfloat16"], np.float32),
                                np.asarray(full["float32"].astype(jnp.bfloat16), np.float32))
  for stepper in (decode.cached, decode.uncached):
    first = {}
    for d, m in models.items():
      s = stepper(m, 8)
      first[d], _ = s.step(jnp.asarray([1, 1], jnp.int32), s.init(jnp.asarray(SRC_BS)))
    assert first["bfloat16"].dtype == jnp.float32, stepper
    np.testing.assert_array_equal(first["bfloat16"], first["float32"])


def test_untied_unshared_embeddings_have_their_own_parameters():
  tied = count_params(small_config())
  untied = count_params(small_config(share_embeddings=False, tie_output=False))
  assert untied - tied == 2 * VOCAB * 16


@pytest.mark.parametrize("positions", ["learned", "relative"])
def test_every_parameter_names_its_logical_axes(positions):
  model = Transformer(small_config(positions=positions, share_embeddings=False, tie_output=False),
                      rngs=nnx.Rngs(0))
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    axes = var.get_metadata().get("axes")
    assert axes is not None and len(axes) == var[...].ndim, path
    assert set(axes) <= set(LOGICAL_AXES), (path, axes)


@pytest.mark.parametrize("positions", [p if p == "relative" else pytest.param(p, marks=pytest.mark.long)
                                       for p in CHOICES["positions"]])
def test_packed_rows_equal_separate_rows(positions):
  """Two pairs packed into one row (segment ids 1, 2, positions restarting at each) give the
  logits they get in rows of their own: positions come from each token's place in its
  sentence, never from its index in the row (relative biases included)."""
  model = Transformer(small_config(positions=positions), rngs=nnx.Rngs(0))
  (src_a, src_b), (tgt_a, tgt_b) = ([5, 6, 7, 8, 9, 10], [11, 12, 13]), ([1, 20, 21, 22], [1, 26, 27, 28, 29])
  separate = model(np.array([src_a, src_b + [0] * 3]), np.array([tgt_a + [0], tgt_b]))
  place = lambda a, b, width: [(x + [0] * width)[:width] for x in (a + b, [1] * len(a) + [2] * len(b),
                                                                     list(range(len(a))) + list(range(len(b))))]
  src, src_segments, src_positions = (np.array([row]) for row in place(src_a, src_b, 11))
  tgt, tgt_segments, tgt_positions = (np.array([row]) for row in place(tgt_a, tgt_b, 10))
  packed = model(src, tgt, src_segments_bs=src_segments, tgt_segments_bt=tgt_segments, src_positions_bs=src_positions,
                 tgt_positions_bt=tgt_positions)
  np.testing.assert_allclose(packed[0, :4], separate[0, :4], atol=1e-5)
  np.testing.assert_allclose(packed[0, 4:9], separate[1, :5], atol=1e-5)


def test_relative_positions_make_outputs_depend_only_on_position_differences():
  """No absolute position reaches a relative model: shifting every position of a sentence by a
  constant leaves the encoder output and the logits alone. Sinusoidal positions (the control)
  are absolute, and change them."""
  shifted = lambda x, c: np.broadcast_to(np.arange(x.shape[1]) + c, x.shape)
  for positions, invariant in (("relative", True), ("sinusoidal", False)):
    model = Transformer(small_config(positions=positions), rngs=nnx.Rngs(0))
    enc, logits = model.encode(SRC_BS), model(SRC_BS, TGT_BT)
    for c in (3, 50):
      enc_c = model.encode(SRC_BS, src_positions_bs=shifted(SRC_BS, c))
      logits_c = model(SRC_BS, TGT_BT, src_positions_bs=shifted(SRC_BS, c), tgt_positions_bt=shifted(TGT_BT, c),
                       packed=False)
      real = SRC_BS != 0
      assert np.allclose(enc_c[real], enc[real], atol=1e-5) == invariant, (positions, c)
      assert np.allclose(logits_c[TGT_BT != 0], logits[TGT_BT != 0], atol=1e-5) == invariant, (positions, c)


def test_learned_positions_refuse_what_the_table_does_not_hold():
  """max_len=8: rows of up to 8 tokens run; a longer source or target row, or a decoding cache
  of more positions, is an error naming config.model.max_len (found while tracing, from the
  shapes), never positions that reuse the table's last row."""
  model = Transformer(small_config(positions="learned", max_len=8), rngs=nnx.Rngs(0))
  model(SRC_BS, TGT_BT)  # 8 source and 7 target tokens: within the table
  with pytest.raises(ConfigError, match="a source row of 9 tokens .*config.model.max_len=8"):
    nnx.jit(lambda m: m.encode(np.pad(SRC_BS, ((0, 0), (0, 1)))))(model)
  with pytest.raises(ConfigError, match="a target row of 9 tokens .*config.model.max_len=8"):
    model(SRC_BS, np.pad(TGT_BT, ((0, 0), (0, 2))))
  enc = model.encode(SRC_BS)
  with pytest.raises(ConfigError, match="a decoding cache of 9 positions .*config.model.max_len=8"):
    model.init_cache(enc, (SRC_BS != 0).astype(np.int32), 9)
  # A cache made longer elsewhere (a model with a larger table, the same shapes) is refused at the step.
  larger = Transformer(small_config(positions="learned", max_len=16), rngs=nnx.Rngs(0))
  cache = larger.init_cache(larger.encode(SRC_BS), (SRC_BS != 0).astype(np.int32), 12)
  with pytest.raises(ConfigError, match="a decoding cache of 12 positions .*config.model.max_len=8"):
    model.decode_step(TGT_BT[:, 0], cache)


@pytest.mark.parametrize("overrides, expected_millions", [
    (dict(), 65),  # Vaswani et al. base
    (dict(d_model=1024, num_heads=16, d_ff=4096, dropout_rate=0.3), 213),  # big
])
def test_parameter_count_matches_the_paper(overrides, expected_millions):
  count = count_params(ModelConfig(vocab_size=37000, **overrides))
  assert abs(count / 1e6 - expected_millions) <= 0.05 * expected_millions, count


def test_bad_model_settings_name_the_key():
  with pytest.raises(ValueError, match="config.model.norm"):
    ModelConfig(vocab_size=10, norm="batchnorm")
  with pytest.raises(ValueError, match="config.model.nrom"):
    ModelConfig.from_config({"nrom": "rmsnorm"}, vocab_size=10)
  with pytest.raises(ValueError, match="num_heads"):
    ModelConfig(vocab_size=10, d_model=10, num_heads=3)


def test_cross_attention_weights_are_distributions_over_real_source_tokens():
  model = Transformer(small_config(), rngs=nnx.Rngs(0))
  weights = model.cross_attention_weights(SRC_BS, TGT_BT)
  assert weights.shape == (2, 2, 2, TGT_BT.shape[1], SRC_BS.shape[1])  # layers, b, heads, t, s
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  assert np.all(weights[:, 0, :, :, 6:] == 0.0)  # sentence 0's padding gets no attention
  # Recording takes the explicit attention path; the model's output is the same either way.
  assert not model.decoder_layers[0].cross_attn.record_weights
  fused = model(SRC_BS, TGT_BT)
  for layer in model.decoder_layers:
    layer.cross_attn.record_weights = True
  np.testing.assert_allclose(model(SRC_BS, TGT_BT), fused, atol=1e-5)
