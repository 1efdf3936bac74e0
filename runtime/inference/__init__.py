"""What a request passes through before and after its engine: admission, the reasoning split,
tool-call parsing, stop sequences, embeddings
and rerank."""
