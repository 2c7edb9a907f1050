"""The job directory: manifest, journal, lock, input map, and the state derived from them."""
