"""Probes of translation as users poke it (issue 59): decode settings that cannot work, an
output path that cannot be written, references of any length, n-best lists of blank lines,
input from a file, a pipe or stdin read alike, the prompt's --output, flags that do not
parse, and the Python API given the wrong types. Each case asserts the exit status, one
`error:` line where there should be one, no traceback, and that nothing else changed."""

import math
import os
import pty
import re
import signal
import subprocess
import sys

import pytest
from probing import command, no_traceback, one_error_line, snapshot

from seq2seq import Translator
from seq2seq.inference.decode import Sampling
from seq2seq.errors import ConfigError

TRANSLATE = "seq2seq.commands.translate"

# Refused before the model loads: one line naming the flag. {name: (flags, pattern of the error line)}.
# Every case here and below failed on the code before issue 59 (a traceback, or a line that named no flag).
BAD_FLAGS = {
    "alpha=nan": (["--alpha=nan", "--scores"], r"^error: --alpha=nan: the length penalty exponent must be a finite"),
    "temperature=inf": (["--sampling", "--temperature=inf"], r"^error: --temperature=inf: .* must be a finite number"),
    "max_len_b=-100": (["--max_len_b=-100"], r"^error: --max_len_b=-100: .* must be >= 0"),
    "batch_size=abc": (["--batch_size=abc"], r"^error: --batch_size=abc: expected an integer$"),
    "beam_size=1.5": (["--beam_size=1.5"], r"^error: --beam_size=1.5: expected an integer$"),
    "top_p=0": (["--sampling", "--top_p=0"], r"^error: --top_p=0: .* must be > 0 and <= 1"),
    "nbest=0": (["--nbest=0"], r"^error: --nbest=0: .* must be >= 1"),
    "seed=2**40": (["--sampling", f"--seed={2**40}"], r"^error: --seed=1099511627776: .* <= 2147483647"),
    "output is a folder": (["--output=."], r"^error: --output=\. is a folder"),
    # From the second round of probes: --output replaced what it named, its input and the run's files included.
    "output is the input": (["--output=in.en"], r"^error: --output=in\.en is the file --input=in\.en reads"),
    "output is a run's file": (["--output={run}/config.json"], r"^error: --output=\S+/config\.json is in \S+, a file "
                                                               r"of the run \(results may go in eval/\)"),
    "empty --input": (["--input="], r"^error: --input is empty"),
    "max_len_b=2**31-1": (["--max_len_b=2147483647"], r"^error: --max_len_b=2147483647: .* <= 100000$"),
    "alpha=1e308": (["--alpha=1e308"], r"^error: --alpha=1e\+308: .* <= 10$"),
    "compilation cache is a file": (["--compilation_cache=in.en"], r"^error: the compilation cache in\.en .* is a "
                                                                   r"file; give a folder"),
    # Issue 60: one checkpoint vocabulary (latest|best|STEP) in every command; a run is one ensemble member.
    "checkpoint=last": (["--checkpoint=last"], r"^error: --checkpoint=last: expected latest, best or a step number$"),
    "a run twice in an ensemble": (["--ensemble={run}/"], r"^error: --ensemble=\S+/ is the run --workdir=\S+ names "
                                                          r"already: an ensemble's members are different runs"),
}


ISSUE_CASES = {"alpha=nan", "temperature=inf", "max_len_b=-100", "batch_size=abc", "output is a folder",
               "output is the input"}  # in the fast suite; the others in the slow one


@pytest.mark.parametrize("case", [c if c in ISSUE_CASES else pytest.param(c, marks=pytest.mark.long)
                                  for c in sorted(BAD_FLAGS)])
def test_a_decode_setting_that_cannot_work_is_one_error_line_before_the_model_loads(case, tiny_run, tmp_path):
  flags, pattern = BAD_FLAGS[case]
  (tmp_path / "in.en").write_text("A man rides a bike.\n")
  before = snapshot(tmp_path, tiny_run)
  out = command(TRANSLATE, f"--workdir={tiny_run}", "--input=in.en", *(f.format(run=tiny_run) for f in flags),
                cwd=tmp_path)
  one_error_line(out, pattern)
  assert snapshot(tmp_path, tiny_run) == before
  assert "Translating" not in out.stderr and "compiling" not in out.stderr  # refused before any work


# -- the Python API ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def translator(tiny_run):
  return Translator.from_workdir(tiny_run, beam_size=2, batch_size=4)


