"""Sources: every file kind round-trips its lines; downloads are checksummed (the checksums
are the real release's); bad input raises an error that names the file and line."""

import gzip
import http.server
import shutil
import threading

import numpy as np
import pytest
import synthetic

from seq2seq.data import sources
from seq2seq.data.sources import DataError, Source, check_language, read_lines, read_parallel
from seq2seq.files import file_sha256

NEWSTEST = "wmt14/newstest2014.{lang}"


def plain_lines(path):
  return path.read_text(encoding="utf-8").splitlines()


def test_plain_files_round_trip(data_dir):
  pairs = list(Source(f"files:{NEWSTEST}", "en", "de", data_dir=str(data_dir)))
  assert len(pairs) == synthetic.NEWSTEST["newstest2014"]
  assert [p[0] for p in pairs] == plain_lines(data_dir / "wmt14/newstest2014.en")
  assert [p[1] for p in pairs] == plain_lines(data_dir / "wmt14/newstest2014.de")


def test_gzip_multi30k_round_trip_and_direction(data_dir):
  en_de = list(Source("multi30k:val", "en", "de", data_dir=str(data_dir)))
  de_en = list(Source("multi30k:val", "de", "en", data_dir=str(data_dir)))
  with gzip.open(data_dir / "multi30k/val.de.gz", "rt", encoding="utf-8") as f:
    german = f.read().splitlines()
  assert len(en_de) == synthetic.MULTI30K["val"] and [p[1] for p in en_de] == german
  assert de_en == [(t, s) for s, t in en_de]


def test_sgml_equals_the_plain_text_extraction(data_dir):
  spec = "files:wmt14/newstest2014-deen-src.en.sgm,wmt14/newstest2014-deen-ref.de.sgm"
  assert list(Source(spec, "en", "de", data_dir=str(data_dir))) == list(
      Source(f"files:{NEWSTEST}", "en", "de", data_dir=str(data_dir)))


