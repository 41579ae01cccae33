"""Helpers shared by test modules (conftest holds the fixtures)."""

import torch

# Kernel tests run on every device present; CUDA ones are simply absent without a GPU.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
