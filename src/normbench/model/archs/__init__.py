"""The architectures beside the placement GPT: nGPT, SimpleGPT and the norm-free residual GPTs."""
