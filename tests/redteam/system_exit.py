# Raises SystemExit(0) at import.
raise SystemExit(0)
