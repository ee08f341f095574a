"""Translating text with a trained model: tokenize, sort by length, decode batches of a few
shapes on the device mesh (at most `max_programs` per call, compiled ahead:
seq2seq/inference/programs.py), detokenize, and return the input order. Also n-best lists,
sampled outputs (decode.Sampling) and the log-probability of given translations (`score`).

  from seq2seq import Translator
  translator = Translator.from_workdir("/tmp/m30k")            # a training run's directory
  translator = Translator.from_pretrained("/tmp/m30k-model")   # a `python -m seq2seq.export` folder
  translator.translate(["A man rides a bike."])                # -> ["Ein Mann fährt Fahrrad."]
  hypotheses, scores = translator.translate(sentences, return_scores=True)

Inside the library the parameters are passed per call (training validates changing ones):

  translator = Translator(model_cfg, graphdef, tok, mesh, beam_size=4, alpha=0.6)
  hypotheses = translator(params, ["A man rides a bike.", ...])

An ensemble passes lists: Translator([cfg_a, cfg_b], [graphdef_a, graphdef_b], ...) and
translator([params_a, params_b], sentences) searches the mean of the models' probabilities.
"""

from __future__ import annotations

import concurrent.futures
import errno
import math
import os
import sys
from collections.abc import Iterable

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from seq2seq import compilation, sharding
from seq2seq.errors import ConfigError, ResourceError
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.inference import decode, inputs
from seq2seq.inference.inputs import Want
from seq2seq.inference.programs import Programs, plan_widths, signature, source_bucket, step_cost, width_for
from seq2seq.inference.progress import Progress
from seq2seq.inference.settings import SearchSettings, check, search_settings  # noqa: F401 - imported from here
from seq2seq.model.config import ModelConfig

# Batches of sources up to this many tokens hold `batch_size` sentences; longer ones hold as
# many source tokens, in fewer sentences (a power of two): one long line cannot make a batch
# that needs more memory than a batch of ordinary ones.
FULL_ROWS_WIDTH = 128
DEFAULT = SearchSettings()


