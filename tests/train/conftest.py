"""The train tests' fixtures live beside them (bandit.py: the one-token learning check); with
`--import-mode=importlib` a test imports them by name only when this folder is on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
