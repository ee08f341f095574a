"""Search: greedy decoding, sampling and beam search (GNMT length penalty) on a decode step.

A *stepper* turns the model into `init(src_bs) -> state` and `step(tokens_x, state) ->
(logits_xv, state)`, the state a `DecoderState` (seq2seq/model/transformer.py) in two parts:
`rows`, one entry per output row, and `sentences`, one per sentence (what depends only on
the source). `cached` keeps the self-attention keys/values of past tokens (rows) and the
cross-attention keys/values of the source (sentences): the fast path; `uncached` reruns the
decoder over the whole prefix each step (the reference it must equal); `ensemble` makes
several models one stepper (the mean of their next-token probabilities; its rows and
sentences are tuples of the models'). Beam search copies a sentence's rows to its k beams
and reorders them with the beams; its sentences' entries stay one copy for the k beams.

  tokens_bl = search(model, src_bs, limits_b, beam_size=4, alpha=0.6, max_len=L)
  tokens_bl = search([model_a, model_b], ...)  # an ensemble

`sample` draws outputs instead (`Sampling`: temperature, top-k, top-p; seeded per sentence):

  tokens_bl, logp_b = search(model, src_bs, limits_b, ..., sampling=Sampling(top_p=0.9, seed=1))

Output rows hold the generated tokens: eos ends a hypothesis, padding follows it (the ids:
`tokens`, a `SpecialTokens` that comes from the tokenizer). Each search is a while loop on
a typed state (`GreedyState`, `SampleState`, `BeamState`). A sentence stops as soon as its
result is certain, and `compact=(n, ...)` moves a batch's unfinished sentences into a batch
of n once they fit, so finished ones cost nothing (`_loop`); neither changes an output.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from flax import struct

from seq2seq.errors import ConfigError
from seq2seq.inference.settings import Sampling
from seq2seq.model.transformer import DecoderState
from seq2seq.special_tokens import SPECIAL, SpecialTokens

NEG_INF = -1.0e9  # a score no hypothesis can have; finite so that sums stay ordered


class Stepper(NamedTuple):
  init: Callable[[jax.Array], DecoderState]  # src_bs -> state
  step: Callable[[jax.Array, DecoderState], tuple[jax.Array, DecoderState]]  # (tokens_x, state) -> (logits_xv, state)


def cached(model, max_len: int, tokens: SpecialTokens = SPECIAL) -> Stepper:
  """Incremental decoding with the model's key/value cache."""
  def init(src_bs):
    segments_bs = (src_bs != tokens.pad).astype(jnp.int32)
    return model.init_cache(model.encode(src_bs, src_segments_bs=segments_bs), segments_bs, max_len)

  return Stepper(init, model.decode_step)


def uncached(model, max_len: int, tokens: SpecialTokens = SPECIAL) -> Stepper:
  """Reruns the decoder over the whole prefix at every step (no cache): slow, for reference.
  Rows: {"prefix_bl": the tokens so far}; sentences: {"enc_bsd", "segments_bs"} of the source."""
  def init(src_bs):
    segments_bs = (src_bs != tokens.pad).astype(jnp.int32)
    prefix_bl = jnp.zeros((src_bs.shape[0], max_len), jnp.int32)
    enc_bsd = model.encode(src_bs, src_segments_bs=segments_bs)
    return DecoderState(index=jnp.zeros((), jnp.int32), rows={"prefix_bl": prefix_bl},
                        sentences={"enc_bsd": enc_bsd, "segments_bs": segments_bs})

  def step(tokens_b, state):
    prefix_bl = state.rows["prefix_bl"].at[:, state.index].set(tokens_b)
    ones_bl = jnp.ones_like(prefix_bl)  # later positions are hidden by the causal mask
    beams = prefix_bl.shape[0] // state.sentences["enc_bsd"].shape[0]
    enc_bsd, segments_bs = (jnp.repeat(state.sentences[k], beams, axis=0) for k in ("enc_bsd", "segments_bs"))
    logits_blv = model.decode(prefix_bl, enc_bsd, segments_bs, tgt_segments_bt=ones_bl, logits_dtype="float32")
    logits_bv = jax.lax.dynamic_index_in_dim(logits_blv, state.index, axis=1, keepdims=False)
    return logits_bv, state.replace(index=state.index + 1, rows={"prefix_bl": prefix_bl})

  return Stepper(init, step)


