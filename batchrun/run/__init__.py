"""Running a job: the commands, the scheduler, poison isolation, the batch-size search."""
