"""Generation from encoders: the masked-diffusion sampler (`diffusion.py`)."""
