"""``python -m otel_gpu`` runs the command line."""

import sys

from otel_gpu.cli import main

sys.exit(main())
