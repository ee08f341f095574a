"""Exports a trained model as a self-contained folder that loads without orbax:

  python -m seq2seq.export --workdir=DIR --out=MODEL_DIR [--checkpoint=latest|best|STEP] [--average_last=K]

MODEL_DIR/
  model.safetensors   the parameters (names like encoder_layers.0.self_attn.wqkv_dn3h), with
                      the checkpoint's label in the file's metadata
  config.json         the run's resolved config (model, data, eval settings)
  spm.model           the sentencepiece model
  export.json         the manifest: {"format", "model": the model settings the export was made
                      from (without attention_impl), "files": {name: {"bytes", "sha256"}}} of
                      the three files above
  README.md           a model card: languages, size, training, the run's BLEU/chrF with
                      their sacreBLEU signatures (free to edit: not verified)

  from seq2seq import Translator
  Translator.from_pretrained("MODEL_DIR").translate(["A man rides a bike."])

Loading verifies the folder before using it (`read_model_dir`): the model settings of
config.json must equal those in export.json (a differing key is named), and each listed file
must have its recorded size and sha256, else `seq2seq.errors.ModelFileError` names the file.
config.json is verified whole: choose search settings with flags or Translator arguments,
not by editing it. A folder without export.json (an older export) loads with a warning,
unverified. A safetensors file that cannot be read is a ModelFileError naming it. An export
with separate q/k/v attention weights (`wq_dnh`, `wk_dnh`, `wv_dnh`: before they were fused)
loads with them fused (seq2seq.model.upgrade).

--out is checked before the checkpoint is loaded, each refusal one ConfigError naming it: a
non-empty folder is refused unless it is an earlier export and --overwrite is given; an earlier
export is a folder whose export.json is a manifest of this format and which holds nothing but
the files above (not verified against it: a damaged export can be replaced). Anything else
(a file beside them, a subfolder, no export.json) is refused naming what is there: --overwrite
never deletes what an export did not write. Refused too: a path that is a file, the current
directory or a folder holding it (replacing it would leave the shell in a deleted folder), and
the run's workdir or a folder holding it. A symbolic link to a folder is followed: the export
replaces the folder it leads to, and the link stays. Missing parent folders are created.

An export is built in a staging folder beside MODEL_DIR (`seq2seq.files.staging_dir`) and
swapped into place (`seq2seq.files.swap_in`: one atomic exchange on Linux, else two renames
through a backup), so that a kill at any moment leaves the earlier export or the new one.
What a killed export left beside MODEL_DIR is cleaned up by the next export to that parent
(a backup put back where MODEL_DIR is missing).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import pathlib
import sys

from seq2seq import cli


def define_flags():
  """The flags of `python -m seq2seq.export`, above JAX's import: --help answers without it."""
  from absl import flags

  from seq2seq import ct2

  return (flags.DEFINE_string("workdir", None, "The training run's directory.", required=True),
          flags.DEFINE_string("out", None, "The model directory to write (new, or empty).", required=True),
          flags.DEFINE_string("checkpoint", None, cli.CHECKPOINT_HELP),
          flags.DEFINE_integer("average_last", 0, cli.AVERAGE_LAST_HELP),
          flags.DEFINE_bool("overwrite", False, "Replace an earlier export in --out."),
          flags.DEFINE_enum("format", "seq2seq", ["seq2seq", "ctranslate2"], "seq2seq: safetensors that "
                            "Translator.from_pretrained loads; ctranslate2: a CTranslate2 model folder, verified."),
          flags.DEFINE_enum("quantization", None, list(ct2.QUANTIZATIONS), "CTranslate2 weights (default float32)."))


cli.answer_before_imports(__name__, define_flags)

import jax
import ml_collections
import numpy as np

from seq2seq import cards, ct2, data, errors, files, sharding
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import ConfigError, ModelFileError
from seq2seq.model import transformer, upgrade
from seq2seq.model.config import ModelConfig

