"""eval.py and translation: sacreBLEU equality, checkpoint choice, file formats, stdin, order,
blank lines, bad input, validation BLEU during training."""

import gzip
import json
import os
import subprocess
import sys
import types

import jax
import numpy as np
import pytest
from conftest import REPO, communicate_all, free_port, make_config, tensorboard_scalars

from seq2seq import metrics, sharding
from seq2seq.inference import load
from seq2seq.inference.settings import SearchSettings
from seq2seq.inference.translate import Translator, Want
from seq2seq.training.train import train_and_evaluate

VAL_SENTENCES = 24


@pytest.fixture(scope="module")
def run(tiny_run):
  """A tiny model trained 60 steps with validation (loss and greedy BLEU on 24 sentences) every 20."""
  return tiny_run


@pytest.fixture(scope="module")
def val_files(run, data_dir, tmp_path_factory):
  """The first validation pairs as plain, gzipped and SGML files."""
  folder = tmp_path_factory.mktemp("val_files")
  config = load.run_config(run)
  from seq2seq import data

  pairs = data.eval_pairs(config, config.data.validation_split)[:VAL_SENTENCES]
  src, ref = [s for s, _ in pairs], [t for _, t in pairs]
  (folder / "src.en").write_text("".join(s + "\n" for s in src), encoding="utf-8")
  (folder / "ref.de").write_text("".join(t + "\n" for t in ref), encoding="utf-8")
  with gzip.open(folder / "ref.de.gz", "wt", encoding="utf-8") as f:
    f.writelines(t + "\n" for t in ref)
  for name, lines in (("src.en.sgm", src), ("ref.de.sgm", ref)):
    segs = "".join(f'<seg id="{i + 1}">{line.replace("&", "&amp;").replace("<", "&lt;")}</seg>\n'
                   for i, line in enumerate(lines))
    (folder / name).write_text(f'<srcset setid="t" srclang="any">\n<doc docid="d" genre="news">\n{segs}</doc>\n'
                               "</srcset>\n", encoding="utf-8")
  return folder


def eval_py(*args, stdin=None, env=None):
  return subprocess.run([sys.executable, "eval.py", *args], cwd=REPO, capture_output=True, text=True, input=stdin,
                        env=env, timeout=600)


def sacrebleu_cli(reference, hypotheses) -> float:
  out = subprocess.run([sys.executable, "-m", "sacrebleu", str(reference), "-i", str(hypotheses), "-b", "-w", "6"],
                       capture_output=True, text=True, check=True)
  return float(out.stdout.strip())


def test_eval_bleu_equals_sacrebleu_cli_and_validation_bleu(run, val_files):
  out = eval_py(f"--workdir={run}", f"--source={val_files / 'src.en'}", f"--reference={val_files / 'ref.de.gz'}",
                "--beam_size=1")
  assert out.returncode == 0, out.stderr
  lines = out.stdout.strip().splitlines()
  assert lines[-1].startswith("src.en: BLEU = ") and lines[-1].endswith("version:" + __import__("sacrebleu").__version__)
  assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in lines[-1]
  result = json.loads((run / "eval" / "src.en.step60.greedy-len1x+10.json").read_text())
  assert result["checkpoint"] == "step60" and result["sentences"] == VAL_SENTENCES
  assert result["decode"]["beam_size"] == 1 and result["sentences_per_s"] > 0 and result["workers"] == 2
  hyps = (run / "eval" / "src.en.step60.greedy-len1x+10.hyp").read_text().splitlines()
  assert len(hyps) == VAL_SENTENCES and any(hyps)
  assert result["bleu"] == pytest.approx(sacrebleu_cli(val_files / "ref.de", run / "eval" / "src.en.step60.greedy-len1x+10.hyp"),
                                         abs=1e-6)
  # Validation BLEU during training is the same code on the same sentences and parameters.
  logged = [r for r in metrics.read(run) if "val_bleu" in r]
  assert [r["step"] for r in logged] == [20, 40, 60]
  assert logged[-1]["val_bleu"] == pytest.approx(result["bleu"], abs=1e-9)
  assert logged[-1]["val_chrf"] == pytest.approx(result["chrf"], abs=1e-9)
  # TensorBoard: train and validation curves share charts; eval.py's scores land at the checkpoint's step.
  scalars = tensorboard_scalars(run)
  assert [s for s, _ in scalars["train/loss"]] == [20, 40, 60] and [s for s, _ in scalars["val/loss"]] == [20, 40, 60]
  assert scalars["val/bleu"][-1] == (60, pytest.approx(logged[-1]["val_bleu"], abs=1e-4))
  assert scalars["eval/src.en/bleu"] == [(60, pytest.approx(result["bleu"], abs=1e-4))]
  assert scalars["eval/src.en/chrf"] == [(60, pytest.approx(result["chrf"], abs=1e-4))]
  assert not [tag for tag in scalars if "/" not in tag]


