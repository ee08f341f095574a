"""The public Python API: `from seq2seq import Translator`, loading a run or an exported model,
scores that are the model's own, the export folder. (The layout's rules: tests/test_layout.py.)"""

import json
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO
from flax import nnx

import seq2seq
from seq2seq import Translator, data, export, metrics, sharding
from seq2seq.inference.translate import Want
from seq2seq.inference import decode, evaluate, load

SENTENCES = ["A man is riding a bike.", "", "Two dogs play in the snow near a red house.", "Hello."]
SMALL = dict(beam_size=2, max_len_b=8, batch_size=4)


def test_the_top_level_names_are_the_library_objects():
  from seq2seq.inference.translate import Translator as library_translator
  from seq2seq.training.train import train_and_evaluate

  assert Translator is library_translator and seq2seq.train_and_evaluate is train_and_evaluate
  assert all(getattr(seq2seq, name) is not None for name in seq2seq.__all__)
  assert seq2seq.get_config("multi30k").model.d_model == 128
  with pytest.raises(AttributeError):
    seq2seq.no_such_name  # noqa: B018


def test_from_workdir_translates_as_the_library_path(tiny_run):
  config = load.run_config(tiny_run)
  mesh = sharding.make_mesh(config.mesh)
  loaded = load.load_params(tiny_run, config, mesh)
  params, label = loaded.params, loaded.checkpoint.label
  by_hand = Translator(loaded.model_cfg, loaded.graphdef, loaded.tokenizer, mesh, alpha=config.eval.alpha,
                       max_len_a=1.0, **SMALL)
  translator = Translator.from_workdir(tiny_run, **SMALL)
  assert translator.translate(SENTENCES) == by_hand(params, SENTENCES)
  assert translator.translate(SENTENCES[0]) == by_hand(params, SENTENCES[:1])[0]  # one string in, one out
  assert translator.checkpoint == label == "step60"
  defaults = Translator.from_workdir(tiny_run)  # search settings from the run's config.eval
  assert {k: getattr(defaults.settings, k) for k in ("beam_size", "alpha")} == {"beam_size": config.eval.beam_size,
                                                                       "alpha": config.eval.alpha}


def test_search_settings_take_the_config_then_the_overrides_and_name_each_known_key_once():
  from ml_collections import ConfigDict
  from seq2seq.inference.translate import search_settings
  eval_cfg = ConfigDict({"beam_size": 4, "alpha": 0.6, "max_len_a": 1.0, "max_len_b": 50, "batch_size": 32,
                         "unrelated": 1})  # an older config: no max_source_len, max_programs
  assert search_settings(eval_cfg, alpha=None, min_len=2, max_programs=3) == {
      "beam_size": 4, "alpha": 0.6, "max_len_a": 1.0, "max_len_b": 50, "batch_size": 32, "min_len": 2, "max_programs": 3}
  with pytest.raises(ValueError) as err:
    search_settings(eval_cfg, beam=3, unrelated=2)
  known = ["alpha", "batch_size", "beam_size", "compact", "max_len_a", "max_len_b", "max_programs", "max_source_len",
           "min_len", "use_cache", "workers"]
  assert str(err.value) == f"unknown search setting(s) ['beam', 'unrelated']; known: {known}"


def test_from_workdir_chooses_the_checkpoint(tiny_run):
  best = min((r for r in metrics.read(tiny_run) if "val_loss" in r), key=lambda r: r["val_loss"])["step"]
  assert Translator.from_workdir(tiny_run, "best", **SMALL).checkpoint == f"best{best}"
  assert Translator.from_workdir(tiny_run, 40, **SMALL).checkpoint == "step40"
  with pytest.raises(ValueError, match="has no checkpoint 7; it has steps"):
    Translator.from_workdir(tiny_run, 7)
  assert Translator.from_workdir(tiny_run, "latest", **SMALL).checkpoint == Translator.from_workdir(
      tiny_run, **SMALL).checkpoint == f"step{max(r['step'] for r in metrics.read(tiny_run))}"
  assert Translator.from_workdir(tiny_run, 40, average_last=2, **SMALL).checkpoint == "average2-40"
  for wrong in ("last", True, -1):
    with pytest.raises(ValueError, match="checkpoint must be None, 'latest', 'best' or a step"):
      Translator.from_workdir(tiny_run, wrong)
  with pytest.raises(ValueError, match="average_last must be a number of checkpoints >= 0, got -1"):
    Translator.from_workdir(tiny_run, average_last=-1)
  with pytest.raises(ValueError, match="unknown search setting"):
    Translator.from_workdir(tiny_run, beam=3)
  config = load.run_config(tiny_run)
  mesh = sharding.make_mesh(config.mesh)
  loaded = load.load_params(tiny_run, config, mesh)
  with pytest.raises(ValueError, match="holds no parameters"):
    Translator(loaded.model_cfg, loaded.graphdef, loaded.tokenizer, mesh).translate(["x"])


