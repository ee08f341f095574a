"""The pipeline from a config file: `python -m seq2seq.data` statistics, direction and
evaluation splits, and clear errors for bad settings."""

import os
import re
import subprocess
import sys

import pytest

from seq2seq import data
from seq2seq.sources import DataError

from conftest import REPO, make_config


def run_cli(*args, cache):
  env = dict(os.environ, SEQ2SEQ_CACHE=str(cache))
  return subprocess.run([sys.executable, "-m", "seq2seq.data", *args], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300)


def test_statistics_command_on_multi30k(data_dir, session_cache):
  out = run_cli("--config=configs/multi30k.py", f"--config.data.dir={data_dir}", cache=session_cache)
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


def test_bad_language_in_config_is_reported_by_the_command(data_dir, session_cache):
  out = run_cli("--config=configs/tiny.py", f"--config.data.dir={data_dir}", "--config.data.src_lang=english",
                cache=session_cache)
  assert out.returncode != 0
  assert "config.data.src_lang='english' is not a known ISO 639-1 language code" in out.stderr


def test_direction_and_eval_splits_follow_the_config(data_dir, session_cache):
  config = make_config("multi30k", data_dir, session_cache, src_lang="de", tgt_lang="en")
  pairs = data.eval_pairs(config, "test_2016_flickr")
  assert len(pairs) == 1000
  assert pairs[0] == ("Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
                      "A man in an orange hat starring at something.")
  newstest = data.eval_pairs(config, "files:wmt14/newstest2014.{lang}")
  assert len(newstest) == 3003
  with pytest.raises(DataError, match="no split/language file 'test_2018.de.gz'"):
    data.eval_pairs(config, "test_2018")


def test_wmt14_base_config_names_hub_and_local_splits():
  from configs import wmt14_base

  config = wmt14_base.get_config()
  train = data.source(config, config.data.train_split)
  assert train.kind_what == ("hf", "wmt14/de-en:train")
  assert data.source(config, config.data.test_splits[0]).spec == "files:wmt14/newstest2014.{lang}"
