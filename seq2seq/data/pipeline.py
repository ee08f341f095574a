"""The data pipeline from config to batches: sources -> sentencepiece -> cleaned, cached
token arrays -> batches. `python -m seq2seq.data --config=... [--json]` prints corpus and
batching statistics.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import numpy as np

from seq2seq.errors import ConfigError
from seq2seq import cli
from seq2seq.data import corpus as corpus_lib
from seq2seq.data import subword
from seq2seq.data import tokenizer as tokenizer_lib
from seq2seq.data.batching import Batching, BatchIterator, epoch_plan, plan_stats
from seq2seq.data.sources import DataError, Source, check_language
from seq2seq.files import write_atomic

SPM_FILE = "spm.model"
SPM_SETTINGS_FILE = "spm_settings.json"  # the settings spm.model was made with


def file_in_the_way(path: str | os.PathLike) -> pathlib.Path | None:
  """The file that `path`, or a folder above it, is (so no folder can be made there), else None."""
  for above in (pathlib.Path(path), *pathlib.Path(path).parents):
    if os.path.lexists(above):
      return None if above.is_dir() else above
  return None


def cache_dir(config) -> pathlib.Path:
  """The folder of cached tokenizers, token arrays and downloads: config.data.cache_dir, else
  $SEQ2SEQ_CACHE, else ~/.cache/seq2seq. A path that is (or lies under) a file is a
  ConfigError naming the setting it came from, not a traceback where it is first written."""
  setting, d = "config.data.cache_dir", config.data.get("cache_dir", "")
  if not d:
    setting, d = "SEQ2SEQ_CACHE", os.environ.get("SEQ2SEQ_CACHE", "")
  path = pathlib.Path(os.path.expanduser(d or "~/.cache/seq2seq"))
  if (blocking := file_in_the_way(path)) is not None:
    where, fix = (f"{setting}={d}", setting) if d else (f"the cache folder {path}",
                                                        "config.data.cache_dir or SEQ2SEQ_CACHE")
    where += "" if blocking == path else f": {blocking}"
    raise ConfigError(f"{where} is a file, not a folder; set {fix} to a folder (it holds cached tokenizers, token "
                      "arrays and downloads)")
  return path


def source(config, split: str) -> Source:
  """The source of one split; a split without ':' is taken from `config.data.source`."""
  data = config.data
  check_language(data.src_lang, "src_lang")
  check_language(data.tgt_lang, "tgt_lang")
  spec = split if ":" in split else f"{data.source}:{split}"
  return Source(spec, data.src_lang, data.tgt_lang, data_dir=data.dir, cache_dir=str(cache_dir(config)),
                streaming=data.get("streaming", False), tsv_columns=tuple(data.get("tsv_columns", (0, 1))),
                **({"multi30k_url": data.multi30k_url} if data.get("multi30k_url") else {}))


def load_tokenizer(config, workdir: str | None = None, *, write: bool = True) -> tokenizer_lib.Tokenizer:
  """The run's sentencepiece model: the workdir's, else `data.spm_model`, else trained.

  A trained model is cached by (training data, settings, seed, sentencepiece's version: other
  versions train other models) and copied into the workdir
  (unless `write` is False: then `save_tokenizer` does it), so a restart reuses it even if
  the cache is gone.
  """
  data = config.data
  in_workdir = pathlib.Path(workdir) / SPM_FILE if workdir else None
  wanted = tokenizer_settings(config)
  if in_workdir is not None and in_workdir.is_file():
    recorded = in_workdir.with_name(SPM_SETTINGS_FILE)
    if recorded.is_file():  # older workdirs have none
      had = json.loads(recorded.read_text(encoding="utf-8"))
      diffs = [f"config.data.{k}: {had.get(k)!r} there, {v!r} now" for k, v in wanted.items()
               if had.get(k) != v and not (k == "spm_model" and _same_file(had.get(k), v))]
      if diffs:
        raise ConfigError(f"{in_workdir} was made with other tokenizer settings than this config's, so this run "
                         "would silently use the old vocabulary:\n  " + "\n  ".join(diffs)
                         + "\nUse a new --workdir (or restore the settings).")
    return tokenizer_lib.Tokenizer.load(in_workdir)
  if data.get("spm_model"):
    tok = tokenizer_lib.Tokenizer.load(os.path.expanduser(data.spm_model))
  else:
    train = source(config, data.train_split)
    settings = [train.fingerprint(), data.vocab_size, data.spm_model_type, data.spm_character_coverage,
                data.spm_sample_size, config.seed, tokenizer_lib.trained_by()]
    key = hashlib.sha256(repr(settings).encode()).hexdigest()[:20]
    cached = cache_dir(config) / "spm" / f"{key}.model"
    if cached.is_file():
      tok = tokenizer_lib.Tokenizer.load(cached)
    else:
      sample = tokenizer_lib.sample_sentences(train, data.spm_sample_size, config.seed)
      model = tokenizer_lib.train(sample, vocab_size=data.vocab_size, model_type=data.spm_model_type,
                                  character_coverage=data.spm_character_coverage, seed=config.seed)
      write_atomic(cached, model)
      tok = tokenizer_lib.Tokenizer(model)
  if not data.get("spm_model") and tok.vocab_size < data.vocab_size:
    raise ConfigError(f"config.data.vocab_size={data.vocab_size}, but the sample of {data.train_split} supports only "
                     f"{tok.vocab_size} pieces; set config.data.vocab_size to at most {tok.vocab_size}")
  if in_workdir is not None and write:
    save_tokenizer(config, workdir, tok)
  return tok


def save_tokenizer(config, workdir: str, tok: tokenizer_lib.Tokenizer) -> None:
  """Writes the run's sentencepiece model, and the settings it was made with, into the workdir."""
  path = pathlib.Path(workdir) / SPM_FILE
  if path.is_file() and path.read_bytes() == tok.model_bytes:
    return
  # What a model trained here was trained by is recorded too, not checked on a restart.
  made_with = tokenizer_settings(config) | ({} if config.data.get("spm_model") else tokenizer_lib.trained_by())
  write_atomic(path.with_name(SPM_SETTINGS_FILE), json.dumps(made_with, indent=1).encode())
  write_atomic(path, tok.model_bytes)


