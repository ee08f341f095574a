"""Search: exhaustive optimum, greedy = beam 1, cached = uncached, length rules, ensembles,
and the Translator keeping learned positions within their table."""

import functools
import itertools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq import sharding
from seq2seq.inference import decode
from seq2seq.inference.translate import Translator
from seq2seq.model.config import ModelConfig
from seq2seq.model.transformer import Transformer
from seq2seq.special_tokens import SPECIAL

BOS, EOS, PAD = SPECIAL.bos, SPECIAL.eos, SPECIAL.pad


def make_model(vocab: int, seed: int = 3, **overrides) -> Transformer:
  settings = dict(vocab_size=vocab, d_model=32, num_heads=2, num_encoder_layers=2, num_decoder_layers=2, d_ff=48,
                  max_len=64, dropout_rate=0.0)
  return Transformer(ModelConfig(**(settings | overrides)), rngs=nnx.Rngs(seed))


def run_search(model, src_bs, limits_b, fn, **kwargs):
  graphdef, state = nnx.split(model)
  max_len = kwargs.pop("max_len")
  use_cache = kwargs.pop("use_cache", True)

  @jax.jit
  def go(state, src_bs, limits_b):
    m = nnx.merge(graphdef, state)
    stepper = (decode.cached if use_cache else decode.uncached)(m, max_len)
    return fn(stepper, src_bs, limits_b, max_len=max_len, **kwargs)

  return jax.device_get(go(state, src_bs, limits_b))


@nnx.jit  # one program, not one per operation
def log_softmax_forward(model, src_bs, tgt_bt):
  return jax.nn.log_softmax(model(src_bs, tgt_bt).astype(jnp.float32))


def sequence_log_probs(model, src_1s, outs):
  """log p(out | src) of each out by teacher forcing, all in one forward pass (the decoder is
  causal: the pads after a shorter out change none of its positions)."""
  width = max(map(len, outs))
  tgt_in = np.array([[BOS, *out[:-1]] + [PAD] * (width - len(out)) for out in outs])
  logp = np.asarray(log_softmax_forward(model, np.repeat(src_1s, len(outs), 0), tgt_in))
  return [float(sum(logp[k, i, tok] for i, tok in enumerate(out))) for k, out in enumerate(outs)]


def test_length_penalty_formula():
  for length, alpha in ((1, 0.6), (7, 0.6), (30, 1.0), (12, 0.0)):
    assert float(decode.length_penalty(length, alpha)) == pytest.approx(((5 + length) / 6) ** alpha, rel=1e-6)


def test_wide_beam_returns_every_hypothesis_in_exhaustive_order():
  """With a beam as wide as the set of all hypotheses, beam search is exhaustive search."""
  vocab, max_len, alpha = 6, 3, 0.6
  words = [t for t in range(vocab) if t not in (PAD, EOS)]
  model = make_model(vocab)
  src_bs = np.array([[2, 3, 4, 5, EOS], [5, 4, EOS, PAD, PAD]])
  limits_b = np.array([3, 2])
  everything = [prefix + (EOS,) for n in range(max_len) for prefix in itertools.product(words, repeat=n)]
  beam = len(everything)  # 1 + 4 + 16
  tokens_bkl, scores_bk = run_search(model, src_bs, limits_b, decode.beam_search, beam_size=beam, alpha=alpha,
                                     max_len=max_len)
  for row in range(2):
    allowed = [h for h in everything if len(h) <= limits_b[row]]
    log_probs = sequence_log_probs(model, src_bs[row:row + 1], allowed)
    exhaustive = sorted(((lp / ((5 + len(h)) / 6) ** alpha, h) for lp, h in zip(log_probs, allowed)), reverse=True)
    found = [tuple(int(t) for t in tokens_bkl[row, j] if t != PAD) for j in range(len(allowed))]
    assert found == [h for _, h in exhaustive]
    np.testing.assert_allclose(scores_bk[row, :len(allowed)], [s for s, _ in exhaustive], rtol=1e-5)
    assert np.all(scores_bk[row, len(allowed):] == decode.NEG_INF)  # empty slots stay empty


