"""Prediction: per-GPU memory (MARP), step time, calibration profiles and the closed loop."""