def ensemble(steppers: Sequence[Stepper]) -> Stepper:
  """Several models as one, as fairseq ensembles them: the next-token distribution is the mean
  of the models' probabilities (returned as log-probabilities). The state's rows and sentences
  are tuples of each model's own. The models must share the target vocabulary. One model is
  returned as is."""
  steppers = tuple(steppers)
  if len(steppers) == 1:
    return steppers[0]

  def join(states):
    return DecoderState(states[0].index, tuple(s.rows for s in states), tuple(s.sentences for s in states))

  def step(tokens_b, state):
    members = [DecoderState(state.index, rows, sentences) for rows, sentences in zip(state.rows, state.sentences)]
    outs = [s.step(tokens_b, member) for s, member in zip(steppers, members)]
    logp_mbv = jnp.stack([jax.nn.log_softmax(logits_bv.astype(jnp.float32), axis=-1) for logits_bv, _ in outs])
    return jax.nn.logsumexp(logp_mbv, axis=0) - jnp.log(float(len(steppers))), join([state for _, state in outs])

  return Stepper(lambda src_bs: join([s.init(src_bs) for s in steppers]), step)


def _map_rows(state: DecoderState, f) -> DecoderState:
  """`state` with f applied to each of its rows' arrays (its sentences' stay)."""
  return state.replace(rows=jax.tree.map(f, state.rows))


def gather_beams(state: DecoderState, origin_bk) -> DecoderState:
  """Reorders the rows [b * k, ...] of `state` so that beam j holds beam origin_bk[:, j]'s."""
  b, k = origin_bk.shape
  flat = (jnp.arange(b)[:, None] * k + origin_bk).reshape(-1)
  return _map_rows(state, lambda x: jnp.take(x, flat, axis=0))


def length_penalty(length, alpha: float):
  """GNMT (Wu et al. 2016): ((5 + length) / 6) ** alpha; a hypothesis scores log p / penalty."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def output_limits(src_lengths_b, max_len_a: float, max_len_b: int, max_len: int):
  """Longest output (eos included) per sentence: a * source length + b, at most `max_len`."""
  limits = jnp.floor(max_len_a * src_lengths_b.astype(jnp.float32)).astype(jnp.int32) + max_len_b
  return jnp.clip(limits, 1, max_len)


def _log_probs(logits_xv, t, limits_x, min_len: int, tokens: SpecialTokens):
  """Log-probabilities of output token t + 1 with the length rules applied: never padding;
  no eos before `min_len` tokens; only eos once the row's limit is reached (the limit wins)."""
  logp_xv = jax.nn.log_softmax(logits_xv.astype(jnp.float32), axis=-1)
  is_eos_v = jnp.arange(logp_xv.shape[-1]) == tokens.eos
  length = t + 1  # the hypothesis' length once this token is added
  force_eos_x = length >= limits_x
  no_eos_x = (length < min_len) & ~force_eos_x
  banned_xv = (jnp.arange(logp_xv.shape[-1]) == tokens.pad)[None, :]
  banned_xv = banned_xv | (is_eos_v[None, :] & no_eos_x[:, None]) | (~is_eos_v[None, :] & force_eos_x[:, None])
  return jnp.where(banned_xv, NEG_INF, logp_xv)


@struct.dataclass
class GreedyState:
  """The loop state of greedy search: one output per row."""

  t: jax.Array  # []: tokens generated so far; tokens_bl[:, t] is the last
  tokens_bl: jax.Array  # [b, max_len + 1] int32: bos, the output so far, then padding
  done_b: jax.Array  # [b] bool: the output ended with eos
  logp_b: jax.Array  # [b] f32: its log-probability
  decoder: DecoderState  # the stepper's state: rows [b, ...], sentences [b, ...]


@struct.dataclass
class SampleState(GreedyState):
  """The loop state of sampling: greedy search's, and each row's PRNG key."""

  keys_b2: jax.Array  # [b, 2] uint32: each row's PRNG key data; step t draws with fold_in(key, t)


def greedy(stepper: Stepper, src_bs, limits_b, *, max_len: int, min_len: int = 0, tokens: SpecialTokens = SPECIAL,
           compact: Sequence[int] = ()):
  """Most likely token at each step. Returns (tokens [b, max_len], log-probabilities [b]).
  `compact`: see `beam_search`."""
  return _one_per_row(stepper, src_bs, limits_b, GreedyState, lambda logp_bv, s: jnp.argmax(logp_bv, axis=-1),
                      max_len=max_len, min_len=min_len, tokens=tokens, compact=compact)


