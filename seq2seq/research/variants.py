"""Named architecture variants for `python -m seq2seq.research.sweep`: bundles of config
overrides, defined here and nowhere else.

`vanilla` is Vaswani et al.'s Transformer: post-norm LayerNorm, ReLU, sinusoidal positions,
biases, tied output embedding. Every other variant is vanilla plus one modification (as in
Narang et al. 2021, "Do Transformer Modifications Transfer Across Implementations and
Applications?"), except `transformer++`. Names joined by + combine variants in order
("prenorm+rope": vanilla, then pre-norm, then RoPE), to test a modification on another base
(`python -m seq2seq.research.sweep --baseline=prenorm`).

`transformer++` here is vanilla with four changes at once: pre-norm residual blocks with
RMSNorm (and a final RMSNorm per stack), a SwiGLU feed-forward at 2/3 width, rotary
positions, and no biases (RMSNorm has a scale only); it keeps vanilla's encoder-decoder, tied
output embedding, sizes and learning rate, and is compared on translation (NLL, BLEU). Gu &
Dao (2023, Mamba) name Transformer++ a decoder-only language model: the GPT-3 architecture
improved as in the PaLM and LLaMA recipes (rotary embeddings, SwiGLU, RMSNorm, no linear
biases), compared on language-modelling perplexity. The architectural recipe is theirs; the
task, the model's shape, the scale and the training are not (docs/sweeps.md#variants).

`adanorm-xu` is AdaNorm as Xu et al. (2019, "Understanding and Improving Layer
Normalization") released it for translation, also a bundle: pre-norm residual blocks and
norm = adanorm with k = 1/10 and scale C = 2 (their script `machine translation/
baseline-adanorm-km.sh` in lancopku/AdaNorm: fairseq's IWSLT14 de-en Transformer with
--encoder-normalize-before --decoder-normalize-before --lnv adanorm --adanorm_scale 2; one
version of that folder's README example shows 1). Their fairseq norm divides by the standard
deviation plus eps and uses Kaiming initialisation (--init_method km); here the norm is
seq2seq/model/layers.py's Norm, z = C (1 - k y) y with y standardised and C (1 - k y)
detached, and initialisation stays the project's. `adanorm` alone is that norm with the base
config's C (1 by default) on post-norm vanilla. Run it beside LayerNorm and RMSNorm on the
pre-norm base: --variants=prenorm,prenorm+rmsnorm,prenorm+adanorm,adanorm-xu --baseline=prenorm.

`relative` is T5's bucketed relative position bias (model.positions=relative, Raffel et al.
2020). A variant that sets a model choice this version does not offer yet is refused when its
runs are planned (`overrides`; `available` asks), and the default grid takes `relative` only
where the model has it.

Widths are set so that parameters stay comparable:
- Gated feed-forwards (glu, reglu, geglu, swiglu) have three matrices instead of two, so
  their hidden width is 2/3 of the base d_ff, rounded to a multiple of 8 (`glu_width`):
  the feed-forward keeps the same parameters (Shazeer 2020).
- `deep` doubles the layers and `wide` halves them (at least one); their d_ff is solved so
  the layers hold the same parameters as vanilla's (`layer_params`). `deep` also takes
  d_model x 3/4, since twice the layers' attention alone would outgrow vanilla's layers.

Sizes scale d_model and d_ff of the base config (heads and layers stay): `small` x1/2,
`base` x1, `large` x2, for the Transformer vs Transformer++ scaling comparison. The peak
learning rate goes with d_model^-0.5, as in Vaswani et al.'s schedule (`size_learning_rate`).

A name may end with a learning-rate part, `lrRATE`: the peak learning rate at the base size,
scaled with the size like the config's (`learning_rate`), so that each architecture can train
at its own best rate: `vanilla+lr0.004`, `transformer+++lr0.008`. It changes no model setting;
`architecture` is the name without it.

  overrides("swiglu", config)  -> {"model.norm_position": "post", ..., "model.activation": "swiglu", "model.d_ff": 168}
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable

from seq2seq.errors import ConfigError
from seq2seq.model.config import CHOICES, ModelConfig

# The settings every variant starts from; a variant's own overrides replace some of them.
VANILLA = {"model.norm_position": "post", "model.norm": "layernorm", "model.activation": "relu",
           "model.positions": "sinusoidal", "model.use_bias": True, "model.tie_output": True}

SIZES = {"small": 0.5, "base": 1.0, "large": 2.0, "xlarge": 4.0}


def glu_width(d_ff: int) -> int:
  """Hidden width of a gated feed-forward with the parameters of a plain one of width d_ff."""
  return max(8, 8 * round(2 * d_ff / 3 / 8))


def _gated(activation: str) -> Callable[[dict, int], dict]:
  """A gated feed-forward at 2/3 of the width (see glu_width)."""
  return lambda m, v: {"model.activation": activation, "model.d_ff": glu_width(m["d_ff"])}


def layer_params(model: dict, vocab_size: int) -> int:
  """Parameters of the encoder and decoder layers and final norms (embeddings, positions and
  the output projection excluded), from the abstract shapes of one layer of each kind:
  `model` is a config.model dict."""
  return _layer_params(ModelConfig.from_config(model, vocab_size))


@functools.lru_cache(maxsize=256)
def _layer_params(cfg: ModelConfig) -> int:
  import jax  # here, not above: the research commands' --help needs no JAX
  from flax import nnx

  from seq2seq.model import transformer

  def count(build) -> int:
    return sum(int(v.size) for v in jax.tree.leaves(nnx.state(nnx.eval_shape(lambda: build(cfg, rngs=nnx.Rngs(0))),
                                                            nnx.Param)))

  final_norms = 2 * count(lambda c, rngs: transformer._norm(c, rngs)) if cfg.norm_position == "pre" else 0
  return (cfg.num_encoder_layers * count(transformer.EncoderLayer) + cfg.num_decoder_layers *
          count(transformer.DecoderLayer) + final_norms)


def solve_d_ff(model: dict, vocab_size: int, target: int, **changes) -> int:
  """The d_ff (a multiple of 8) that gives `model` with `changes` layers of `target`
  parameters; layer parameters are linear in d_ff."""
  at = lambda f: layer_params(model | changes | {"d_ff": f}, vocab_size)
  slope = (at(16) - at(8)) / 8
  d_ff = 8 * round((target - at(8)) / slope / 8 + 1)
  if d_ff < 8:
    raise ConfigError(f"no d_ff gives layers of {target} parameters with {changes}: the attention alone is larger")
  return d_ff


def _depth(factor: float) -> Callable[[dict, int], dict]:
  def bundle(m: dict, vocab_size: int) -> dict:
    base = m | {k.split(".")[1]: v for k, v in VANILLA.items()}
    layers = {k: max(1, round(m[k] * factor)) for k in ("num_encoder_layers", "num_decoder_layers")}
    width = {} if factor <= 1 else {"d_model": _round_heads(m["d_model"] * 3 / 4, m["num_heads"])}
    d_ff = solve_d_ff(base, vocab_size, layer_params(base, vocab_size), **layers, **width)
    return {f"model.{k}": v for k, v in (layers | width | {"d_ff": d_ff}).items()}
  return bundle


def _round_heads(d_model: float, num_heads: int) -> int:
  """d_model rounded to a multiple of 2 * num_heads (an even head dimension, for RoPE)."""
  return 2 * num_heads * max(1, round(d_model / (2 * num_heads)))


# name -> (what it changes, overrides from (config.model as a dict, vocabulary size)).
VARIANTS: dict[str, tuple[str, Callable[[dict, int], dict]]] = {
    "vanilla": ("post-norm LayerNorm, ReLU, sinusoidal positions, biases (Vaswani et al.)", lambda m, v: {}),
    "gelu": ("GELU activation", lambda m, v: {"model.activation": "gelu"}),
    "swish": ("Swish (SiLU) activation", lambda m, v: {"model.activation": "swish"}),
    "glu": ("GLU feed-forward, 2/3 width", _gated("glu")),
    "reglu": ("ReGLU feed-forward, 2/3 width", _gated("reglu")),
    "geglu": ("GeGLU feed-forward, 2/3 width", _gated("geglu")),
    "swiglu": ("SwiGLU feed-forward, 2/3 width", _gated("swiglu")),
    "rmsnorm": ("RMSNorm instead of LayerNorm", lambda m, v: {"model.norm": "rmsnorm"}),
    "prenorm": ("pre-norm residual blocks", lambda m, v: {"model.norm_position": "pre"}),
    "adanorm": ("AdaNorm instead of LayerNorm", lambda m, v: {"model.norm": "adanorm"}),
    "adanorm-xu": ("pre-norm AdaNorm with C = 2, k = 0.1 (Xu et al. 2019's released translation setting)",
                   lambda m, v: {"model.norm_position": "pre", "model.norm": "adanorm", "model.adanorm_c": 2.0,
                                 "model.adanorm_k": 0.1}),
    "learned": ("learned position embeddings", lambda m, v: {"model.positions": "learned"}),
    "rope": ("rotary position embeddings", lambda m, v: {"model.positions": "rope"}),
    "relative": ("T5 relative position bias, bucketed, per head", lambda m, v: {"model.positions": "relative"}),
    "untied": ("output projection untied from the target embedding", lambda m, v: {"model.tie_output": False}),
    "nobias": ("no biases in attention and feed-forward", lambda m, v: {"model.use_bias": False}),
    "deep": ("2x the layers, d_model x3/4, d_ff for equal layer parameters", _depth(2.0)),
    "wide": ("1/2 the layers, d_ff for equal layer parameters", _depth(0.5)),
    "transformer++": ("pre-norm RMSNorm, SwiGLU (2/3 width), RoPE, no biases (LLaMA-style)",
                      lambda m, v: {"model.norm_position": "pre", "model.norm": "rmsnorm", "model.positions": "rope",
                                    "model.use_bias": False} | _gated("swiglu")(m, v)),
}

# The default grid of `python -m seq2seq.research.sweep` (12 variants, 13 with `relative` once the
# model offers model.positions=relative; the others are there to name).
DEFAULT = ("vanilla", "gelu", "swish", "reglu", "geglu", "swiglu", "rmsnorm", "prenorm", "learned", "rope",
           *(("relative",) if "relative" in CHOICES["positions"] else ()), "nobias", "transformer++")


def size_overrides(size: str, model: dict) -> dict:
  """d_model and d_ff of config.model scaled by SIZES[size] (nothing for base)."""
  if size not in SIZES:
    raise ConfigError(f"unknown size {size!r}; known: {sorted(SIZES)}")
  if size == "base":
    return {}
  f = SIZES[size]
  return {"model.d_model": _round_heads(model["d_model"] * f, model["num_heads"]),
          "model.d_ff": 8 * max(1, round(model["d_ff"] * f / 8))}


def size_learning_rate(size: str, learning_rate: float) -> dict:
  """The peak learning rate at `size`: x 1/sqrt(SIZES[size]), the d_model^-0.5 of Vaswani et
  al.'s schedule (nothing for base). One rate for all sizes trains post-norm vanilla at twice
  the width worse than at base (docs/findings.md)."""
  if size not in SIZES:
    raise ConfigError(f"unknown size {size!r}; known: {sorted(SIZES)}")
  return {} if size == "base" else {"train.learning_rate": float(f"{learning_rate / SIZES[size] ** 0.5:.4g}")}


# A learning-rate part: lr then a positive number (lr0.004, lr4e-3).
_RATE = re.compile(r"lr(\d+(?:\.\d*)?(?:e-?\d+)?|\.\d+(?:e-?\d+)?)")


def rate_of(part: str) -> float | None:
  """The peak learning rate a part names (`lr0.004` -> 0.004), None for an architecture part."""
  match = _RATE.fullmatch(part)
  return float(match.group(1)) if match else None


def parts(name: str) -> list[str]:
  """The variants a name combines, joined by +: "prenorm+rope" -> ["prenorm", "rope"];
  "transformer++" is one variant, "transformer+++swish" two; a learning-rate part comes last:
  "vanilla+lr0.004" -> ["vanilla", "lr0.004"]."""
  if not name:
    raise ConfigError("an empty variant name: name one of " + ", ".join(VARIANTS))
  out, rest = [], name
  while rest:
    match = max((v for v in VARIANTS if rest == v or rest.startswith(v + "+")), key=len, default=None)
    if match is None and out:
      match = rest.split("+", 1)[0] if rate_of(rest.split("+", 1)[0]) is not None else None
    if match is None or match in out:
      raise ConfigError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}, or several of them joined by + "
                       "(prenorm+rope), each at most once, and a learning rate last (vanilla+lr0.004)")
    if out and rate_of(out[-1]) is not None:
      raise ConfigError(f"variant {name!r}: the learning-rate part {out[-1]} comes last")
    if rate_of(match) == 0:
      raise ConfigError(f"variant {name!r}: {match} is not a positive learning rate")
    out.append(match)
    rest = rest[len(match):]
    if rest == "+":
      raise ConfigError(f"variant {name!r} ends with +: name the variant to combine after it")
    rest = rest[1:]
  return out


def split(name: str) -> tuple[list[str], float | None]:
  """The architecture parts of `name` and the rate its learning-rate part names (None without
  one): "transformer+++swish+lr0.008" -> (["transformer++", "swish"], 0.008)."""
  named = parts(name)
  rate = rate_of(named[-1])
  return (named if rate is None else named[:-1]), rate


def architecture(name: str) -> str:
  """The name without its learning-rate part: "transformer+++lr0.008" -> "transformer++"."""
  return "+".join(split(name)[0])


def learning_rate(name: str, size: str, default: float) -> dict:
  """The peak learning rate of variant `name` at `size`: its learning-rate part, else `default`
  (the config's), each scaled by size_learning_rate; {} where that is the config's own rate."""
  own = split(name)[1]
  if own is None:
    return size_learning_rate(size, default)
  return size_learning_rate(size, own) or {"train.learning_rate": own}


def describe(name: str) -> str:
  """What variant `name` (possibly combined) changes from vanilla."""
  return " + ".join(VARIANTS[p][0] if rate_of(p) is None else
                    f"peak learning rate {rate_of(p):g} at the base size" for p in parts(name))


def overrides(name: str, model: dict, vocab_size: int, size: str = "base") -> dict:
  """The flat {"model.KEY": value} overrides that turn `model` (config.model as a dict) into
  variant `name` at `size`: the size first, then vanilla's settings, then each combined
  variant's in turn (a later one sees, and may replace, the earlier ones' settings)."""
  names = split(name)[0]
  sized = size_overrides(size, model)
  changes = dict(VANILLA)
  for part in names:
    current = model | {k.split(".", 1)[1]: v for k, v in (sized | changes).items()}
    changes |= VARIANTS[part][1](current, vocab_size)
  for key, value in changes.items():
    offered = CHOICES.get(key.split(".", 1)[1], (value,))
    if value not in offered:
      raise ConfigError(f"variant {name!r} sets {key}={value!r}, which this version's model does not offer "
                        f"(seq2seq/model/config.py: {', '.join(offered)})")
  return sized | changes


def available(name: str) -> bool:
  """Whether this version's model offers every choice variant `name` sets (`relative` needs
  model.positions=relative)."""
  model = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.name != "vocab_size"}
  try:
    overrides(name, model, 1000)
  except ConfigError:
    return False
  return True


def flag(key: str, value) -> str:
  """A command-line override: --config.model.d_ff=168."""
  return f"--config.{key}={value}"

