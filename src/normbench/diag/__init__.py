"""What a run measures and records: per-layer diagnostics, outcomes, the recorder, W&B logging, the coordinate check."""