def sources(vocab: int, seed: int = 0, batch: int = 5, width: int = 9):
  rng = np.random.default_rng(seed)
  src_bs = rng.integers(2, vocab, (batch, width))
  lengths = rng.integers(1, width + 1, batch)
  for i, n in enumerate(lengths):
    src_bs[i, n - 1] = EOS
    src_bs[i, n:] = PAD
  return src_bs, lengths


def test_beam_one_without_penalty_equals_greedy():
  model = make_model(40)
  src_bs, lengths = sources(40)
  limits = np.asarray(decode.output_limits(jnp.asarray(lengths), 1.0, 3, 16))
  greedy_bl, _ = run_search(model, src_bs, limits, decode.greedy, max_len=16)
  beam_bkl, _ = run_search(model, src_bs, limits, decode.beam_search, beam_size=1, alpha=0.0, max_len=16)
  np.testing.assert_array_equal(beam_bkl[:, 0], greedy_bl)


@pytest.mark.parametrize("positions, norm_position", [("sinusoidal", "post"), ("rope", "pre"), ("learned", "pre"),
                                                     pytest.param("relative", "post", marks=pytest.mark.long)])
def test_cached_equals_uncached(positions, norm_position):
  model = make_model(40, positions=positions, norm_position=norm_position)
  src_bs, lengths = sources(40, seed=1)
  limits = np.asarray(decode.output_limits(jnp.asarray(lengths), 1.0, 4, 14))
  for fn, kwargs in ((decode.greedy, {}), (decode.beam_search, dict(beam_size=4, alpha=0.6))):
    fast = run_search(model, src_bs, limits, fn, max_len=14, **kwargs)
    slow = run_search(model, src_bs, limits, fn, max_len=14, use_cache=False, **kwargs)
    np.testing.assert_array_equal(fast[0], slow[0])
    np.testing.assert_allclose(fast[1], slow[1], rtol=1e-5)


def check_well_formed(tokens_bl, limits_b, min_len=0):
  """One eos ends each hypothesis, padding follows, the length is within [min_len, limit]."""
  for row, limit in zip(tokens_bl, limits_b):
    ends = np.flatnonzero(row == EOS)
    assert len(ends) == 1, row
    length = ends[0] + 1
    assert min(min_len, limit) <= length <= limit
    assert np.all(row[length:] == PAD) and np.all(row[:length] != PAD)


@pytest.mark.parametrize("beam", [1, 3])
def test_length_rules_and_finished_hypotheses_never_extended(beam):
  model = make_model(40)
  src_bs, lengths = sources(40, seed=2, batch=6)
  limits = np.array([1, 2, 5, 9, 12, 12])
  for min_len in (0, 6, 20):
    fn = decode.greedy if beam == 1 else functools.partial(decode.beam_search, beam_size=beam, alpha=0.6)
    tokens, scores = run_search(model, src_bs, limits, fn, max_len=12, min_len=min_len)
    if beam > 1:  # every filled slot of the k-best lists (a limit of 1 allows one hypothesis)
      filled = (scores > decode.NEG_INF / 2).reshape(-1)
      assert filled.reshape(scores.shape)[:, 0].all()
      tokens, row_limits = tokens.reshape(-1, tokens.shape[-1])[filled], np.repeat(limits, beam)[filled]
    else:
      row_limits = limits
    check_well_formed(tokens, row_limits, min_len)
    if min_len == 20:  # eos only at the limit: every hypothesis is exactly as long as allowed
      assert [int(np.flatnonzero(r == EOS)[0]) + 1 for r in tokens] == list(row_limits)


def test_output_limits():
  limits = decode.output_limits(jnp.array([1, 10, 100]), 1.5, 5, 120)
  np.testing.assert_array_equal(limits, [6, 20, 120])


def test_search_with_beam_one_is_greedy_fast_path():
  model = make_model(40)
  src_bs, lengths = sources(40, seed=4)
  limits = np.full(len(lengths), 10)
  greedy_bl, _ = run_search(model, src_bs, limits, decode.greedy, max_len=10)
  graphdef, state = nnx.split(model)
  out = jax.jit(lambda s: decode.search(nnx.merge(graphdef, s), src_bs, limits, beam_size=1, alpha=0.6,
                                        max_len=10)[0])(state)
  np.testing.assert_array_equal(out, greedy_bl)


