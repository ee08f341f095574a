# Base configuration every other config starts from; not meant to be run by itself.
#   python train.py --config=configs/default.py --workdir=/tmp/default
# Expected: nothing in particular; use tiny.py, multi30k.py, wmt14_base.py or wmt14_big.py.
"""Defaults for every section: seed, model, data, train, mesh, eval.

The model section mirrors `seq2seq.model.config.ModelConfig` (Vaswani et al. base); the
vocabulary size comes from `data.vocab_size`. Override any leaf on the command line:
`--config.model.norm=rmsnorm`.
"""

import os

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.model = ml_collections.ConfigDict(dict(
      d_model=512,
      num_heads=8,
      head_dim=0,  # 0: d_model // num_heads
      num_encoder_layers=6,
      num_decoder_layers=6,
      d_ff=2048,
      activation="relu",  # relu | gelu | swish (plain) | glu | reglu | geglu | swiglu (gated)
      norm="layernorm",  # layernorm | rmsnorm | adanorm
      norm_position="post",  # post (Vaswani et al.) | pre
      norm_eps=1e-6,
      adanorm_k=0.1,
      adanorm_c=1.0,
      positions="sinusoidal",  # sinusoidal | learned | rope | relative (T5's bucketed bias on self-attention scores)
      max_len=256,  # learned position table size
      rope_base=10000.0,
      # relative: buckets of key - query distances per attention stack (half each way in the encoder, all
      # backwards in the decoder), exact up to a quarter / half of them, log-spaced up to max_distance
      relative_buckets=32,
      relative_max_distance=128,
      dropout_rate=0.1,
      attention_dropout_rate=0.0,
      ffn_dropout_rate=0.0,
      share_embeddings=True,
      tie_output=True,
      use_bias=True,
      dtype="float32",  # compute dtype: float32 | bfloat16
      logits_dtype="float32",  # teacher-forced logits: float32 | bfloat16 (half their bytes; loss sums in f32)
      # auto | xla | explicit | cudnn | flash | splash. auto on GPU (bf16/fp16): cuDNN for unpacked rows, the
      # Pallas flash kernel for packed ones; splash on TPU (lengths multiples of 128); else XLA; attention
      # dropout always takes explicit. See seq2seq/model/attention.py.
      attention_impl="auto",
      # auto | xla | pallas. auto: on GPU, LayerNorm and RMSNorm of a power-of-two width in the Pallas
      # kernels of seq2seq/model/norm_kernels.py (one pass forward, one back); else XLA.
      norm_impl="auto",
  ))

  config.data = ml_collections.ConfigDict(dict(
      dir=os.environ.get("SEQ2SEQ_DATA_DIR", ""),  # "" = download Multi30k into cache_dir
      cache_dir="",  # tokenizers and tokenized corpora; "" = $SEQ2SEQ_CACHE or ~/.cache/seq2seq
      # Splits are KIND:WHAT specs (see seq2seq/data/sources.py); a bare name means `source:name`.
      source="multi30k",
      src_lang="en",
      tgt_lang="de",
      train_split="train",
      validation_split="val",
      test_splits=("test_2016_flickr",),
      streaming=False,  # Hugging Face datasets: stream instead of downloading whole
      multi30k_url="",  # "" = the public release; a mirror must serve the same files
      tsv_columns=(0, 1),  # tsv: source and target columns
      # Sentencepiece: one joint model, trained on a seeded sample of the training pairs.
      vocab_size=8000,
      spm_model_type="unigram",  # unigram | bpe
      spm_character_coverage=1.0,
      spm_sample_size=2_000_000,  # sentences (both sides count)
      spm_model="",  # path of an existing model to use instead
      # Subword regularization (Kudo 2018), training only: each epoch samples every pair's
      # segmentations from the unigram model's `subword_nbest` best, P ~ P_unigram^alpha.
      subword_alpha=0.0,  # 0 = off (the one best segmentation)
      subword_nbest=64,
      # Cleaning (training and validation corpora).
      max_len=128,  # subword tokens per side, eos included; longer pairs are dropped
      max_length_ratio=3.0,  # drop pairs whose longer side is more than this times the shorter
      # Batching (seq2seq/data/batching.py): rows of a few fixed lengths, filled best-fit with pairs.
      max_tokens=4096,  # token budget per batch and side: rows * row length
      batch_multiple=8,  # rows per batch are a multiple of this
      num_buckets=8,  # row lengths (so batch shapes, so compilations), geometric from bucket_min to max_len
      bucket_min=8,  # shortest row length
      fill_rows=True,  # top rows up with shorter pairs; False = one pair per row (more padding)
      packing=False,  # True: one row length, pack_length, so one batch shape for the whole run
      pack_length=0,  # row length when packing; 0 = max_len
  ))

  config.train = ml_collections.ConfigDict(dict(
      steps=100_000,
      checkpoint_every=1000,
      keep_checkpoints=3,
      log_every=100,
      eval_every=1000,
      learning_rate=1.0,  # rsqrt: multiplies d_model^-0.5 * min(n^-0.5, n * warmup^-1.5); else the peak
      schedule="rsqrt",  # rsqrt | warmup_cosine | warmup_linear | warmup_rsqrt | constant
      warmup_steps=4000,
      end_lr_fraction=0.0,  # warmup_cosine / warmup_linear: final rate as a fraction of the peak
      label_smoothing=0.1,
      # Target positions a step projects onto the vocabulary and scores at a time
      # (seq2seq/training/loss.py: chunked_cross_entropy_sums): no [b, t, vocab] logits are held.
      # 0 = all at once.
      loss_chunk=0,
      # The loss's statistics and its gradient: auto = on GPUs, one Pallas kernel that reads the
      # [tokens, vocab] logits once (seq2seq/training/loss_kernel.py), else XLA | xla | pallas.
      loss_impl="auto",
      adam_b1=0.9,
      adam_b2=0.98,
      adam_eps=1e-9,
      weight_decay=0.0,
      adam_mu_dtype="",  # "" = the parameters' (float32); "bfloat16" halves the first moment's memory
      grad_clip_norm=0.0,  # 0 = off
      # The gradient's global norm every step: logged (grad_norm) and checked by the divergence
      # guard. False leaves out its per-parameter reductions (on a GPU about 130 small kernels of
      # wmt14_base's step; docs/scaling.md) and the guard checks the loss alone. Clipping
      # (grad_clip_norm) computes the norm all the same.
      grad_norm=True,
      accum_steps=1,  # micro-batches per update (token-weighted gradient accumulation)
      rng_impl="threefry2x32",  # dropout key PRNG (threefry2x32 | rbg); masks hash the key, dropout.keep_mask
      # FLOP/s of all devices, MFU's denominator. 0 = the device kind's nominal dense peak for model.dtype
      # (seq2seq/model/flops.py: PEAK_TFLOPS); on a CPU or an unlisted device, the fastest f32 matmul
      # measured at start and evals. metrics.jsonl's peak_source says which.
      peak_flops=0.0,
      # Divergence guard: on a NaN/inf loss or gradient norm (or a loss over spike_factor x
      # its running mean), restore the last checkpoint, skip that data, scale the rate.
      guard_max_rollbacks=3,  # then stop with an error; 0 = no guard
      guard_spike_factor=0.0,  # 0 = only non-finite values count
      guard_lr_factor=0.5,  # learning-rate multiplier applied at each rollback
      inject_nan_at_step=-1,  # testing: make the gradients of this step NaN
      # Steps that neither log, evaluate nor checkpoint read nothing back from the devices (the
      # guard checks the steps since the last check at those that do). "disallow" makes a read
      # on such a step an error (jax.transfer_guard_device_to_host); "log" reports it.
      transfer_guard="allow",
      allow_data_change=False,  # resume although data/batching settings differ from the checkpoint's (logged)
  ))

  # Mesh axis sizes; -1 takes the remaining devices.
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))

  config.eval = ml_collections.ConfigDict(dict(
      beam_size=4,
      alpha=0.6,  # GNMT length penalty
      max_len_a=1.0,  # max target length = a * source length + b
      max_len_b=50,
      batch_size=64,  # sentences per batch up to 128 source tokens; fewer for longer ones (same tokens)
      max_source_len=1024,  # longer sources are cut to this many tokens, with a warning (learned positions: less)
      max_programs=3,  # compiled searches per test set: source widths fitted to its lengths (0: one per bucket)
      # Validation BLEU during training, on the first N sentences of the validation split.
      val_bleu_sentences=0,  # 0 = off
      val_beam_size=1,  # 1 = greedy (fast); the length settings above apply
  ))
  return config
