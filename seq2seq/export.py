"""Exports a trained model as a self-contained folder that loads without orbax:

  python -m seq2seq.export --workdir=DIR --out=MODEL_DIR [--checkpoint=best|STEP]

MODEL_DIR/
  model.safetensors   the parameters (names like encoder_layers.0.self_attn.wq_dnh), with
                      the checkpoint's label in the file's metadata
  config.json         the run's resolved config (model, data, eval settings)
  spm.model           the sentencepiece model
  README.md           a model card: languages, size, training, the run's BLEU/chrF with
                      their sacreBLEU signatures

  from seq2seq import Translator
  Translator.from_pretrained("MODEL_DIR").translate(["A man rides a bike."])
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile

import jax
import ml_collections
import numpy as np

from seq2seq import data, metrics, sharding
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.model import transformer
from seq2seq.model.config import ModelConfig

PARAMS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
CARD_FILE = "README.md"
FORMAT = "seq2seq-model-1"


def _name(path) -> str:
  return ".".join(str(getattr(k, "key", getattr(k, "idx", ""))) for k in path if not hasattr(k, "name"))


def flatten(params) -> dict[str, np.ndarray]:
  """{dotted name: host array} of an nnx parameter state (every process gathers the whole)."""
  from jax.experimental import multihost_utils

  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  return {_name(path): np.asarray(multihost_utils.process_allgather(x, tiled=True)) for path, x in leaves}


def export(workdir: str | os.PathLike, out: str | os.PathLike, checkpoint: None | str | int = None, *,
           overwrite: bool = False) -> pathlib.Path:
  """Writes MODEL_DIR from a run's checkpoint (None: the newest intact one; "best"; a step)."""
  from safetensors.numpy import save_file

  from seq2seq.inference import load

  workdir, out = pathlib.Path(workdir), pathlib.Path(out)
  if out.exists() and any(out.iterdir()) and not (overwrite and (out / PARAMS_FILE).is_file()):
    raise ValueError(f"{out} exists and is not empty; choose a new --out"
                     + (" (or --overwrite to replace an earlier export)" if (out / PARAMS_FILE).is_file() else ""))
  config = load.run_config(workdir)
  mesh = sharding.make_mesh(config.mesh)
  model_cfg, _, params, tok, label = load.load_params(workdir, config, mesh, best=checkpoint == "best",
                                                      step=checkpoint if isinstance(checkpoint, int) else None)
  tensors = flatten(params)
  if jax.process_index() != 0:
    return out
  out.parent.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
  try:  # written beside, then moved into place: an interrupted export leaves no half a model
    save_file(tensors, str(staging / PARAMS_FILE), metadata={"format": FORMAT, "checkpoint": label})
    (staging / CONFIG_FILE).write_text((workdir / CONFIG_FILE).read_text(encoding="utf-8"), encoding="utf-8")
    (staging / data.SPM_FILE).write_bytes(tok.model_bytes)
    (staging / CARD_FILE).write_text(model_card(workdir, config, model_cfg, label), encoding="utf-8")
    if out.exists():
      shutil.rmtree(out)
    staging.rename(out)
  finally:
    if staging.exists():
      shutil.rmtree(staging)
  return out


def read_model_dir(model_dir: str | os.PathLike):
  """(config, model config, tokenizer, checkpoint label) of an exported model folder."""
  from safetensors import safe_open

  model_dir = pathlib.Path(model_dir)
  for name in (PARAMS_FILE, CONFIG_FILE, data.SPM_FILE):
    if not (model_dir / name).is_file():
      raise ValueError(f"{model_dir / name} not found: is {model_dir} a folder written by python -m seq2seq.export?")
  try:
    config = ml_collections.ConfigDict(json.loads((model_dir / CONFIG_FILE).read_text(encoding="utf-8")))
  except json.JSONDecodeError as err:
    raise ValueError(f"{model_dir / CONFIG_FILE}: not JSON ({err})") from None
  tok = Tokenizer.load(model_dir / data.SPM_FILE)
  with safe_open(str(model_dir / PARAMS_FILE), framework="numpy") as f:
    label = (f.metadata() or {}).get("checkpoint", "exported")
  return config, ModelConfig.from_config(config.model, vocab_size=tok.vocab_size), tok, label


