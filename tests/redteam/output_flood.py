# Floods its standard output.
import sys

for _ in range(200):
    sys.stdout.write("x" * 100_000 + "\n")
