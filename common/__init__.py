"""What every folder of the package may import (issue 77): errors a person can act on (``errors``), files written
whole and locks (``files``), a free port (``ports``). Imports nothing of the package and no heavy library."""
