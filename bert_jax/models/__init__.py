"""The encoder: its config and blocks (`model`), splash attention, FLOP counts."""
