# Starts a multiprocessing child that sleeps past the row.
import multiprocessing
import time

multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,), daemon=False).start()
