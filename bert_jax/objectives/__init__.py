"""Pretraining objectives: masking and the losses."""