def load_params(model_dir: str | os.PathLike, model_cfg: ModelConfig, mesh):
  """(graphdef, parameters laid out on `mesh`) from MODEL_DIR/model.safetensors; every
  parameter must be there with the model's shape and dtype."""
  from flax import nnx
  from safetensors.numpy import load_file

  path = pathlib.Path(model_dir) / PARAMS_FILE
  tensors = load_file(str(path))
  abstract = nnx.state(transformer.abstract(model_cfg), nnx.Param)
  shardings = sharding.state_shardings(abstract, mesh)
  paths, treedef = jax.tree_util.tree_flatten_with_path(abstract)
  names = [_name(p) for p, _ in paths]
  missing, extra = sorted(set(names) - set(tensors)), sorted(set(tensors) - set(names))
  if missing or extra:
    raise ValueError(f"{path} does not match the config's model: missing {missing[:5]}, unexpected {extra[:5]}")
  leaves = []
  for name, (_, like), where in zip(names, paths, jax.tree.leaves(shardings)):
    x = tensors[name]
    if x.shape != like.shape or x.dtype != like.dtype:
      raise ValueError(f"{path}: {name} is {x.dtype}{list(x.shape)}, the model needs {like.dtype}{list(like.shape)}")
    leaves.append(jax.make_array_from_callback(x.shape, where, lambda index, x=x: x[index]))
  return transformer.graphdef(model_cfg), jax.tree_util.tree_unflatten(treedef, leaves)


def model_card(workdir: pathlib.Path, config, model_cfg: ModelConfig, label: str) -> str:
  """A README for the model folder: what it translates, its size, how it was trained and scored."""
  d = config.data
  summary = metrics.training_summary(workdir)
  results = []
  for path in sorted((workdir / "eval").glob("*.json")):
    try:
      r = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
      continue
    if r.get("checkpoint") == label and "bleu" in r:
      results.append(r)
  lines = [f"# seq2seq translation model: {d.get('src_lang', '?')} → {d.get('tgt_lang', '?')}", "",
           f"An encoder-decoder Transformer trained with seq2seq on `{d.get('source', '?')}`, "
           f"exported from checkpoint `{label}` of `{workdir.resolve()}`.", "",
           "```python", "from seq2seq import Translator", "",
           'translator = Translator.from_pretrained("path/to/this/folder")',
           'print(translator.translate(["A man rides a bike."]))', "```", "",
           "or from the shell: `seq2seq-translate --model=path/to/this/folder < input.txt`", "",
           "## Model", "",
           f"{transformer.count_params(model_cfg) / 1e6:.1f}M parameters: d_model {model_cfg.d_model}, "
           f"{model_cfg.num_encoder_layers}+{model_cfg.num_decoder_layers} layers, {model_cfg.num_heads} heads, "
           f"d_ff {model_cfg.d_ff}, {model_cfg.norm_position}-{model_cfg.norm}, {model_cfg.activation}, "
           f"{model_cfg.positions} positions, sentencepiece vocabulary of {model_cfg.vocab_size}.", "",
           "## Training", "",
           f"{summary['steps']} steps in {summary['minutes']:.1f} minutes ({summary['tokens_per_s']:.0f} target "
           f"tokens/s): `{summary['command']}`", "", "## Evaluation", ""]
  if results:
    lines += ["| test set | BLEU | chrF | search | sentences |", "|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['bleu']:.1f} | {r['chrf']:.1f} | beam {r['decode']['beam_size']}, alpha "
              f"{r['decode']['alpha']:g} | {r['sentences']} |" for r in results]
    lines += ["", "sacreBLEU signatures:", ""]
    lines += [f"- {r['name']}: `{r['bleu_signature']}`, `{r['chrf_signature']}`" for r in results]
  else:
    lines += [f"No evaluation of checkpoint `{label}` was found in {workdir / 'eval'}: run "
              f"`seq2seq-eval --workdir={workdir}` before exporting to include its scores."]
  return "\n".join(lines) + "\n"


def main(argv=None) -> None:
  from absl import flags

  from seq2seq import cli

  workdir = flags.DEFINE_string("workdir", None, "The training run's directory.", required=True)
  out = flags.DEFINE_string("out", None, "The model directory to write (new, or empty).", required=True)
  checkpoint = flags.DEFINE_string("checkpoint", None, "'best' or a step (default: the newest intact checkpoint).")
  overwrite = flags.DEFINE_bool("overwrite", False, "Replace an earlier export in --out.")

  def run(_):
    path = export(workdir.value, out.value, cli.checkpoint_choice(checkpoint.value), overwrite=overwrite.value)
    if jax.process_index() == 0:
      print(f"exported {workdir.value} to {path}: {', '.join(sorted(p.name for p in path.iterdir()))}")

  cli.run(run, __name__, argv)


if __name__ == "__main__":
  main()
