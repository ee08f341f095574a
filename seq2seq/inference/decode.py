"""Search: greedy decoding and beam search (GNMT length penalty) on a decode step.

A *stepper* turns the model into `init(src_bs) -> state` and `step(tokens_b, state) ->
(logits_bv, state)`. `cached` keeps the self-attention keys/values of past tokens and
the cross-attention keys/values of the source (the fast path); `uncached` reruns the
decoder over the whole prefix each step (the reference it must equal); `ensemble` makes
several models one stepper (the mean of their next-token probabilities). Every state array
whose leading axis is the batch is gathered by beam index; entries whose name contains
"cross" depend only on the source, so beam search keeps one copy per sentence for its k
beams and never gathers them.

  tokens_bl = search(model, src_bs, limits_b, beam_size=4, alpha=0.6, max_len=L)
  tokens_bl = search([model_a, model_b], ...)  # an ensemble

`sample` draws outputs instead (`Sampling`: temperature, top-k, top-p; seeded per sentence):

  tokens_bl, logp_b = search(model, src_bs, limits_b, ..., sampling=Sampling(top_p=0.9, seed=1))

Output rows hold the generated tokens: eos ends a hypothesis, padding follows it. A
sentence stops as soon as its result is certain, and `compact=(n, ...)` moves a batch's
unfinished sentences into a batch of n once they fit, so finished ones cost nothing
(`_loop`); neither changes an output.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from seq2seq.errors import ConfigError

NEG_INF = -1.0e9  # a score no hypothesis can have; finite so that sums stay ordered


class Stepper(NamedTuple):
  init: Callable[[jax.Array], Any]  # src_bs -> state
  step: Callable[[jax.Array, Any], tuple[jax.Array, Any]]  # (tokens_b, state) -> (logits_bv, state)


def cached(model, max_len: int) -> Stepper:
  """Incremental decoding with the model's key/value cache."""
  def init(src_bs):
    segments_bs = (src_bs != model.cfg.pad_id).astype(jnp.int32)
    return model.init_cache(model.encode(src_bs, src_segments_bs=segments_bs), segments_bs, max_len)

  return Stepper(init, model.decode_step)


def uncached(model, max_len: int) -> Stepper:
  """Reruns the decoder over the whole prefix at every step (no cache): slow, for reference."""
  def init(src_bs):
    segments_bs = (src_bs != model.cfg.pad_id).astype(jnp.int32)
    return {"index": jnp.zeros((), jnp.int32), "prefix_bl": jnp.zeros((src_bs.shape[0], max_len), jnp.int32),
            "cross_enc_bsd": model.encode(src_bs, src_segments_bs=segments_bs), "cross_segments_bs": segments_bs}

  def step(tokens_b, state):
    index = state["index"]
    prefix_bl = state["prefix_bl"].at[:, index].set(tokens_b)
    ones_bl = jnp.ones_like(prefix_bl)  # later positions are hidden by the causal mask
    beams = prefix_bl.shape[0] // state["cross_enc_bsd"].shape[0]
    enc_bsd, segments_bs = (jnp.repeat(state[k], beams, axis=0) for k in ("cross_enc_bsd", "cross_segments_bs"))
    logits_blv = model.decode(prefix_bl, enc_bsd, segments_bs, tgt_segments_bt=ones_bl)
    logits_bv = jax.lax.dynamic_index_in_dim(logits_blv, index, axis=1, keepdims=False)
    return logits_bv, state | {"index": index + 1, "prefix_bl": prefix_bl}

  return Stepper(init, step)


