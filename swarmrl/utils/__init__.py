"""Small shared helpers (metrics files, progress)."""
