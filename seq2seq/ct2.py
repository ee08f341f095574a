"""The model as a CTranslate2 model folder (`python -m seq2seq.export --format=ctranslate2`).

CTranslate2 (OpenNMT's inference engine: int8/int16/float16 weights, CPU and GPU) runs our
models through its Transformer spec. `spec` maps each parameter onto it:

  embeddings (x sqrt(d_model))       encoder/decoder.embeddings; the output projection is
                                     the target embedding (tied) or output_dv^T
  sinusoidal / learned positions     position_encodings.encodings: our own table, rows 0..
  RoPE (self-attention only)         rotary_dim 0 (all of the head), halves not interleaved
  T5 relative bias (one per stack)   every self-attention layer's relative_attention_bias
  self-attention wqkv_dn3h, bqv_n2h  linear[0]: q, k, v fused [3nh, d] (keys without bias)
  cross-attention wq_dnh, wkv_dn2h   linear[0] (queries), linear[1] (keys, values)
  wo_nhd, bo_d                       linear[-1]
  feed-forward wi_df, bi_f, wo_fd    ffn.linear_0, linear_1; gated: linear_0 is the gate
                                     (wg_df, no bias) and linear_0_noact the linear half
  norms (pre or post)                layer_norm of each sublayer; pre-norm's final norms

Sources are sentencepiece pieces without eos (the model config adds it, `add_source_eos`);
the decoder starts from eos, as ours does. AdaNorm has no CTranslate2 counterpart and is
refused (`refusal`). `verify` checks an export against the model it came from.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from seq2seq.errors import ConfigError, ModelFileError
from seq2seq.model.config import ModelConfig

FORMAT = "seq2seq-ctranslate2-1"
FILES = ("model.bin", "config.json", "shared_vocabulary.json")  # what CTranslate2 writes (one vocabulary: ours)
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int16", "float16", "bfloat16")
SINUSOIDAL_ROWS = 2048  # positions of a sinusoidal table (CTranslate2 cuts inputs at 1024 tokens by default)
SCORE_TOLERANCE = 1e-4  # |CTranslate2 - ours| per token of a verified score, float32
EOS, UNK = "</s>", "<unk>"
ACTIVATIONS = {"relu": "RELU", "gelu": "GELUTanh", "swish": "SWISH",  # jax.nn.gelu is the tanh approximation
               "glu": "Sigmoid", "reglu": "RELU", "geglu": "GELUTanh", "swiglu": "SWISH"}


def refusal(model_cfg: ModelConfig) -> str | None:
  """Why the CTranslate2 spec cannot express this model, naming the setting; None when it can."""
  if model_cfg.norm == "adanorm":
    return ("config.model.norm='adanorm' has no CTranslate2 counterpart (its Transformer spec has LayerNorm and "
            "RMSNorm): export this model with --format=seq2seq")
  return None


def _linear(spec, w_oi: np.ndarray, b_o: np.ndarray | None = None) -> None:
  spec.weight = np.ascontiguousarray(w_oi, np.float32)
  if b_o is not None:
    spec.bias = np.ascontiguousarray(b_o, np.float32)


def _norm(spec, t: dict, name: str) -> None:
  spec.gamma = t[f"{name}.scale_d"]
  if f"{name}.bias_d" in t:
    spec.beta = t[f"{name}.bias_d"]


def _attention(spec, t: dict, name: str, cfg: ModelConfig, *, self_attention: bool) -> None:
  d, nh = cfg.d_model, cfg.num_heads * cfg.head_size
  bias = cfg.use_bias
  out_w = t[f"{name}.wo_nhd"].reshape(nh, d).T
  if self_attention:
    w = np.moveaxis(t[f"{name}.wqkv_dn3h"], 0, -1)  # [n, 3, h, d] -> q, k, v stacked
    w = np.concatenate([w[:, i].reshape(nh, d) for i in range(3)])
    b = None
    if bias:
      b_n2h = t[f"{name}.bqv_n2h"]
      b = np.concatenate([b_n2h[:, 0].reshape(nh), np.zeros(nh, np.float32), b_n2h[:, 1].reshape(nh)])
    _linear(spec.linear[0], w, b)
  else:
    _linear(spec.linear[0], t[f"{name}.wq_dnh"].reshape(d, nh).T, t[f"{name}.bq_nh"].reshape(nh) if bias else None)
    w = np.moveaxis(t[f"{name}.wkv_dn2h"], 0, -1)  # [n, 2, h, d]
    w = np.concatenate([w[:, i].reshape(nh, d) for i in range(2)])
    b = np.concatenate([np.zeros(nh, np.float32), t[f"{name}.bv_nh"].reshape(nh)]) if bias else None
    _linear(spec.linear[1], w, b)
  _linear(spec.linear[-1], out_w, t[f"{name}.bo_d"] if bias else None)


def _ffn(spec, t: dict, name: str, cfg: ModelConfig) -> None:
  b_in = t.get(f"{name}.bi_f")
  if f"{name}.wg_df" in t:  # gated: act(x wg) * (x wi + bi)
    _linear(spec.linear_0, t[f"{name}.wg_df"].T)
    _linear(spec.linear_0_noact, t[f"{name}.wi_df"].T, b_in)
  else:
    _linear(spec.linear_0, t[f"{name}.wi_df"].T, b_in)
  _linear(spec.linear_1, t[f"{name}.wo_fd"].T, t.get(f"{name}.bo_d"))


def _positions(stack, t: dict, table: str, cfg: ModelConfig) -> None:
  from seq2seq.model.layers import sinusoidal

  if cfg.positions == "learned":
    stack.position_encodings.encodings = t[f"{table}.table_ld"]
  elif cfg.positions == "sinusoidal":
    rows = np.arange(SINUSOIDAL_ROWS, dtype=np.int32)[None]
    stack.position_encodings.encodings = np.array(sinusoidal(rows, cfg.d_model)[0], np.float32)
  elif hasattr(stack, "position_encodings"):  # RoPE or relative: nothing added to the embeddings
    delattr(stack, "position_encodings")


def spec(cfg: ModelConfig, tensors: dict[str, np.ndarray], pieces: list[str]):
  """The CTranslate2 TransformerSpec of a model: its settings, parameters ({dotted name:
  array}, `seq2seq.export.flatten`) and vocabulary (the sentencepiece pieces by id)."""
  from ctranslate2.specs import common_spec, transformer_spec

  problem = refusal(cfg)
  if problem:
    raise ConfigError(problem)
  t = {k: np.array(v, np.float32) for k, v in tensors.items()}  # writable copies: quantizing works in place
  common = dict(pre_norm=cfg.norm_position == "pre", activation=getattr(common_spec.Activation,
                ACTIVATIONS[cfg.activation]), ffn_glu=cfg.activation in ("glu", "reglu", "geglu", "swiglu"),
                rms_norm=cfg.norm == "rmsnorm", relative_attention_bias=cfg.positions == "relative",
                head_dim=cfg.head_size if cfg.head_dim else None)
  rope = dict(rotary_dim=0, rotary_interleave=False, rotary_base=cfg.rope_base) if cfg.positions == "rope" else {}
  encoder = transformer_spec.TransformerEncoderSpec(cfg.num_encoder_layers, cfg.num_heads, **common, **rope)
  decoder = transformer_spec.TransformerDecoderSpec(cfg.num_decoder_layers, cfg.num_heads, **common, **rope)
  model = transformer_spec.TransformerSpec(encoder, decoder)

  src_embed = t["src_embed.embedding_vd"]
  tgt_embed = t.get("tgt_embed.embedding_vd", src_embed)
  encoder.embeddings[0].weight, decoder.embeddings.weight = src_embed, tgt_embed
  _linear(decoder.projection, tgt_embed if cfg.tie_output else t["output_dv"].T)
  _positions(encoder, t, "src_positions", cfg)
  _positions(decoder, t, "tgt_positions", cfg)
  if cfg.norm_position == "pre":
    _norm(encoder.layer_norm, t, "encoder_norm")
    _norm(decoder.layer_norm, t, "decoder_norm")
  for stack, prefix, table in ((encoder, "encoder_layers", "encoder_bias"), (decoder, "decoder_layers",
                                                                               "decoder_bias")):
    for i, layer in enumerate(stack.layer):
      name = f"{prefix}.{i}"
      _attention(layer.self_attention, t, f"{name}.self_attn", cfg, self_attention=True)
      _norm(layer.self_attention.layer_norm, t, f"{name}.{'attn_norm' if stack is encoder else 'self_norm'}")
      if cfg.positions == "relative":  # one table per stack, as T5's first layer shares it with the others
        layer.self_attention.relative_attention_bias = t[f"{table}.bias_rn"]
        layer.self_attention.relative_attention_max_distance = np.int32(cfg.relative_max_distance)
      if stack is decoder:
        _attention(layer.attention, t, f"{name}.cross_attn", cfg, self_attention=False)
        _norm(layer.attention.layer_norm, t, f"{name}.cross_norm")
      _ffn(layer.ffn, t, f"{name}.ffn", cfg)
      _norm(layer.ffn.layer_norm, t, f"{name}.ffn_norm")

  model.config.layer_norm_epsilon = cfg.norm_eps
  for key, value in dict(unk_token=UNK, bos_token=EOS, eos_token=EOS, decoder_start_token=EOS,
                         add_source_eos=True).items():
    setattr(model.config, key, value)
  model.register_source_vocabulary(pieces)
  model.register_target_vocabulary(pieces)
  return model


def write(folder: os.PathLike, cfg: ModelConfig, tensors: dict[str, np.ndarray], pieces: list[str],
          quantization: str | None = None) -> list[str]:
  """Saves the CTranslate2 model into `folder` (existing, empty); the names of the files written."""
  model = spec(cfg, tensors, pieces)
  model.validate()
  model.optimize(quantization=quantization)
  before = set(os.listdir(folder))
  model.save(str(folder))
  return sorted(set(os.listdir(folder)) - before)


def search_options(beam_size: int, limit: int) -> dict:
  """`ctranslate2.Translator.translate_batch` options that search as ours does with alpha 0
  and an output limit of `limit` tokens (eos included; `Translator.max_output`). What
  differs: at the limit we end a hypothesis with eos, CTranslate2 cuts it (its score then
  lacks eos), and we never emit padding, which CTranslate2 could (a trained model never
  does; `suppress_sequences=[["<pad>"]]` would ban it but renormalize every score)."""
  return dict(beam_size=beam_size, length_penalty=0.0, max_decoding_length=limit - 1, min_decoding_length=0,
              max_input_length=0, return_scores=True)


def search(ct, sp, src_ids: list[list[int]], limits: list[int], beam_size: int) -> list[tuple[list[int], float]]:
  """The best output (ids, without eos) and its score of CTranslate2 translator `ct` for each
  source (ids, eos appended), searched as ours does with alpha 0 and output limits `limits`
  (`search_options`): one sentence at a time, since each has its own limit."""
  out = []
  for ids, limit in zip(src_ids, limits):
    result = ct.translate_batch([[sp.id_to_piece(i) for i in ids[:-1]]], **search_options(beam_size, limit))[0]
    out.append(([sp.piece_to_id(piece) for piece in result.hypotheses[0]], result.scores[0]))
  return out


@dataclasses.dataclass(frozen=True)
class Check:
  """What `verify` found: sentences whose greedy output differed, and the largest score gap per token."""

  sentences: int
  differing: list[int]
  largest_gap: float


def verify(folder: os.PathLike, translator, sentences: list[str], *, strict: bool = True,
           compute_type: str = "float32") -> Check:
  """Greedy translations of `sentences` by the CTranslate2 model in `folder` and by
  `translator` (ours, beam 1), and the scores both give our translations (teacher forced).
  `strict`: any differing output, or a score more than SCORE_TOLERANCE per token away from
  ours, is a ModelFileError naming the folder and the sentence (float32 exports); otherwise
  the numbers are only returned (quantized weights translate differently by design)."""
  import ctranslate2

  sp, eos = translator.tok.sp, translator.tok.special.eos
  src_ids = translator.tok.encode(sentences)  # eos appended
  ours = translator.translate_ids(translator.params, src_ids)
  ct = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute_type)
  theirs = [ids for ids, _ in search(ct, sp, src_ids, [translator.max_output(len(ids)) for ids in src_ids], 1)]
  src = [[sp.id_to_piece(i) for i in ids[:-1]] for ids in src_ids]
  targets = [[sp.id_to_piece(i) for i in ids] for ids in ours]
  their_scores = [sum(r.log_probs) for r in ct.score_batch(src, targets, max_input_length=0)]
  our_scores = translator.score_ids(translator.params, src_ids, [ids + [eos] for ids in ours], normalize=False)
  gaps = [abs(a - b) / (len(ids) + 1) for a, b, ids in zip(their_scores, our_scores, ours)]
  check = Check(len(sentences), [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b],
                max(gaps, default=0.0))
  if strict and (check.differing or check.largest_gap > SCORE_TOLERANCE or not math.isfinite(check.largest_gap)):
    i = check.differing[0] if check.differing else int(np.argmax(gaps))
    raise ModelFileError(f"{folder}: the CTranslate2 model does not reproduce the model it was made from: sentence "
                         f"{i + 1} {sentences[i]!r} gives {sp.decode(theirs[i])!r} (ours {sp.decode(ours[i])!r}), scores "
                         f"{their_scores[i]:.6f} and {our_scores[i]:.6f}; {len(check.differing)} of {len(sentences)} "
                         "outputs differ")
  return check


SENTENCES = ["A man rides a bike.", "Two dogs play in the snow near a red house.", "A woman is reading a book.",
             "Children are playing football in the park.", "The quick brown fox jumps over the lazy dog.",
             "A group of people stand outside a building.", "He said: \"It is 5 o'clock!\"", "Yes."]


def build(folder: os.PathLike, loaded, config, mesh, tensors: dict[str, np.ndarray], quantization: str | None) -> dict:
  """Writes the CTranslate2 model of a loaded checkpoint (`seq2seq.inference.load.Loaded`)
  into `folder`, verified on SENTENCES against the checkpoint (computed in float32) with the
  run's length limits:
  float32 weights strictly (`verify`); quantized ones are written after and their agreement
  recorded. Returns what export.json records of it."""
  from seq2seq.inference.translate import Translator, search_settings
  from seq2seq.model import transformer

  tok, cfg = loaded.tokenizer, loaded.model_cfg
  pieces = [tok.sp.id_to_piece(i) for i in range(tok.sp.get_piece_size())]
  settings = search_settings(config.eval, beam_size=1, alpha=0.0)
  exact = dataclasses.replace(cfg, dtype="float32")  # a bfloat16 model is checked against its float32 function
  translator = Translator(exact, transformer.graphdef(exact), tok, mesh, params=loaded.params, **settings)
  written = write(folder, cfg, tensors, pieces)
  record = {"quantization": quantization or "float32", "verified_on": len(SENTENCES),
            "learned_positions": cfg.max_len if cfg.positions == "learned" else None,
            "float32": dataclasses.asdict(verify(folder, translator, SENTENCES))}
  if quantization:
    for name in written:
      os.remove(os.path.join(folder, name))
    write(folder, cfg, tensors, pieces, quantization)
    check = verify(folder, translator, SENTENCES, strict=False, compute_type="auto")
    record[quantization] = dataclasses.asdict(check)
  return record
