"""``python -m rlx_core`` is the ``rlx`` command."""

from rlx_core.cli import main

if __name__ == "__main__":
    main()
