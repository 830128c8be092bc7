"""What the checks of several katas share: strategies, models and tables (``common``), and the
device checks every kata runs (``devices``)."""
