"""`python -m oncelog.cli`: the same as the `oncelog` command."""

from oncelog.cli import main

if __name__ == "__main__":
    main()
