"""Where sentence pairs come from: local files (plain, gzip, SGML, TSV), Multi30k (local
or downloaded with checksums), and Hugging Face datasets (hub, saved to disk, parquet).

A split is named by a spec string `KIND:WHAT`:
  multi30k:train                     <dir>/multi30k/train.<lang>.gz, else downloaded
  files:wmt14/newstest2014.{lang}    one file per language ({lang} is substituted)
  files:europarl.{lang},nc.{lang}    several corpora, read one after the other
  files:training/*.de-en.{lang}      a glob: each source file pairs with the target file
                                     matching the same wildcards (sorted by source path)
  files:a.en.sgm,b.de.sgm            explicit source and target files (plain/.gz/.sgm)
  tsv:corpus.tsv                     source<TAB>target per line
  hf:wmt/wmt14:de-en:train           datasets.load_dataset("wmt/wmt14", "de-en", split="train"):
                                     hf:NAME[:CONFIG]:SPLIT, NAME a Hub id or a local folder
  hf-disk:/path/to/saved:train       datasets.load_from_disk(path)[split]
  parquet:/path/*.parquet            datasets.load_dataset("parquet", data_files=...)
Relative paths are resolved against the data directory. Every source yields
(source sentence, target sentence) pairs and raises `DataError` naming the file and line.
Hugging Face records are either {"translation": {lang: text}} (the WMT layout) or flat,
one column per language.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import gzip
import hashlib
import html
import http.client
import itertools
import os
import pathlib
import re
import sys
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator

from seq2seq.errors import DataError, DownloadError
from seq2seq.files import atomic_open, file_sha256

Pair = tuple[str, str]

# ISO 639-1 codes of languages with public MT data (WMT, IWSLT, Multi30k, OPUS).
LANGUAGES = frozenset(
    "af am ar as az be bg bn bs ca cs cy da de el en eo es et eu fa fi fr ga gl gu ha he hi hr ht hu hy id ig is "
    "it ja jv ka kk km kn ko ku ky la lb lo lt lv mg mi mk ml mn mr ms mt my ne nl no oc or pa pl ps pt ro ru "
    "rw si sk sl so sq sr sv sw ta te tg th tk tl tr tt ug uk ur uz vi xh yi yo zh zu".split())

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"
# sha256 of the Multi30k task-1 raw release files (<split>.<lang>.gz).
MULTI30K_SHA256 = {
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}


def check_language(code: str, key: str) -> str:
  if code not in LANGUAGES:
    raise DataError(f"config.data.{key}={code!r} is not a known ISO 639-1 language code")
  return code


# -- line readers ------------------------------------------------------------------------
_SEG = re.compile(rb"<seg[^>]*>(.*?)</seg>", re.S)


def read_lines(path: str | os.PathLike, *, replace_invalid: bool = False, allow_empty: bool = False) -> Iterator[str]:
  """Lines of a plain, gzip (.gz) or SGML (.sgm: the <seg> texts) file, without newlines; a
  named pipe or /dev/fd/N (`<(command)`) reads as a file does. Invalid UTF-8 and an empty
  file are DataErrors naming the file (and line), unless `replace_invalid` (U+FFFD, with a
  warning naming the line: every line keeps its place) and `allow_empty`."""
  path = pathlib.Path(path)
  if not path.exists():
    raise DataError(f"{path}: no such file")
  if path.is_dir():
    raise DataError(f"{path}: a folder, not a file")
  decode = functools.partial(_decode, replace=replace_invalid)
  opener = gzip.open if path.suffix == ".gz" else open
  sgml = path.name.endswith((".sgm", ".sgm.gz"))
  lineno = 0
  try:
    with opener(path, "rb") as f:
      if sgml:
        text = f.read()
        for match in _SEG.finditer(text):
          lineno = text.count(b"\n", 0, match.start()) + 1
          yield html.unescape(decode(match.group(1), path, lineno).strip())
        return
      for lineno, raw in enumerate(f, start=1):
        yield decode(raw, path, lineno).rstrip("\r\n")
  except (EOFError, gzip.BadGzipFile, zlib.error) as err:  # a truncated or corrupt download or copy
    raise DataError(f"{path}: damaged gzip file after line {lineno} ({type(err).__name__}: {err}); "
                    "download or copy it again") from None
  if lineno == 0 and not sgml and not allow_empty:
    raise DataError(f"{path}: empty file")


def _decode(raw: bytes, path, lineno: int, replace: bool = False) -> str:
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    if not replace:
      raise DataError(f"{path}:{lineno}: invalid UTF-8 at byte {e.start} of the line") from None
    print(f"warning: {path}:{lineno}: invalid UTF-8 at byte {e.start}, replaced by U+FFFD", file=sys.stderr,
          flush=True)
    return raw.decode("utf-8", errors="replace")


def read_parallel(src_path, tgt_path) -> Iterator[Pair]:
  """Pairs from two line-aligned files; a different number of lines is an error."""
  src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
  count = 0
  for src, tgt in itertools.zip_longest(src_lines, tgt_lines):
    if src is None or tgt is None:
      longer, shorter = (tgt_path, src_path) if src is None else (src_path, tgt_path)
      raise DataError(f"{shorter} has {count} lines but {longer} has more: source and target line counts differ")
    count += 1
    yield src, tgt


def read_tsv(path, columns: tuple[int, int] = (0, 1)) -> Iterator[Pair]:
  """Pairs from a tab-separated file, source and target in the given columns."""
  for lineno, line in enumerate(read_lines(path), start=1):
    fields = line.split("\t")
    if len(fields) <= max(columns):
      raise DataError(f"{path}:{lineno}: expected at least {max(columns) + 1} tab-separated fields, got {len(fields)}")
    yield fields[columns[0]], fields[columns[1]]


# -- Multi30k ----------------------------------------------------------------------------
MAX_DOWNLOAD_BYTES = 512 * 2**20  # a download larger than this is refused (a wrong URL, not a corpus file)
_verified: set[tuple[str, str]] = set()  # (path, sha256) of cached files checked by this process


def download(url: str, dest: pathlib.Path, sha256: str, max_bytes: int = MAX_DOWNLOAD_BYTES) -> pathlib.Path:
  """Downloads `url` to `dest`, verifying its sha256; never leaves a partial file. A file
  already in the cache is verified too (once per process): one that does not match (damaged,
  or put there by hand) is downloaded again. More than `max_bytes` is refused."""
  if dest.is_file():
    if (str(dest), sha256) in _verified:
      return dest
    if file_sha256(dest) == sha256:
      _verified.add((str(dest), sha256))
      return dest
    import logging

    logging.getLogger(__name__).warning("%s does not match its sha256; downloading it again", dest)
  digest, size = hashlib.sha256(), 0
  made = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]  # removed again if the download fails
  try:
    with atomic_open(dest, suffix=".part") as out, urllib.request.urlopen(url, timeout=60) as response:
      for chunk in iter(lambda: response.read(1 << 20), b""):
        size += len(chunk)
        if size > max_bytes:
          raise DataError(f"{url}: more than {max_bytes} bytes; refusing the download (nothing was written to {dest})")
        digest.update(chunk)
        out.write(chunk)
      if digest.hexdigest() != sha256:
        raise DataError(f"{url}: sha256 {digest.hexdigest()} does not match the expected {sha256}; "
                        f"nothing was written to {dest}")
  except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as err:
    _remove_empty(made)
    reason = f"HTTP {err.code} {err.reason}" if isinstance(err, urllib.error.HTTPError) else \
        f"no network? {getattr(err, 'reason', None) or err}"
    raise DownloadError(f"{url}: download failed ({reason}). Without a network, copy the files into a data folder "
                        f"(DIR/{dest.parent.name}/{dest.name}, as in ../shared/data) and point SEQ2SEQ_DATA_DIR "
                        "(or config.data.dir) at DIR") from None
  except BaseException:
    _remove_empty(made)
    raise
  _verified.add((str(dest), sha256))
  return dest


def _remove_empty(folders: list[pathlib.Path]) -> None:
  """Removes the folders of `folders` (innermost first) that are empty."""
  for folder in folders:
    try:
      folder.rmdir()
    except OSError:
      return


def multi30k_file(split: str, lang: str, data_dir: str, cache_dir: str, base_url: str = MULTI30K_URL) -> pathlib.Path:
  """The local Multi30k file, from `data_dir` if it has it, else downloaded into the cache."""
  name = f"{split}.{lang}.gz"
  if data_dir:
    if not pathlib.Path(data_dir).is_dir():
      raise DataError(f"config.data.dir={data_dir} (or SEQ2SEQ_DATA_DIR) is not a folder; point it at a folder laid "
                      "out like ../shared/data, or leave it empty to download Multi30k")
    local = pathlib.Path(data_dir) / "multi30k" / name
    if local.is_file():
      return local
  if name not in MULTI30K_SHA256:
    raise DataError(f"multi30k has no split/language file {name!r} "
                    f"(known: {', '.join(sorted(MULTI30K_SHA256))})")
  return download(f"{base_url}/{name}", pathlib.Path(cache_dir) / "multi30k" / name, MULTI30K_SHA256[name])


# -- Hugging Face datasets ----------------------------------------------------------------
def parse_hf(what: str) -> tuple[str, str | None, str]:
  """(name, config or None, split) of an `hf:NAME[:CONFIG]:SPLIT` spec."""
  parts = what.split(":")
  if len(parts) not in (2, 3) or not all(parts):
    raise DataError(f"hf:{what}: expected hf:NAME[:CONFIG]:SPLIT, e.g. hf:wmt/wmt14:de-en:train")
  return parts[0], (parts[1] if len(parts) == 3 else None), parts[-1]


def _languages(features) -> list[str] | None:
  """The languages a dataset's features offer: the translation field's, else its columns."""
  if features is None:
    return None
  if "translation" in features:
    languages = getattr(features["translation"], "languages", None)
    return sorted(languages) if languages else None
  return sorted(features)


def _check_languages(features, src_lang: str, tgt_lang: str, where: str) -> None:
  have = _languages(features)
  if have is not None and not {src_lang, tgt_lang} <= set(have):
    missing = [lang for lang in (src_lang, tgt_lang) if lang not in have]
    raise DataError(f"{where}: no {', '.join(map(repr, missing))} text; the dataset has languages {have} "
                    "(pick another config or set config.data.src_lang / tgt_lang)")


def _batches_to_pairs(records, src_lang: str, tgt_lang: str, where: str, batch_size: int = 1000) -> Iterator[Pair]:
  """Pairs from a Dataset or IterableDataset, read a batch of records at a time."""
  first = 0
  for batch in records.iter(batch_size=batch_size):
    columns = batch["translation"] if "translation" in batch else None
    try:
      if columns is None:
        yield from zip(batch[src_lang], batch[tgt_lang])
      else:
        yield from ((r[src_lang], r[tgt_lang]) for r in columns)
    except KeyError as e:
      fields = sorted(columns[0]) if columns else sorted(batch)
      raise DataError(f"{where}: a record in {first}..{first + batch_size - 1} has no field {e.args[0]!r} "
                      f"(fields: {fields})") from None
    first += batch_size


def hf_pairs(kind: str, what: str, src_lang: str, tgt_lang: str, *, streaming: bool,
             fingerprint: str = "") -> Iterator[Pair]:
  """Pairs of a Hugging Face source. `fingerprint` (of a local folder's files) gives the
  folder a `datasets` cache of its own: `datasets` keys a local folder's cache by its name
  and config, so two folders of one name would otherwise share (stale) prepared data."""
  import datasets  # imported here: it is slow to import and only needed for these sources

  where = f"{kind}:{what}"
  if kind == "hf":
    name, config, split = parse_hf(what)
    cache = {"cache_dir": str(pathlib.Path(datasets.config.HF_DATASETS_CACHE) / "seq2seq" / fingerprint)} \
        if fingerprint else {}
    try:
      records = datasets.load_dataset(name, config, split=split, streaming=streaming, **cache)
    except ConnectionError as e:  # offline, or the Hub did not answer
      raise DownloadError(f"{where}: cannot download dataset {name!r} from the Hugging Face Hub (no network? {e}). "
                          "Without a network, use a local copy: files:..., or hf:/path/to/a/saved/dataset") from None
    except (ValueError, OSError) as e:  # unknown config or split, no such dataset
      raise DataError(f"{where}: cannot load dataset {name!r} (config {config!r}, split {split!r}): {e}") from None
  elif kind == "hf-disk":
    path, _, split = what.rpartition(":") if ":" in what else (what, "", "")
    dataset = datasets.load_from_disk(path)
    if isinstance(dataset, datasets.DatasetDict):
      if split not in dataset:
        raise DataError(f"{path}: no split {split!r} (splits: {sorted(dataset)})")
      dataset = dataset[split]
    records = dataset.to_iterable_dataset() if streaming else dataset
  else:  # parquet
    records = datasets.load_dataset("parquet", data_files=what, split="train", streaming=streaming)
  _check_languages(records.features, src_lang, tgt_lang, where)
  yield from _batches_to_pairs(records, src_lang, tgt_lang, where)


def _expand(template: str, src_lang: str, tgt_lang: str) -> list[tuple[pathlib.Path, pathlib.Path]]:
  """(source, target) files of one `{lang}` template; with glob wildcards, each source match
  pairs with the target file whose wildcards match the same text."""
  if not glob.has_magic(template):
    return [(pathlib.Path(template.format(lang=src_lang)), pathlib.Path(template.format(lang=tgt_lang)))]
  parts = re.split(r"(\{lang\}|\*|\?|\[[^\]]*\])", template)
  pattern = "".join({"{lang}": re.escape(src_lang), "*": "([^/]*)", "?": "([^/])"}.get(
      p, "([^/])" if p.startswith("[") else re.escape(p)) for p in parts)
  pairs = []
  for src in sorted(glob.glob(template.format(lang=src_lang))):
    captured = iter(re.fullmatch(pattern, src).groups())
    tgt = "".join(tgt_lang if p == "{lang}" else next(captured) if p in ("*", "?") or p.startswith("[") else p
                  for p in parts)
    if not os.path.isfile(tgt):
      raise DataError(f"{tgt}: no such file, the {tgt_lang} side of {src} (files:{template})")
    pairs.append((pathlib.Path(src), pathlib.Path(tgt)))
  if not pairs:
    raise DataError(f"files:{template}: no file matches {template.format(lang=src_lang)}")
  return pairs


# -- specs -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Source:
  """One split of parallel data, resolved from a spec string; iterate to get pairs."""

  spec: str
  src_lang: str
  tgt_lang: str
  data_dir: str = ""
  cache_dir: str = ""
  streaming: bool = False
  multi30k_url: str = MULTI30K_URL
  tsv_columns: tuple[int, int] = (0, 1)

  def _path(self, p: str) -> pathlib.Path:
    p = pathlib.Path(os.path.expanduser(p))
    return p if p.is_absolute() or not self.data_dir else pathlib.Path(self.data_dir) / p

  @property
  def kind_what(self) -> tuple[str, str]:
    kind, sep, what = self.spec.partition(":")
    if not sep or kind not in ("multi30k", "files", "tsv", "hf", "hf-disk", "parquet"):
      raise DataError(f"data split spec {self.spec!r}: expected KIND:WHAT with KIND one of "
                      "multi30k, files, tsv, hf, hf-disk, parquet")
    return kind, what

  def file_pairs(self) -> list[tuple[pathlib.Path, pathlib.Path]]:
    """The (source, target) files of a multi30k or files source, in reading order."""
    kind, what = self.kind_what
    if kind == "multi30k":
      return [tuple(multi30k_file(what, lang, self.data_dir, self.cache_dir, self.multi30k_url)
                    for lang in (self.src_lang, self.tgt_lang))]
    if kind != "files":
      return []
    entries = what.split(",")
    templated = ["{lang}" in e for e in entries]
    if not any(templated) and len(entries) == 2:
      return [(self._path(entries[0]), self._path(entries[1]))]
    if not all(templated):
      raise DataError(f"files:{what}: give paths with {{lang}} (one corpus each, comma-separated) or exactly two "
                      "paths, source and target, separated by a comma")
    return [pair for e in entries for pair in _expand(str(self._path(e)), self.src_lang, self.tgt_lang)]

  def files(self) -> list[pathlib.Path]:
    """The local files this source reads (empty for Hugging Face sources)."""
    if self.kind_what[0] == "tsv":
      return [self._path(self.kind_what[1])]
    return [f for pair in self.file_pairs() for f in pair]

  def _dataset_files(self) -> list[pathlib.Path]:
    """The files of a Hugging Face source stored locally (a folder, saved dataset or parquet glob)."""
    kind, what = self.kind_what
    if kind == "parquet":
      return sorted(pathlib.Path(p) for p in glob.glob(os.path.expanduser(what)))
    folder = pathlib.Path(os.path.expanduser(parse_hf(what)[0] if kind == "hf" else what.rpartition(":")[0] or what))
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []

  def fingerprint(self) -> str:
    """Identifies the content: file paths, sizes and mtimes (of local Hugging Face datasets
    too), or the Hub dataset spec."""
    parts = [self.spec, self.src_lang, self.tgt_lang, str(self.tsv_columns)]
    local = self._dataset_files() if self.kind_what[0] in ("hf", "hf-disk", "parquet") else self.files()
    for f in local:
      if not f.is_file():
        raise DataError(f"{f}: no such file (split {self.spec!r})")
      st = f.stat()
      parts.append(f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]

  def __iter__(self) -> Iterator[Pair]:
    kind, what = self.kind_what
    if kind in ("multi30k", "files"):
      return itertools.chain.from_iterable(read_parallel(src, tgt) for src, tgt in self.file_pairs())
    if kind == "tsv":
      return read_tsv(self.files()[0], self.tsv_columns)
    local = kind == "hf" and self._dataset_files()
    return hf_pairs(kind, what, self.src_lang, self.tgt_lang, streaming=self.streaming,
                    fingerprint=self.fingerprint() if local else "")
