"""A run directory: its files, lock, resume policy, and the Hydra callbacks that keep them."""
