"""Channel tests: the shared contract suite and per-transport tests against fake APIs."""
