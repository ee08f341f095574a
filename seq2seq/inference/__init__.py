"""Inference: beam and greedy search (`decode`), batched translation of sentences
(`translate.Translator`), sacreBLEU scoring and the evaluation command (`evaluate`)."""
