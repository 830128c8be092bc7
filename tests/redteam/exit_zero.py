# Leaves at import with a success code.
import os

os._exit(0)
