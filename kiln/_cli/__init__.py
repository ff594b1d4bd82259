"""Floor 4, the command line: the commands of ``kiln`` (see :mod:`kiln.cli`,
which holds the parser and ``main``).  This ``__init__`` imports nothing."""