def _one_per_row(stepper: Stepper, src_bs, limits_b, state_type, pick, *, max_len: int, min_len: int,
                 tokens: SpecialTokens, compact: Sequence[int], **fields):
  """Greedy search or sampling: each step extends every row that has not ended (with eos) by
  the token `pick(logp_bv, state)` chooses. Returns (tokens [b, max_len], log-probabilities [b]);
  b is that of limits_b (`draw`'s stepper makes several rows of each sentence in src_bs)."""
  b = jnp.shape(limits_b)[0]
  tokens_bl = jnp.full((b, max_len + 1), tokens.pad, jnp.int32).at[:, 0].set(tokens.bos)
  state = state_type(t=jnp.int32(0), tokens_bl=tokens_bl, done_b=jnp.zeros((b,), bool),
                     logp_b=jnp.zeros((b,), jnp.float32), decoder=stepper.init(src_bs), **fields)

  def body(s, limits_b):
    logits_bv, decoder = stepper.step(s.tokens_bl[:, s.t], s.decoder)
    logp_bv = _log_probs(logits_bv, s.t, limits_b, min_len, tokens)
    next_b = pick(logp_bv, s).astype(jnp.int32)
    logp_b = s.logp_b + jnp.where(s.done_b, 0.0, jnp.take_along_axis(logp_bv, next_b[:, None], axis=1)[:, 0])
    next_b = jnp.where(s.done_b, tokens.pad, next_b)  # finished rows are never extended
    return s.replace(t=s.t + 1, tokens_bl=s.tokens_bl.at[:, s.t + 1].set(next_b),
                     done_b=s.done_b | (next_b == tokens.eos), logp_b=logp_b, decoder=decoder)

  s = _loop(state, limits_b, lambda s, limits_b: ~s.done_b, body, max_len, tuple(compact), beams=1)
  return s.tokens_bl[:, 1:], s.logp_b


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
           tokens: SpecialTokens = SPECIAL, compact: Sequence[int] = ()):
  """One drawn output per row: (tokens [b, max_len], log-probabilities [b] under the model,
  length rules applied). `keys_b2`: each row's PRNG key data; step t draws with
  fold_in(key, t). `compact`: see `beam_search`."""
  def pick(logp_bv, s):
    keys = jax.vmap(lambda k: jax.random.fold_in(jax.random.wrap_key_data(k), s.t))(s.keys_b2)
    return jax.vmap(jax.random.categorical)(keys, filtered_logits(logp_bv, sampling))

  return _one_per_row(stepper, src_bs, limits_b, SampleState, pick, max_len=max_len, min_len=min_len, tokens=tokens,
                      compact=compact, keys_b2=keys_b2)


def sentence_keys(seed, ids_b, samples: int):
  """PRNG key data [b * samples, 2]: sample j of sentence ids_b[i] draws from
  fold_in(fold_in(key(seed), ids_b[i]), j), whatever batch it is in."""
  def one(i):
    key = jax.random.fold_in(jax.random.key(seed), i)
    return jax.vmap(lambda j: jax.random.key_data(jax.random.fold_in(key, j)))(jnp.arange(samples))

  return jax.vmap(one)(ids_b).reshape(-1, 2)


def _loop(state, limits_b, active, body, max_len: int, compact: tuple[int, ...], *, beams: int):
  """`while t < max_len and a sentence is active: state = body(state)` on a search state: its
  `t`, its `decoder` and search arrays with the sentences first. With `compact` = (n, ...),
  once at most n sentences are active they move into a batch of n (`_take_sentences`) and the
  loop goes on there, so finished sentences cost nothing; their search arrays are written
  back. Each sentence's steps are unchanged."""
  limits_b = jnp.asarray(limits_b)
  b = limits_b.shape[0]
  n = next((n for n in compact if n < b), 0)
  cond = lambda s: (s.t < max_len) & (jnp.sum(active(s, limits_b)) > n)
  state = jax.lax.while_loop(cond, lambda s: body(s, limits_b), state)
  if not n:
    return state
  pick_n = jnp.argsort(~active(state, limits_b), stable=True)[:n]  # the active sentences first
  sub = _loop(_take_sentences(state, pick_n, beams), limits_b[pick_n], active, body, max_len,
              tuple(c for c in compact if c < n), beams=beams)
  arrays = jax.tree.map(lambda full, part: full.at[pick_n].set(part), _search_arrays(state), _search_arrays(sub))
  return arrays.replace(t=sub.t, decoder=state.decoder)


