"""Experiments built from the library: the attention-variant ablation."""