def ensemble(steppers: Sequence[Stepper]) -> Stepper:
  """Several models as one, as fairseq ensembles them: the next-token distribution is the mean
  of the models' probabilities (returned as log-probabilities); the state is a tuple with
  each model's own. The models must share the target vocabulary. One model is returned as is."""
  steppers = tuple(steppers)
  if len(steppers) == 1:
    return steppers[0]

  def init(src_bs):
    return tuple(s.init(src_bs) for s in steppers)

  def step(tokens_b, states):
    outs = [s.step(tokens_b, state) for s, state in zip(steppers, states)]
    logp_mbv = jnp.stack([jax.nn.log_softmax(logits_bv.astype(jnp.float32), axis=-1) for logits_bv, _ in outs])
    return jax.nn.logsumexp(logp_mbv, axis=0) - jnp.log(float(len(steppers))), tuple(state for _, state in outs)

  return Stepper(init, step)


def length_penalty(length, alpha: float):
  """GNMT (Wu et al. 2016): ((5 + length) / 6) ** alpha; a hypothesis scores log p / penalty."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def output_limits(src_lengths_b, max_len_a: float, max_len_b: int, max_len: int):
  """Longest output (eos included) per sentence: a * source length + b, at most `max_len`."""
  limits = jnp.floor(max_len_a * src_lengths_b.astype(jnp.float32)).astype(jnp.int32) + max_len_b
  return jnp.clip(limits, 1, max_len)


def _log_probs(logits_xv, t, limits_x, min_len: int, pad_id: int, eos_id: int):
  """Log-probabilities of output token t + 1 with the length rules applied: never padding;
  no eos before `min_len` tokens; only eos once the row's limit is reached (the limit wins)."""
  logp_xv = jax.nn.log_softmax(logits_xv.astype(jnp.float32), axis=-1)
  is_eos_v = jnp.arange(logp_xv.shape[-1]) == eos_id
  length = t + 1  # the hypothesis' length once this token is added
  force_eos_x = length >= limits_x
  no_eos_x = (length < min_len) & ~force_eos_x
  banned_xv = (jnp.arange(logp_xv.shape[-1]) == pad_id)[None, :]
  banned_xv = banned_xv | (is_eos_v[None, :] & no_eos_x[:, None]) | (~is_eos_v[None, :] & force_eos_x[:, None])
  return jnp.where(banned_xv, NEG_INF, logp_xv)


def greedy(stepper: Stepper, src_bs, limits_b, *, max_len: int, min_len: int = 0, bos_id: int = 1,
           eos_id: int = 1, pad_id: int = 0, compact: Sequence[int] = ()):
  """Most likely token at each step. Returns (tokens [b, max_len], log-probabilities [b]).
  `compact`: see `beam_search`."""
  b = src_bs.shape[0]
  tokens_bl = jnp.full((b, max_len + 1), pad_id, jnp.int32).at[:, 0].set(bos_id)

  def active(carry, limits_b):
    return ~carry[1][1]

  def body(carry, limits_b):
    t, (tokens_bl, done_b, logp_b), state = carry
    logits_bv, state = stepper.step(tokens_bl[:, t], state)
    logp_bv = _log_probs(logits_bv, t, limits_b, min_len, pad_id, eos_id)
    next_b = jnp.argmax(logp_bv, axis=-1).astype(jnp.int32)
    logp_b = logp_b + jnp.where(done_b, 0.0, jnp.max(logp_bv, axis=-1))
    next_b = jnp.where(done_b, pad_id, next_b)  # finished rows are never extended
    tokens_bl = tokens_bl.at[:, t + 1].set(next_b)
    return t + 1, (tokens_bl, done_b | (next_b == eos_id), logp_b), state

  search_b = (tokens_bl, jnp.zeros((b,), bool), jnp.zeros((b,), jnp.float32))
  carry = (jnp.int32(0), search_b, stepper.init(src_bs))
  _, (tokens_bl, _, logp_b), _ = _loop(carry, limits_b, active, body, max_len, tuple(compact), beams=1)
  return tokens_bl[:, 1:], logp_b