PARAMS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
CARD_FILE = "README.md"
MANIFEST_FILE = "export.json"
VERIFIED = (PARAMS_FILE, CONFIG_FILE, data.SPM_FILE)  # the files export.json records
FORMAT = "seq2seq-model-1"
LISTED = {FORMAT: VERIFIED, ct2.FORMAT: (*ct2.FILES, data.SPM_FILE)}  # each format's files that export.json records
WRITTEN = {*VERIFIED, *ct2.FILES, MANIFEST_FILE, CARD_FILE}  # all an export writes: what --overwrite may replace


def _name(path) -> str:
  return ".".join(str(getattr(k, "key", getattr(k, "idx", ""))) for k in path if not hasattr(k, "name"))


def flatten(params) -> dict[str, np.ndarray]:
  """{dotted name: host array} of an nnx parameter state (every process gathers the whole)."""
  from jax.experimental import multihost_utils

  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  return {_name(path): np.asarray(multihost_utils.process_allgather(x, tiled=True)) for path, x in leaves}


def export(workdir: str | os.PathLike, out: str | os.PathLike, checkpoint: None | str | int = None, *,
           average_last: int = 0, overwrite: bool = False, format: str = "seq2seq",
           quantization: str | None = None) -> pathlib.Path:
  """Writes MODEL_DIR from a run's checkpoint (None: the newest intact one; "best"; a step),
  or with `average_last` K the mean of the K checkpoints ending there. `format`
  "ctranslate2": a CTranslate2 model folder instead (seq2seq/ct2.py), its weights quantized
  as `quantization` says (None: float32)."""
  from safetensors.numpy import save

  from seq2seq.inference import load
  from seq2seq.training.checkpoint import NOT_IDENTITY

  workdir, out = pathlib.Path(workdir), pathlib.Path(out)
  _check_format(format, quantization)
  target = _target(workdir, out)
  if jax.process_index() == 0:
    files.remove_stale(target.parent)  # what killed exports left: staging folders, a backup to put back
  _check_replaceable(target, out, overwrite)
  config = load.run_config(workdir)
  mesh = sharding.make_mesh(config.mesh)
  loaded = load.load_params(workdir, config, mesh, checkpoint=checkpoint, average_last=average_last)
  model_cfg, tok, label = loaded.model_cfg, loaded.tokenizer, loaded.checkpoint.label
  if format == "ctranslate2" and (problem := ct2.refusal(model_cfg)):
    raise ConfigError(problem)
  tensors = flatten(loaded.params)
  if jax.process_index() != 0:
    return out
  if format == "seq2seq":
    contents = {PARAMS_FILE: save(tensors, metadata={"format": FORMAT, "checkpoint": label}),
                CONFIG_FILE: (workdir / CONFIG_FILE).read_bytes(), data.SPM_FILE: tok.model_bytes,
                CARD_FILE: cards.model_card(workdir, config, model_cfg, label).encode("utf-8")}
    del tensors
  model = {k: v for k, v in dataclasses.asdict(model_cfg).items() if k not in NOT_IDENTITY}
  try:  # built beside, then swapped into place: an interrupted export leaves the old one or the new
    with files.staging_dir(target.parent, target.name) as staging:
      if format == "ctranslate2":
        record = ct2.build(staging, loaded, config, mesh, tensors, quantization)
        card = cards.ctranslate2_card(label, workdir.resolve(), quantization, record).encode("utf-8")
        _write(staging, {data.SPM_FILE: tok.model_bytes, CARD_FILE: card}, model, ct2.FORMAT, {"ctranslate2": record})
      else:
        _write(staging, contents, model)
      _check_replaceable(target, out, overwrite)  # again: files may have come while the checkpoint loaded
      files.swap_in(staging, target)
  except OSError as err:  # disk full, a file-size limit, no permission: the staging folder is gone
    refused = errors.from_os_error(err, f"exporting to {out}")
    if refused is None:
      raise
    raise refused from err
  return out


