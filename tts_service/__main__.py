"""``python -m tts_service`` is ``streamvox serve``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