def test_tsv_round_trip(data_dir, tmp_path):
  pairs = list(Source(f"files:{NEWSTEST}", "en", "de", data_dir=str(data_dir)))[:200]
  (tmp_path / "c.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
  assert list(Source(f"tsv:{tmp_path}/c.tsv", "en", "de")) == pairs
  swapped = Source(f"tsv:{tmp_path}/c.tsv", "de", "en", tsv_columns=(1, 0))
  assert list(swapped) == [(t, s) for s, t in pairs]


@pytest.mark.parametrize("streaming", [False, True])
def test_hugging_face_disk_and_parquet_round_trip(data_dir, tmp_path, streaming):
  import datasets

  pairs = list(Source("multi30k:test_2016_flickr", "en", "de", data_dir=str(data_dir)))[:100]
  records = {"translation": [{"de": t, "en": s} for s, t in pairs]}  # the WMT14 layout on the hub
  ds = datasets.DatasetDict({"validation": datasets.Dataset.from_dict(records)})
  ds.save_to_disk(str(tmp_path / "saved"))
  ds["validation"].to_parquet(str(tmp_path / "part-0.parquet"))
  got = list(Source(f"hf-disk:{tmp_path}/saved:validation", "en", "de", streaming=streaming))
  assert got == pairs
  got = list(Source(f"parquet:{tmp_path}/*.parquet", "de", "en", streaming=streaming))
  assert got == [(t, s) for s, t in pairs]


def write_hub_dataset(root, pairs, *, flat=False, config="de-en"):
  """A dataset repository laid out as the Hub's wmt/wmt14 is: parquet shards per config and
  split, declared in the README's YAML header; `flat`: one column per language instead."""
  import datasets

  features = datasets.Features({"de": datasets.Value("string"), "en": datasets.Value("string")} if flat else
                               {"translation": datasets.Translation(languages=["de", "en"])})
  records = ({"de": [t for _, t in pairs], "en": [s for s, _ in pairs]} if flat else
             {"translation": [{"de": t, "en": s} for s, t in pairs]})
  (root / config).mkdir(parents=True)
  datasets.Dataset.from_dict(records, features=features).to_parquet(str(root / config / "train-00000-of-00001.parquet"))
  (root / "README.md").write_text(f"---\nconfigs:\n- config_name: {config}\n  data_files:\n  - split: train\n"
                                  f"    path: {config}/train-*\n---\n")
  return root


@pytest.fixture(scope="module")
def hub_pairs(data_dir):
  return list(Source("multi30k:test_2016_flickr", "en", "de", data_dir=str(data_dir)))[:300]


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("flat", [False, True])
def test_hub_layout_dataset_loads_through_load_dataset(hub_pairs, tmp_path, streaming, flat):
  """Every case writes a folder named wmt14 with other contents: none may read another's cache."""
  repo = write_hub_dataset(tmp_path / "wmt14", hub_pairs, flat=flat)
  got = list(Source(f"hf:{repo}:de-en:train", "en", "de", streaming=streaming))
  assert got == hub_pairs
  assert list(Source(f"hf:{repo}:de-en:train", "de", "en", streaming=streaming)) == [(t, s) for s, t in hub_pairs]


def test_hub_spec_names_namespace_config_and_split():
  from seq2seq.data.sources import parse_hf

  assert parse_hf("wmt/wmt14:de-en:train") == ("wmt/wmt14", "de-en", "train")
  assert parse_hf("wmt/wmt19:de-en:validation") == ("wmt/wmt19", "de-en", "validation")
  assert parse_hf("bentrevett/multi30k:train") == ("bentrevett/multi30k", None, "train")
  for bad in ("wmt14", "wmt/wmt14:de-en:", "a:b:c:d"):
    with pytest.raises(DataError, match=r"expected hf:NAME\[:CONFIG\]:SPLIT"):
      parse_hf(bad)


def test_hub_errors_name_what_the_dataset_has(hub_pairs, tmp_path):
  repo = write_hub_dataset(tmp_path / "wmt14", hub_pairs)
  for streaming in (False, True):
    with pytest.raises(DataError, match=r"no 'fr' text; the dataset has languages \['de', 'en'\]"):
      list(Source(f"hf:{repo}:de-en:train", "en", "fr", streaming=streaming))
  with pytest.raises(DataError, match=r"cannot load dataset .*config 'fr-en'.*Available: \['de-en'\]"):
    list(Source(f"hf:{repo}:fr-en:train", "en", "fr"))
  with pytest.raises(DataError, match=r"split 'test'.*Unknown split"):
    list(Source(f"hf:{repo}:de-en:test", "en", "de"))
  with pytest.raises(DataError, match=r"hf:.*nowhere:de-en:train: cannot load dataset"):
    list(Source(f"hf:{tmp_path}/nowhere:de-en:train", "en", "de"))


def test_local_hub_dataset_fingerprint_follows_its_files(hub_pairs, tmp_path):
  repo = write_hub_dataset(tmp_path / "wmt14", hub_pairs)
  src = Source(f"hf:{repo}:de-en:train", "en", "de")
  before = src.fingerprint()
  shard = repo / "de-en" / "train-00000-of-00001.parquet"
  shard.write_bytes(shard.read_bytes() + b"x")
  assert src.fingerprint() != before
  assert Source("hf:wmt/wmt14:de-en:train", "en", "de").fingerprint()  # a Hub id: the spec alone


def test_hugging_face_missing_field_is_a_clear_error(tmp_path):
  import datasets

  datasets.Dataset.from_dict({"translation": [{"de": "a", "en": "b"}]}).to_parquet(str(tmp_path / "x.parquet"))
  with pytest.raises(DataError, match=r"record in 0\.\.999 has no field 'fr' \(fields: \['de', 'en'\]\)"):
    list(Source(f"parquet:{tmp_path}/x.parquet", "en", "fr"))


def write_corpora(root, pairs, names):
  """Splits `pairs` into one corpus per name, written as NAME.en / NAME.de under `root`."""
  chunks = np.array_split(np.arange(len(pairs)), len(names))
  for name, chunk in zip(names, chunks):
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    for side, lang in enumerate(("en", "de")):
      (root / f"{name}.{lang}").write_text("".join(pairs[i][side] + "\n" for i in chunk), encoding="utf-8")
  return [[pairs[i] for i in chunk] for chunk in chunks]


def test_several_corpora_per_side_by_list_and_by_glob(data_dir, tmp_path):
  pairs = list(Source(f"files:{NEWSTEST}", "en", "de", data_dir=str(data_dir)))
  parts = write_corpora(tmp_path, pairs, ["training/europarl-v7.de-en", "training/commoncrawl.de-en",
                                          "training/news-commentary-v9.de-en"])
  listed = Source("files:training/europarl-v7.de-en.{lang},training/commoncrawl.de-en.{lang},"
                  "training/news-commentary-v9.de-en.{lang}", "en", "de", data_dir=str(tmp_path))
  assert list(listed) == pairs
  globbed = Source("files:training/*.de-en.{lang}", "en", "de", data_dir=str(tmp_path))
  # Sorted by source path: commoncrawl, europarl, news-commentary.
  assert list(globbed) == parts[1] + parts[0] + parts[2]
  assert [f.name for f in globbed.files()] == ["commoncrawl.de-en.en", "commoncrawl.de-en.de", "europarl-v7.de-en.en",
                                               "europarl-v7.de-en.de", "news-commentary-v9.de-en.en",
                                               "news-commentary-v9.de-en.de"]
  assert list(Source("files:training/*.de-en.{lang}", "de", "en", data_dir=str(tmp_path))) == [
      (t, s) for s, t in parts[1] + parts[0] + parts[2]]


def test_several_corpora_errors_name_the_file(tmp_path):
  write_corpora(tmp_path, [("a", "b")] * 6, ["one", "two", "three"])
  (tmp_path / "two.de").write_text("b\n")  # one line where two.en has two
  with pytest.raises(DataError, match=r"two\.de has 1 lines but .*two\.en has more"):
    list(Source("files:one.{lang},two.{lang},three.{lang}", "en", "de", data_dir=str(tmp_path)))
  (tmp_path / "three.de").unlink()
  with pytest.raises(DataError, match=r"three\.de: no such file, the de side of .*three\.en"):
    Source("files:t*.{lang}", "en", "de", data_dir=str(tmp_path)).files()
  with pytest.raises(DataError, match=r"three\.de: no such file"):
    Source("files:one.{lang},three.{lang}", "en", "de", data_dir=str(tmp_path)).fingerprint()
  with pytest.raises(DataError, match=r"no file matches .*/x\*\.en"):
    Source("files:x*.{lang}", "en", "de", data_dir=str(tmp_path)).files()
  with pytest.raises(DataError, match="give paths with {lang}"):
    Source("files:one.{lang},two.en,two.de", "en", "de", data_dir=str(tmp_path)).files()


class _Server:
  """A static file server on 127.0.0.1 for the download tests; stops itself."""

  def __init__(self, directory):
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(directory), **k)
    handler.log_message = lambda *a: None
    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

  def __enter__(self):
    self.thread.start()
    return f"http://127.0.0.1:{self.httpd.server_address[1]}"

  def __exit__(self, *exc):
    self.httpd.shutdown()
    self.httpd.server_close()


