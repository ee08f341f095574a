"""BLEU evaluation of a trained run: load a checkpoint (latest, a step, the best by validation
loss, or an average of the last K) on the config's mesh, translate the test sets or given
files, score with sacreBLEU, and write hypotheses and a JSON result into DIR/eval/
(NAME.CHECKPOINT.SEARCH.{hyp,json}, e.g. test_2016_flickr.step20000.beam4-alpha0.6.json).

  python eval.py --workdir=DIR                                   # the config's test sets
  python eval.py --workdir=DIR --source=in.en --reference=ref.de
  python eval.py --workdir=DIR --source=- < in.en > out.de       # translate stdin
  python eval.py --workdir=DIR --ensemble=DIR2 --ensemble=DIR3    # the runs' ensemble

Many hosts (a model too large for one): the same command on every host, plus
--coordinator_address=auto or --coordinator_address=HOST:PORT --num_processes=N --process_id=I;
process 0 writes the files and prints the scores.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import pathlib
import shlex
import sys
import time

import jax
import ml_collections
from flax import nnx

from seq2seq import average, checkpoint, cli, data, metrics, sharding, transformer
from seq2seq.config import ModelConfig
from seq2seq.score import score
from seq2seq.sources import DataError, read_lines
from seq2seq.tokenizer import Tokenizer, write_atomic
from seq2seq.translate import Translator


def load_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
  """The resolved config the run wrote at start; $SEQ2SEQ_DATA_DIR overrides its data folder."""
  path = pathlib.Path(workdir) / "config.json"
  if not path.is_file():
    raise ValueError(f"{path} not found: is {workdir} a training directory (python train.py --workdir=...)?")
  config = ml_collections.ConfigDict(json.loads(path.read_text()))
  if os.environ.get("SEQ2SEQ_DATA_DIR"):
    config.data.dir = os.environ["SEQ2SEQ_DATA_DIR"]
  return config


def load_params(workdir, config, mesh, *, step: int | None = None, best: bool = False, average_last: int = 0):
  """(model config, graphdef, parameters on `mesh`, tokenizer, label) of a run's checkpoint."""
  tok_path = pathlib.Path(workdir) / data.SPM_FILE
  if not tok_path.is_file():
    raise ValueError(f"{tok_path} not found: the run's sentencepiece model is needed to translate")
  tok = Tokenizer.load(tok_path)
  model_cfg = ModelConfig.from_config(config.model, vocab_size=tok.vocab_size)
  run_identity = checkpoint.identity(model_cfg, tok.model_bytes)

  def init():
    return nnx.state(transformer.Transformer(model_cfg, rngs=nnx.Rngs(0)), nnx.Param)

  target, _ = sharding.init_on_mesh(init, mesh)
  graphdef = transformer.graphdef(model_cfg)
  if average_last:
    path = average.directory(workdir, average_last)
    steps = average.newest_steps(workdir, average_last)
    if average.averaged_steps(path) != steps:  # none yet, or stale
      average.save_average(workdir, steps)
    params, saved = average.load_average(path, target)
    checkpoint.check_identity(saved, run_identity, str(path))
    return model_cfg, graphdef, params, tok, f"average{average_last}-{saved['averaged_steps'][-1]}"
  ckpts = checkpoint.Checkpoints(workdir, asynchronous=False)
  try:
    chosen = ckpts.best_step() if best else step  # None: the newest intact one
    if (best or step is not None) and (chosen is None or chosen not in ckpts.manager.all_steps()):
      what = "a validated checkpoint (best)" if best else f"checkpoint {step}"
      raise ValueError(f"{ckpts.directory} has no {what}; it has steps {list(ckpts.manager.all_steps())}")
    if not ckpts.manager.all_steps():
      raise ValueError(f"{ckpts.directory} has no checkpoint")
    params, chosen = ckpts.restore_params(target, run_identity, chosen)
    if ckpts.fallbacks and jax.process_index() == 0:
      skipped = "; ".join(f"{f['step']} ({f['problem']})" for f in ckpts.fallbacks)
      print(f"warning: damaged checkpoints skipped: {skipped}; evaluating checkpoint {chosen}, the newest intact one",
            file=sys.stderr, flush=True)
  finally:
    ckpts.close()
  return model_cfg, graphdef, params, tok, f"{'best' if best else 'step'}{chosen}"


