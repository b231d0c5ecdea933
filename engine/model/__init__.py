"""What the model computes: configs, our Gemma 4, the DFlash drafter, the KV cache."""
