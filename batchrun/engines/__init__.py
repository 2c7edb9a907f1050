"""Engines: the vLLM engine and the echo engine behind one narrow interface."""