class Sampling(NamedTuple):
  """Ancestral sampling instead of search: each next token is drawn from the model's
  distribution with the length rules applied, sharpened or flattened by `temperature`, kept
  to the `top_k` most likely tokens (0: all) and to the smallest set whose probability
  reaches `top_p` (1: all; Holtzman et al. 2020). Draws follow `seed` and each sentence's
  number, so they do not depend on batching."""
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0

  def check(self) -> Sampling:
    if not self.temperature > 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
      raise ConfigError(f"sampling needs temperature > 0, top_k >= 0 and 0 < top_p <= 1, got {self.temperature}, "
                        f"{self.top_k} and {self.top_p}")
    return self


def filtered_logits(logp_xv, sampling: Sampling):
  """What a token is drawn from: log-probabilities / temperature, outside the top-k and the
  top-p nucleus set to NEG_INF (the most likely token is always kept)."""
  x_xv = logp_xv / sampling.temperature
  if sampling.top_k:
    kth_x = jax.lax.top_k(x_xv, min(sampling.top_k, x_xv.shape[-1]))[0][:, -1]
    x_xv = jnp.where(x_xv < kth_x[:, None], NEG_INF, x_xv)
  if sampling.top_p < 1.0:
    sorted_xv = jnp.sort(x_xv, axis=-1)[:, ::-1]
    p_xv = jax.nn.softmax(sorted_xv, axis=-1)
    before_xv = jnp.cumsum(p_xv, axis=-1) - p_xv  # probability of the more likely tokens
    cut_x = jnp.min(jnp.where(before_xv < sampling.top_p, sorted_xv, jnp.inf), axis=-1)  # least likely one kept
    x_xv = jnp.where(x_xv < cut_x[:, None], NEG_INF, x_xv)
  return x_xv


def sample(stepper: Stepper, src_bs, limits_b, keys_b2, *, max_len: int, sampling: Sampling, min_len: int = 0,
           bos_id: int = 1, eos_id: int = 1, pad_id: int = 0, compact: Sequence[int] = ()):
  """One drawn output per row: (tokens [b, max_len], log-probabilities [b] under the model,
  length rules applied). `keys_b2`: each row's PRNG key data; step t draws with
  fold_in(key, t). `compact`: see `beam_search`."""
  b = src_bs.shape[0]
  tokens_bl = jnp.full((b, max_len + 1), pad_id, jnp.int32).at[:, 0].set(bos_id)

  def active(carry, limits_b):
    return ~carry[1][1]

  def body(carry, limits_b):
    t, (tokens_bl, done_b, logp_b, keys_b2), state = carry
    logits_bv, state = stepper.step(tokens_bl[:, t], state)
    logp_bv = _log_probs(logits_bv, t, limits_b, min_len, pad_id, eos_id)
    keys = jax.vmap(lambda k: jax.random.fold_in(jax.random.wrap_key_data(k), t))(keys_b2)
    next_b = jax.vmap(jax.random.categorical)(keys, filtered_logits(logp_bv, sampling)).astype(jnp.int32)
    logp_b = logp_b + jnp.where(done_b, 0.0, jnp.take_along_axis(logp_bv, next_b[:, None], axis=1)[:, 0])
    next_b = jnp.where(done_b, pad_id, next_b)
    tokens_bl = tokens_bl.at[:, t + 1].set(next_b)
    return t + 1, (tokens_bl, done_b | (next_b == eos_id), logp_b, keys_b2), state

  search_b = (tokens_bl, jnp.zeros((b,), bool), jnp.zeros((b,), jnp.float32), keys_b2)
  carry = (jnp.int32(0), search_b, stepper.init(src_bs))
  _, (tokens_bl, _, logp_b, _), _ = _loop(carry, limits_b, active, body, max_len, tuple(compact), beams=1)
  return tokens_bl[:, 1:], logp_b


