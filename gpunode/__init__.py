"""gpunode: turn a Linux box with NVIDIA GPUs into a working GPU container host."""

__version__ = "0.1.0"
SCHEMA_VERSION = 1  # of every JSON document gpunode prints (plan, install, doctor, verify, fleet summaries)
