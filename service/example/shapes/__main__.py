"""`python -m service.example.shapes [NAME ...]`: run each shape, print its verdicts."""

import sys

from service.example.shapes import main

sys.exit(main(sys.argv[1:]))
