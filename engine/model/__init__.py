"""Talker, code predictor and their shared layers (state-dict keys equal the official ones)."""
