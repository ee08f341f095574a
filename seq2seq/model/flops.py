"""Model FLOPs of a train step (for MFU), and MFU's denominator: the device's nominal peak
for the compute dtype, or a matmul peak measured on this machine."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from seq2seq.model.config import ModelConfig


def forward_flops(cfg: ModelConfig, batch: int, src_len: int, tgt_len: int) -> float:
  """Matmul FLOPs (2 per multiply-add) of one forward pass on a padded [batch, len] batch.
  Elementwise work is not counted: norms, softmax, masks, and the relative position bias
  (positions=relative: one add per score, b*n*t*s a self-attention layer, against the
  4*b*n*t*s*h of its two score products: 1/(4h) of them, under 0.4% for h >= 64)."""
  d, hd, f, v = cfg.d_model, cfg.num_heads * cfg.head_size, cfg.d_ff, cfg.vocab_size
  ffn_mats = 3 if cfg.activation in ("glu", "reglu", "geglu", "swiglu") else 2  # gated: three matrices
  s, t = batch * src_len, batch * tgt_len
  proj = lambda tokens, n_mats: 2 * tokens * d * hd * n_mats
  ffn = lambda tokens: 2 * tokens * d * f * ffn_mats
  encoder = cfg.num_encoder_layers * (proj(s, 4) + ffn(s))
  decoder = cfg.num_decoder_layers * (proj(t, 4) + proj(t, 2) + proj(s, 2) + ffn(t))
  return float(encoder + decoder + 2 * t * d * v) + attention_flops(cfg, batch, src_len, tgt_len)


def attention_flops(cfg: ModelConfig, batch: int, src_len: int, tgt_len: int) -> float:
  """The part of `forward_flops` in the attention kernels: q k^T and weights x v of every
  self- and cross-attention layer, over whole rows (a kernel that skips blocks does less)."""
  scores = lambda q_len, k_len: 2 * 2 * batch * q_len * k_len * cfg.num_heads * cfg.head_size
  return float(cfg.num_encoder_layers * scores(src_len, src_len)
               + cfg.num_decoder_layers * (scores(tgt_len, tgt_len) + scores(tgt_len, src_len)))


def train_step_flops(cfg: ModelConfig, batch: int, src_len: int, tgt_len: int) -> float:
  """Forward plus backward (twice the forward): 3x the forward FLOPs."""
  return 3.0 * forward_flops(cfg, batch, src_len, tgt_len)


def measure_matmul_peak(n: int = 2048, repeats: int = 10) -> float:
  """FLOP/s of a plain f32 [n, n] x [n, n] matmul on the default device (best of `repeats`)."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  matmul = jax.jit(lambda a, b: a @ b)
  matmul(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, b).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2.0 * n**3 / best


# Nominal dense peak TFLOP/s of ONE JAX device (vendor figures, no sparsity), by a substring
# of `device_kind` (the longest matching key wins): (bfloat16, float32); None = no figure.
# float32 is the figure of what an f32 matmul at JAX's default precision runs on: with
# `jax_default_matmul_precision` unset (None), XLA may use TF32 tensor cores on Ampere and
# later NVIDIA GPUs (an f32 2048^2 matmul ran at 103 TFLOP/s on an H200, above its 67 TFLOP/s
# of plain FP32) and one bfloat16 pass on TPUs, so those columns hold the dense TF32 and the
# bf16 figure. V100 has neither TF32 nor bf16 tensor cores: plain FP32, and no bf16 figure.
# TPU v2/v3 expose each of a chip's two cores as a device (half the chip's figure); later
# TPUs one chip per device. device_kind names: "NVIDIA H100 80GB HBM3", "TPU v5 lite" (v5e),
# "TPU v5" (v5p), "TPU v6 lite" (v6e).
PEAK_TFLOPS: dict[str, tuple[float | None, float | None]] = {
    "H100": (989.4, 494.7), "H100 PCIe": (756.5, 378.0), "H100 NVL": (835.5, 417.5),  # SXM, PCIe, NVL
    "H200": (989.4, 494.7), "H200 NVL": (835.5, 417.5), "GH200": (989.4, 494.7), "B200": (2250.0, 1100.0),
    "A100": (312.0, 156.0), "L40S": (362.0, 183.0), "L40": (181.0, 90.5), "L4": (121.0, 60.0),
    "RTX 4090": (165.2, 82.6), "V100": (None, 15.7), "V100-PCIE": (None, 14.0),
    "TPU v3": (61.5, 61.5), "TPU v4": (275.0, 275.0), "TPU v4 lite": (None, None),
    "TPU v5 lite": (197.0, 197.0), "TPU v5e": (197.0, 197.0), "TPU v5": (459.0, 459.0), "TPU v5p": (459.0, 459.0),
    "TPU v6 lite": (918.0, 918.0), "TPU v6e": (918.0, 918.0),
}
MEASURED = "measured f32 matmul"


def nominal_peak(device_kind: str, dtype: str = "bfloat16") -> float | None:
  """Nominal TFLOP/s of one `device_kind` device computing in `dtype`, or None if unknown."""
  column = {"bfloat16": 0, "float32": 1}.get(jnp.dtype(dtype).name)
  matches = [k for k in PEAK_TFLOPS if k.lower() in device_kind.lower()]
  if column is None or not matches:
    return None
  return PEAK_TFLOPS[max(matches, key=len)][column]


def peak_flops(device_kind: str, platform: str, dtype: str, count: int, configured: float = 0.0,
               repeats: int = 10) -> tuple[float, str]:
  """MFU's denominator, FLOP/s of `count` devices, and where it came from: `configured` if
  set ("config"), else on a GPU or TPU the nominal peak for `dtype` ("table:KIND DTYPE"),
  else (a CPU, or a device kind without a figure) an f32 matmul measured now (MEASURED)."""
  if configured:
    return float(configured), "config"
  tflops = nominal_peak(device_kind, dtype) if platform != "cpu" else None
  if tflops:
    return tflops * 1e12 * count, f"table:{device_kind} {jnp.dtype(dtype).name}"
  return measure_matmul_peak(repeats=repeats) * count, MEASURED
