"""Hand-written accelerator kernels, fenced off from the reference models they speed up.

conv_kernel.py: the Hopper implicit-GEMM conv (Pallas Mosaic GPU), bf16 or FP8 (study and numbers:
conv_kernel.md); vae_conv.py: that kernel plugged into models/vae.py as its injected conv;
vae_fp8.py: static FP8 activation scales for it (calibration, scale files, what serving picks).
"""
