"""Issue 46, parts 5 to 7: sampling, scoring a reference, and the translate command's flags."""

import functools
import io
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.errors import ConfigError
from seq2seq.inference import evaluate
from seq2seq.inference.decode import Sampling
from seq2seq.inference.translate import Translator, Want
from seq2seq.special_tokens import SPECIAL
from seq2seq.training.loss import cross_entropy_sums

SOURCE = "A man in a blue shirt rides a red bike."
# The chi-square statistic's 0.999 quantile for 7 degrees of freedom (8 categories): a
# sampler that draws from the model's distribution exceeds it one time in a thousand.
CHI2_999_DF7 = 24.322


@functools.partial(jax.jit, static_argnums=0)  # one program for every call, not one per operation
def first_logits(graphdef, params, src):
  return nnx.merge(graphdef, params)(src, jnp.asarray([[SPECIAL.bos]], jnp.int32))[0, 0]


def first_token_log_probs(translator, source: str) -> np.ndarray:
  """The model's log-probabilities of the first output token, padding banned (as decoding does)."""
  src = jnp.asarray([translator.tok.encode([source])[0]], jnp.int32)
  logits = first_logits(translator.graphdefs[0], translator.params, src)
  logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32)), np.float64)
  logp[0] = -np.inf
  return logp - np.logaddexp.reduce(logp)


def first_tokens(translator, sampling: Sampling, draws: int) -> np.ndarray:
  """The first output token of `draws` samples of SOURCE (eos where the output is empty)."""
  ids = translator.tok.encode([SOURCE])[0]
  outputs, _ = translator._translate_ids(translator.params, [ids] * draws, False, Want(1, sampling))
  return np.array([out[0][0] if out[0] else SPECIAL.eos for out in outputs])


@pytest.fixture(scope="module")
def sampler(tiny_run):
  return Translator.from_workdir(tiny_run, beam_size=1, batch_size=64, max_len_a=0.0, max_len_b=2)


def test_sampled_first_tokens_follow_the_models_top_k_distribution_at_a_temperature(sampler):
  temperature, k, draws = 1.5, 8, 4000
  logp = first_token_log_probs(sampler, SOURCE) / temperature
  top = np.argsort(-logp)[:k]
  p = np.exp(logp[top] - np.logaddexp.reduce(logp[top]))
  tokens = first_tokens(sampler, Sampling(temperature=temperature, top_k=k, seed=3), draws)
  assert set(tokens) <= set(top)  # nothing outside the top k
  counts = np.array([(tokens == t).sum() for t in top])
  chi2 = float(np.sum((counts - draws * p) ** 2 / (draws * p)))
  assert chi2 < CHI2_999_DF7, (counts, draws * p)


def test_top_p_draws_only_from_the_nucleus_and_draws_do_not_depend_on_batching(sampler, tiny_run):
  logp = first_token_log_probs(sampler, SOURCE)
  order = np.argsort(-logp)
  p = np.exp(logp[order])
  top_p = float(p[0] + p[1] + p[2] / 2)  # the nucleus: the 3 most likely tokens
  tokens = first_tokens(sampler, Sampling(top_p=top_p, seed=1), 600)
  assert set(tokens) <= set(order[:3]) and len(set(tokens)) >= 2
  sampling = Sampling(top_p=0.9, seed=7)
  want = sampler.translate([SOURCE, "Two dogs play.", "A girl sings."] * 5, sampling=sampling)
  other = Translator.from_workdir(tiny_run, beam_size=1, batch_size=4, max_len_a=0.0, max_len_b=2, workers=1)
  assert other.translate([SOURCE, "Two dogs play.", "A girl sings."] * 5, sampling=sampling) == want  # reproducible
  flat = Sampling(temperature=2.0, seed=7)
  assert (first_tokens(sampler, flat, 40) != first_tokens(sampler, flat._replace(seed=8), 40)).any()  # another seed