@pytest.mark.parametrize("beam", [pytest.param(1, marks=pytest.mark.long), 3])
def test_scores_are_the_models_log_probability_of_the_translation(tiny_run, beam):
  translator = Translator.from_workdir(tiny_run, beam_size=beam, alpha=0.6, max_len_b=8, batch_size=4)
  sources = [s for s in SENTENCES if s]
  ids = translator.tok.encode(sources)
  hyps, scores = translator._translate_ids(translator.params, ids, False, Want(beam))  # the n-best, n = beam
  for best, best_scores in zip(hyps, scores):
    assert len({tuple(h) for h in best}) == beam and best_scores == sorted(best_scores, reverse=True)
  # Every hypothesis scored by one teacher-forced forward pass of the model, a row each, padded.
  special = translator.tok.special
  rows = [(src, hyp + [special.eos]) for src, best in zip(ids, hyps) for hyp in best]  # eos is scored too
  src_bs = np.full((len(rows), max(len(src) for src, _ in rows)), special.pad)
  target_bt = np.full((len(rows), max(len(target) for _, target in rows)), special.pad)
  for i, (src, target) in enumerate(rows):
    src_bs[i, :len(src)], target_bt[i, :len(target)] = src, target
  inputs_bt = np.concatenate([np.full((len(rows), 1), special.bos), target_bt[:, :-1]], 1)

  @jax.jit  # one program, not one per operation
  def log_probs(params, src_bs, inputs_bt, target_bt):
    logits_btv = nnx.merge(translator.graphdefs[0], params)(src_bs, inputs_bt)
    logp_bt = jnp.take_along_axis(jax.nn.log_softmax(logits_btv), target_bt[..., None], -1)[..., 0]
    return jnp.sum(jnp.where(target_bt != special.pad, logp_bt, 0), 1)

  logp_b = np.asarray(log_probs(translator.params, src_bs, inputs_bt, target_bt))
  for (_, target), logp, score in zip(rows, logp_b, [s for best_scores in scores for s in best_scores]):
    expected = logp if beam == 1 else logp / float(decode.length_penalty(len(target), 0.6))
    assert score == pytest.approx(expected, abs=1e-4)
  text, text_scores = translator.translate(sources, return_scores=True)  # the 1-best search stops sooner: the same
  assert text_scores == [s[0] for s in scores] and text == [translator.tok.decode(h[0]) for h in hyps]
  if beam > 1:
    nbest, nbest_scores = translator.translate(sources, return_scores=True, nbest=beam)
    assert nbest_scores == scores and nbest == [[translator.tok.decode(h) for h in best] for best in hyps]
    with pytest.raises(ValueError, match="nbest=4 must be between 1 and the beam size"):
      translator.translate(sources, nbest=beam + 1)


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
  """A copy of the tiny run, evaluated on 24 validation sentences, exported."""
  root = tmp_path_factory.mktemp("export")
  run = shutil.copytree(tiny_run, root / "run")
  config = load.run_config(run)
  pairs = data.eval_pairs(config, config.data.validation_split)[:24]
  translator = Translator.from_workdir(run, **SMALL)
  evaluate.evaluate(translator, translator.params, [s for s, _ in pairs], [t for _, t in pairs], name="val24",
                    label=translator.checkpoint, outdir=run / "eval")
  return run, export.export(run, root / "model")


