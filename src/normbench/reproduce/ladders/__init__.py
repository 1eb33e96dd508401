"""The ladders: one claim at several model sizes (scale), LRs (lr) or training lengths (duration), run by rungs."""