class Translator:
  """Batched, jit-compiled translation of sentences: at most `max_programs` compiled searches
  per call (seq2seq/inference/programs.py; 0: one per source bucket), compiled ahead."""

  def __init__(self, model_cfg: ModelConfig | list[ModelConfig], graphdef, tok: Tokenizer, mesh, *,
               beam_size: int = DEFAULT.beam_size, alpha: float = DEFAULT.alpha, max_len_a: float = DEFAULT.max_len_a,
               max_len_b: int = DEFAULT.max_len_b, batch_size: int = 64, min_len: int = DEFAULT.min_len,
               use_cache: bool = True, compact: tuple[int, ...] | None = None,
               workers: int | None = None, max_source_len: int = 1024, max_programs: int = 3, params=None):
    # Every setting is checked here, where it enters (seq2seq/inference/settings.py): a ConfigError names it.
    self.settings = SearchSettings(beam_size, alpha, max_len_a, max_len_b, min_len)
    batch_size, max_source_len, max_programs = (check(k, v) for k, v in (
        ("batch_size", batch_size), ("max_source_len", max_source_len), ("max_programs", max_programs)))
    workers = None if workers is None else check("workers", workers)
    self.ensemble = isinstance(model_cfg, list)
    cfgs, graphdefs = (model_cfg, graphdef) if self.ensemble else ([model_cfg], [graphdef])
    if not cfgs or len(cfgs) != len(graphdefs) or len({c.vocab_size for c in cfgs}) != 1:
      raise ValueError(f"an ensemble needs one graphdef per model config and one vocabulary, got {len(cfgs)} "
                       f"configs (vocabularies {sorted({c.vocab_size for c in cfgs})}) and {len(graphdefs)} graphdefs")
    self.graphdefs, self.tok, self.mesh, self.params = graphdefs, tok, mesh, params
    self.checkpoint, self.config = "", None  # set by from_workdir / from_pretrained: what they loaded
    # Outputs and rows must fit every learned position table (None: no limit); sources that too, and max_source_len.
    self.position_limit = min((c.max_len for c in cfgs if c.positions == "learned"), default=None)
    self.max_source_len, self.source_limit = max_source_len, min(max_source_len, self.position_limit or max_source_len)
    dp = sharding.data_parallel_size(mesh)
    self.batch_size = dp * math.ceil(batch_size / dp)  # rows are split over the data-parallel devices
    self.use_cache = inputs.flag(use_cache, "use_cache")
    # Once a quarter of a batch's sentences are unfinished they go on in a batch of that size
    # (same results). Each smaller batch compiles one more loop (~1.3 s on the 2-core CPU), so
    # batches under 32 sentences are not compacted; a second level, batch/16, made the
    # Multi30k test sets no faster.
    self.compact = tuple(n for n in (self.batch_size // 4,) if n >= max(dp, 8)) if compact is None \
        else tuple(compact)
    # Batches decoded at once, each from its own thread. One XLA:CPU search loop keeps 2
    # cores only partly busy (small ops, one after another), and two loops side by side
    # translate test_2016_flickr 1.3x faster there. Accelerators and multi-process runs take
    # one at a time: every process must launch the same programs in the same order.
    single_cpu = jax.process_count() == 1 and all(d.platform == "cpu" for d in mesh.devices.flat)
    self.workers = (2 if single_cpu else 1) if workers is None else workers
    if self.workers < 1 or (self.workers > 1 and jax.process_count() > 1):
      raise ConfigError(f"workers must be >= 1, and 1 when several processes decode together, got {self.workers}")
    self.dp = dp
    self.max_programs = max_programs
    self._score_fn = None  # jitted on first use (`score`)
    self.truncated = 0  # sources of the last call cut to `source_limit` tokens
    self.compiled_programs, self.compile_seconds = 0, 0.0  # the last call's search programs, and their compile time
    self._batch_sharding = sharding.batch_sharding(mesh)
    self.programs = Programs(jax.jit(self._search_fn, static_argnames=("max_len", "nbest", "sampling"),
                                     out_shardings=NamedSharding(mesh, PartitionSpec())))

  def _search_fn(self, params, src_bs, limits_b, ids_b, seed, max_len: int, nbest: int = 1,
                 sampling: decode.Sampling | None = None):
    models = [nnx.merge(g, p) for g, p in zip(self.graphdefs, params if self.ensemble else [params])]
    s = self.settings
    return decode.search(models, src_bs, limits_b, beam_size=s.beam_size, alpha=s.alpha, max_len=max_len,
                         min_len=s.min_len, use_cache=self.use_cache, compact=self.compact, nbest=nbest,
                         sampling=sampling, ids_b=ids_b, seed=seed, tokens=self.tok.special)

  def max_output(self, src_len: int, fit: bool = True) -> int:
    """Output tokens (eos included) allowed for a source of `src_len`; cut to the position table if `fit`."""
    out = int(self.settings.max_len_a * src_len) + self.settings.max_len_b
    return self._fit(out) if fit else out

  def _fit(self, length: int) -> int:
    """`length` cut to the learned position table, if any (a row's width, an output limit)."""
    return length if self.position_limit is None else min(length, self.position_limit)

  def _program_key(self, params, batch: int, width: int, want: Want):
    """The compiled search of a batch shape (started now if it is not compiled or compiling)."""
    nbest, sampling = want.nbest, want.sampling and want.sampling._replace(seed=0)  # the seed is an input
    key = (signature(params), batch, width, nbest, sampling)
    spec = lambda *shape: jax.ShapeDtypeStruct(shape, np.int32, sharding=self._batch_sharding)
    seed = jax.ShapeDtypeStruct((), np.int32, sharding=NamedSharding(self.mesh, PartitionSpec()))
    self.programs.prepare(key, (params, spec(batch, width), spec(batch), spec(batch), seed),
                          max_len=self.max_output(width), nbest=nbest, sampling=sampling)
    return key

  def _search(self, params, src_bs, limits_b, ids_b, want: Want):
    """(tokens, scores) of a batch: its compiled search (compiled first if need be)."""
    key = self._program_key(params, *src_bs.shape, want)
    value = np.int32(want.sampling.seed if want.sampling else 0)
    seed = jax.make_array_from_callback((), NamedSharding(self.mesh, PartitionSpec()), lambda index: value)
    return self.programs.get(key)(params, src_bs, limits_b, ids_b, seed)

  def _put(self, x: np.ndarray) -> jax.Array:
    """A global array from the full batch every process holds (each places its own shards)."""
    return jax.make_array_from_callback(x.shape, self._batch_sharding, lambda index: x[index])

  @classmethod
  def from_workdir(cls, workdir: str | os.PathLike, checkpoint: None | str | int = None, *,
                   average_last: int = 0, beam_size: int | None = None, alpha: float | None = None, mesh=None,
                   compilation_cache: str | None = None, **settings) -> Translator:
    """The model of a training run: `checkpoint` None or "latest" (the newest intact one),
    "best" (lowest validation loss) or a step, as the commands' --checkpoint; `average_last`
    K > 0: the mean of the K checkpoints ending there (--average_last). Search settings default to the run's config.eval; `settings`
    may set max_len_a, max_len_b, batch_size, min_len and max_source_len. `mesh` defaults to
    config.mesh. Compiled searches are kept on disk as the commands keep them
    (`compilation_cache`: None the folder this process uses already, else the default one; ""
    off; a path; seq2seq/compilation.py)."""
    from seq2seq.inference import load

    compilation.enable(compilation_cache)
    checkpoint = None if checkpoint == "latest" else checkpoint
    if checkpoint not in (None, "best") and (type(checkpoint) is not int or checkpoint < 0):  # noqa: E721 (not bool)
      raise ConfigError(f"checkpoint must be None, 'latest', 'best' or a step number, got {checkpoint!r}")
    if not isinstance(average_last, int) or isinstance(average_last, bool) or average_last < 0:
      raise ConfigError(f"average_last must be a number of checkpoints >= 0, got {average_last!r}")
    config = load.run_config(inputs.path(workdir, "workdir"))
    mesh = sharding.make_mesh(config.mesh) if mesh is None else mesh
    loaded = load.load_params(workdir, config, mesh, checkpoint=checkpoint, average_last=average_last)
    return cls._holding(config, loaded.model_cfg, loaded.graphdef, loaded.tokenizer, mesh, loaded.params,
                        loaded.checkpoint.label,
                        **search_settings(config.eval, beam_size=beam_size, alpha=alpha, **settings))

  @classmethod
  def from_pretrained(cls, model_dir: str | os.PathLike, *, beam_size: int | None = None,
                      alpha: float | None = None, mesh=None, compilation_cache: str | None = None,
                      **settings) -> Translator:
    """The model of a folder written by `python -m seq2seq.export` (safetensors, no orbax);
    it translates exactly as `from_workdir` on the checkpoint that was exported."""
    from seq2seq import export

    compilation.enable(compilation_cache)
    config, model_cfg, tok, label = export.read_model_dir(inputs.path(model_dir, "model_dir"))
    mesh = sharding.make_mesh(config.mesh) if mesh is None else mesh
    graphdef, params = export.load_params(model_dir, model_cfg, mesh)
    return cls._holding(config, model_cfg, graphdef, tok, mesh, params, label,
                        **search_settings(config.eval, beam_size=beam_size, alpha=alpha, **settings))

  @classmethod
  def _holding(cls, config, model_cfg, graphdef, tok, mesh, params, label: str, **settings) -> Translator:
    """A Translator that holds `params` (loaded from checkpoint `label`) and the run's config."""
    translator = cls(model_cfg, graphdef, tok, mesh, params=params, **settings)
    translator.checkpoint, translator.config = label, config
    return translator

  def translate(self, sentences: Iterable[str] | str, *, return_scores: bool = False, progress: bool = False,
                nbest: int = 1, sampling: decode.Sampling | None = None):
    """Translations of `sentences` (a string gives a string); with return_scores, also each
    translation's score: its log-probability, divided by the GNMT length penalty for beam > 1.
    `nbest` > 1 (at most the beam size): each sentence gets a list of its `nbest` best
    translations (and scores), best first; the first is what nbest=1 gives.
    `sampling` (a `decode.Sampling`): outputs drawn from the model instead, `nbest` of them
    per sentence (any number), most likely first, scored by their plain log-probability;
    sentence i (counted from 1) draws as it does in any batch, for a given seed.
    With nbest=N every sentence gets N entries: those the search left empty (a blank
    sentence has one translation, the empty one with score 0; a length limit can finish
    fewer than N) are empty strings scored -inf. Arguments of the wrong type or value are a
    ConfigError naming them, raised before any work."""
    if self.params is None:
      raise ValueError("this Translator holds no parameters: build it with Translator.from_workdir or "
                       "Translator.from_pretrained, or call it as translator(params, sentences)")
    one, sentences = inputs.texts(sentences, "sentences")
    want = inputs.want(nbest, sampling, self.settings.beam_size)
    inputs.flag(return_scores, "return_scores"), inputs.flag(progress, "progress")
    hypotheses, scores = self._translate(self.params, sentences, progress, want)
    if one:
      hypotheses, scores = hypotheses[0], scores[0]
    return (hypotheses, scores) if return_scores else hypotheses

  def translate_ids(self, params, sources: list[list[int]], *, progress: bool = False) -> list[list[int]]:
    """Output ids (without eos) of each source id sequence (with eos), in input order."""
    return [best[0] for best in self._translate_ids(params, sources, progress)[0]]

  def score(self, sources: Iterable[str] | str, targets: Iterable[str] | str, *, normalize: bool | None = None,
            params=None) -> list[float] | float:
    """The log-probability of each target (with its eos) given its source, by teacher forcing
    (seq2seq/inference/forced.py): what training's loss sums, negated. `normalize` divides
    it by the GNMT length penalty with this Translator's alpha (None: as its beam search
    scores are, i.e. for beam > 1). An ensemble scores with the mean of its probabilities.
    Two strings give one score; targets longer than the model takes are cut as sources are,
    with a warning naming them."""
    params = self.params if params is None else params
    if params is None:
      raise ValueError("this Translator holds no parameters: pass params=")
    (one, sources), (one_target, targets) = inputs.texts(sources, "sources"), inputs.texts(targets, "targets")
    normalize = normalize if normalize is None else inputs.flag(normalize, "normalize")
    if len(sources) != len(targets) or one != one_target:
      raise ConfigError(f"score needs one target per source (two strings, or two lists of the same length), got "
                        f"{'a string' if one else len(sources)} and {'a string' if one_target else len(targets)}")
    encode = lambda texts: self.tok.encode(list(texts)) if texts else []
    scores = self.score_ids(params, encode(sources), encode(targets), normalize=normalize)
    return scores[0] if one else scores

  def score_ids(self, params, src_ids: list[list[int]], tgt_ids: list[list[int]], *,
                normalize: bool | None = None) -> list[float]:
    """`score` of id sequences (with eos)."""
    from seq2seq.inference import forced

    normalize = self.settings.beam_size > 1 if normalize is None else normalize
    (tgt_cut_ids, tgt_cut), (src_cut_ids, cut) = self._truncate(list(tgt_ids)), self._truncate(list(src_ids))
    if jax.process_index() == 0:  # references are cut to the same limit as sources, and named the same way
      self._warn_truncated([(i + 1, len(src_ids[i])) for i in cut])
      self._warn_truncated([(i + 1, len(tgt_ids[i])) for i in tgt_cut], what="reference line", doing="scoring")
    src_ids, tgt_ids = src_cut_ids, tgt_cut_ids
    if self._score_fn is None:
      self._score_fn = jax.jit(lambda params, src_bs, tgt_bt, alpha, normalize: forced.log_probs(
          self.graphdefs, params if self.ensemble else [params], src_bs, tgt_bt, alpha=alpha, normalize=normalize,
          tokens=self.tok.special),
          static_argnames=("alpha", "normalize"), out_shardings=NamedSharding(self.mesh, PartitionSpec()))
    order = sorted(range(len(src_ids)), key=lambda i: -max(len(src_ids[i]), len(tgt_ids[i])))
    out = [0.0] * len(src_ids)
    start = 0
    while start < len(order):
      rows = self.rows_for(source_bucket(max(len(src_ids[order[start]]), len(tgt_ids[order[start]]))))
      part = order[start:start + rows]
      arrays = []
      for ids in (src_ids, tgt_ids):
        x = np.zeros((rows, self._fit(source_bucket(max(len(ids[i]) for i in part)))), np.int32)
        x[len(part):, 0] = self.tok.special.eos  # filler rows: an empty sentence
        for r, i in enumerate(part):
          x[r, :len(ids[i])] = ids[i]
        arrays.append(self._put(x))
      logp_b = jax.device_get(self._score_fn(params, *arrays, alpha=float(self.settings.alpha), normalize=normalize))
      for r, i in enumerate(part):
        out[i] = float(logp_b[r])
      start += rows
    return out

  def rows_for(self, width: int) -> int:
    """Sentences in a batch of sources padded to `width` tokens: `batch_size` up to
    FULL_ROWS_WIDTH, then as many tokens in fewer sentences (a power of two, a multiple of
    the data-parallel devices)."""
    if width <= FULL_ROWS_WIDTH:
      return self.batch_size
    rows = 2 ** int(math.log2(max(self.batch_size * FULL_ROWS_WIDTH // width, 1)))
    return self.dp * max(math.ceil(rows / self.dp), 1)

  def _batches(self, lengths: list[int]) -> list[tuple[range, int, int]]:
    """(positions, sentences, width) of each batch of sources of these lengths (longest first):
    consecutive positions, as many as `rows_for` the width of the first, the smallest of
    `plan_widths` that holds it."""
    a, b = self.settings.max_len_a, self.settings.max_len_b
    widths = plan_widths(lengths, self.max_programs, lambda w: step_cost(w, self.max_output(w)),
                         weight=lambda n: max(1, min(int(a * n) + b, self.max_output(source_bucket(n)))))
    batches, start = [], 0
    while start < len(lengths):
      width = self._fit(width_for(lengths[start], widths))  # sources fit the table: source_limit
      size = self.rows_for(width)
      batches.append((range(start, min(start + size, len(lengths))), size, width))
      start += size
    return batches

  def _warn_truncated(self, cut: list[tuple[int, int]], sources: list[tuple[int, int]] = (), what: str = "line",
                      doing: str = "translating") -> None:
    """A warning naming each truncated source, and each of `sources` whose output limit the learned position
    table cuts (by line number and token count), at most MAX_WARNINGS of each."""
    capped = [(line, n) for line, n in sources if self.max_output(n) < self.max_output(n, False)]
    table = "config.model.max_len, the learned position table"
    limit = ", ".join(name for name, value in (("eval.max_source_len", self.max_source_len),
                                               (table, self.position_limit)) if value == self.source_limit)
    for line, length in cut[:MAX_WARNINGS]:
      print(f"warning: {what} {line}: {length} tokens, longer than the model takes: {doing} its first "
            f"{self.source_limit} ({limit})", file=sys.stderr, flush=True)
    for line, length in capped[:MAX_WARNINGS]:
      print(f"warning: line {line}: {length} tokens: its translation is cut at {self.position_limit} tokens ({table}), "
            "not at eval.max_len_a * length + eval.max_len_b", file=sys.stderr, flush=True)
    for items, kind in ((cut, f"{what}s truncated"), (capped, "translations cut at the learned position table")):
      if len(items) > MAX_WARNINGS:
        print(f"warning: {len(items) - MAX_WARNINGS} more {kind}", file=sys.stderr, flush=True)

  def _truncate(self, sources: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Sources cut to `source_limit` tokens (eos kept), and the indices of those cut."""
    limit = self.source_limit
    cut = [i for i, s in enumerate(sources) if len(s) > limit]
    self.truncated = len(cut)
    return [s if len(s) <= limit else s[:limit - 1] + [self.tok.special.eos] for s in sources], cut

  def _decode_rows(self, params, sources, ids: list[int], rows: list[int], batch: int, width: int, want: Want):
    """[(tokens, score), ...] (the `nbest` best) of each source in `rows` (numbered by `ids`),
    decoded as a batch of `batch` sentences `width` tokens wide. A batch the device has no
    memory for is decoded again in halves (one process only: the processes of a multi-host
    run must run the same programs)."""
    src_bs = np.zeros((batch, width), np.int32)
    src_bs[:, 0] = self.tok.special.eos  # filler rows: an empty sentence, finished after one step
    lengths, ids_b = np.ones((batch,), np.int32), np.zeros((batch,), np.int32)
    for r, i in enumerate(rows):
      src_bs[r, :len(sources[i])] = sources[i]
      lengths[r], ids_b[r] = len(sources[i]), ids[i]
    max_len = self.max_output(width)
    limits = np.array(decode.output_limits(lengths, self.settings.max_len_a, self.settings.max_len_b, max_len))
    limits[len(rows):] = 1
    try:
      tokens_bl, scores_b = jax.device_get(self._search(params, self._put(src_bs), self._put(limits), self._put(ids_b),
                                                        want))
    except jax.errors.JaxRuntimeError as err:
      half = self.dp * (batch // 2 // self.dp)
      if not out_of_memory(err) or jax.process_count() > 1:
        raise
      if half < 1:  # one sentence does not fit: its output limit (or the model) is too large for the device
        raise ResourceError(errno.ENOMEM, f"out of device memory decoding one sentence of up to {width} tokens "
                            f"with outputs of up to {self.max_output(width)} tokens (beam {self.settings.beam_size}): "
                            "lower max_len_a / max_len_b or the beam size") from None
      if jax.process_index() == 0:
        print(f"warning: out of memory decoding {len(rows)} sentences of up to {width} tokens in batches of {batch}; "
              f"retrying in batches of {half}", file=sys.stderr, flush=True)
      return [out for part in (rows[:half], rows[half:]) if part
              for out in self._decode_rows(params, sources, ids, part, half, width, want)]
    tokens_bnl, scores_bn = (tokens_bl[:, None], scores_b[:, None]) if want.nbest == 1 else (tokens_bl, scores_b)
    return [[(np.asarray(tokens_bnl[r, j]).tolist(), float(scores_bn[r, j])) for j in range(want.nbest)
             if scores_bn[r, j] > decode.NEG_INF / 2] for r in range(len(rows))]

  def _translate_ids(self, params, sources: list[list[int]], progress: bool, want: Want = None,
                     lines: list[int] | None = None):
    """(ids, score) lists of the `nbest` best outputs of each source, in input order. `lines`:
    each source's input line number (default: 1, 2, ...), which names truncated sources in
    warnings and decides a sampled sentence's draws."""
    want = inputs.want(*(want or Want()), self.settings.beam_size)
    lengths = [len(source) for source in sources]
    sources, cut = self._truncate(list(sources))
    if lines is not None and jax.process_index() == 0:
      self._warn_truncated([(lines[i], lengths[i]) for i in cut], [(lines[i], len(s)) for i, s in enumerate(sources)])
    lines = list(range(1, len(sources) + 1)) if lines is None else lines
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))  # longest first: memory errors show early
    outputs: list[list[list[int]]] = [[] for _ in sources]
    eos = self.tok.special.eos
    scores: list[list[float]] = [[] for _ in sources]
    batches = self._batches([len(sources[i]) for i in order])
    keys = list(dict.fromkeys(self._program_key(params, size, width, want) for _, size, width in batches))
    pending = [k for k in keys if not self.programs.ready(k)]
    bar = Progress(len(sources), enabled=progress and jax.process_index() == 0)
    bar.compiling(len(pending))
    left = set(pending)
    for key in pending:
      self.programs.prepare(key, ()).add_done_callback(lambda _, key=key: (left.discard(key), bar.compiling(len(left))))
    pool = concurrent.futures.ThreadPoolExecutor(self.workers)
    try:
      decoded = pool.map(lambda batch: self._decode_rows(params, sources, lines, [order[j] for j in batch[0]],
                                                         *batch[1:], want), batches)
      for (rows, _, _), results in zip(batches, decoded):
        for j, best in zip(rows, results):
          outputs[order[j]] = [row[:row.index(eos)] if eos in row else row for row, _ in best]
          scores[order[j]] = [score for _, score in best]
        bar.update(len(rows))
    finally:
      pool.shutdown(cancel_futures=True)  # after an error, the batches not started are dropped
      bar.close()
    self.compiled_programs = len(keys)
    self.compile_seconds = sum(self.programs.seconds.get(k, 0.0) for k in pending)
    return outputs, scores

  def __call__(self, params, sentences: list[str], *, progress: bool = False) -> list[str]:
    """Detokenized translations; blank sources give blank outputs without running the model."""
    return self._translate(params, sentences, progress)[0]

  def _translate(self, params, sentences: list[str], progress: bool, want: Want = None):
    """(translations, scores) of `sentences`: strings and floats, or lists of `nbest` of them."""
    nonblank = [i for i, s in enumerate(sentences) if s.strip()]
    ids = self.tok.encode([sentences[i] for i in nonblank]) if nonblank else []
    out, scores = [[""]] * len(sentences), [[0.0]] * len(sentences)  # blank sources: one blank translation
    want = want or Want()
    hypotheses, hyp_scores = self._translate_ids(params, ids, progress, want, lines=[i + 1 for i in nonblank])
    for i, hyps, best_scores in zip(nonblank, hypotheses, hyp_scores):
      out[i], scores[i] = [self.tok.decode(hyp) for hyp in hyps], best_scores
    # n-best entries the search left empty (a blank sentence, a tight length limit): empty, scored -inf
    out = [inputs.padded(o, want.nbest, "") for o in out]
    scores = [inputs.padded(s, want.nbest, -math.inf) for s in scores]
    if want.nbest == 1:
      return [o[0] for o in out], [s[0] for s in scores]
    return out, scores


MAX_WARNINGS = 10  # truncated sources named, per call


def out_of_memory(err: Exception) -> bool:
  """Whether a JAX runtime error is the device running out of memory. XLA reports it as the
  status code RESOURCE_EXHAUSTED, which JAX gives only as the message's prefix."""
  return str(err).startswith("RESOURCE_EXHAUSTED")