def _search_arrays(state):
  """The search state without `t` and `decoder`: the arrays with the sentences first."""
  return state.replace(t=None, decoder=None)


def _take_sentences(state, pick_n, beams: int):
  """The search state of sentences pick_n: their search arrays, their decoder rows (`beams`
  consecutive rows a sentence) and decoder sentences."""
  rows = (pick_n[:, None] * beams + jnp.arange(beams)).reshape(-1)
  decoder = _map_rows(state.decoder, lambda x: jnp.take(x, rows, axis=0))
  decoder = decoder.replace(sentences=jax.tree.map(lambda x: jnp.take(x, pick_n, axis=0), decoder.sentences))
  return jax.tree.map(lambda x: x[pick_n], _search_arrays(state)).replace(t=state.t, decoder=decoder)


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


@struct.dataclass
class BeamState:
  """The loop state of beam search: k alive and k finished hypotheses per sentence."""

  t: jax.Array  # []: tokens generated so far; seqs_bkl[:, :, t] is the last
  seqs_bkl: jax.Array  # [b, k, max_len + 1] int32: alive hypotheses (bos, tokens, then padding)
  alive_bk: jax.Array  # [b, k] f32: their log-probabilities, best first (NEG_INF: an empty slot)
  fin_seqs_bkl: jax.Array  # [b, k, max_len + 1] int32: the best finished hypotheses, best first
  fin_scores_bk: jax.Array  # [b, k] f32: their length-normalised scores (NEG_INF: an empty slot)
  decoder: DecoderState  # the stepper's state: rows [b * k, ...] (sentence i's beams at i * k ...), sentences [b, ...]