def test_validation_with_the_test_beam_compiles_the_programs_eval_runs(run):
  """With val_beam_size = beam_size, in-training validation lowers to the very program eval.py
  runs (same HLO text, so the same key in JAX's persistent compilation cache): the first
  eval.py after training loads what validation compiled. A greedy validation does not."""
  from seq2seq import data
  from seq2seq.model.config import ModelConfig
  from seq2seq.training import optimizer
  from seq2seq.training.train import init_state
  from seq2seq.training.validation import bleu_validator

  evaluator = Translator.from_workdir(str(run))
  config = load.run_config(run)
  mesh = sharding.make_mesh(config.mesh)
  tok = data.load_tokenizer(config, str(run))
  model_cfg = ModelConfig.from_config(config.model, vocab_size=tok.vocab_size)
  graphdef, state, _ = init_state(model_cfg, optimizer.make(config.train, d_model=model_cfg.d_model)[0], mesh,
                                  config.seed)  # what training validates: its live parameters

  def program(translator, params, width=16) -> str:
    """The search's lowered module without its debug information: what the persistent cache's
    key hashes (jax/_src/cache_key.py strips it). The compiled HLO also lists the traced
    functions' names, in the order they were first traced in the process, so it differs with
    what ran before (the test alone against the whole suite) where the key does not."""
    lower, text = translator.programs.fn.lower, []

    def lower_and_keep_text(*args, **static):
      lowered = lower(*args, **static)
      text.append(lowered.as_text(debug_info=False))
      return lowered

    translator.programs.fn = types.SimpleNamespace(lower=lower_and_keep_text)
    translator.programs.get(translator._program_key(params, translator.batch_size, width, Want()))
    return text[0]

  texts = {}
  for val_beam in (config.eval.beam_size, 1):
    config.eval.val_beam_size = val_beam
    validator = bleu_validator(config, model_cfg, graphdef, tok, mesh).translator
    assert validator.settings.beam_size == val_beam
    texts[val_beam] = program(validator, state.params)
  expected = program(evaluator, evaluator.params)
  assert config.eval.beam_size > 1 and texts[config.eval.beam_size] == expected
  assert texts[1] != expected


def test_sgml_input_average_and_output_file(run, val_files, tmp_path):
  out = eval_py(f"--workdir={run}", f"--source={val_files / 'src.en.sgm'}", f"--reference={val_files / 'ref.de.sgm'}",
                "--average_last=2", "--beam_size=2", f"--output={tmp_path / 'out.de'}", "--workers=1")
  assert out.returncode == 0, out.stderr
  result = json.loads((run / "eval" / "src.en.sgm.average2-60.beam2-alpha0.6-len1x+10.json").read_text())
  assert result["workers"] == 1
  assert (run / "average" / "last2").is_dir()
  assert (tmp_path / "out.de").read_text() == (run / "eval" / "src.en.sgm.average2-60.beam2-alpha0.6-len1x+10.hyp").read_text()
  assert result["bleu"] == pytest.approx(sacrebleu_cli(val_files / "ref.de", tmp_path / "out.de"), abs=1e-6)