def load_ensemble(workdirs: list[str], config, mesh, *, step: int | None = None, best: bool = False,
                  average_last: int = 0):
  """(model configs, graphdefs, parameters, tokenizer, label, members) of several runs decoded
  as one ensemble. The first run's checkpoint is chosen by `step`; every run's by `best` or
  `average_last` (else its latest). The runs must share the sentencepiece model."""
  cfgs, graphdefs, params, members = [], [], [], []
  tok = None
  for i, workdir in enumerate(workdirs):
    run_config = config if i == 0 else load_config(workdir)
    cfg, graphdef, p, run_tok, label = load_params(workdir, run_config, mesh, step=step if i == 0 else None,
                                                   best=best, average_last=average_last)
    if tok is not None and run_tok.model_bytes != tok.model_bytes:
      raise ValueError(f"{pathlib.Path(workdir) / data.SPM_FILE} differs from {pathlib.Path(workdirs[0]) / data.SPM_FILE}: "
                       "ensembled runs must share one sentencepiece model")
    tok = tok or run_tok
    cfgs.append(cfg)
    graphdefs.append(graphdef)
    params.append(p)
    members.append({"workdir": str(pathlib.Path(workdir).resolve()), "checkpoint": label}
                   | metrics.training_summary(workdir))
  digest = hashlib.sha1(json.dumps([[m["workdir"], m["checkpoint"]] for m in members]).encode()).hexdigest()[:8]
  label = f"{members[0]['checkpoint']}+ensemble{len(members)}-{digest}"  # one result file per set of members
  return cfgs, graphdefs, params, tok, label, members


def read_text(path: str) -> list[str]:
  """Lines of a plain, gzipped or SGML file (one segment per line)."""
  try:
    return list(read_lines(path))
  except OSError as e:
    raise ValueError(f"cannot read {path}: {e}") from None


def hardware() -> str:
  """What the run is on, for result tables: devices and, on a CPU, the host's processor."""
  devices = f"{jax.device_count()} x {jax.devices()[0].device_kind}"
  if jax.devices()[0].platform != "cpu":
    return devices
  model = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "CPU")
  return f"{os.cpu_count()}-core {model}"


def _cpuinfo() -> list[str]:
  try:
    return pathlib.Path("/proc/cpuinfo").read_text().splitlines()
  except OSError:
    return []


def search_name(settings: dict) -> str:
  """The SEARCH part of result file names: greedy or beamK-alphaA, plus the length limits
  where they differ from Translator's defaults (so differently decoded runs do not
  overwrite each other)."""
  name = "greedy" if settings["beam_size"] == 1 else f"beam{settings['beam_size']}-alpha{settings['alpha']:g}"
  defaults = {k: v.default for k, v in inspect.signature(Translator).parameters.items()}
  a, b, m = settings["max_len_a"], settings["max_len_b"], settings["min_len"]
  if (a, b) != (defaults["max_len_a"], defaults["max_len_b"]):
    name += f"-len{a:g}x+{b}"
  return name + (f"-min{m}" if m != defaults["min_len"] else "")


def evaluate(translator: Translator, params, sources: list[str], references: list[str], *, name: str, label: str,
             outdir: pathlib.Path, output: str = "", tokenize: str = "13a", lowercase: bool = False,
             extra: dict | None = None) -> dict:
  """Translates, scores and writes DIR/eval/NAME.CHECKPOINT.SEARCH.{hyp,json}; returns the result."""
  start = time.perf_counter()
  hypotheses = translator(params, sources, progress=True)
  seconds = time.perf_counter() - start
  result = score(hypotheses, references, tokenize=tokenize, lowercase=lowercase) | {
      "name": name, "checkpoint": label, "sentences": len(sources), "seconds": seconds,
      "sentences_per_s": len(sources) / max(seconds, 1e-9), "decode": translator.settings,
      "truncated_sources": translator.truncated, "hardware": hardware()} | (extra or {})
  if jax.process_index() == 0:
    outdir.mkdir(parents=True, exist_ok=True)
    stem = f"{name}.{label}.{search_name(translator.settings)}"  # one file per checkpoint and search
    hyp_path = outdir / f"{stem}.hyp"
    text = "".join(h + "\n" for h in hypotheses)
    for path in [hyp_path] + ([pathlib.Path(output)] if output else []):
      write_atomic(path, text.encode("utf-8"))
    result["hypotheses"] = str(hyp_path)
    write_atomic(outdir / f"{stem}.json", (json.dumps(result, indent=1) + "\n").encode("utf-8"))
  return result


def decoded_lines(stream):
  """Text lines of a byte or text stream. An invalid UTF-8 byte becomes U+FFFD with a warning
  naming the line, so every input line still gets its output line."""
  raw = getattr(stream, "buffer", stream)
  for number, line in enumerate(raw, 1):
    if isinstance(line, str):
      yield line.rstrip("\r\n")
      continue
    try:
      text = line.decode("utf-8")
    except UnicodeDecodeError as err:
      print(f"warning: stdin line {number}: invalid UTF-8 at byte {err.start}, replaced by U+FFFD", file=sys.stderr)
      text = line.decode("utf-8", errors="replace")
    yield text.rstrip("\r\n")


def translate_stream(translator: Translator, params, lines, out) -> None:
  """Stdin to stdout: line by line at a terminal, in batches when piped; one output line each."""
  if hasattr(lines, "isatty") and lines.isatty():
    for line in decoded_lines(lines):
      out.write(translator(params, [line])[0] + "\n")
      out.flush()
    return
  for hyp in translator(params, list(decoded_lines(lines))):
    out.write(hyp + "\n")
  out.flush()


