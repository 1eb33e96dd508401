"""The ladders: one claim at several model sizes (scale) or training lengths (duration)."""
