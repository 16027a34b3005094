"""A user policy module that fails while being imported (a bad-input corpus case)."""

raise ImportError("this module is broken on purpose: numpy.fancy_thing does not exist")
