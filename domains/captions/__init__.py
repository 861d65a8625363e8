"""The captions domain: the tokenizer shared by the multimodal corpus job, model and pyfunc."""
