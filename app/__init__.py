"""The app: what a user types or calls (the ``hyperband`` CLI, ``hb.tune``, ``hyperband deploy``), over the flows."""