def beam_search(stepper: Stepper, src_bs, limits_b, *, beam_size: int, alpha: float, max_len: int,
                min_len: int = 0, tokens: SpecialTokens = SPECIAL, final: int | None = None,
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
  pad_bkl = jnp.full((b, k, max_len + 1), tokens.pad, jnp.int32)
  # Each sentence is encoded once; its rows are copied to its k beams, its sentences' entries shared.
  state = BeamState(t=jnp.int32(0), seqs_bkl=pad_bkl.at[:, :, 0].set(tokens.bos),
                    alive_bk=jnp.full((b, k), NEG_INF).at[:, 0].set(0.0),  # one live start per sentence
                    fin_seqs_bkl=pad_bkl, fin_scores_bk=jnp.full((b, k), NEG_INF),
                    decoder=_map_rows(stepper.init(src_bs), lambda x: jnp.repeat(x, k, axis=0)))

  def active(s, limits_b):
    best_alive_b = jnp.max(s.alive_bk, axis=1)
    improvable_b = best_alive_b / length_penalty(limits_b, alpha) >= s.fin_scores_bk[:, final - 1]  # sorted
    return improvable_b & (best_alive_b > NEG_INF / 2)  # a row past its limit is done

  def body(s, limits_b):
    b = limits_b.shape[0]
    logits_xv, decoder = stepper.step(s.seqs_bkl[:, :, s.t].reshape(-1), s.decoder)
    logp_bkv = _log_probs(logits_xv, s.t, jnp.repeat(limits_b, k), min_len, tokens).reshape(b, k, -1)
    vocab = logp_bkv.shape[-1]
    # 2k candidates always include the k best that do not end in eos.
    cand_logp_bc, flat_bc = top_k((s.alive_bk[:, :, None] + logp_bkv).reshape(b, k * vocab), 2 * k)
    origin_bc, token_bc = flat_bc // vocab, (flat_bc % vocab).astype(jnp.int32)
    cand_seqs_bcl = _take(s.seqs_bkl, origin_bc).at[:, :, s.t + 1].set(token_bc)
    ends_bc = token_bc == tokens.eos
    alive_bk, keep_bk = jax.lax.top_k(jnp.where(ends_bc, NEG_INF, cand_logp_bc), k)
    # Like fairseq, a hypothesis ending in eos finishes only if it ranks in the top k (so
    # beam 1 is greedy search); continuations of empty beam slots never count.
    real_bc = ends_bc & (jnp.arange(2 * k) < k)[None, :] & (cand_logp_bc > NEG_INF / 2)
    new_scores_bc = jnp.where(real_bc, cand_logp_bc / length_penalty(s.t + 1, alpha), NEG_INF)
    fin_scores_bk, pick_bk = jax.lax.top_k(jnp.concatenate([s.fin_scores_bk, new_scores_bc], axis=1), k)
    return BeamState(t=s.t + 1, seqs_bkl=_take(cand_seqs_bcl, keep_bk), alive_bk=alive_bk,
                     fin_seqs_bkl=_take(jnp.concatenate([s.fin_seqs_bkl, cand_seqs_bcl], axis=1), pick_bk),
                     fin_scores_bk=fin_scores_bk, decoder=gather_beams(decoder, _take(origin_bc, keep_bk)))

  s = _loop(state, limits_b, active, body, max_len, tuple(compact), beams=k)
  return s.fin_seqs_bkl[:, :, 1:], s.fin_scores_bk


def search(model, src_bs, limits_b, *, beam_size: int, alpha: float, max_len: int, min_len: int = 0,
           use_cache: bool = True, compact: Sequence[int] = (), nbest: int = 1, sampling: Sampling | None = None,
           ids_b=None, seed=None, tokens: SpecialTokens = SPECIAL):
  """(tokens [b, max_len], scores [b]) of the best output per sentence: its tokens end with eos,
  then padding; its score is the sum of its log-probabilities, divided by the GNMT length
  penalty for beam > 1. Beam 1 is greedy. `model` may be a list of models sharing the
  vocabulary: their ensemble is searched. A sentence stops once its best output is certain;
  `compact` (see `beam_search`) moves the unfinished ones into smaller batches.
  `nbest` > 1 (at most `beam_size`): the `nbest` best finished hypotheses, best first,
  (tokens [b, nbest, max_len], scores [b, nbest]); the search goes on until all of them are
  certain, so the first is the 1-best exactly.
  `sampling`: draw `nbest` outputs per sentence instead (`draw`); the beam size plays no part.
  `tokens`: the special token ids (the tokenizer's `special`)."""
  models = list(model) if isinstance(model, (list, tuple)) else [model]
  stepper = ensemble([(cached if use_cache else uncached)(m, max_len, tokens) for m in models])
  rules = dict(max_len=max_len, min_len=min_len, tokens=tokens)
  if sampling is not None:
    return draw(stepper, src_bs, limits_b, sampling, nbest=nbest, ids_b=ids_b, seed=seed, compact=compact, **rules)
  if not 1 <= nbest <= beam_size:
    raise ConfigError(f"nbest={nbest} must be between 1 and the beam size ({beam_size})")
  if beam_size == 1:
    return greedy(stepper, src_bs, limits_b, compact=compact, **rules)
  tokens_bkl, scores_bk = beam_search(stepper, src_bs, limits_b, beam_size=beam_size, alpha=alpha, final=nbest,
                                      compact=compact, **rules)
  return (tokens_bkl[:, 0], scores_bk[:, 0]) if nbest == 1 else (tokens_bkl[:, :nbest], scores_bk[:, :nbest])


def draw(stepper: Stepper, src_bs, limits_b, sampling: Sampling, *, nbest: int, ids_b=None, seed=None,
         compact: Sequence[int] = (), **rules):
  """`nbest` sampled outputs per sentence, most likely first: (tokens [b, max_len], log-probabilities
  [b]) for nbest 1, else (tokens [b, nbest, max_len], log-probabilities [b, nbest]). `ids_b`:
  each sentence's number, which with the seed decides its draws; `seed` overrides
  `sampling.seed`, and may be traced. `rules`: max_len, min_len and tokens, as `sample` takes them."""
  b = src_bs.shape[0]
  keys_x2 = sentence_keys(sampling.seed if seed is None else seed, jnp.arange(b) if ids_b is None else ids_b, nbest)
  copies = lambda x: jnp.repeat(x, nbest, axis=0)

  def init(src_bs):  # each sentence is encoded once; its nbest rows start from copies of its state
    state = stepper.init(src_bs)
    return state.replace(rows=jax.tree.map(copies, state.rows), sentences=jax.tree.map(copies, state.sentences))

  tokens_xl, logp_x = sample(stepper._replace(init=init), src_bs, copies(jnp.asarray(limits_b)), keys_x2,
                             sampling=sampling.check(), compact=[n * nbest for n in compact], **rules)
  if nbest == 1:
    return tokens_xl, logp_x
  logp_bn, order_bn = jax.lax.top_k(logp_x.reshape(b, nbest), nbest)
  return jnp.take_along_axis(tokens_xl.reshape(b, nbest, -1), order_bn[:, :, None], axis=1), logp_bn
