"""Optimizers: AdamW, SGD, Lion, Muon, Adafactor, their parameter groups by kind and the LR schedule."""