def test_a_stale_average_is_recomputed(run, tmp_path):
  """An average made before the newest checkpoints changed is remade from the current ones."""
  import shutil

  from seq2seq import average

  copy = tmp_path / "run"
  shutil.copytree(run, copy, ignore=shutil.ignore_patterns("eval", "average"))
  average.save_average(str(copy), average.newest_steps(str(copy), 2))
  assert average.averaged_steps(copy / "average" / "last2") == [40, 60]
  shutil.rmtree(copy / "checkpoints" / "60")  # the newest two are now 20 and 40
  config = load.run_config(copy)
  loaded = load.load_params(copy, config, sharding.make_mesh(config.mesh), average_last=2)
  params, label = loaded.params, loaded.checkpoint.label
  assert label == "average2-40" and average.averaged_steps(copy / "average" / "last2") == [20, 40]
  want, _ = average.average_params(str(copy), average.newest_steps(str(copy), 2))
  for x, y in zip(jax.tree.leaves(want), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_best_checkpoint_is_chosen_by_validation_loss(run):
  val = {r["step"]: r["val_loss"] for r in metrics.read(run) if "val_loss" in r}
  out = eval_py(f"--workdir={run}", "--checkpoint=best", "--split=val", "--beam_size=1", "--max_len_b=5")
  assert out.returncode == 0, out.stderr
  best = min(val, key=val.get)
  assert (run / "eval" / f"val.best{best}.greedy-len1x+5.json").is_file()
  assert out.stdout.strip().splitlines()[-1].startswith("val: BLEU = ")


def test_mismatched_reference_is_a_clear_error(run, val_files, tmp_path):
  short = tmp_path / "short.de"
  short.write_text("eins\nzwei\n")
  out = eval_py(f"--workdir={run}", f"--source={val_files / 'src.en'}", f"--reference={short}")
  assert out.returncode != 0
  assert f"has {VAL_SENTENCES} lines but --reference={short} has 2" in out.stderr
  missing = eval_py(f"--workdir={run}", "--step=7")  # --checkpoint's old name: it works, and says so
  assert missing.returncode == 2 and missing.stderr.splitlines()[0] == (
      "warning: --step=7 is deprecated; use --checkpoint=7 (the same flag in seq2seq-eval, seq2seq-translate, "
      "python -m seq2seq.export and python -m seq2seq.average)")
  assert missing.stderr.splitlines()[-1].startswith("error: ") and "has no checkpoint 7" in missing.stderr


@pytest.fixture(scope="module")
def translator(run):
  config = load.run_config(run)
  mesh = sharding.make_mesh(config.mesh)
  loaded = load.load_params(run, config, mesh)
  return Translator(loaded.model_cfg, loaded.graphdef, loaded.tokenizer, mesh, beam_size=2, alpha=0.6, max_len_a=1.0,
                    max_len_b=8, batch_size=4), loaded.params


def test_stdin_to_stdout_line_by_line(run, translator):
  lines = ["A man is riding a bike.", "", "Two dogs play in the snow near a red house.", "   ", "Hello."]
  out = eval_py(f"--workdir={run}", "--source=-", "--beam_size=2", "--max_len_b=8", "--batch_size=4",
                stdin="".join(line + "\n" for line in lines))
  assert out.returncode == 0, out.stderr
  got = out.stdout.split("\n")[:-1]
  tr, params = translator
  assert got == tr(params, lines)
  # Blank lines stay blank, in place; each sentence's line is its own translation (alone). The
  # 60-step model may translate a sentence to nothing ("Hello." under some library versions),
  # so what it says is not asserted, only where.
  assert got[1] == "" and got[3] == "" and any(got[i] for i in (0, 2, 4))
  assert [got[i] for i in (0, 2, 4)] == [tr(params, [lines[i]])[0] for i in (0, 2, 4)]


def test_output_order_equals_input_order(translator, val_files):
  tr, params = translator
  sources = (val_files / "src.en").read_text().splitlines()[:12]
  sources = [sources[i][: 10 + 7 * i] for i in range(len(sources))]  # spread the lengths over buckets
  reference = tr(params, sources)
  perm = np.random.default_rng(0).permutation(len(sources))
  shuffled = tr(params, [sources[i] for i in perm] + [""])
  assert shuffled == [reference[i] for i in perm] + [""]
  assert len(set(reference)) > 1



def test_compacted_concurrent_batches_translate_as_whole_ones_in_turn(run, val_files):
  """A 32-sentence batch compacts to 8 once that many are unfinished, and on one CPU process two
  batches are decoded at once (the defaults): the same translations, in the same order, as
  batches searched whole (compact=()) one after another (workers=1)."""
  sources = (val_files / "src.en").read_text().splitlines()[:24]
  sources = (sources + [s[:len(s) // 2] for s in sources])[:40]  # lengths spread: sentences finish apart
  compacted = Translator.from_workdir(run, batch_size=32, beam_size=2)
  assert compacted.compact == (8,) and compacted.workers == 2
  whole = Translator.from_workdir(run, batch_size=32, beam_size=2, compact=(), workers=1)
  hyps, scores = compacted.translate(sources, return_scores=True)
  whole_hyps, whole_scores = whole.translate(sources, return_scores=True)
  assert hyps == whole_hyps and len(set(hyps)) > 1
  np.testing.assert_allclose(scores, whole_scores, rtol=1e-5)  # batch shapes change float rounding slightly


@pytest.mark.long
def test_sharded_mesh_gives_the_same_translations(run, val_files, tmp_path):
  """The checkpoint is loaded onto the config's mesh: (2,2,2) on 8 devices equals 1 device."""
  import shutil

  sharded = tmp_path / "run"
  shutil.copytree(run, sharded, ignore=shutil.ignore_patterns("eval", "average"))
  config = json.loads((sharded / "config.json").read_text())
  config["mesh"] = {"data": 2, "fsdp": 2, "tensor": 2}
  (sharded / "config.json").write_text(json.dumps(config))
  args = [f"--source={val_files / 'src.en'}", f"--reference={val_files / 'ref.de'}", "--beam_size=3"]
  one = eval_py(f"--workdir={run}", *args, f"--output={tmp_path / 'one.de'}")
  env = os.environ | {"XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"}
  eight = eval_py(f"--workdir={sharded}", *args, f"--output={tmp_path / 'eight.de'}", env=env)
  assert one.returncode == 0 and eight.returncode == 0, one.stderr + eight.stderr
  assert (tmp_path / "eight.de").read_text() == (tmp_path / "one.de").read_text()


@pytest.mark.long
def test_two_processes_translate_as_one(run, val_files, tmp_path):
  """eval.py on 2 processes (gloo on 127.0.0.1, one CPU device each) splits every batch over
  them; process 0 writes the same hypotheses as one process and alone prints the scores."""
  args = [f"--workdir={run}", f"--source={val_files / 'src.en'}", f"--reference={val_files / 'ref.de'}", "--beam_size=3"]
  one = eval_py(*args, f"--output={tmp_path / 'one.de'}")
  assert one.returncode == 0, one.stderr
  port = free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  procs = [subprocess.Popen([sys.executable, "eval.py", *args, f"--output={tmp_path / 'two.de'}",
                             f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  outs = communicate_all(procs)
  assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
  assert (tmp_path / "two.de").read_text() == (tmp_path / "one.de").read_text()
  assert outs[0][0].splitlines()[-1] == one.stdout.splitlines()[-1] and "BLEU" not in outs[1][0]
  bad_id = eval_py(f"--workdir={run}", "--source=-", "--coordinator_address=127.0.0.1:1", "--num_processes=2",
                   "--process_id=5")
  assert bad_id.returncode != 0 and "0 <= --process_id < num_processes" in bad_id.stderr


def test_result_names_tell_decodings_apart():
  base = dict(beam_size=4, alpha=0.6, max_len_a=1.0, max_len_b=50, min_len=0)
  names = [SearchSettings(**(base | change)).name() for change in
           ({}, {"alpha": 1.2}, {"beam_size": 1}, {"beam_size": 1, "alpha": 1.2}, {"max_len_a": 1.2, "max_len_b": 10},
            {"min_len": 3})]
  assert names == ["beam4-alpha0.6", "beam4-alpha1.2", "greedy", "greedy", "beam4-alpha0.6-len1.2x+10",
                   "beam4-alpha0.6-min3"]


@pytest.mark.long
def test_ensemble_decodes_the_mean_of_the_runs_and_records_its_members(run, translator, val_files, data_dir,
                                                                         session_cache, tmp_path):
  """--ensemble: the CLI loads each member's checkpoint (here step 40 of a run and step 60 of
  its copy) and translates as the in-process ensemble of those parameters does; a model
  ensembled with itself translates as it does alone; runs with different sentencepiece
  models are refused (the commands refuse a run named twice: test_probes_translate)."""
  import shutil

  from seq2seq.research import results

  copy = tmp_path / "copy"
  shutil.copytree(run, copy, ignore=shutil.ignore_patterns("eval", "average"))
  out = eval_py(f"--workdir={run}", "--checkpoint=40", f"--ensemble={copy}", f"--source={val_files / 'src.en'}",
                f"--reference={val_files / 'ref.de'}", "--beam_size=2", "--max_len_b=8", "--batch_size=4")
  assert out.returncode == 0, out.stderr
  [path] = (run / "eval").glob("src.en.step40+ensemble2-*.beam2-alpha0.6-len1x+8.json")
  result = json.loads(path.read_text())
  assert [m["checkpoint"] for m in result["ensemble"]] == ["step40", "step60"]
  assert result["ensemble"][1]["workdir"] == str(copy.resolve()) and result["ensemble"][1]["steps"] == 60
  config = load.run_config(run)
  mesh = sharding.make_mesh(config.mesh)
  loaded = load.load_ensemble([run, copy], config, mesh, checkpoint=40)
  params, label = loaded.params, loaded.checkpoint.label
  assert label == result["checkpoint"]
  both = Translator(loaded.model_cfg, loaded.graphdef, loaded.tokenizer, mesh, beam_size=2, alpha=0.6, max_len_a=1.0,
                    max_len_b=8, batch_size=4)
  sources = (val_files / "src.en").read_text().splitlines()
  assert (run / "eval" / f"{path.name.removesuffix('.json')}.hyp").read_text().splitlines() == both(params, sources)
  # One model twice is that model: the same translations as the run alone.
  tr, single_params = translator
  assert both([single_params, single_params], sources) == tr(single_params, sources)
  row = next(r for r in results.rows(run) if "ensemble" in r)
  assert f"ensemble of 2: step40 + `{copy.name}` step60" in row and "(2 runs)" in row
  # A run with another vocabulary cannot join.
  other = tmp_path / "other"
  other_config = make_config("tiny", data_dir, session_cache, vocab_size=800)
  other_config.train.update(steps=2, log_every=1, eval_every=0, checkpoint_every=2)
  train_and_evaluate(other_config, str(other))
  with pytest.raises(ValueError, match=f"{other / 'spm.model'} differs from {run / 'spm.model'}"):
    load.load_ensemble([run, other], config, mesh)


def test_compare_gives_sacrebleus_own_paired_bootstrap_for_each_system(run, val_files, tmp_path):
  """--compare: this run's hypotheses are the baseline; each file's BLEU, chrF++ and TER, means,
  95% intervals and p-values equal `sacrebleu REF -i BASE SYS... --paired-bs` on the same files."""
  import re

  refs = (val_files / "ref.de").read_text(encoding="utf-8").splitlines()
  better, other = tmp_path / "better.de", tmp_path / "other.de"
  better.write_text("".join((r if i % 3 else r.split(" ")[0]) + "\n" for i, r in enumerate(refs)), encoding="utf-8")
  other.write_text("".join(" ".join(r.split(" ")[::2]) + "\n" for r in refs), encoding="utf-8")
  out = eval_py(f"--workdir={run}", f"--source={val_files / 'src.en'}", f"--reference={val_files / 'ref.de'}",
                "--beam_size=1", "--output=" + str(tmp_path / "ours.de"), f"--compare={better}", f"--compare={other}")
  assert out.returncode == 0, out.stderr
  lines = out.stdout.strip().splitlines()
  assert lines[-1].startswith("src.en: BLEU = ") and lines[-2].startswith("src.en: chrF2 = ")  # scores stay last
  assert any(line.startswith("compared with src.en.step60 (this run) (paired bootstrap, 1000 resamples") for line in lines)
  result = json.loads((run / "eval" / "src.en.step60.greedy-len1x+10.json").read_text())
  systems = result["compare"]["systems"]
  assert [s["name"] for s in systems] == ["src.en.step60 (this run)", str(better), str(other)]
  assert systems[0]["BLEU"]["score"] == pytest.approx(result["bleu"], abs=1e-9)
  cli = subprocess.run([sys.executable, "-m", "sacrebleu", str(val_files / "ref.de"), "-i", str(tmp_path / "ours.de"),
                        str(better), str(other), "--paired-bs", "-m", "bleu", "chrf", "ter", "--chrf-word-order", "2", "-f", "text"],
                       capture_output=True, text=True, check=True).stdout.splitlines()
  rows = [n for n, line in enumerate(cli) if re.search(r"│\s*(Baseline: |/)", line)]
  assert len(rows) == 3, cli
  number = re.compile(r"\d+\.\d+")
  for system, n in zip(systems, rows):
    expected = number.findall(cli[n]) + (number.findall(cli[n + 1]) if system is not systems[0] else [])
    ours = [f"{system[m][k]:.1f}" for m in ("BLEU", "chrF2++", "TER") for k in ("score", "mean", "ci")]
    ours += [f"{system[m]['p_value']:.4f}" for m in ("BLEU", "chrF2++", "TER") if system[m]["p_value"] is not None]
    assert ours == expected, (system["name"], cli[n:n + 2])
  assert systems[1]["BLEU"]["p_value"] < 0.05 < systems[1]["BLEU"]["score"]  # the better system is significantly so
  # a file that is not a system's output for this test set, and two test sets at once: one error line each
  short = tmp_path / "short.de"
  short.write_text("one line\n", encoding="utf-8")
  out = eval_py(f"--workdir={run}", f"--source={val_files / 'src.en'}", f"--reference={val_files / 'ref.de'}",
                f"--compare={short}")
  assert out.returncode == 2 and out.stderr.strip().splitlines() == [
      f"error: --compare={short} has 1 lines but src.en has {VAL_SENTENCES} sentences: a system's hypotheses for the "
      "same test set, one line each, are needed"]
  out = eval_py(f"--workdir={run}", "--split=val", "--split=test_2016_flickr", f"--compare={better}")
  assert out.returncode == 2 and "error: --compare needs one test set to compare on, got 2" in out.stderr
