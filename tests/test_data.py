"""The pipeline from a config file: `python -m seq2seq.data` statistics, direction and
evaluation splits, and clear errors for bad settings."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import synthetic
from conftest import REPO, make_config

from seq2seq import data
from seq2seq.data.sources import DataError


def run_cli(*args, cache):
  env = dict(os.environ, SEQ2SEQ_CACHE=str(cache))
  return subprocess.run([sys.executable, "-m", "seq2seq.data", *args], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300)


@pytest.mark.data
def test_statistics_command_on_multi30k(real_data_dir, session_cache):
  """On the real corpus: the multi30k config's output limit is the one that fits it."""
  out = run_cli("--config=configs/multi30k.py", f"--config.data.dir={real_data_dir}", cache=session_cache)
  assert out.returncode == 0, out.stderr
  text = out.stdout
  assert "pairs: read=29000, kept=" in text
  kept = int(re.search(r"kept=(\d+)", text).group(1))
  dropped = sum(int(n) for n in re.findall(r"(?:empty|too_long|length_ratio)=(\d+)", text))
  assert kept + dropped == 29000
  assert re.search(r"source length p50/p90/p95/p99/max: \d+/\d+/\d+/\d+/\d+", text)
  assert re.search(r"batches per epoch: \d+", text)
  padding = float(re.search(r"padding fraction: ([\d.]+)%", text).group(1))
  assert 0 < padding < 10
  assert re.search(r"distinct batch shapes \(B, S, T\): \d+: \(\d+, \d+, \d+\)", text)
  # The config's output limit is the one that fits every training target, no looser.
  assert ("longest target: 1 x source + 18 tokens (eval.max_len_b that fits every training target; "
          "this config: 18)") in text


def test_bad_language_in_config_is_reported_by_the_command(data_dir, session_cache):
  out = run_cli("--config=configs/tiny.py", f"--config.data.dir={data_dir}", "--config.data.src_lang=english",
                cache=session_cache)
  assert out.returncode != 0
  assert "config.data.src_lang='english' is not a known ISO 639-1 language code" in out.stderr


def test_direction_and_eval_splits_follow_the_config(data_dir, session_cache):
  import gzip

  config = make_config("multi30k", data_dir, session_cache, src_lang="de", tgt_lang="en")
  pairs = data.eval_pairs(config, "test_2016_flickr")
  german, english = (gzip.decompress((data_dir / f"multi30k/test_2016_flickr.{lang}.gz").read_bytes()).decode()
                     .splitlines() for lang in ("de", "en"))
  assert len(pairs) == synthetic.MULTI30K["test_2016_flickr"] and pairs == list(zip(german, english))
  newstest = data.eval_pairs(config, "files:wmt14/newstest2014.{lang}")
  assert newstest == list(zip(*((data_dir / f"wmt14/newstest2014.{lang}").read_text().splitlines()
                                for lang in ("de", "en"))))
  with pytest.raises(DataError, match="no split/language file 'test_2018.de.gz'"):
    data.eval_pairs(config, "test_2018")


def test_wmt14_configs_name_the_hub_and_the_local_corpora():
  from seq2seq.configs import wmt14_base, wmt14_big, wmt14_files

  for module in (wmt14_base, wmt14_big):
    train = data.source(module.get_config(), module.get_config().data.train_split)
    assert train.kind_what == ("hf", "wmt/wmt14:de-en:train")
  config = wmt14_files.get_config()
  assert config.data.train_split == ("files:wmt14/training/europarl-v7.de-en.{lang},wmt14/commoncrawl.de-en.{lang},"
                                     "wmt14/training/news-commentary-v9.de-en.{lang}")
  assert data.source(config, config.data.test_splits[0]).spec == "files:wmt14/newstest2014.{lang}"


