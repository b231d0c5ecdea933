"""Reading checkpoints into memory: safetensors, the int4 formats, and whether it all fits."""