def main(argv=None) -> None:
  from absl import app, flags

  f = flags
  workdir = f.DEFINE_string("workdir", None, "The training run's directory.", required=True)
  step = f.DEFINE_integer("step", None, "Evaluate this checkpoint step (default: the latest).")
  best = f.DEFINE_bool("best", False, "Evaluate the kept checkpoint with the lowest validation loss.")
  average_last = f.DEFINE_integer("average_last", 0, "Evaluate the average of the last K checkpoints.")
  splits = f.DEFINE_multi_string("split", None, "Split(s) to evaluate (default: config.data.test_splits).")
  source = f.DEFINE_string("source", None, "Source file to translate (plain/gz/sgm); '-' reads stdin.")
  reference = f.DEFINE_string("reference", None, "Reference file for --source (plain/gz/sgm).")
  output = f.DEFINE_string("output", "", "Also write the hypotheses to this file.")
  beam_size = f.DEFINE_integer("beam_size", None, "Beam size (default: config.eval.beam_size); 1 = greedy.")
  alpha = f.DEFINE_float("alpha", None, "Length penalty exponent (default: config.eval.alpha).")
  max_len_a = f.DEFINE_float("max_len_a", None, "Max output length = a * source length + b.")
  max_len_b = f.DEFINE_integer("max_len_b", None, "Max output length = a * source length + b.")
  batch_size = f.DEFINE_integer("batch_size", None, "Sentences per batch (default: config.eval.batch_size).")
  tokenize = f.DEFINE_string("tokenize", "13a", "sacreBLEU tokenizer (13a, intl, zh, char, none, ...).")
  lowercase = f.DEFINE_bool("lowercase", False, "Case-insensitive BLEU and chrF.")
  join_hosts = sharding.define_distributed_flags()
  ensemble = f.DEFINE_multi_string("ensemble", None, "Also load this run (repeatable) and decode the ensemble: the "
                                   "mean of the models' probabilities. Runs must share the sentencepiece model.")
  for flag in f.FLAGS.flags_by_module_dict()[__name__]:  # listed by eval.py --help, not only --helpfull
    f.FLAGS.register_key_flag_for_module(sys.argv[0], flag)

  def run(_):
    try:
      join_hosts()
      if source.value == "-" and jax.process_count() > 1:
        raise ValueError("--source=- (stdin) translates on one process; give --source=FILE on a multi-host run")
      config = load_config(workdir.value)
      if (reference.value is None) != (source.value is None) and source.value != "-":
        raise ValueError("--source and --reference go together (or --source=- alone to translate stdin)")
      if [best.value, step.value is not None, bool(average_last.value)].count(True) > 1:
        raise ValueError("choose at most one of --step, --best and --average_last")
      if source.value not in (None, "-"):
        sources, references = read_text(source.value), read_text(reference.value)
        if len(sources) != len(references):
          raise ValueError(f"--source={source.value} has {len(sources)} lines but --reference={reference.value} "
                           f"has {len(references)}; they must be parallel, one segment per line")
        jobs = [(pathlib.Path(source.value).name.removesuffix(".gz"), sources, references)]
      else:
        jobs = []
        for split in [] if source.value == "-" else splits.value or list(config.data.test_splits):
          pairs = data.eval_pairs(config, split)
          jobs.append((split.replace("/", "_").replace(":", "_"), [s for s, _ in pairs], [t for _, t in pairs]))
      mesh = sharding.make_mesh(config.mesh)
      choice = dict(step=step.value, best=best.value, average_last=average_last.value)
      extra = {"command": shlex.join(["python", *sys.argv])}
      if ensemble.value:
        model_cfg, graphdef, params, tok, label, members = load_ensemble([workdir.value, *ensemble.value], config,
                                                                         mesh, **choice)
        extra["ensemble"] = members
      else:
        model_cfg, graphdef, params, tok, label = load_params(workdir.value, config, mesh, **choice)
      e = config.eval
      pick = lambda flag, default: default if flag.value is None else flag.value
      translator = Translator(model_cfg, graphdef, tok, mesh, beam_size=pick(beam_size, e.beam_size),
                              alpha=pick(alpha, e.alpha), max_len_a=pick(max_len_a, e.max_len_a),
                              max_len_b=pick(max_len_b, e.max_len_b), batch_size=pick(batch_size, e.batch_size))
      if source.value == "-":
        translate_stream(translator, params, sys.stdin, sys.stdout)
        return
      outdir = pathlib.Path(workdir.value) / "eval"
      results = [evaluate(translator, params, src, ref, name=name, label=label, outdir=outdir, output=output.value,
                          tokenize=tokenize.value, lowercase=lowercase.value,
                          extra=extra) for name, src, ref in jobs]
    except (ValueError, DataError) as err:
      cli.fail(str(err))
    if jax.process_index() == 0:
      for r in results:
        print(f"{r['name']} ({r['checkpoint']}): {r['sentences']} sentences in {r['seconds']:.1f} s "
              f"({r['sentences_per_s']:.1f} sentences/s); hypotheses in {r['hypotheses']}")
      for r in results:  # the score lines come last, each ending with its signature
        print(f"{r['name']}: {r['chrf_line']}")
        print(f"{r['name']}: {r['bleu_line']}")

  app.run(run, argv=argv, flags_parser=cli.parse_flags)
