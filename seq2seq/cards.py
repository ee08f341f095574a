"""The README.md of an exported model folder: what it translates and how to use it
(`model_card`, python -m seq2seq.export), or how to run a CTranslate2 export and how it was
checked (`ctranslate2_card`, --format=ctranslate2)."""

from __future__ import annotations

import json
import pathlib
import re

from seq2seq import metrics
from seq2seq.model import transformer
from seq2seq.model.config import ModelConfig


def eval_flags(label: str) -> str:
  """seq2seq-eval's flags that evaluate the checkpoint a label names: best40 -> --checkpoint=best,
  step60 -> --checkpoint=60, average5-20000 -> --checkpoint=20000 --average_last=5."""
  m = re.fullmatch(r"(step|best|average)(\d+)(?:-(\d+))?", label)
  if not m:
    return ""
  kind, number, step = m.groups()
  return {"step": f" --checkpoint={number}", "best": " --checkpoint=best",
          "average": f" --checkpoint={step} --average_last={number}"}[kind]


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
              f"`seq2seq-eval --workdir={workdir}{eval_flags(label)}` before exporting to include its scores."]
  return "\n".join(lines) + "\n"


def ctranslate2_card(label: str, workdir, quantization: str | None, record: dict) -> str:
  """README.md of a CTranslate2 export: how to translate with it, and how it was checked."""
  f32 = record["float32"]
  lines = [f"# CTranslate2 model exported by seq2seq from checkpoint `{label}` of `{workdir}`", "",
           f"Weights: {quantization or 'float32'}. Translate in five lines (`pip install ctranslate2 sentencepiece`):",
           "", "```python", "import ctranslate2, sentencepiece",
           'sp = sentencepiece.SentencePieceProcessor(model_file="path/to/this/folder/spm.model")',
           'translator = ctranslate2.Translator("path/to/this/folder", device="cpu")  # or "cuda"',
           'result = translator.translate_batch([sp.encode("A man rides a bike.", out_type=str)], beam_size=4)',
           "print(sp.decode(result[0].hypotheses[0]))", "```", "",
           "To reproduce `seq2seq-translate` exactly: `length_penalty=0` with our `--alpha=0` (CTranslate2 divides "
           "by length**penalty, we by GNMT's ((5 + length) / 6)**alpha) and `max_decoding_length` one less than our "
           "limit (a * source length + b, eos included): at the limit we end a hypothesis with eos, CTranslate2 "
           "cuts it (`seq2seq.ct2.search_options`).", "",
           f"Checked at export on {record['verified_on']} sentences with greedy search: float32 outputs differing "
           f"from the checkpoint's: {len(f32['differing'])}; largest score gap per token: {f32['largest_gap']:.2e}."]
  if record.get("learned_positions"):
    n = record["learned_positions"]
    lines += ["", f"Learned positions: the model has {n} (CTranslate2 refuses a longer input or output with "
              f"'No position encodings are defined for positions >= {n}'): translate with "
              f"`max_input_length={n - 1}, max_decoding_length={n - 1}`, as seq2seq cuts its inputs."]
  if quantization:
    q = record[quantization]
    lines.append(f"With {quantization} weights: {len(q['differing'])} of {q['sentences']} outputs differ; largest "
                 f"score gap per token {q['largest_gap']:.3f}.")
  return "\n".join(lines) + "\n"