def test_an_exported_model_translates_exactly_as_its_run(exported):
  run, model_dir = exported
  assert sorted(p.name for p in model_dir.iterdir()) == ["README.md", "config.json", "export.json",
                                                          "model.safetensors", "spm.model"]
  sources = SENTENCES + [s for s, _ in data.eval_pairs(load.run_config(run), "val")[:20]]
  a = Translator.from_workdir(run, **SMALL).translate(sources, return_scores=True)
  b = Translator.from_pretrained(model_dir, **SMALL)
  assert b.translate(sources, return_scores=True) == a and b.checkpoint == "step60"
  from safetensors.numpy import load_file

  tensors = load_file(str(model_dir / "model.safetensors"))
  params = Translator.from_workdir(run).params
  flat = export.flatten(params)
  assert sorted(tensors) == sorted(flat) and all(np.array_equal(tensors[k], flat[k]) for k in flat)
  card = (model_dir / "README.md").read_text()
  result = json.loads(next((run / "eval").glob("val24.step60.*.json")).read_text())
  assert result["bleu_signature"] in card and result["chrf_signature"] in card
  assert f"| val24 | {result['bleu']:.1f} | {result['chrf']:.1f} |" in card


@pytest.mark.long
def test_an_exported_model_loads_without_orbax(exported):
  _, model_dir = exported
  code = ("import sys; sys.modules['orbax'] = sys.modules['orbax.checkpoint'] = None\n"
          "from seq2seq import Translator\n"
          f"print(Translator.from_pretrained({str(model_dir)!r}, beam_size=2, max_len_b=8).translate(['Hello.'])[0])\n"
          "assert not [m for m in sys.modules if m.startswith('orbax') and sys.modules[m] is not None]\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
  assert out.returncode == 0, out.stderr
  assert out.stdout == Translator.from_pretrained(model_dir, beam_size=2, max_len_b=8).translate(["Hello."])[0] + "\n"


@pytest.mark.long
def test_export_keeps_what_is_there_and_names_bad_files(exported, tmp_path):
  run, model_dir = exported
  before = (model_dir / "model.safetensors").read_bytes()
  with pytest.raises(ValueError, match="exists and is not empty.*--overwrite"):
    export.export(run, model_dir)
  assert (model_dir / "model.safetensors").read_bytes() == before
  export.export(run, model_dir, 40, overwrite=True)
  assert Translator.from_pretrained(model_dir).checkpoint == "step40"
  export.export(run, model_dir, overwrite=True)
  broken = shutil.copytree(model_dir, tmp_path / "broken")
  (broken / "spm.model").unlink()
  with pytest.raises(ValueError, match=r"broken/spm.model not found"):
    Translator.from_pretrained(broken)
  from safetensors.numpy import load_file, save_file

  tensors = load_file(str(model_dir / "model.safetensors"))
  name = sorted(tensors)[0]
  tensors[name] = tensors[name][..., :1]
  shutil.copy(model_dir / "spm.model", broken / "spm.model")
  save_file(tensors, str(broken / "model.safetensors"))
  (broken / "export.json").unlink()  # an older export (unverified), so the shape check is what refuses it
  with pytest.raises(ValueError, match=f"{name} is float32"):
    Translator.from_pretrained(broken)


CACHED_TRANSLATION = """
import sys
from seq2seq import Translator
folder = {"default": {}, "off": {"compilation_cache": ""}}.get(sys.argv[2], {"compilation_cache": sys.argv[2]})
print(Translator.from_workdir(sys.argv[1], beam_size=2, **folder).translate("A man is riding a bike."))
"""


@pytest.mark.long
def test_the_python_api_keeps_compiled_programs_where_the_commands_do(tiny_run, tmp_path):
  """Translator.from_workdir uses the persistent compilation cache: by default in
  $SEQ2SEQ_CACHE/xla/host-HASH (the commands' default), in a chosen folder, or not at all."""
  import os

  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}  # that variable would win
  outputs = {}
  for choice in ("default", "off", str(tmp_path / "chosen")):
    cache = tmp_path / f"seq2seq-cache-{len(outputs)}"
    out = subprocess.run([sys.executable, "-c", CACHED_TRANSLATION, str(tiny_run), choice], capture_output=True,
                         text=True, timeout=300, cwd=REPO, env=env | {"SEQ2SEQ_CACHE": str(cache)})
    assert out.returncode == 0, out.stderr[-3000:]
    outputs[choice] = out.stdout
    programs = [p for p in cache.rglob("*") if p.is_file()]
    if choice == "default":
      assert programs and all(p.relative_to(cache).parts[:2][0] == "xla" for p in programs)
      assert programs[0].relative_to(cache).parts[1].startswith("host-")
    else:
      assert not programs
  assert [p for p in (tmp_path / "chosen").rglob("*") if p.is_file()]
  assert len(set(outputs.values())) == 1