def sentence_keys(seed, ids_b, samples: int):
  """PRNG key data [b * samples, 2]: sample j of sentence ids_b[i] draws from
  fold_in(fold_in(key(seed), ids_b[i]), j), whatever batch it is in."""
  def one(i):
    key = jax.random.fold_in(jax.random.key(seed), i)
    return jax.vmap(lambda j: jax.random.key_data(jax.random.fold_in(key, j)))(jnp.arange(samples))

  return jax.vmap(one)(ids_b).reshape(-1, 2)


def _loop(carry, limits_b, active, body, max_len: int, compact: tuple[int, ...], *, beams: int):
  """`while t < max_len and a sentence is active: carry = body(carry)` on a carry
  (t, search arrays [b, ...], stepper state). With `compact` = (n, ...), once at most n
  sentences are active they move into a batch of n (the state is gathered: rows of beams,
  one "cross" entry per sentence) and the loop goes on there, so finished sentences cost
  nothing; their search arrays are written back. Each sentence's steps are unchanged."""
  limits_b = jnp.asarray(limits_b)
  b = limits_b.shape[0]
  n = next((n for n in compact if n < b), 0)
  cond = lambda c: (c[0] < max_len) & (jnp.sum(active(c, limits_b)) > n)
  carry = jax.lax.while_loop(cond, lambda c: body(c, limits_b), carry)
  if not n:
    return carry
  t, search_b, state = carry
  pick_n = jnp.argsort(~active(carry, limits_b), stable=True)[:n]  # the active sentences first
  rows = (pick_n[:, None] * beams + jnp.arange(beams)).reshape(-1)

  def take(path, x):
    return x if jnp.ndim(x) == 0 else jnp.take(x, pick_n if _shared(path) else rows, axis=0)

  sub = (t, jax.tree.map(lambda x: x[pick_n], search_b), jax.tree_util.tree_map_with_path(take, state))
  t, sub_search, _ = _loop(sub, limits_b[pick_n], active, body, max_len, tuple(c for c in compact if c < n),
                           beams=beams)
  return t, jax.tree.map(lambda full, part: full.at[pick_n].set(part), search_b, sub_search), state


def gather_beams(tree, origin_bk):
  """Reorders every [b * k, ...] array of `tree` so that beam j holds beam origin_bk[:, j]'s state."""
  b, k = origin_bk.shape
  flat = (jnp.arange(b)[:, None] * k + origin_bk).reshape(-1)

  def one(path, x):
    return x if jnp.ndim(x) == 0 or _shared(path) else jnp.take(x, flat, axis=0)

  return jax.tree_util.tree_map_with_path(one, tree)


def _shared(path) -> bool:
  """State entries that depend only on the source: one copy per sentence, not per beam."""
  return "cross" in jax.tree_util.keystr(path)