@pytest.fixture
def served_checksums(data_dir, monkeypatch):
  """The release's checksums replaced by those of the synthetic files the tests serve."""
  monkeypatch.setattr(sources, "MULTI30K_SHA256",
                      {name: file_sha256(data_dir / "multi30k" / name) for name in sources.MULTI30K_SHA256
                       if (data_dir / "multi30k" / name).is_file()})


@pytest.mark.data
def test_the_checksums_are_those_of_the_multi30k_release(real_data_dir):
  assert {name: file_sha256(real_data_dir / "multi30k" / name) for name in sources.MULTI30K_SHA256} == \
      sources.MULTI30K_SHA256


def test_multi30k_download_verifies_checksum(data_dir, tmp_path, served_checksums):
  with _Server(data_dir / "multi30k") as url:
    src = Source("multi30k:val", "en", "de", cache_dir=str(tmp_path / "cache"), multi30k_url=url)
    assert list(src) == list(Source("multi30k:val", "en", "de", data_dir=str(data_dir)))
  assert (tmp_path / "cache/multi30k/val.en.gz").read_bytes() == (data_dir / "multi30k/val.en.gz").read_bytes()
  # Cached now: no server needed any more.
  assert len(list(src)) == synthetic.MULTI30K["val"]


def test_multi30k_download_with_wrong_checksum_fails_and_leaves_nothing(data_dir, tmp_path, served_checksums):
  served = tmp_path / "served"
  served.mkdir()
  shutil.copy(data_dir / "multi30k/val.en.gz", served / "val.en.gz")
  with open(served / "val.en.gz", "ab") as f:
    f.write(b"tampered")
  shutil.copy(data_dir / "multi30k/val.de.gz", served / "val.de.gz")
  cache = tmp_path / "cache"
  with _Server(served) as url:
    with pytest.raises(DataError, match="sha256"):
      Source("multi30k:val", "en", "de", cache_dir=str(cache), multi30k_url=url).files()
  assert not (cache / "multi30k").exists()  # no partial or temporary file, and no empty folder


