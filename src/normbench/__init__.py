"""normbench: normalization ablations for GPT-style pretraining."""

__version__ = "0.1.0"