def test_sampled_nbest_are_independent_draws_most_likely_first_with_their_log_probabilities(tiny_run):
  translator = Translator.from_workdir(tiny_run, beam_size=2, max_len_b=6)
  hyps, scores = translator.translate([SOURCE], return_scores=True, nbest=5, sampling=Sampling(seed=0))
  assert len(hyps[0]) == 5 and scores[0] == sorted(scores[0], reverse=True) and len(set(hyps[0])) > 1
  ids = translator.tok.encode([SOURCE])
  outputs, logps = translator._translate_ids(translator.params, ids, False, Want(5, Sampling(seed=0)))
  assert [translator.tok.decode(o) for o in outputs[0]] == hyps[0] and logps[0] == scores[0]
  rescored = translator.score_ids(translator.params, ids * 5, [o + [SPECIAL.eos] for o in outputs[0]], normalize=False)
  # a sample's score is its log-probability: the cached decoder's sum equals the full decoder's
  assert rescored == pytest.approx(scores[0], rel=1e-5)
  with pytest.raises(ConfigError, match=r"temperature=0: the sampling temperature must be > 0"):
    translator.translate([SOURCE], sampling=Sampling(temperature=0.0))


def test_a_reference_scores_its_teacher_forced_training_loss_and_beam_scores_normalise_alike(tiny_run):
  translator = Translator.from_workdir(tiny_run, beam_size=2, max_len_b=8)
  sources = [SOURCE, "Two dogs play in the snow.", "A girl sings."]
  references = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee vor einem roten Haus.", "Ein Mädchen."]
  plain = translator.score(sources, references, normalize=False)
  model_graph, params, tok = translator.graphdefs[0], translator.params, translator.tok

  @jax.jit  # one program per shape, not one per operation
  def training_nll(params, src, tgt_in, tgt):
    logits = nnx.merge(model_graph, params)(src, tgt_in, src_segments_bs=jnp.ones_like(src),
                                            tgt_segments_bt=jnp.ones_like(tgt), packed=False)
    return cross_entropy_sums(logits, tgt, jnp.ones_like(tgt))["nll_sum"]  # training's loss

  for source, reference, score in zip(sources, references, plain):
    src, tgt = (np.asarray([tok.encode([text])[0]], np.int32) for text in (source, reference))
    tgt_in = np.concatenate([[[SPECIAL.bos]], tgt[:, :-1]], axis=1)
    nll = float(training_nll(params, src, tgt_in, tgt))
    assert -score == pytest.approx(nll, rel=1e-6)  # f32 sums of a few tokens in another order
  normalized = translator.score(sources, references)  # beam 2: as beam search scores
  lengths = [len(tok.encode([r])[0]) for r in references]
  assert normalized == pytest.approx([s / ((5 + n) / 6) ** 0.6 for s, n in zip(plain, lengths)], rel=1e-6)
  ids = tok.encode(sources)
  outputs, beam_scores = translator._translate_ids(params, ids, False)
  rescored = translator.score_ids(params, ids, [out[0] + [SPECIAL.eos] for out in outputs])  # normalised as beam 2's
  assert rescored == pytest.approx([s[0] for s in beam_scores], rel=1e-5)
  with pytest.raises(ConfigError, match="one target per source"):
    translator.score(sources, references[:2])