@pytest.mark.parametrize("n, k", [(8000, 8), (32000, 8), (5000, 3), (300, 2)])
def test_blocked_top_k_equals_lax_top_k(n, k):
  x = jnp.asarray(np.random.default_rng(n).standard_normal((6, n)).astype(np.float32))
  x = x.at[0, :].set(decode.NEG_INF).at[0, 7].set(0.0)  # a row where almost everything is banned
  values, indices = jax.jit(decode.top_k, static_argnums=1)(x, k)
  ref_values, ref_indices = jax.lax.top_k(x, k)
  np.testing.assert_array_equal(values, ref_values)
  np.testing.assert_array_equal(indices[1:], ref_indices[1:])  # row 0 ties: any banned index will do
  assert int(indices[0, 0]) == 7


@pytest.mark.parametrize("beam", [1, 4])
def test_search_stops_once_every_sentence_is_finished(beam):
  """Steps run = the longest limit in the batch, not max_len (rows past their limit are done)."""
  model = make_model(40)
  graphdef, state = nnx.split(model)
  src_bs, _ = sources(40, seed=5, batch=3)
  steps = []

  def counted(m, max_len):
    inner = decode.cached(m, max_len)

    def step(tokens_b, st):
      jax.debug.callback(lambda: steps.append(1))
      return inner.step(tokens_b, st)

    return decode.Stepper(inner.init, step)

  for limits, expected in (([1, 1, 1], 1), ([1, 3, 2], 3)):
    steps.clear()
    fn = decode.greedy if beam == 1 else functools.partial(decode.beam_search, beam_size=beam, alpha=0.6)
    out = jax.jit(lambda s: fn(counted(nnx.merge(graphdef, s), 20), src_bs, jnp.array(limits), max_len=20))(state)
    jax.block_until_ready(out)
    assert 1 <= len(steps) <= expected  # may stop earlier: every row emitted eos / none can still win


def search_models(models, src_bs, limits, **kwargs):
  graphdefs, states = zip(*(nnx.split(m) for m in models))
  fn = lambda states: decode.search([nnx.merge(g, s) for g, s in zip(graphdefs, states)], src_bs, limits, **kwargs)[0]
  return np.asarray(jax.jit(fn)(list(states)))


@pytest.mark.parametrize("beam", [1, 4])
def test_an_ensemble_of_one_model_twice_searches_like_the_model(beam):
  model = make_model(40)
  src_bs, lengths = sources(40, seed=6)
  limits = np.asarray(decode.output_limits(jnp.asarray(lengths), 1.0, 4, 12))
  kwargs = dict(beam_size=beam, alpha=0.6, max_len=12)
  np.testing.assert_array_equal(search_models([model, model], src_bs, limits, **kwargs),
                                search_models([model], src_bs, limits, **kwargs))


@pytest.mark.long
def test_ensemble_greedy_picks_the_most_probable_token_of_the_mean_distribution():
  """Reference by teacher forcing: every output token is the argmax of the mean of the two
  models' probabilities given the prefix (models of different depth and positions)."""
  models = [make_model(40), make_model(40, seed=9, num_decoder_layers=3, positions="rope")]
  src_bs, _ = sources(40, seed=7)
  limits = np.full(src_bs.shape[0], 10)
  out_bl = search_models(models, src_bs, limits, beam_size=1, alpha=0.0, max_len=10)
  single_bl = search_models(models[:1], src_bs, limits, beam_size=1, alpha=0.0, max_len=10)
  assert not np.array_equal(out_bl, single_bl)  # the second model changes the outputs
  tgt_in_bl = np.concatenate([np.full((len(out_bl), 1), BOS), out_bl[:, :-1]], axis=1)
  probs_bl_v = sum(jax.nn.softmax(m(src_bs, tgt_in_bl).astype(jnp.float32), axis=-1) for m in models) / 2
  for row, probs_lv in zip(out_bl, np.array(probs_bl_v)):
    length = int(np.flatnonzero(row == EOS)[0]) + 1 if EOS in row else 10
    probs_lv[:, PAD] = -1.0  # the search never emits padding
    np.testing.assert_array_equal(row[:length - 1], probs_lv[:length - 1].argmax(-1))
    assert length == 10 or probs_lv[length - 1].argmax() == EOS


