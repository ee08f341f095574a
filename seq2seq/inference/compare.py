"""Systems compared as MT papers report them: BLEU, chrF++ and TER of each system on one test
set, and a paired test of each against the baseline, all by sacreBLEU's own implementation
(`sacrebleu.significance.PairedTest`, what `sacrebleu REF -i BASE SYS --paired-bs` runs).

- `bs`, paired bootstrap resampling (Koehn 2004; 1000 resamples by default): each system's
  mean and 95% confidence interval over the resamples, and the p-value of its difference from
  the baseline;
- `ar`, approximate randomization (Riezler and Maxwell 2005; 10000 trials by default): the
  p-value; no interval.

The resampling is seeded (sacreBLEU's `SACREBLEU_SEED`, 12345 unless set), so a comparison
repeats exactly. `seq2seq-eval --compare=HYPS` compares the run's translation of the test set
with the given hypothesis files (docs/evaluation.md, "Compare").
"""

from __future__ import annotations

import os

TESTS = ("bs", "ar")


def compare(baseline: tuple[str, list[str]], systems: list[tuple[str, list[str]]], references: list[str], *,
            test: str = "bs", samples: int = 0, tokenize: str = "13a", lowercase: bool = False) -> dict:
  """{test, samples, seed, signatures: {metric: signature}, systems: [{name, METRIC: {score,
  p_value, mean, ci}}]}: the baseline first (no p-value), then each system against it.
  `samples`: resamples (bs) or trials (ar); 0 for sacreBLEU's default."""
  from sacrebleu.metrics import BLEU, CHRF, TER
  from sacrebleu.significance import PairedTest

  if test not in TESTS:
    raise ValueError(f"test must be one of {TESTS}, got {test!r}")
  for name, hypotheses in [baseline, *systems]:
    if len(hypotheses) != len(references):
      raise ValueError(f"{name} has {len(hypotheses)} lines but the references have {len(references)}")
  metrics = {"BLEU": BLEU(tokenize=tokenize, lowercase=lowercase), "chrF": CHRF(word_order=2, lowercase=lowercase),
             "TER": TER(case_sensitive=not lowercase)}
  paired = PairedTest([baseline, *systems], metrics, [references], test_type=test, n_samples=samples)
  signatures, scores = paired()
  names = scores.pop("System")
  rows = [{"name": name} for name in names]
  for metric, results in scores.items():
    for row, r in zip(rows, results):
      row[metric] = {key: None if value is None else float(value)
                     for key, value in (("score", r.score), ("p_value", r.p_value), ("mean", r.mean), ("ci", r.ci))}
  return {"test": test, "samples": paired.n_samples, "seed": os.environ.get("SACREBLEU_SEED", "12345"),
          "signatures": {metric: signature.format() for metric, signature in signatures.items()}, "systems": rows}


def cell(row: dict, metric: str) -> str:
  """A system's figure as sacreBLEU's table prints it: `56.3 (56.4 ± 6.5) (p = 0.0060)*` (bs),
  `56.3 (p = 0.0060)*` (ar); a star where p < 0.05."""
  r = row[metric]
  text = f"{r['score']:.1f}" + (f" ({r['mean']:.1f} ± {r['ci']:.1f})" if r["ci"] is not None else "")
  if r["p_value"] is not None:
    text += f" (p = {r['p_value']:.4f})" + ("*" if r["p_value"] < 0.05 else "")
  return text


def lines(result: dict) -> list[str]:
  """The comparison as text: one line per system and metric, then the signatures."""
  test = {"bs": f"paired bootstrap, {result['samples']} resamples",
          "ar": f"approximate randomization, {result['samples']} trials"}[result["test"]]
  metrics = list(result["signatures"])
  out = [f"compared with {result['systems'][0]['name']} ({test}, seed {result['seed']}; * p < 0.05):"]
  for row in result["systems"]:
    out.append(f"  {row['name']}: " + "; ".join(f"{metric} {cell(row, metric)}" for metric in metrics))
  out += [f"  {metric} signature: {signature}" for metric, signature in result["signatures"].items()]
  return out