def run_translate(*args, stdin: str = "", cwd=None):
  return subprocess.run([sys.executable, "-m", "seq2seq.commands.translate", *args], input=stdin,
                        capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.mark.long
def test_translate_reads_and_writes_files_with_evals_search_flags_and_scores_references(tiny_run, tmp_path):
  sources = [SOURCE, "", "Two dogs play in the snow."]
  (tmp_path / "in.en").write_text("".join(s + "\n" for s in sources))
  (tmp_path / "ref.de").write_text("Ein Mann fährt Fahrrad.\n\nZwei Hunde spielen.\n")
  flags = ["--beam_size=3", "--max_len_a=0.5", "--max_len_b=5", "--batch_size=2", "--average_last=2", "--quiet"]
  out = run_translate(f"--workdir={tiny_run}", "--input=in.en", "--output=out.de", *flags, cwd=tmp_path)
  assert out.returncode == 0, out.stderr
  assert out.stdout == "" and out.stderr == ""  # --quiet: nothing but errors and warnings
  averaged = Translator.from_workdir(tiny_run, beam_size=3, max_len_a=0.5, max_len_b=5, batch_size=2)
  from seq2seq.inference import load

  loaded = load.load_params(tiny_run, load.run_config(tiny_run), averaged.mesh, average_last=2)
  avg_params, label = loaded.params, loaded.checkpoint.label
  assert label.startswith("average2-")
  assert (tmp_path / "out.de").read_text().splitlines() == averaged(avg_params, sources)
  scored = run_translate(f"--workdir={tiny_run}", "--input=in.en", "--score_reference=ref.de", "--beam_size=1",
                         cwd=tmp_path)
  assert scored.returncode == 0, scored.stderr
  greedy = Translator.from_workdir(tiny_run, beam_size=1)
  refs = (tmp_path / "ref.de").read_text().splitlines()
  got = [line.split("\t") for line in scored.stdout.splitlines()]
  assert [r for _, r in got] == refs
  assert [float(s) for s, _ in got] == pytest.approx(greedy.score(sources, refs, normalize=False), abs=1e-4)
  twin = tmp_path / "twin"  # another run with the same model (the commands refuse a run named twice)
  shutil.copytree(tiny_run, twin, ignore=shutil.ignore_patterns("eval", "average"))
  ensemble = run_translate(f"--workdir={tiny_run}", f"--ensemble={twin}", "--beam_size=2", "--quiet",
                           stdin=SOURCE + "\n")
  assert ensemble.returncode == 0, ensemble.stderr
  assert ensemble.stdout.strip() == Translator.from_workdir(tiny_run, beam_size=2).translate(SOURCE)
  # (--temperature=0 is refused in process above, --model with --workdir by test_commands.)
  for bad, message in ((["--top_k=3"], "add --sampling"), (["--score_reference=ref.de", "--nbest=2"], "--score_reference")):
    failed = run_translate(f"--workdir={tiny_run}", *bad, "--input=in.en", cwd=tmp_path)
    assert failed.returncode == 2 and message in failed.stderr, failed.stderr


class Terminal(io.StringIO):
  def isatty(self):
    return True


def test_at_a_terminal_translation_prompts_and_answers_line_by_line(tiny_run):
  translator = Translator.from_workdir(tiny_run, beam_size=2)
  typed = Terminal("A man rides a bike.\nTwo dogs play.\n")
  out, prompts = io.StringIO(), io.StringIO()
  evaluate.interactive(lambda lines: translator.translate(lines), typed, out, prompts)
  assert prompts.getvalue() == evaluate.PROMPT * 3 + "\n"  # a prompt per line, and one answered by Ctrl-D
  assert out.getvalue().splitlines() == translator.translate(["A man rides a bike.", "Two dogs play."])


@pytest.mark.long
def test_the_command_at_a_real_terminal_prompts_and_translates_each_line(tiny_run, tmp_path):
  import os
  import pty

  controller, terminal = pty.openpty()
  proc = subprocess.Popen([sys.executable, "-m", "seq2seq.commands.translate", f"--workdir={tiny_run}",
                           "--beam_size=2"], stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, cwd=tmp_path)
  os.close(terminal)
  os.write(controller, b"A man rides a bike.\nTwo dogs play.\n\x04")  # two lines, then Ctrl-D
  out, err = proc.communicate(timeout=600)
  os.close(controller)
  assert proc.returncode == 0, err
  assert out.splitlines() == Translator.from_workdir(tiny_run, beam_size=2).translate(
      ["A man rides a bike.", "Two dogs play."])
  assert err.count(evaluate.PROMPT) == 3 and "type a sentence" in err
