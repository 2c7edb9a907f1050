"""What a person sees: progress, tables, words and commands, output that never stops a job."""
