"""Shared test configuration."""

from __future__ import annotations

import torch

# Tests are small; more threads than cores only adds contention on the 2-core CI machine.
torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
