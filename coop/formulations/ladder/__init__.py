"""The ladder: auto (rungs tried in order through the registry) and the constructed budget."""
