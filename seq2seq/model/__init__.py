"""The model: layers (norms, feed-forward, embeddings, positions) -> attention -> the
encoder-decoder Transformer, configured by a frozen `ModelConfig`."""
