"""Console transport: the terminal shows every agent's composed card, live (no credentials)."""