def test_line_count_mismatch_names_both_files(tmp_path):
  (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
  (tmp_path / "a.de").write_text("eins\nzwei\n")
  with pytest.raises(DataError, match=r"a\.de has 2 lines but .*a\.en has more"):
    list(read_parallel(tmp_path / "a.en", tmp_path / "a.de"))


def test_invalid_utf8_names_file_and_line(tmp_path):
  with gzip.open(tmp_path / "bad.de.gz", "wb") as f:
    f.write("gut\nauch gut\n".encode() + b"kaputt \xff\xfe\n")
  with pytest.raises(DataError, match=r"bad\.de\.gz:3: invalid UTF-8"):
    list(read_lines(tmp_path / "bad.de.gz"))


def test_missing_file_and_missing_split(data_dir, tmp_path):
  with pytest.raises(DataError, match=r"nope\.en: no such file"):
    list(Source("files:nope.{lang}", "en", "de", data_dir=str(tmp_path)))
  with pytest.raises(DataError, match=r"no split/language file 'test_2017_flickr\.cs\.gz'"):
    Source("multi30k:test_2017_flickr", "en", "cs", data_dir=str(data_dir), cache_dir=str(tmp_path)).files()
  with pytest.raises(DataError, match="KIND:WHAT"):
    list(Source("ftp:somewhere", "en", "de"))


def test_unknown_language_code_names_the_key():
  assert check_language("de", "tgt_lang") == "de"
  with pytest.raises(DataError, match=r"config\.data\.tgt_lang='xx'"):
    check_language("xx", "tgt_lang")


def test_a_cached_file_that_does_not_match_its_checksum_is_downloaded_again(data_dir, tmp_path, caplog,
                                                                           served_checksums):
  """A 50-line val.en.gz put into the cache by hand was once read as Multi30k val."""
  cache = tmp_path / "cache"
  (cache / "multi30k").mkdir(parents=True)
  lines = gzip.decompress((data_dir / "multi30k/val.en.gz").read_bytes()).splitlines(keepends=True)[:50]
  (cache / "multi30k/val.en.gz").write_bytes(gzip.compress(b"".join(lines)))
  with _Server(data_dir / "multi30k") as url:
    src = Source("multi30k:val", "en", "de", cache_dir=str(cache), multi30k_url=url)
    assert len(list(src)) == synthetic.MULTI30K["val"]
  assert "val.en.gz does not match its sha256; downloading it again" in caplog.text
  assert (cache / "multi30k/val.en.gz").read_bytes() == (data_dir / "multi30k/val.en.gz").read_bytes()
  with _Server(data_dir / "multi30k") as url:  # a cap below the file's size
    with pytest.raises(DataError, match=r"more than 1000 bytes; refusing the download"):
      sources.download(f"{url}/val.de.gz", tmp_path / "capped" / "val.de.gz", "0" * 64, max_bytes=1000)
  assert not (tmp_path / "capped").exists()
