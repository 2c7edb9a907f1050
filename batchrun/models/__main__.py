"""`python -m batchrun.models [FILE.gguf]`: convert ahead of time and print the directory."""

from batchrun.models.convert import main

main()
