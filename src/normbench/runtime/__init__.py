"""How a run runs on its machine: processes and FSDP2, compile, memory, FLOPs, throughput and its length in steps."""