BAD_CALLS = {
    "alpha='0.6'": (lambda t, run: Translator.from_workdir(run, alpha="0.6"), r"^alpha='0.6': .* must be a number"),
    "alpha=nan": (lambda t, run: Translator.from_workdir(run, alpha=math.nan), r"^alpha=nan: .* finite"),
    "beam_size=True": (lambda t, run: Translator.from_workdir(run, beam_size=True), r"^beam_size=True: .* integer"),
    "max_len_b=-100": (lambda t, run: Translator.from_workdir(run, max_len_b=-100), r"^max_len_b=-100: .* >= 0"),
    "workdir=None": (lambda t, run: Translator.from_workdir(None), r"^workdir must be a path"),
    "compilation_cache=123": (lambda t, run: Translator.from_workdir(run, compilation_cache=123),
                              r"^compilation_cache must be a folder's path"),
    "translate(None)": (lambda t, run: t.translate(None), r"^sentences must be a string or a list of strings, got "
                                                          r"NoneType"),
    "translate([1, 2])": (lambda t, run: t.translate([1, 2]), r"^sentences\[0\] must be a string, got int"),
    "translate(bytes)": (lambda t, run: t.translate(b"A dog."), r"^sentences must be a string .* got bytes"),
    "nbest='2'": (lambda t, run: t.translate(["A dog."], nbest="2"), r"^nbest='2': .* must be an integer"),
    "sampling=tuple": (lambda t, run: t.translate(["A dog."], sampling=(1.0, 0, 1.0, 0)),
                       r"^sampling must be None or a seq2seq.Sampling"),
    "temperature=inf": (lambda t, run: t.translate(["A dog."], sampling=Sampling(temperature=math.inf)),
                        r"^temperature=inf: .* finite"),
    "return_scores='yes'": (lambda t, run: t.translate(["A dog."], return_scores="yes"),
                            r"^return_scores must be True or False"),
    "score(list, None)": (lambda t, run: t.score(["A dog."], None), r"^targets must be a string or a list"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_the_python_api_given_a_wrong_type_or_value_raises_a_config_error_naming_it(case, translator, tiny_run):
  call, pattern = BAD_CALLS[case]
  with pytest.raises(ConfigError, match=pattern):
    call(translator, tiny_run)


def test_two_strings_score_as_one_pair_and_a_long_reference_is_cut_as_sources_are(translator, capsys):
  """`score("A dog", "Hund!")` gave five scores, one per character; a 50,000-word reference
  ran out of memory (146 GB) where sources are cut to eval.max_source_len."""
  one = translator.score("A dog runs.", "Ein Hund rennt.")
  assert isinstance(one, float) and one == translator.score(["A dog runs."], ["Ein Hund rennt."])[0]
  long = " ".join(["Hund"] * 50_000)
  ids = translator.tok.encode([long])[0]
  limit = translator.source_limit
  cut = translator.tok.encode(["A dog runs."]), [ids[:limit - 1] + [translator.tok.special.eos]]
  scores = translator.score(["A dog runs.", "A dog runs."], ["Ein Hund rennt.", long])
  assert scores[0] == one and scores[1] == translator.score_ids(translator.params, *cut)[0]
  assert (f"warning: reference line 2: {len(ids)} tokens, longer than the model takes: scoring its first {limit}"
          in capsys.readouterr().err)


def test_nbest_always_gives_n_entries_blank_lines_included(translator, tiny_run):
  """A blank line with nbest=2 gave one entry: now the empty translation (score 0) and an
  empty entry scored -inf; a line the length limit lets finish only one way likewise."""
  hyps, scores = translator.translate(["A dog runs.", "", "  "], nbest=2, return_scores=True)
  assert [len(h) for h in hyps] == [2, 2, 2] and [len(s) for s in scores] == [2, 2, 2]
  assert hyps[1] == hyps[2] == ["", ""] and scores[1] == scores[2] == [0.0, -math.inf]
  assert hyps[0][0] == translator.translate("A dog runs.") and all(math.isfinite(s) for s in scores[0])
  tight = Translator.from_workdir(tiny_run, beam_size=2, max_len_a=0, max_len_b=1)  # eos only: one hypothesis
  hyps, scores = tight.translate(["A dog runs."], nbest=2, return_scores=True)
  assert hyps == [["", ""]] and math.isfinite(scores[0][0]) and scores[0][1] == -math.inf


# -- the command, with the model loaded -----------------------------------------------------
@pytest.mark.long
def test_file_pipe_and_stdin_read_alike_and_every_line_keeps_its_output_line(tiny_run, tmp_path):
  """Invalid UTF-8 was an error from --input=FILE and a warning on stdin; an empty file an
  error, empty stdin exit 0; --input=<(echo ...) said /dev/fd/63: no such file. Now all warn
  and go on, alike; --nbest=2 gives a blank line 2 lines."""
  text = b"A man rides a bike.\nbad \xff byte\n\nTwo dogs.\n"
  (tmp_path / "in.en").write_bytes(text)
  common = [f"--workdir={tiny_run}", "--quiet", "--beam_size=2", "--nbest=2"]
  from_file = command(TRANSLATE, *common, "--input=in.en", cwd=tmp_path)
  from_stdin = command(TRANSLATE, *common, cwd=tmp_path, stdin=text)
  script = f"{sys.executable} -m {TRANSLATE} {' '.join(common)} --input=<(cat in.en)"
  from_pipe = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
  for out in (from_file, from_stdin, from_pipe):
    no_traceback(out)
    assert re.search(r"^warning: (in\.en|stdin|/dev/fd/\d+):2: invalid UTF-8 at byte 4, replaced by U\+FFFD$",
                     out.stderr, re.M), out.stderr
    numbers = [line.split("\t")[0] for line in out.stdout.splitlines()]
    assert numbers == ["1", "1", "2", "2", "3", "3", "4", "4"], out.stdout
  assert from_file.stdout == from_stdin.stdout == from_pipe.stdout
  (tmp_path / "empty.en").write_text("")
  (tmp_path / "out.de").write_text("older\n")
  for args in (["--input=empty.en"], []):  # an empty file; empty stdin
    (tmp_path / "out.de").write_text("older\n")
    out = command(TRANSLATE, *common, *args, "--output=out.de", cwd=tmp_path, stdin="")
    no_traceback(out)
    assert "has no lines" in out.stderr and (tmp_path / "out.de").read_text() == ""


@pytest.mark.long
def test_an_output_folder_is_refused_before_translating_and_a_long_reference_line_is_scored(tiny_run, tmp_path):
  """--output=DIR translated everything, then failed on the rename (IsADirectoryError); a
  50,000-word --score_reference line ran out of memory."""
  (tmp_path / "in.en").write_text("A dog runs.\n")
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "kept.txt").write_text("mine\n")
  before = snapshot(tmp_path, tiny_run)
  out = command(TRANSLATE, f"--workdir={tiny_run}", "--input=in.en", "--output=out", cwd=tmp_path)
  one_error_line(out, r"^error: --output=out is a folder")
  assert snapshot(tmp_path, tiny_run) == before
  (tmp_path / "ref.de").write_text(" ".join(["Hund"] * 50_000) + "\n")
  out = command(TRANSLATE, f"--workdir={tiny_run}", "--input=in.en", "--score_reference=ref.de", cwd=tmp_path)
  no_traceback(out)
  assert "warning: reference line 1: " in out.stderr and len(out.stdout.splitlines()) == 1
  assert math.isfinite(float(out.stdout.split("\t")[0]))


@pytest.mark.long
def test_at_the_prompt_output_replaces_the_file_as_batch_mode_does(tiny_run, tmp_path):
  """The prompt appended to --output=FILE where batch mode replaces it."""
  (tmp_path / "out.de").write_text("an older translation\n")
  controller, terminal = pty.openpty()
  proc = subprocess.Popen([sys.executable, "-m", TRANSLATE, f"--workdir={tiny_run}", "--beam_size=2",
                           "--output=out.de"], stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, cwd=tmp_path)
  os.close(terminal)
  os.write(controller, b"A man rides a bike.\nTwo dogs play.\n\x04")
  _, err = proc.communicate(timeout=600)
  os.close(controller)
  assert proc.returncode == 0 and "Traceback" not in err, err
  assert (tmp_path / "out.de").read_text().splitlines() == Translator.from_workdir(tiny_run, beam_size=2).translate(
      ["A man rides a bike.", "Two dogs play."])
  assert [p.name for p in tmp_path.iterdir()] == ["out.de"]  # no temporary file left


EVAL_FLAGS = {  # seq2seq-eval: refused before decoding (they failed after it, or were ignored)
    "tokenize=bogus": (["--source=in.en", "--reference=in.en", "--tokenize=bogus"],
                       r"^error: --tokenize=bogus: sacreBLEU has no such tokenizer; choose one of .*13a"),
    "stdin with --output": (["--source=-", "--output=out.de"], r"^error: --output goes with --source=FILE"),
    "old and new checkpoint flags": (["--step=20", "--checkpoint=best"], r"^error: --step=20 and --checkpoint=best "
                                                                          r"each choose the checkpoint: give one"),
}


@pytest.mark.long
@pytest.mark.parametrize("case", sorted(EVAL_FLAGS))
def test_eval_refuses_a_setting_it_would_fail_on_or_ignore_before_decoding(case, tiny_run, tmp_path):
  flags, pattern = EVAL_FLAGS[case]
  (tmp_path / "in.en").write_text("A man rides a bike.\n")
  before = snapshot(tmp_path, tiny_run)
  out = command("seq2seq.commands.eval", f"--workdir={tiny_run}", *flags, cwd=tmp_path, stdin="A dog.\n")
  one_error_line(out, pattern)
  assert snapshot(tmp_path, tiny_run) == before


@pytest.mark.long
def test_a_pipe_or_process_output_is_written_to_and_a_full_stdout_is_an_error(tiny_run, tmp_path):
  """--output=FIFO and --output=>(command) were replaced by a regular file (the reader left
  waiting) or failed after the work (FileNotFoundError on /dev/fd/.63.XXXX.tmp); stdout on a
  full disk was cut short with exit status 0."""
  (tmp_path / "in.en").write_text("A man rides a bike.\nTwo dogs play.\n")
  expected = "".join(t + "\n" for t in Translator.from_workdir(tiny_run).translate(["A man rides a bike.",
                                                                                      "Two dogs play."]))
  os.mkfifo(tmp_path / "fifo")
  script = (f"cat fifo > from_fifo.txt & {sys.executable} -m {TRANSLATE} --workdir={tiny_run} --input=in.en "
            f"--output=fifo --quiet && {sys.executable} -m {TRANSLATE} --workdir={tiny_run} --input=in.en "
            f"--output=>(cat > from_process.txt) --quiet; status=$?; wait; exit $status")
  out = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
  no_traceback(out)
  assert (tmp_path / "fifo").is_fifo() and (tmp_path / "from_fifo.txt").read_text() == expected
  assert (tmp_path / "from_process.txt").read_text() == expected
  big = "".join(["A man rides a bike.\n"] * 400)
  (tmp_path / "big.en").write_text(big)
  script = (f"ulimit -f 4; {sys.executable} -m {TRANSLATE} --workdir={tiny_run} --input=big.en --quiet "
            "> out.de")  # a 4 KiB file-size limit stands for a full disk (EFBIG instead of ENOSPC)
  out = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
  one_error_line(out, r"^error: stdout: File too large$")


@pytest.mark.long
def test_ctrl_c_while_translating_is_one_line_and_keeps_an_older_output(tiny_run, tmp_path):
  """Ctrl-C printed a 40-line KeyboardInterrupt traceback."""
  (tmp_path / "in.en").write_text("".join(f"A man rides bike number {i}.\n" for i in range(3000)))
  (tmp_path / "out.de").write_text("older\n")
  # A shell's background job (`cmd &`) ignores SIGINT and its children inherit that, where a user's
  # terminal does not: a handled signal is reset to its default in a new program, an ignored one stays
  # ignored. So SIGINT is handled here while the child starts, whatever ran the tests.
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    proc = subprocess.Popen([sys.executable, "-m", TRANSLATE, f"--workdir={tiny_run}", "--input=in.en",
                             "--output=out.de", "--max_programs=1"], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
  finally:
    signal.signal(signal.SIGINT, previous)
  for line in proc.stderr:  # interrupted once translating has started (its progress shows)
    if "sentences" in line or "compiling" in line:
      break
  proc.send_signal(signal.SIGINT)
  err = proc.stderr.read()
  assert proc.wait(timeout=300) == 130 and "Traceback" not in err, err
  assert err.rstrip().splitlines()[-1] == "interrupted (Ctrl-C)"
  assert (tmp_path / "out.de").read_text() == "older\n"