@pytest.mark.long
def test_wmt14_files_config_trains_from_local_corpora(data_dir, tmp_path):
  """The three WMT14 corpora as wmt14_files.py names them (here: newstest2014 cut in three),
  newstest2013 for validation, and a few training steps of a tiny model on them."""
  from seq2seq import metrics
  from seq2seq.configs import wmt14_files
  from seq2seq.data.sources import Source
  from seq2seq.training.train import train_and_evaluate

  pairs = list(Source("files:wmt14/newstest2014.{lang}", "en", "de", data_dir=str(data_dir)))
  for name, chunk in zip(wmt14_files.CORPORA, (pairs[:100], pairs[100:170], pairs[170:])):
    (tmp_path / "data" / name).parent.mkdir(parents=True, exist_ok=True)
    for side, lang in enumerate(("en", "de")):
      (tmp_path / "data" / f"{name}.{lang}").write_text("".join(p[side] + "\n" for p in chunk), encoding="utf-8")
  for lang in ("en", "de"):
    (tmp_path / "data/wmt14" / f"newstest2013.{lang}").symlink_to(data_dir / "wmt14" / f"newstest2013.{lang}")
  config = wmt14_files.get_config()
  config.data.update(dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"), vocab_size=500,
                     max_tokens=4096)
  config.model.update(d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1)
  config.train.update(steps=3, log_every=1, eval_every=3, checkpoint_every=3)
  assert list(data.source(config, config.data.train_split)) == pairs
  train_and_evaluate(config, str(tmp_path / "run"))
  records = metrics.read(tmp_path / "run")
  assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
  assert [r["step"] for r in records if "val_loss" in r] == [3]
  assert json.loads((tmp_path / "run/config.json").read_text())["data"]["train_split"] == config.data.train_split


def test_json_statistics_match_the_text(data_dir, session_cache):
  args = ("--config=configs/tiny.py", f"--config.data.dir={data_dir}", "--config.data.packing=false")
  stats = json.loads(run_cli(*args, "--json", cache=session_cache).stdout)
  text = run_cli(*args, cache=session_cache).stdout
  assert stats["pairs"] + sum(stats["dropped"].values()) == stats["pairs_read"] == synthetic.MULTI30K["train"]
  assert f"kept={stats['pairs']}" in text and f"batches per epoch: {stats['batches']}" in text
  assert f"distinct batch shapes (B, S, T): {len(stats['batch_shapes'])}:" in text
  assert f"padding fraction: {stats['padding_fraction']:.2%}" in text
  limit = stats["output_limit"]
  assert (f"longest target: 1 x source + {limit['fitting_max_len_b']} tokens (eval.max_len_b that fits every "
          f"training target; this config: {limit['max_len_b']})") in text
  assert 1 < len(stats["batch_shapes"]) <= 8 and all(rows * max(s, t) <= 1024 for rows, s, t in stats["batch_shapes"])


def test_fitting_max_len_b_is_the_tightest_limit_that_fits_every_target():
  """The b printed by `python -m seq2seq.data`: with decode.output_limits' own rounding, every
  target fits in a * source + b, and one does not fit in a * source + b - 1."""
  from seq2seq.data.pipeline import fitting_max_len_b
  from seq2seq.inference.decode import output_limits

  rng = np.random.default_rng(0)
  src, tgt = rng.integers(1, 60, 500), rng.integers(1, 90, 500)
  for a in (0.0, 1.0, 1.2, 1.5):
    b = fitting_max_len_b(src, tgt, a)
    fits = lambda b: np.all(tgt <= np.asarray(output_limits(src, a, b, 10_000)))
    assert fits(b) and not fits(b - 1), a
  assert fitting_max_len_b(np.array([10, 3]), np.array([12, 9]), 1.5) == 5  # 9 - floor(4.5)
  # 1.4 x 45 is 62.99999999999999 in float64 but 63 in float32, decoding's precision.
  assert fitting_max_len_b(np.array([45]), np.array([70]), 1.4) == 7
  assert np.asarray(output_limits(np.array([45]), 1.4, 7, 10_000)).tolist() == [70]