def _same_file(a, b) -> bool:
  """Whether two recorded paths name one file (a run started before paths were stored absolute)."""
  return bool(a) and bool(b) and os.path.abspath(os.path.expanduser(a)) == os.path.abspath(os.path.expanduser(b))


def tokenizer_settings(config) -> dict:
  """The config keys a run's sentencepiece model depends on (recorded beside it)."""
  data = config.data
  keys = ("spm_model",) if data.get("spm_model") else ("train_split", "vocab_size", "spm_model_type",
                                                       "spm_character_coverage", "spm_sample_size")
  return {k: data.get(k) for k in keys}


# Data settings an exact resume depends on (the batches a step sees), recorded in checkpoints.
RESUME_KEYS = ("train_split", "src_lang", "tgt_lang", "max_len", "max_length_ratio", "max_tokens", "batch_multiple",
               "num_buckets", "bucket_min", "fill_rows", "packing", "pack_length", "subword_alpha", "subword_nbest")


def resume_settings(config) -> dict:
  return {k: config.data.get(k) for k in RESUME_KEYS}


def cleaning(config) -> corpus_lib.Cleaning:
  return corpus_lib.Cleaning(max_len=config.data.max_len, max_length_ratio=config.data.max_length_ratio)


def load_corpus(config, split: str, tok: tokenizer_lib.Tokenizer) -> corpus_lib.Corpus:
  """The tokenized and cleaned split, cached on disk."""
  src = source(config, split)
  return corpus_lib.build(src, src.fingerprint(), tok, cleaning(config), cache_dir(config), src.spec)


def batching_config(config) -> Batching:
  data = config.data
  return Batching(max_tokens=data.max_tokens, max_len=data.max_len, batch_multiple=data.batch_multiple,
                  num_buckets=data.num_buckets, bucket_min=data.bucket_min, fill_rows=data.fill_rows,
                  packing=data.packing, pack_length=data.pack_length)


def train_iterator(config, tok, *, state: dict | None = None, process_index: int = 0,
                   process_count: int = 1) -> BatchIterator:
  """Endless training batches for this process, resumed from `state` when given.

  With `data.subword_alpha` > 0 each epoch sees new segmentations (seq2seq.data.subword).
  """
  data, train = config.data, load_corpus(config, config.data.train_split, tok)
  resample = None
  if data.get("subword_alpha", 0.0):
    if tok.model_type != "unigram":
      raise ConfigError(f"config.data.subword_alpha needs a unigram sentencepiece model; this one is {tok.model_type}")
    resample = subword.Sampler(train, tok, alpha=data.subword_alpha, nbest=data.subword_nbest, max_len=data.max_len,
                               seed=config.seed)
  return BatchIterator(train, batching_config(config), config.seed, process_index=process_index,
                       process_count=process_count, state=state, resample=resample)


