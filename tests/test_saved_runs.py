"""Runs written by earlier versions still resume and translate.

tests/fixtures/run_0_1_0 is a workdir that version 0.1.0 (commit 0fa06ce, before the
training and search state became typed) trained 4 steps on the synthetic corpus, with a
checkpoint at step 4 (`python tests/test_saved_runs.py DIR` writes one again, with the code
checked out and the tests' XLA flags, tests/conftest.py FAST_COMPILE). Resuming it to step 6
must take the next batches and, on a machine that computes as the one that wrote it
(fixture.json: jax 0.10.2 on an AMD EPYC), give exactly the parameters a fresh run of 6 steps
gives. Elsewhere the last bits differ (seen on a Xeon with AVX-512, and on an AMD EPYC of
another generation), so there only the batches are compared; the witness is the fresh run's
step 4 against the fixture's, not the CPU's vendor, which let the second case through.
"""

import json
import pathlib
import shutil
import sys

import jax
import numpy as np
import pytest

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "run_0_1_0"


def fixture_config(data_dir, cache_dir, steps: int):
  from seq2seq import configs

  config = configs.get("tiny")
  config.data.update(dir=str(data_dir), cache_dir=str(cache_dir), vocab_size=120, spm_sample_size=4000)
  config.model.update(d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32, max_len=64)
  config.train.update(steps=steps, checkpoint_every=2, log_every=2, eval_every=0, warmup_steps=4, keep_checkpoints=2,
                      peak_flops=1e12)
  config.eval.update(beam_size=2, max_len_b=6, batch_size=8)
  return config


def _params(workdir, step: int | None = None):
  from seq2seq import sharding
  from seq2seq.inference import load

  config = load.run_config(workdir)
  loaded = load.load_params(workdir, config, sharding.make_mesh(config.mesh), checkpoint=step)
  return jax.tree.leaves(jax.device_get(loaded.params))


def _equal(a: list, b: list) -> bool:
  return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def cpu_vendor() -> str:
  """The CPU's vendor (AuthenticAMD, GenuineIntel), or "" where /proc/cpuinfo does not say."""
  try:
    lines = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
  except OSError:
    return ""
  return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("vendor_id")), "")


@pytest.mark.long  # two short trainings (8 s)
def test_a_run_saved_by_0_1_0_resumes_as_if_never_stopped(data_dir, tmp_path):
  from seq2seq import Translator, metrics
  from seq2seq.training.train import train_and_evaluate

  run = shutil.copytree(FIXTURE, tmp_path / "old")
  old = Translator.from_workdir(run, beam_size=2, max_len_b=6)  # its config.json, as 0.1.0 wrote it, loads
  assert old.checkpoint == "step4" and len(old.translate(["A man rides a bike."])) == 1
  train_and_evaluate(fixture_config(data_dir, tmp_path / "cache", steps=6), str(run))
  # The fresh run takes the fixture's sentencepiece model: the one it would train is another
  # sentencepiece version's (pinned since), whose pieces make other batches.
  fresh = fixture_config(data_dir, tmp_path / "cache", steps=6)
  fresh.data.spm_model = str(run / "spm.model")
  train_and_evaluate(fresh, str(tmp_path / "fresh"))
  rows = [{r["step"]: r for r in metrics.read(d) if "loss" in r} for d in (run, tmp_path / "fresh")]
  assert sorted(rows[0]) == sorted(rows[1]) == [2, 4, 6]
  assert rows[0][6]["padding_fraction"] == rows[1][6]["padding_fraction"]  # the same batches: the data position
  # XLA's CPU programs differ in the last bits by JAX version and instruction set (AMD EPYCs of
  # two generations differ: the CPU's vendor is not enough), so the bit-for-bit check needs a
  # witness that this machine computes as the fixture's did: the fresh run's step 4 equal to
  # the fixture's (kept in the resumed run).
  if _equal(_params(run, step=4), _params(tmp_path / "fresh", step=4)):
    assert _equal(_params(run), _params(tmp_path / "fresh"))


if __name__ == "__main__":  # writes the fixture again: python tests/test_saved_runs.py DIR
  sys.path.insert(0, str(pathlib.Path(__file__).parent))
  import synthetic
  from seq2seq.training.train import train_and_evaluate

  out = pathlib.Path(sys.argv[1])
  data = synthetic.write(out / "data")
  train_and_evaluate(fixture_config(data, out / "cache", steps=4), str(out / "run"), command="fixture")
  (out / "run" / "fixture.json").write_text(json.dumps({"jax": jax.__version__, "written_by": "0.1.0",
                                                         "cpu_vendor": cpu_vendor()}) + "\n")
  for name in ("checkpoints/2", "train.lock", *(p.name for p in (out / "run").glob("events.*"))):
    shutil.rmtree(out / "run" / name, ignore_errors=True) if (out / "run" / name).is_dir() else (
        out / "run" / name).unlink(missing_ok=True)
