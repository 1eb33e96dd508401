"""The training loop and its stateful parts: build, state, checkpoint, signals, optimizers, diagnostics."""