def top_k(x_bn, k: int, block: int = 256):
  """`jax.lax.top_k` over the last axis, exact and several times faster on CPU for large n:
  the k largest values lie in the k blocks with the largest maxima, so only those are sorted."""
  b, n = x_bn.shape
  if n <= 4 * block or k * block >= n:
    return jax.lax.top_k(x_bn, k)
  pad = -n % block
  blocks_bmc = jnp.pad(x_bn, ((0, 0), (0, pad)), constant_values=-jnp.inf).reshape(b, -1, block)
  _, best_bk = jax.lax.top_k(jnp.max(blocks_bmc, axis=-1), k)
  cand_bkc = jnp.take_along_axis(blocks_bmc, best_bk[:, :, None], axis=1).reshape(b, k * block)
  values_bk, j_bk = jax.lax.top_k(cand_bkc, k)
  return values_bk, jnp.take_along_axis(best_bk, j_bk // block, axis=1) * block + j_bk % block


def _take(x_bk, idx_bj):
  """x[b, idx[b, j]] for arrays shaped [b, k, ...]."""
  idx = idx_bj.reshape(idx_bj.shape + (1,) * (x_bk.ndim - 2))
  return jnp.take_along_axis(x_bk, idx, axis=1)


def beam_search(stepper: Stepper, src_bs, limits_b, *, beam_size: int, alpha: float, max_len: int,
                min_len: int = 0, bos_id: int = 1, eos_id: int = 1, pad_id: int = 0, final: int | None = None,
                compact: Sequence[int] = ()):
  """Beam search with the GNMT length penalty.

  Keeps `beam_size` alive hypotheses and the `beam_size` best finished ones per sentence; a
  hypothesis that emits eos among the k best candidates is finished and never extended.
  A sentence is done when no alive hypothesis is left or none can still enter its `final`
  best finished ones (default: all k). Log-probabilities only fall as tokens are added and
  the penalty is largest at the length limit, so this bound is exact for alpha >= 0: those
  `final` hypotheses are the ones a search to the limit would return. `final=1` (what
  `search` uses) stops as soon as the best one is certain.
  `compact` = (n, ...): once at most n sentences are not done, they go on in a batch of n.
  Returns (tokens [b, k, max_len], scores [b, k]) of the finished hypotheses, best first.
  """
  if alpha < 0:
    raise ConfigError(f"alpha must be >= 0, got {alpha}")
  b, k = src_bs.shape[0], beam_size
  final = k if final is None else final
  if not 1 <= final <= k:
    raise ValueError(f"final must be in [1, beam_size={k}], got {final}")
  # Encode each sentence once; its decoder state is copied to its k beams, the cross entries shared.
  state = jax.tree_util.tree_map_with_path(
      lambda path, x: x if jnp.ndim(x) == 0 or _shared(path) else jnp.repeat(x, k, axis=0), stepper.init(src_bs))
  seqs_bkl = jnp.full((b, k, max_len + 1), pad_id, jnp.int32).at[:, :, 0].set(bos_id)
  alive_bk = jnp.full((b, k), NEG_INF).at[:, 0].set(0.0)  # one live start per sentence
  finished = (jnp.full((b, k, max_len + 1), pad_id, jnp.int32), jnp.full((b, k), NEG_INF))

  def active(carry, limits_b):
    _, (_, alive_bk, _, fin_scores_bk), _ = carry
    best_alive_b = jnp.max(alive_bk, axis=1)
    improvable_b = best_alive_b / length_penalty(limits_b, alpha) >= fin_scores_bk[:, final - 1]  # sorted
    return improvable_b & (best_alive_b > NEG_INF / 2)  # a row past its limit is done

  def body(carry, limits_b):
    t, (seqs_bkl, alive_bk, fin_seqs_bkl, fin_scores_bk), state = carry
    b = limits_b.shape[0]
    logits_xv, state = stepper.step(seqs_bkl[:, :, t].reshape(-1), state)
    logp_bkv = _log_probs(logits_xv, t, jnp.repeat(limits_b, k), min_len, pad_id, eos_id).reshape(b, k, -1)
    vocab = logp_bkv.shape[-1]
    # 2k candidates always include the k best that do not end in eos.
    cand_logp_bc, flat_bc = top_k((alive_bk[:, :, None] + logp_bkv).reshape(b, k * vocab), 2 * k)
    origin_bc, token_bc = flat_bc // vocab, (flat_bc % vocab).astype(jnp.int32)
    cand_seqs_bcl = _take(seqs_bkl, origin_bc).at[:, :, t + 1].set(token_bc)
    ends_bc = token_bc == eos_id
    alive_bk, keep_bk = jax.lax.top_k(jnp.where(ends_bc, NEG_INF, cand_logp_bc), k)
    seqs_bkl = _take(cand_seqs_bcl, keep_bk)
    state = gather_beams(state, _take(origin_bc, keep_bk))
    # Like fairseq, a hypothesis ending in eos finishes only if it ranks in the top k (so
    # beam 1 is greedy search); continuations of empty beam slots never count.
    real_bc = ends_bc & (jnp.arange(2 * k) < k)[None, :] & (cand_logp_bc > NEG_INF / 2)
    new_scores_bc = jnp.where(real_bc, cand_logp_bc / length_penalty(t + 1, alpha), NEG_INF)
    fin_scores_bk, pick_bk = jax.lax.top_k(jnp.concatenate([fin_scores_bk, new_scores_bc], axis=1), k)
    fin_seqs_bkl = _take(jnp.concatenate([fin_seqs_bkl, cand_seqs_bcl], axis=1), pick_bk)
    return t + 1, (seqs_bkl, alive_bk, fin_seqs_bkl, fin_scores_bk), state

  carry = (jnp.int32(0), (seqs_bkl, alive_bk) + finished, state)
  _, (_, _, fin_seqs_bkl, fin_scores_bk), _ = _loop(carry, limits_b, active, body, max_len, tuple(compact), beams=k)
  return fin_seqs_bkl[:, :, 1:], fin_scores_bk


def search(model, src_bs, limits_b, *, beam_size: int, alpha: float, max_len: int, min_len: int = 0,
           use_cache: bool = True, compact: Sequence[int] = (), nbest: int = 1, sampling: Sampling | None = None,
           ids_b=None, seed=None):
  """(tokens [b, max_len], scores [b]) of the best output per sentence: its tokens end with eos,
  then padding; its score is the sum of its log-probabilities, divided by the GNMT length
  penalty for beam > 1. Beam 1 is greedy. `model` may be a list of models sharing the
  vocabulary: their ensemble is searched. A sentence stops once its best output is certain;
  `compact` (see `beam_search`) moves the unfinished ones into smaller batches.
  `nbest` > 1 (at most `beam_size`): the `nbest` best finished hypotheses, best first,
  (tokens [b, nbest, max_len], scores [b, nbest]); the search goes on until all of them are
  certain, so the first is the 1-best exactly.
  `sampling`: draw `nbest` outputs per sentence instead (`Sampling`; `ids_b`: each sentence's
  number, which with the seed decides its draws; `seed` overrides `sampling.seed`, and may be
  traced), most likely first; scores are plain log-probabilities; the beam size plays no part."""
  models = list(model) if isinstance(model, (list, tuple)) else [model]
  if sampling is not None:
    stepper = ensemble([(cached if use_cache else uncached)(m, max_len) for m in models])
    b = src_bs.shape[0]
    keys_x2 = sentence_keys(sampling.seed if seed is None else seed, jnp.arange(b) if ids_b is None else ids_b, nbest)
    tokens_xl, logp_x = sample(stepper, jnp.repeat(src_bs, nbest, axis=0), jnp.repeat(limits_b, nbest), keys_x2,
                               max_len=max_len, min_len=min_len, sampling=sampling.check(),
                               compact=[n * nbest for n in compact], pad_id=models[0].cfg.pad_id)
    if nbest == 1:
      return tokens_xl, logp_x
    logp_bn, order_bn = jax.lax.top_k(logp_x.reshape(b, nbest), nbest)
    return jnp.take_along_axis(tokens_xl.reshape(b, nbest, -1), order_bn[:, :, None], axis=1), logp_bn
  if not 1 <= nbest <= beam_size:
    raise ConfigError(f"nbest={nbest} must be between 1 and the beam size ({beam_size})")
  stepper = ensemble([(cached if use_cache else uncached)(m, max_len) for m in models])
  ids = dict(bos_id=1, eos_id=1, pad_id=models[0].cfg.pad_id)
  if beam_size == 1:
    return greedy(stepper, src_bs, limits_b, max_len=max_len, min_len=min_len, compact=compact, **ids)
  tokens_bkl, scores_bk = beam_search(stepper, src_bs, limits_b, beam_size=beam_size, alpha=alpha, max_len=max_len,
                                      min_len=min_len, final=nbest, compact=compact, **ids)
  return (tokens_bkl[:, 0], scores_bk[:, 0]) if nbest == 1 else (tokens_bkl[:, :nbest], scores_bk[:, :nbest])
