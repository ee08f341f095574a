"""Verified exports: export.json records the model settings and each file's size and sha256;
a damaged or altered folder is refused naming the file (or key); staging folders of killed
exports are removed; a file-size limit is one `error:` line."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

from seq2seq import Translator, cards, export, files
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import ModelFileError
from seq2seq.inference import load
from seq2seq.model.config import ModelConfig

SENTENCES = ["A man is riding a bike.", "", "Two dogs play in the snow near a red house.", "Hello."]
SMALL = dict(beam_size=2, max_len_b=8, batch_size=4)


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
  """The tiny run exported once; tests that damage it work on a copy."""
  return export.export(tiny_run, tmp_path_factory.mktemp("export") / "model")


@pytest.fixture
def model_copy(exported, tmp_path):
  return shutil.copytree(exported, tmp_path / "model")


def run_module(args, **kwargs) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                        **kwargs)


def error_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.startswith("error: ")]


def test_an_intact_export_is_verified_and_translates_as_its_run(tiny_run, exported, capfd):
  manifest = json.loads((exported / "export.json").read_text())
  config = load.run_config(tiny_run)
  model_cfg = ModelConfig.from_config(config.model, vocab_size=Tokenizer.load(tiny_run / "spm.model").vocab_size)
  assert manifest["format"] == export.FORMAT
  assert manifest["model"] == {k: v for k, v in dataclasses.asdict(model_cfg).items()
                               if k not in ("attention_impl", "norm_impl", "logits_dtype")}  # how, not what: checkpoint.NOT_IDENTITY
  assert sorted(manifest["files"]) == ["config.json", "model.safetensors", "spm.model"]
  for name, record in manifest["files"].items():
    assert record == {"bytes": (exported / name).stat().st_size, "sha256": files.file_sha256(exported / name)}
  capfd.readouterr()
  translator = Translator.from_pretrained(exported, **SMALL)
  assert "warning" not in capfd.readouterr().err
  expected = Translator.from_workdir(tiny_run, **SMALL).translate(SENTENCES, return_scores=True)
  assert translator.translate(SENTENCES, return_scores=True) == expected


def test_flipped_bytes_in_the_parameters_are_refused(model_copy):
  path = model_copy / "model.safetensors"
  raw = bytearray(path.read_bytes())
  middle = len(raw) // 2
  raw[middle:middle + 16] = bytes(b ^ 0xFF for b in raw[middle:middle + 16])  # same size, a valid header
  path.write_bytes(bytes(raw))
  with pytest.raises(ModelFileError, match=r"model\.safetensors: contents differ from the sha256 recorded"):
    Translator.from_pretrained(model_copy)


@pytest.mark.parametrize("key, value", [("activation", "gelu"), ("positions", "learned")])
def test_edited_model_settings_are_refused_naming_the_key(model_copy, key, value):
  path = model_copy / "config.json"
  config = json.loads(path.read_text())
  before = config["model"].get(key, ModelConfig.__dataclass_fields__[key].default)
  config["model"][key] = value
  path.write_text(json.dumps(config, indent=2))
  message = rf"config\.json: .*config\.model\.{key}: the export was made with '{before}', config\.json has '{value}'"
  with pytest.raises(ModelFileError, match=message):
    Translator.from_pretrained(model_copy)


def test_a_truncated_parameter_file_is_named_without_a_manifest(model_copy, capfd):
  (model_copy / "export.json").unlink()  # as an older export: only the safetensors check can catch it
  path = model_copy / "model.safetensors"
  path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
  capfd.readouterr()
  with pytest.raises(ModelFileError, match=r"model\.safetensors: not a readable safetensors file"):
    Translator.from_pretrained(model_copy)
  warnings = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning: ")]
  assert warnings == [f"warning: {model_copy} has no export.json (an older export); its files are not verified"]
  with pytest.raises(ModelFileError, match=r"model\.safetensors: not a readable safetensors file"):
    export.load_params(model_copy, None, None)


def test_the_next_export_removes_a_killed_exports_staging_folder(tiny_run, tmp_path):
  kill = ("import os, sys; from seq2seq import files\n"
          "held = files.staging_dir(sys.argv[1], 'model')  # kept: a collected generator would clean up\n"
          "staging = held.__enter__()\n"
          "(staging / 'model.safetensors').write_bytes(b'half')\n"
          "os._exit(9)\n")
  out = subprocess.run([sys.executable, "-c", kill, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 9, out.stderr
  left = sorted(p.name for p in tmp_path.iterdir())
  assert len(left) == 2 and left[0].startswith(".model.") and left[1] == left[0] + files.OWNER_SUFFIX
  export.export(tiny_run, tmp_path / "model")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_translate_a_tampered_model_is_one_error_line(model_copy):
  path = model_copy / "model.safetensors"
  raw = bytearray(path.read_bytes())
  raw[len(raw) // 2] ^= 0x01
  path.write_bytes(bytes(raw))
  out = run_module(["seq2seq.commands.translate", f"--model={model_copy}"], input="Hello.\n")
  assert out.returncode == 2, out.stderr
  assert "Traceback" not in out.stderr
  errors = error_lines(out.stderr)
  assert len(errors) == 1 and "model.safetensors" in errors[0] and "sha256" in errors[0], out.stderr


def test_a_file_size_limit_during_export_is_one_error_line_and_leaves_nothing(tiny_run, exported, tmp_path):
  # The error line is seq2seq.cli.run's account of a seq2seq.errors.Error (here a ResourceError, an OSError).
  limit = (exported / "model.safetensors").stat().st_size // 2
  limited = (f"import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
             "runpy.run_module('seq2seq.export', run_name='__main__', alter_sys=True)\n")  # python -m, limited
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}  # no cache entries over the limit
  out = subprocess.run([sys.executable, "-c", limited, f"--workdir={tiny_run}", f"--out={tmp_path / 'model'}",
                        "--compilation_cache="], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
  assert out.returncode == 2, out.stderr
  assert "Traceback" not in out.stderr
  errors = error_lines(out.stderr)
  assert len(errors) == 1 and "model.safetensors: File too large (exporting to" in errors[0], out.stderr
  assert list(tmp_path.iterdir()) == []


def test_the_model_card_of_an_unevaluated_checkpoint_names_the_eval_flags_that_score_it(tiny_run):
  assert [cards.eval_flags(label) for label in ("step60", "best40", "average5-20000", "step40+ensemble2-1a2b")] == [
      " --checkpoint=60", " --checkpoint=best", " --checkpoint=20000 --average_last=5", ""]
  config = load.run_config(tiny_run)
  model_cfg = ModelConfig.from_config(config.model, vocab_size=Tokenizer.load(tiny_run / "spm.model").vocab_size)
  card = cards.model_card(tiny_run, config, model_cfg, "average3-60")
  assert f"`seq2seq-eval --workdir={tiny_run} --checkpoint=60 --average_last=3`" in card
