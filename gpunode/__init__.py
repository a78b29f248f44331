"""gpunode: turn a Linux box with NVIDIA GPUs into a working GPU container host."""

__version__ = "0.1.0"
