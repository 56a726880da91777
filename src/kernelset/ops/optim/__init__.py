"""Optimizer family: multi-tensor AdamW (a drop-in torch.optim.AdamW) and clip_grad_norm_."""
from .api import AdamW, clip_grad_norm_

__all__ = ["AdamW", "clip_grad_norm_"]
PUBLIC = ["clip_grad_norm_"]  # kernelset exports these; the optimizer stays ks.optim.AdamW, as torch.optim.AdamW
