"""Integrations with training libraries (transformers)."""
