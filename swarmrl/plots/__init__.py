"""Plots a user reads a run by: the learning curves of a run directory (``curves``, ``swarmrl plot RUN_DIR``)."""
