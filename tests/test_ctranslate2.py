"""CTranslate2 export (seq2seq/ct2.py; python -m seq2seq.export --format=ctranslate2): every
architecture its Transformer spec expresses translates and scores as ours does, greedy and
beam search agree on a trained model, and the export command is verified and refuses what
it cannot write."""

import gzip
import json
import re
import shutil

import jax
import ml_collections
import pytest
from flax import nnx
from test_export import error_lines, run_module

from seq2seq import ct2, export
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import ConfigError, ModelFileError
from seq2seq.inference.translate import Translator
from seq2seq.model import transformer
from seq2seq.model.config import ModelConfig
from seq2seq.sharding import make_mesh

ctranslate2 = pytest.importorskip("ctranslate2")

# Every activation once; each position kind, norm, norm position, embedding sharing, bias
# and head size in at least one of them.
VARIANTS = {
  "relu, post-layernorm, sinusoidal (the base)": {},
  "gelu, pre-layernorm, learned positions, head_dim 12": dict(activation="gelu", norm_position="pre",
                                                             positions="learned", head_dim=12),
  "swish, pre-rmsnorm, rope, untied embeddings and output": dict(activation="swish", norm="rmsnorm",
                                                                norm_position="pre", positions="rope",
                                                                share_embeddings=False, tie_output=False),
  "glu, post-rmsnorm, relative": dict(activation="glu", norm="rmsnorm", positions="relative"),
  "reglu, pre-layernorm, relative, no biases": dict(activation="reglu", norm_position="pre", positions="relative",
                                                    use_bias=False),
  "geglu, post-layernorm, rope, separate target embedding": dict(activation="geglu", positions="rope",
                                                                 share_embeddings=False),
  "swiglu, pre-rmsnorm, output projection of its own": dict(activation="swiglu", norm="rmsnorm",
                                                            norm_position="pre", tie_output=False),
}
SENTENCES = ["A man rides a bike.", "Two dogs play in the snow near a red house.", "x"]
LONG = [" ".join(["A man in a blue shirt rides a bike near the old house while two dogs play."] * 4)]  # ~100 tokens


@pytest.fixture(scope="module")
def tok(tiny_run):
  return Tokenizer.load(tiny_run / "spm.model")


def pieces(tok):
  return [tok.sp.id_to_piece(i) for i in range(tok.sp.get_piece_size())]


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.long] * (i > 0))  # the base in the fast suite
                                  for i, name in enumerate(VARIANTS)])
def test_every_variant_translates_greedily_and_scores_as_ours(name, tok, tmp_path):
  """Random weights (norm gains and biases moved off 1 and 0, so that each is used): greedy
  outputs (ids) equal, among them one that runs to the length limit, and CTranslate2's
  teacher-forced scores of our outputs within 1e-4 of ours (float32)."""
  cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
                    d_ff=64, dropout_rate=0.0, **VARIANTS[name])
  model = transformer.Transformer(cfg, rngs=nnx.Rngs(1))
  params = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.key(3), x.shape), nnx.state(model, nnx.Param))
  ct2.write(tmp_path, cfg, export.flatten(params), pieces(tok))
  mesh = make_mesh(ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1)))
  ours = Translator(cfg, nnx.graphdef(model), tok, mesh, beam_size=1, alpha=0.0, max_len_a=1.0, max_len_b=5,
                    params=params)
  sentences = SENTENCES + (LONG if VARIANTS[name] else [])  # positions past 16 (the base, in the fast suite: not)
  check = ct2.verify(tmp_path, ours, sentences)  # strict: raises on any difference
  assert check.differing == [] and check.largest_gap <= ct2.SCORE_TOLERANCE
  src_ids = tok.encode(sentences)
  outputs = ours.translate_ids(params, src_ids)
  assert any(len(out) + 1 == ours.max_output(len(ids)) for out, ids in zip(outputs, src_ids))  # the limit case


def test_a_wrong_mapping_is_caught(tok, tmp_path, monkeypatch):
  """The check can fail: rotary halves taken as interleaved pairs change the outputs."""
  cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, num_heads=4, num_encoder_layers=1, num_decoder_layers=1,
                    d_ff=64, positions="rope")
  model = transformer.Transformer(cfg, rngs=nnx.Rngs(1))
  from ctranslate2.specs import transformer_spec

  original = transformer_spec.TransformerEncoderSpec.__init__
  monkeypatch.setattr(transformer_spec.TransformerEncoderSpec, "__init__",
                      lambda self, *a, **k: original(self, *a, **{**k, "rotary_interleave": True}))
  ct2.write(tmp_path, cfg, export.flatten(nnx.state(model, nnx.Param)), pieces(tok))
  mesh = make_mesh(ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1)))
  ours = Translator(cfg, nnx.graphdef(model), tok, mesh, beam_size=1, params=nnx.state(model, nnx.Param))
  with pytest.raises(ModelFileError, match="does not reproduce the model it was made from"):
    ct2.verify(tmp_path, ours, SENTENCES)


def test_adanorm_is_refused_naming_the_setting(tok):
  cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, num_heads=4, norm="adanorm")
  with pytest.raises(ConfigError, match=r"config.model.norm='adanorm' has no CTranslate2 counterpart"):
    ct2.spec(cfg, {}, pieces(tok))


@pytest.fixture(scope="module")
def exported_int8(tiny_run, tmp_path_factory):
  return export.export(tiny_run, tmp_path_factory.mktemp("ct2") / "model", format="ctranslate2", quantization="int8")