@pytest.mark.long
def test_ensemble_cached_equals_uncached():
  models = [make_model(40), make_model(40, seed=11, num_encoder_layers=1, positions="learned")]
  src_bs, lengths = sources(40, seed=8)
  limits = np.asarray(decode.output_limits(jnp.asarray(lengths), 1.0, 4, 14))
  for beam in (1, 4):
    kwargs = dict(beam_size=beam, alpha=0.6, max_len=14)
    np.testing.assert_array_equal(search_models(models, src_bs, limits, **kwargs),
                                  search_models(models, src_bs, limits, use_cache=False, **kwargs))


def counting(m, max_len, rows_seen, use_cache=True):
  """The model's stepper, recording the batch size (rows) of every step it runs."""
  inner = (decode.cached if use_cache else decode.uncached)(m, max_len)

  def step(tokens_b, st):
    rows = tokens_b.shape[0]
    jax.debug.callback(lambda: rows_seen.append(rows))
    return inner.step(tokens_b, st)

  return decode.Stepper(inner.init, step)


@pytest.mark.parametrize("beam, use_cache", [(1, True), (3, True), (3, False)])
def test_early_stopping_and_compaction_change_no_hypothesis(beam, use_cache):
  """`search` stops a sentence once its best hypothesis is certain (not its whole k-best list)
  and moves the unfinished sentences into a batch of 4, 2 or 1 once they fit: the outputs equal
  a search of the whole batch to the end of every k-best list, with fewer rows computed."""
  model = make_model(40)
  graphdef, state = nnx.split(model)
  src_bs, _ = sources(40, seed=12, batch=8)
  limits = np.array([1, 3, 16, 5, 9, 11, 2, 7])  # sentences finish at very different steps
  results, seen = {}, {}
  for name, compact, final in (("reference", (), beam), ("fast", (4, 2, 1), 1)):
    seen[name] = []

    def go(s, compact=compact, final=final, name=name):
      stepper = counting(nnx.merge(graphdef, s), 16, seen[name], use_cache)
      if beam == 1:
        return decode.greedy(stepper, src_bs, jnp.asarray(limits), max_len=16, compact=compact)
      tokens_bkl, scores_bk = decode.beam_search(stepper, src_bs, jnp.asarray(limits), beam_size=beam, alpha=0.6,
                                                 max_len=16, final=final, compact=compact)
      return tokens_bkl[:, 0], scores_bk[:, 0]

    results[name] = jax.device_get(jax.block_until_ready(jax.jit(go)(state)))
  np.testing.assert_array_equal(results["fast"][0], results["reference"][0])
  np.testing.assert_allclose(results["fast"][1], results["reference"][1], rtol=1e-5)
  assert set(seen["reference"]) == {8 * beam}
  assert set(seen["fast"]) - {8 * beam} <= {4 * beam, 2 * beam, beam} and min(seen["fast"]) < 8 * beam  # they ran
  row_steps = {name: sum(rows) for name, rows in seen.items()}
  assert row_steps["fast"] < row_steps["reference"], row_steps


