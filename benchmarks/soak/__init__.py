"""The soak: real kvtier servers under a seeded fault schedule for an hour, then a verdict."""