def eval_pairs(config, split: str) -> list[tuple[str, str]]:
  """Untokenized (source, reference) pairs of an evaluation split, nothing dropped."""
  return list(source(config, split))


def fitting_max_len_b(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_len_a: float) -> int:
  """The smallest `eval.max_len_b` whose output limit, floor(a * source length) + b (eos
  included, as in decode.output_limits, in float32 like it), fits every target of these pairs."""
  floor = np.floor(np.float32(max_len_a) * src_lengths.astype(np.float32)).astype(np.int64)
  return int(np.max(tgt_lengths - floor))


def statistics(config, tok) -> dict:
  """The training corpus in numbers: pairs kept and dropped, tokens, lengths, and the batches
  of its first epoch (count, distinct shapes, padding)."""
  train = load_corpus(config, config.data.train_split, tok)
  stats, cfg = train.stats, batching_config(config)
  plan = epoch_plan(train.src_lengths, train.tgt_lengths, cfg, config.seed, 0)
  ps = plan_stats(plan, train.src_lengths, train.tgt_lengths)
  percentiles = (50, 90, 95, 99, 100)
  pct = lambda lengths: dict(zip(map(str, percentiles), np.percentile(lengths, percentiles).astype(int).tolist()))
  return {
      "split": stats["source"], "src_lang": config.data.src_lang, "tgt_lang": config.data.tgt_lang,
      "vocab_size": tok.vocab_size, "spm_model_type": tok.model_type,
      "pairs": stats["pairs"]["kept"], "pairs_read": stats["pairs"]["read"],
      "dropped": {k: v for k, v in stats["pairs"].items() if k not in ("read", "kept")},
      "tokens": stats["tokens"],
      "length_percentiles": {"src": pct(train.src_lengths), "tgt": pct(train.tgt_lengths)},
      "output_limit": {"max_len_a": config.eval.max_len_a, "max_len_b": config.eval.max_len_b,
                       "fitting_max_len_b": fitting_max_len_b(train.src_lengths, train.tgt_lengths,
                                                              config.eval.max_len_a)},
      "batching": f"packing into {cfg.pack_length or cfg.max_len}" if cfg.packing else
                  f"{cfg.num_buckets} row lengths" + ("" if cfg.fill_rows else ", one pair per row"),
      "max_tokens": cfg.max_tokens, "batches": ps["batches"],
      "batch_shapes": [list(s) for s in ps["shapes"]], "padding_fraction": ps["padding_fraction"],
  }


def describe(s: dict) -> str:
  """`statistics` as the lines `python -m seq2seq.data` prints."""
  lines = [f"split: {s['split']}  ({s['src_lang']}->{s['tgt_lang']})",
           f"vocabulary: {s['vocab_size']} sentencepiece {s['spm_model_type']}",
           "pairs: " + ", ".join(f"{k}={v}" for k, v in
                                 {"read": s["pairs_read"], "kept": s["pairs"], **s["dropped"]}.items()),
           f"tokens: source={s['tokens']['src']} target={s['tokens']['tgt']} (eos included)"]
  for side, name in (("src", "source"), ("tgt", "target")):
    lines.append(f"{name} length p50/p90/p95/p99/max: " + "/".join(map(str, s["length_percentiles"][side].values())))
  limit = s["output_limit"]
  lines.append(f"longest target: {limit['max_len_a']:g} x source + {limit['fitting_max_len_b']} tokens "
               f"(eval.max_len_b that fits every training target; this config: {limit['max_len_b']})")
  lines += [f"batching: {s['batching']}, max_tokens={s['max_tokens']}",
            f"batches per epoch: {s['batches']}",
            f"padding fraction: {s['padding_fraction']:.2%}",
            f"distinct batch shapes (B, S, T): {len(s['batch_shapes'])}: " +
            " ".join(str(tuple(shape)) for shape in s["batch_shapes"])]
  return "\n".join(lines)


def main(argv=None) -> int:
  from absl import flags
  from ml_collections import config_flags

  config_flag = config_flags.DEFINE_config_file("config", None, "A shipped config's name or a config file's path.",
                                                lock_config=True)
  as_json = flags.DEFINE_bool("json", False, "Print the statistics as one JSON object.")
  flags.mark_flags_as_required(["config"])

  def run(_):
    config = config_flag.value
    try:
      stats = statistics(config, load_tokenizer(config))
    except DataError as e:
      cli.fail(str(e))
    print(json.dumps(stats) if as_json.value else describe(stats))

  cli.run(run, __name__, argv)
  return 0


if __name__ == "__main__":
  main()