def test_sampled_nbest_encode_each_sentence_once_and_draw_what_its_copies_draw():
  """`draw` with nbest 3 encodes the 5 sentences once (the stepper's init sees 5 rows, not 15)
  and, compacting as it goes, draws what `sample` draws for each sentence repeated 3 times
  with the same keys, most likely first."""
  graphdef, state = nnx.split(make_model(40))
  src_bs, lengths = sources(40, seed=14)
  limits = decode.output_limits(jnp.asarray(lengths), 1.0, 4, 12)
  sampling, encoded = decode.Sampling(temperature=1.5, seed=5), []

  def stepper(s):
    inner = decode.cached(nnx.merge(graphdef, s), 12)
    return inner._replace(init=lambda src: encoded.append(src.shape[0]) or inner.init(src))  # at trace time

  drawn_bnl, logp_bn = jax.device_get(jax.jit(lambda s: decode.draw(
      stepper(s), src_bs, limits, sampling, nbest=3, max_len=12, compact=(2, 1)))(state))
  assert encoded == [5]
  keys_x2 = decode.sentence_keys(5, jnp.arange(5), 3)
  tokens_xl, logp_x = jax.device_get(jax.jit(lambda s: decode.sample(
      stepper(s), jnp.repeat(src_bs, 3, axis=0), jnp.repeat(limits, 3), keys_x2, max_len=12, sampling=sampling))(state))
  assert encoded == [5, 15]
  order_bn = np.argsort(-logp_x.reshape(5, 3), axis=1, kind="stable")
  np.testing.assert_array_equal(drawn_bnl, np.take_along_axis(tokens_xl.reshape(5, 3, -1), order_bn[:, :, None], 1))
  # other batch sizes (5 encoded rows, compacted batches) round float32 sums differently: a few ulp
  np.testing.assert_allclose(logp_bn, np.take_along_axis(logp_x.reshape(5, 3), order_bn, 1), rtol=1e-6)
  assert len({tuple(row) for row in drawn_bnl.reshape(15, -1)}) > 5  # the copies drew apart


@pytest.mark.long
def test_search_compacts_and_keeps_the_order():
  """decode.search with compaction returns each sentence's output in its own row (a batch
  where the longest sentences sit at the end)."""
  model = make_model(40)
  graphdef, state = nnx.split(model)
  src_bs, _ = sources(40, seed=13, batch=6)
  limits = np.array([2, 2, 3, 3, 14, 14])
  run = lambda compact: np.asarray(jax.jit(lambda s: decode.search(
      nnx.merge(graphdef, s), src_bs, limits, beam_size=2, alpha=0.6, max_len=14, compact=compact)[0])(state))
  compacted = run((2, 1))
  np.testing.assert_array_equal(compacted, run(()))
  for s in (1, 4):  # a row equals its sentence searched alone
    alone = np.asarray(jax.jit(lambda st: decode.search(nnx.merge(graphdef, st), src_bs[s:s + 1], limits[s:s + 1],
                                                        beam_size=2, alpha=0.6, max_len=14)[0])(state))
    np.testing.assert_array_equal(compacted[s], alone[0])


def test_the_translator_keeps_learned_positions_within_their_table(capsys):
  """A table of 12 positions (not a source bucket: rows are padded to 16 otherwise). Sources
  past it are cut with a warning naming config.model.max_len; every row is padded to at most
  12 (the model refuses wider ones); an output limit (a * length + b) past the table is cut
  to it with a warning; scoring cuts sources and targets alike, with a warning naming each."""
  model = make_model(40, positions="learned", max_len=12)
  graphdef, params = nnx.split(model)
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
  translator = Translator(model.cfg, graphdef, types.SimpleNamespace(special=SPECIAL), mesh, beam_size=1,
                          max_len_a=1.0, max_len_b=4, batch_size=2, workers=1, params=params)
  long, short, middle = [5] * 20 + [EOS], [6, 7, EOS], [8] * 9 + [EOS]
  outputs, _ = translator._translate_ids(params, [long, short, middle], False, lines=[1, 2, 3])
  err = capsys.readouterr().err
  assert ("line 1: 21 tokens, longer than the model takes: translating its first 12 (config.model.max_len, the "
          "learned position table)") in err
  for line, length in ((1, 12), (3, 10)):  # 12 + 4 and 10 + 4 outputs: more than the table holds
    assert f"line {line}: {length} tokens: its translation is cut at 12 tokens (config.model.max_len" in err
  assert "line 2" not in err and all(len(best[0]) < 12 for best in outputs)
  target = [9, 10, 11, EOS]
  cut = long[:11] + [EOS]
  assert translator.score_ids(params, [long], [target]) == translator.score_ids(params, [cut], [target])
  assert "line 1: 21 tokens, longer than the model takes: translating its first 12" in capsys.readouterr().err
  long_target = [9] * 12 + [EOS]
  assert translator.score_ids(params, [short, short], [target, long_target]) == translator.score_ids(
      params, [short, short], [target, long_target[:11] + [EOS]])
  assert ("reference line 2: 13 tokens, longer than the model takes: scoring its first 12 (config.model.max_len, the "
          "learned position table)") in capsys.readouterr().err
