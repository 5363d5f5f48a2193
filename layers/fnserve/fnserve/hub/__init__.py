"""``fnserve import``: a Hugging Face model folder in, a model and its pipeline in a manifest out, ready to serve."""
