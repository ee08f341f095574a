"""Corpus BLEU and chrF with sacreBLEU on detokenized text, with their signatures, so that
scores are comparable with published ones (cased, 13a tokenization by default)."""

from __future__ import annotations

from sacrebleu.metrics import BLEU, CHRF


def score(hypotheses: list[str], references: list[str], *, tokenize: str = "13a", lowercase: bool = False) -> dict:
  """{"bleu", "chrf", their signatures and printable lines} of one hypothesis per reference."""
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
  bleu, chrf = BLEU(tokenize=tokenize, lowercase=lowercase), CHRF(lowercase=lowercase)
  bleu_score, chrf_score = bleu.corpus_score(hypotheses, [references]), chrf.corpus_score(hypotheses, [references])
  bleu_sig, chrf_sig = str(bleu.get_signature()), str(chrf.get_signature())
  return {"bleu": bleu_score.score, "chrf": chrf_score.score, "bleu_signature": bleu_sig, "chrf_signature": chrf_sig,
          "bleu_line": f"{bleu_score} {bleu_sig}", "chrf_line": f"{chrf_score} {chrf_sig}"}
