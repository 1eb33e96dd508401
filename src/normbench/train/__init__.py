"""The training loop and its state: trainer, loop_parts, build, state, checkpoint, signals."""