def _check_format(format: str, quantization: str | None) -> None:
  """A ConfigError for a format or quantization that cannot be written here."""
  if format not in ("seq2seq", "ctranslate2"):
    raise ConfigError(f"--format={format}: must be seq2seq or ctranslate2")
  if quantization is not None and (format != "ctranslate2" or quantization not in ct2.QUANTIZATIONS):
    raise ConfigError(f"--quantization={quantization}: one of {', '.join(ct2.QUANTIZATIONS)}, with "
                      "--format=ctranslate2")
  if format == "ctranslate2" and importlib.util.find_spec("ctranslate2") is None:
    raise ConfigError("--format=ctranslate2 needs the ctranslate2 package: pip install 'ctranslate2>=4.5,<5' (in the "
                      "clone: pip install '.[ctranslate2]')")
  if format == "ctranslate2" and jax.process_count() > 1:
    raise ConfigError("--format=ctranslate2 runs in one process: export with --num_processes=1")


def _target(workdir: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
  """The folder an export to `out` replaces: `out`, or the folder it leads to when it is a
  symbolic link. A ConfigError naming --out where that cannot be: a file (or a path inside
  one), the current directory or a folder holding it, the workdir or a folder holding it, a
  parent that is not writable. Decided from the paths alone, before anything is loaded or written."""
  flag, target = f"--out={out}", pathlib.Path(os.path.realpath(out))
  shown = f"{flag} ({target})" if target != pathlib.Path(os.path.abspath(out)) else flag
  if target.is_symlink():  # what realpath leaves of a loop
    raise ConfigError(f"{flag}: a symbolic link that leads to itself; choose another --out")
  if os.path.lexists(target) and not target.is_dir():
    raise ConfigError(f"{shown}: is a file, not a folder; choose a new folder as --out")
  try:
    here = pathlib.Path(os.getcwd())
  except OSError:  # a current directory that was deleted holds nothing
    here = None
  if here is not None and here.is_relative_to(target):
    raise ConfigError(f"{shown}: {'is' if here == target else 'holds'} the current directory, which an export "
                      "replaces (this shell would be left in a deleted folder); run it from another directory or "
                      "choose another --out")
  run = pathlib.Path(os.path.realpath(workdir))
  if run.is_relative_to(target):
    raise ConfigError(f"{shown}: {'is' if run == target else 'holds'} the run's --workdir={workdir}; choose another "
                      f"--out (e.g. {run}-model)")
  parent = next((p for p in target.parents if os.path.lexists(p)), None)
  if parent is not None and not parent.is_dir():
    raise ConfigError(f"{flag}: {parent} is a file, not a folder; choose another --out")
  if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
    raise ConfigError(f"{flag}: no permission to write in {parent}; choose another --out")
  return target


def _check_replaceable(target: pathlib.Path, out: pathlib.Path, overwrite: bool) -> None:
  """A ConfigError naming --out unless `target` is missing, empty, or (with overwrite) an
  earlier export: a valid export.json and nothing but the files an export writes."""
  try:
    entries = sorted(os.scandir(target), key=lambda e: e.name)
  except (FileNotFoundError, NotADirectoryError):
    return
  if not entries:
    return
  problem = _not_an_export(target, entries)
  if not overwrite:
    raise ConfigError(f"--out={out}: exists and is not empty; choose a new --out"
                      + ("" if problem else " (or --overwrite to replace this earlier export)"))
  if problem:
    raise ConfigError(f"--out={out}: not replaced: --overwrite replaces only an earlier export, and {problem}")


def _not_an_export(folder: pathlib.Path, entries: list[os.DirEntry]) -> str | None:
  """Why `folder` (its `entries`) is not an earlier export that --overwrite may replace, and
  what to do about it; None when it is one."""
  other = [e.name + ("/" if e.is_dir(follow_symlinks=False) else " (a symbolic link)" if e.is_symlink() else "")
           for e in entries if e.name not in WRITTEN or not e.is_file(follow_symlinks=False)]
  if other:
    named = ", ".join(other[:4]) + (f" and {len(other) - 4} more" if len(other) > 4 else "")
    return (f"it holds {named}, which an export does not write; move {'it' if len(other) == 1 else 'them'} "
            "elsewhere or choose a new --out")
  if not any(e.name == MANIFEST_FILE for e in entries):
    return (f"it has no {MANIFEST_FILE} (an export made before there were manifests, or not an export); delete "
            "the folder yourself or choose a new --out")
  try:
    _parse_manifest(folder / MANIFEST_FILE, tuple(LISTED))
  except (ModelFileError, OSError) as err:
    return f"{err}; delete the folder yourself or choose a new --out"
  return None


def _write(folder: pathlib.Path, contents: dict[str, bytes], model: dict, format: str = FORMAT,
           extra: dict | None = None) -> None:
  """The files of an export, and export.json recording the model settings and the verified files."""
  for name, content in contents.items():
    try:
      with open(folder / name, "wb") as f:  # OSErrors (EFBIG, ENOSPC) keep their errno
        f.write(content)
    except OSError as err:
      err.filename = err.filename or str(folder / name)
      raise
    files.step(f"wrote {name}")
  listed = {name: {"bytes": (folder / name).stat().st_size, "sha256": files.file_sha256(folder / name)}
            for name in LISTED[format]}
  manifest = {"format": format, "model": model, "files": listed, **(extra or {})}
  (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
  files.step(f"wrote {MANIFEST_FILE}")


@contextlib.contextmanager
def _reading(path: pathlib.Path):
  """A safetensors file that cannot be read (truncated, a bad header) as a ModelFileError naming it."""
  from safetensors import SafetensorError

  try:
    yield
  except (SafetensorError, ValueError) as err:
    raise ModelFileError(f"{path}: not a readable safetensors file ({err}); export the model again") from None
  except OSError as err:
    refused = errors.from_os_error(err, f"reading {path}")
    raise (refused or ModelFileError(f"{path}: cannot be read ({err})")) from err


def read_model_dir(model_dir: str | os.PathLike):
  """(config, model config, tokenizer, checkpoint label) of an exported model folder, its
  files verified against export.json first (where there is one)."""
  from safetensors import safe_open

  model_dir = pathlib.Path(model_dir)
  if (model_dir / ct2.FILES[0]).is_file() and not (model_dir / PARAMS_FILE).exists():
    raise ModelFileError(f"{model_dir}: a CTranslate2 model (python -m seq2seq.export --format=ctranslate2); "
                         "translate with ctranslate2.Translator, as its README.md shows")
  for name in VERIFIED:
    if not (model_dir / name).is_file():
      raise ModelFileError(f"{model_dir / name} not found: is {model_dir} a folder written by python -m "
                           "seq2seq.export?")
  manifest = _manifest(model_dir)
  try:
    config = ml_collections.ConfigDict(json.loads((model_dir / CONFIG_FILE).read_text(encoding="utf-8")))
  except (json.JSONDecodeError, UnicodeDecodeError) as err:
    raise ModelFileError(f"{model_dir / CONFIG_FILE}: not JSON ({err})") from None
  if manifest is not None:
    _check_model(model_dir / CONFIG_FILE, config, manifest["model"])
    _check_files(model_dir, manifest["files"])
  tok = Tokenizer.load(model_dir / data.SPM_FILE)
  with _reading(model_dir / PARAMS_FILE), safe_open(str(model_dir / PARAMS_FILE), framework="numpy") as f:
    label = (f.metadata() or {}).get("checkpoint", "exported")
  return config, _model_config(model_dir / CONFIG_FILE, config, tok.vocab_size), tok, label


def _manifest(model_dir: pathlib.Path) -> dict | None:
  """MODEL_DIR/export.json, or None (with a warning) for an export made before there were manifests."""
  path = model_dir / MANIFEST_FILE
  if not path.exists():
    if jax.process_index() == 0:
      print(f"warning: {model_dir} has no {MANIFEST_FILE} (an older export); its files are not verified",
            file=sys.stderr, flush=True)
    return None
  return _parse_manifest(path)


def _parse_manifest(path: pathlib.Path, formats: tuple[str, ...] = (FORMAT,)) -> dict:
  """The manifest at `path` of one of `formats`, else a ModelFileError saying why it is not one."""
  try:
    manifest = json.loads(path.read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as err:
    raise ModelFileError(f"{path}: not JSON ({err})") from None
  manifest = manifest if isinstance(manifest, dict) else {}
  listed, format = manifest.get("files"), manifest.get("format")
  if (format not in formats or not isinstance(manifest.get("model"), dict) or not isinstance(listed, dict)
      or not all(isinstance(listed.get(name), dict) for name in LISTED[format])):
    raise ModelFileError(f"{path}: not a {FORMAT} manifest listing {', '.join(VERIFIED)} (written by another "
                         "version of seq2seq, or altered)")
  return manifest


def _model_config(path: pathlib.Path, config, vocab_size: int) -> ModelConfig:
  try:
    return ModelConfig.from_config(config.get("model", {}), vocab_size=vocab_size)
  except ConfigError as err:
    raise ModelFileError(f"{path}: {err}") from None


def _check_model(path: pathlib.Path, config, saved: dict) -> None:
  """The model settings of config.json are those the export was made with, else a
  ModelFileError naming each differing key."""
  current = ModelConfig.RETIRED | dataclasses.asdict(_model_config(path, config, saved.get("vocab_size", 1)))
  differ = [f"config.model.{key}: the export was made with {value!r}, {path.name} has "
            + (repr(current[key]) if key in current else "no such setting")
            for key, value in sorted(saved.items()) if current.get(key, ...) != value]
  if differ:
    raise ModelFileError(f"{path}: model settings altered since the export: {'; '.join(differ)}")


def _check_files(model_dir: pathlib.Path, listed: dict) -> None:
  """Each verified file has the size and sha256 export.json records, else a ModelFileError naming it."""
  for name in VERIFIED:
    path, record = model_dir / name, listed[name]
    size = path.stat().st_size
    if size != record.get("bytes"):
      raise ModelFileError(f"{path}: {size} bytes, the export wrote {record.get('bytes')} (truncated or altered)")
    if files.file_sha256(path) != record.get("sha256"):
      raise ModelFileError(f"{path}: contents differ from the sha256 recorded at export (damaged or altered)")


def load_params(model_dir: str | os.PathLike, model_cfg: ModelConfig, mesh):
  """(graphdef, parameters laid out on `mesh`) from MODEL_DIR/model.safetensors; every
  parameter must be there with the model's shape and dtype (separate q/k/v are fused)."""
  from flax import nnx
  from safetensors.numpy import load_file

  path = pathlib.Path(model_dir) / PARAMS_FILE
  with _reading(path):
    tensors = load_file(str(path))
  abstract = nnx.state(transformer.abstract(model_cfg), nnx.Param)
  shardings = sharding.state_shardings(abstract, mesh)
  paths, treedef = jax.tree_util.tree_flatten_with_path(abstract)
  names = [_name(p) for p, _ in paths]
  tensors = upgrade.fuse_named(tensors, names)
  missing, extra = sorted(set(names) - set(tensors)), sorted(set(tensors) - set(names))
  if missing or extra:
    raise ModelFileError(f"{path} does not match the config's model: missing {missing[:5]}, unexpected {extra[:5]}")
  leaves = []
  for name, (_, like), where in zip(names, paths, jax.tree.leaves(shardings)):
    x = tensors[name]
    if x.shape != like.shape or x.dtype != like.dtype:
      raise ModelFileError(f"{path}: {name} is {x.dtype}{list(x.shape)}, the model needs "
                           f"{like.dtype}{list(like.shape)}")
    leaves.append(jax.make_array_from_callback(x.shape, where, lambda index, x=x: x[index]))
  return transformer.graphdef(model_cfg), jax.tree_util.tree_unflatten(treedef, leaves)


def main(argv=None) -> None:
  workdir, out, checkpoint, average_last, overwrite, format, quantization = define_flags()

  def run(_):
    if average_last.value < 0:
      raise ConfigError(f"--average_last={average_last.value}: the number of checkpoints to average must be >= 0")
    path = export(workdir.value, out.value, cli.checkpoint_choice(checkpoint.value), average_last=average_last.value,
                  overwrite=overwrite.value, format=format.value, quantization=quantization.value)
    if jax.process_index() == 0:
      print(f"exported {workdir.value} to {path}: {', '.join(sorted(p.name for p in path.iterdir()))}")

  cli.run(run, __name__, argv)


if __name__ == "__main__":
  main()