@pytest.mark.slow
def test_beam_search_of_a_trained_model_equals_ours(tiny_run, data_dir, tmp_path):
  """The tiny run (trained), beam 4 and greedy, alpha 0 against length_penalty 0, on 100
  validation sentences: the same outputs and search scores (within 1e-4), except where
  CTranslate2's output reached the limit (it cuts a hypothesis there; we end it with eos)."""
  folder = export.export(tiny_run, tmp_path / "model", format="ctranslate2")
  with gzip.open(data_dir / "multi30k" / "val.en.gz", "rt", encoding="utf-8") as f:
    sentences = [next(f).strip() for _ in range(100)]
  ct = ctranslate2.Translator(str(folder), device="cpu", compute_type="float32")
  for beam in (1, 4):
    ours = Translator.from_workdir(tiny_run, beam_size=beam, alpha=0.0)
    src_ids = ours.tok.encode(sentences)
    out, scores = ours._translate_ids(ours.params, src_ids, progress=False)
    limits = [ours.max_output(len(ids)) for ids in src_ids]
    compared = 0
    for ids, limit, best, score, (theirs, their_score) in zip(src_ids, limits, out, scores,
                                                              ct2.search(ct, ours.tok.sp, src_ids, limits, beam)):
      if len(theirs) == limit - 1:
        continue
      assert theirs == best[0] and abs(their_score - score[0]) <= 1e-4, (beam, ids)
      compared += 1
    assert compared >= (10 if beam == 1 else 90), compared  # its greedy outputs run to the limit most often


def test_an_int8_export_records_its_checks_and_is_not_a_seq2seq_model(exported_int8, tiny_run):
  names = sorted(p.name for p in exported_int8.iterdir())
  assert names == sorted(["README.md", "export.json", "spm.model", *ct2.FILES])
  manifest = json.loads((exported_int8 / "export.json").read_text())
  assert manifest["format"] == ct2.FORMAT and set(manifest["files"]) == {"spm.model", *ct2.FILES}
  record = manifest["ctranslate2"]
  assert record["quantization"] == "int8" and record["float32"]["differing"] == []
  assert record["float32"]["largest_gap"] <= ct2.SCORE_TOLERANCE and record["int8"]["sentences"] == len(ct2.SENTENCES)
  card = (exported_int8 / "README.md").read_text()
  assert "ctranslate2.Translator(" in card and "int8" in card
  with pytest.raises(ModelFileError, match="a CTranslate2 model .* translate with ctranslate2.Translator"):
    Translator.from_pretrained(exported_int8)
  sp = Tokenizer.load(exported_int8 / "spm.model").sp  # the card's five lines, as a user runs them
  result = ctranslate2.Translator(str(exported_int8)).translate_batch([sp.encode("A man.", out_type=str)], beam_size=4)
  assert isinstance(sp.decode(result[0].hypotheses[0]), str)


@pytest.mark.long
def test_overwrite_replaces_an_export_of_either_format_and_nothing_else(exported_int8, tiny_run, tmp_path):
  out = shutil.copytree(exported_int8, tmp_path / "model")
  export.export(tiny_run, out, overwrite=True)  # a CTranslate2 export replaced by a seq2seq one
  assert (out / "model.safetensors").is_file() and not (out / "model.bin").exists()
  export.export(tiny_run, out, overwrite=True, format="ctranslate2")  # and back
  assert (out / "model.bin").is_file() and not (out / "model.safetensors").exists()
  (out / "notes.txt").write_text("mine")
  with pytest.raises(ConfigError, match="notes.txt, which an export does not write"):
    export.export(tiny_run, out, overwrite=True, format="ctranslate2")


@pytest.mark.parametrize("args, error", [
    (["--quantization=int8"], "--quantization=int8: one of int8, .* with --format=ctranslate2"),
    (["--format=ctranslate2", "--quantization=int4"], "--quantization=int4: value should be one of <int8"),
])
def test_bad_export_flags_are_one_error_line(args, error, tiny_run, tmp_path):
  proc = run_module(["seq2seq.export", f"--workdir={tiny_run}", f"--out={tmp_path / 'model'}", *args])
  assert proc.returncode == 2 and len(error_lines(proc.stderr)) == 1, proc.stderr
  assert re.search(error, error_lines(proc.stderr)[0]), proc.stderr
  assert not (tmp_path / "model").exists()


def test_without_the_package_the_export_is_one_error_naming_the_extra(tiny_run, tmp_path, monkeypatch):
  monkeypatch.setattr(export.importlib.util, "find_spec", lambda name, *a: None if name == "ctranslate2" else ...)
  with pytest.raises(ConfigError, match=r"needs the ctranslate2 package: pip install 'ctranslate2>=4.5,<5'"):
    export.export(tiny_run, tmp_path / "model", format="ctranslate2")
  assert not (tmp_path / "model").exists()


def test_the_card_of_learned_positions_gives_the_limits_that_keep_within_the_table():
  from seq2seq import cards

  check = {"sentences": 8, "differing": [], "largest_gap": 1e-7}
  card = cards.ctranslate2_card("step60", "/runs/x", None, {"verified_on": 8, "float32": check,
                                                            "learned_positions": 64})
  assert "`max_input_length=63, max_decoding_length=63`" in card
  assert "max_input_length" not in cards.ctranslate2_card("step60", "/runs/x", None, {"verified_on": 8,
                                                                                     "float32": check})
