# Transitional alias while opsynth/pipeline.py is split into opsynth/generate/ (removed by the split).
import sys

from opsynth.generate import driver

sys.modules[__name__] = driver
