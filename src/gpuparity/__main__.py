"""`python -m gpuparity ...` (torchrun uses this form: `torchrun -m gpuparity fleet`)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
