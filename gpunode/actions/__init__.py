"""What a plan's actions do to a node. Every action kind implements `apply(conn)`; the runner calls nothing else.

Steps (gpunode/steps/) only construct actions from facts; the I/O lives here: base.py (commands, files,
services, reboots), packages.py (every package-manager call, inside the lock wait), driver.py (the .run
installer), fabric.py (starting fabric manager), runtime.py (nvidia-ctk runtime configure).
"""
