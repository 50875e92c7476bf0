"""The disk backend: block records as files, one SQLite index per root."""
