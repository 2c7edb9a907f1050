"""Engine workers: the parent's handle on a process or a Ray actor, the child loop, devices."""
